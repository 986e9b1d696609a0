"""SASL client mechanisms (service/client/sasl.py): PLAIN and SCRAM, checked against the RFC test vectors."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from service.client.sasl import (
    KAFKA_MIN_SCRAM_ITERATIONS,
    PlainMechanism,
    SaslAuthenticationError,
    SaslStateError,
    ScramMechanism,
    create_mechanism,
    escape_saslname,
    scram_keys,
    unescape_saslname,
)

# -- RFC 5802 section 5 (SCRAM-SHA-1), user "user", password "pencil" ------------------------------------
RFC5802_CLIENT_FIRST = b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL"
RFC5802_SERVER_FIRST = b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
RFC5802_CLIENT_FINAL = b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
RFC5802_SERVER_FINAL = b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ="

# -- RFC 7677 section 3 (SCRAM-SHA-256), user "user", password "pencil" ------------------------------------
RFC7677_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC7677_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC7677_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc5802_scram_sha1_vector() -> None:
    mech = ScramMechanism("SCRAM-SHA-1", "user", "pencil", nonce="fyko+d2lbbFgONRv9qkxdawL")
    assert mech.initial_response() == RFC5802_CLIENT_FIRST
    assert mech.respond(RFC5802_SERVER_FIRST) == RFC5802_CLIENT_FINAL
    assert not mech.complete
    assert mech.respond(RFC5802_SERVER_FINAL) is None
    assert mech.complete


def test_rfc7677_scram_sha256_vector() -> None:
    mech = create_mechanism("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert mech.name == "SCRAM-SHA-256"
    assert mech.initial_response() == RFC7677_CLIENT_FIRST
    assert mech.respond(RFC7677_SERVER_FIRST) == RFC7677_CLIENT_FINAL
    assert mech.respond(RFC7677_SERVER_FINAL) is None
    assert mech.complete


def _server_for(hash_name: str, password: str, salt: bytes, iterations: int):
    """A minimal independent SCRAM server computation for round-trip checks (SHA-512 has no RFC vector)."""
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    stored_key = hashlib.new(hash_name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hash_name).digest()
    return stored_key, server_key


def test_scram_sha512_round_trip_against_independent_server() -> None:
    salt = b"0123456789abcdef"
    mech = create_mechanism("scram-sha-512", "alice", "s3cret", nonce="clientnonce")
    assert mech.name == "SCRAM-SHA-512"
    first = mech.initial_response()
    assert first == b"n,,n=alice,r=clientnonce"
    server_first = f"r=clientnonceSERVER,s={base64.b64encode(salt).decode()},i=4096".encode()
    final = mech.respond(server_first)
    assert final is not None
    without_proof, proof_b64 = final.decode().rsplit(",p=", 1)
    assert without_proof == "c=biws,r=clientnonceSERVER"
    stored_key, server_key = _server_for("sha512", "s3cret", salt, 4096)
    auth_message = b"n=alice,r=clientnonce," + server_first + b"," + without_proof.encode()
    signature = hmac.new(stored_key, auth_message, "sha512").digest()
    client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof_b64), signature, strict=True))
    assert hashlib.sha512(client_key).digest() == stored_key
    verifier = base64.b64encode(hmac.new(server_key, auth_message, "sha512").digest())
    assert mech.respond(b"v=" + verifier) is None
    assert mech.complete


def test_scram_keys_helper_matches_rfc7677() -> None:
    # ClientKey XOR ClientSignature must reproduce the RFC's proof.
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    client_key, stored_key, _server_key = scram_keys("sha256", "pencil", salt, 4096)
    auth_message = (
        RFC7677_CLIENT_FIRST[3:] + b"," + RFC7677_SERVER_FIRST + b"," + RFC7677_CLIENT_FINAL.rsplit(b",p=", 1)[0]
    )
    sig = hmac.new(stored_key, auth_message, "sha256").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, sig, strict=True))
    assert b"p=" + base64.b64encode(proof) == RFC7677_CLIENT_FINAL.rsplit(b",", 1)[1]


def test_saslname_escaping() -> None:
    assert escape_saslname("a,b=c") == "a=2Cb=3Dc"
    assert unescape_saslname("a=2Cb=3Dc") == "a,b=c"
    with pytest.raises(ValueError):
        unescape_saslname("a=41")
    mech = create_mechanism("SCRAM-SHA-256", "us,er=x", "pw", nonce="abc")
    assert mech.initial_response() == b"n,,n=us=2Cer=3Dx,r=abc"


def _started(nonce: str = "abc", mechanism: str = "SCRAM-SHA-256") -> ScramMechanism:
    mech = ScramMechanism(mechanism, "user", "hunter2-password", nonce=nonce)
    mech.initial_response()
    return mech


def _assert_no_password(exc: BaseException) -> None:
    assert "hunter2-password" not in str(exc)
    assert "hunter2-password" not in repr(exc)


@pytest.mark.parametrize(
    "server_first, fragment",
    [
        (b"r=xyzSERVER,s=QSXCR+Q6sek8bf92,i=4096", "nonce"),  # does not extend our nonce
        (b"r=ab,s=QSXCR+Q6sek8bf92,i=4096", "nonce"),  # shorter than ours
        (b"r=abc\x7f,s=QSXCR+Q6sek8bf92,i=4096", "invalid characters"),
        (b"r=abcS,s=***,i=4096", "base64"),
        (b"r=abcS,s=QSXCR+Q6sek8bf92,i=many", "not a number"),
        (b"r=abcS,s=QSXCR+Q6sek8bf92", "malformed"),
        (b"garbage", "malformed"),
        (b"m=ext,r=abcS,s=QSXCR+Q6sek8bf92,i=4096", "extension"),
        (b"\xff\xfe", "UTF-8"),
        (b"e=unknown-user", "unknown-user"),
    ],
)
def test_bad_server_first_is_rejected(server_first: bytes, fragment: str) -> None:
    mech = _started()
    with pytest.raises(SaslAuthenticationError, match=fragment) as info:
        mech.respond(server_first)
    _assert_no_password(info.value)
    assert info.value.mechanism == "SCRAM-SHA-256"
    assert not mech.complete
    with pytest.raises(SaslStateError):
        mech.respond(b"v=AAAA")


def test_server_error_attribute_is_exposed() -> None:
    mech = _started()
    with pytest.raises(SaslAuthenticationError) as info:
        mech.respond(b"e=unknown-user")
    assert info.value.server_error == "unknown-user"


@pytest.mark.parametrize("iterations", [1, 4095])
def test_too_few_iterations_are_rejected(iterations: int) -> None:
    mech = _started()
    with pytest.raises(SaslAuthenticationError, match=f"{iterations} iterations.*at least 4096") as info:
        mech.respond(f"r=abcS,s=QSXCR+Q6sek8bf92,i={iterations}".encode())
    _assert_no_password(info.value)
    assert KAFKA_MIN_SCRAM_ITERATIONS == 4096


def test_wrong_server_signature_is_rejected() -> None:
    mech = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    mech.initial_response()
    mech.respond(RFC7677_SERVER_FIRST)
    forged = b"v=" + base64.b64encode(b"\0" * 32)
    with pytest.raises(SaslAuthenticationError, match="signature does not match"):
        mech.respond(forged)
    assert not mech.complete


@pytest.mark.parametrize(
    "server_final, fragment",
    [(b"e=invalid-proof", "invalid-proof"), (b"x=1", "malformed"), (b"v=@@@", "base64")],
)
def test_bad_server_final(server_final: bytes, fragment: str) -> None:
    mech = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    mech.initial_response()
    mech.respond(RFC7677_SERVER_FIRST)
    with pytest.raises(SaslAuthenticationError, match=fragment) as info:
        mech.respond(server_final)
    assert "pencil" not in str(info.value)


def test_scram_out_of_order_calls() -> None:
    mech = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="n")
    with pytest.raises(SaslStateError):
        mech.respond(b"r=nX,s=QSXCR+Q6sek8bf92,i=4096")
    mech.initial_response()
    with pytest.raises(SaslStateError):
        mech.initial_response()


def test_scram_random_nonce_and_repr_hide_secrets() -> None:
    a = create_mechanism("SCRAM-SHA-512", "user", "hunter2-password")
    b = create_mechanism("SCRAM-SHA-512", "user", "hunter2-password")
    first_a, first_b = a.initial_response(), b.initial_response()
    assert first_a != first_b
    assert first_a.startswith(b"n,,n=user,r=") and b"," not in first_a.split(b",r=")[1]
    assert "hunter2-password" not in repr(a)


def test_invalid_injected_nonce() -> None:
    with pytest.raises(ValueError):
        ScramMechanism("SCRAM-SHA-256", "user", "pw", nonce="has,comma")
    with pytest.raises(ValueError):
        ScramMechanism("SCRAM-SHA-256", "user", "pw", nonce="")


def test_plain() -> None:
    mech = create_mechanism("PLAIN", "alice", "hunter2-password")
    assert isinstance(mech, PlainMechanism)
    assert mech.name == "PLAIN"
    assert mech.initial_response() == b"\0alice\0hunter2-password"
    assert not mech.complete
    assert mech.respond(b"") is None
    assert mech.complete
    assert "hunter2-password" not in repr(mech)
    with pytest.raises(SaslStateError):
        mech.respond(b"")
    with pytest.raises(SaslStateError):
        mech.initial_response()


def test_plain_rejects_nul_and_empty_user() -> None:
    with pytest.raises(ValueError) as info:
        create_mechanism("PLAIN", "alice", "pass\0word")
    assert "pass" not in str(info.value)
    with pytest.raises(ValueError):
        create_mechanism("PLAIN", "", "x")


def test_unknown_mechanism() -> None:
    with pytest.raises(ValueError, match="GSSAPI"):
        create_mechanism("GSSAPI", "u", "p")
    with pytest.raises(ValueError):
        create_mechanism("SCRAM-SHA-1", "u", "p")  # test-vector only, not offered to Kafka users
