"""Client side of the SASL mechanisms Kafka brokers offer: PLAIN and SCRAM-SHA-256/512 (sans-io).

Nothing here touches a socket. The connection layer drives a mechanism like this::

    mech = create_mechanism("SCRAM-SHA-256", username, password)
    # SaslHandshake(mechanism=mech.name) ...
    token = mech.initial_response()              # first client message
    while token is not None:
        reply = SaslAuthenticate(auth_bytes=token)   # a non-zero error code there is a failure
        token = mech.respond(reply.auth_bytes)       # next client message, or None when done
    assert mech.complete

Interface of every mechanism (:class:`SaslMechanism`):

* ``name`` — the SASL mechanism name to put into SaslHandshake (``"PLAIN"``, ``"SCRAM-SHA-256"``...).
* ``initial_response() -> bytes`` — the first client message; call it exactly once.
* ``respond(server_bytes) -> bytes | None`` — feed the server's ``auth_bytes``; returns the next client
  message, or ``None`` once the exchange is over (then ``complete`` is true).
* ``complete`` — true once the server is verified to have accepted us (for SCRAM: the server's
  signature checked out, so the server also proved it knows the credentials).

Failures raise :class:`SaslAuthenticationError` (a server ``e=`` error, a forged or mangled server
message, too few PBKDF2 iterations...). Calling the methods out of order raises
:class:`SaslStateError`, a subclass. No error message and no ``repr`` ever contains the password.

PLAIN (RFC 4616) sends ``authzid NUL authcid NUL passwd`` with an empty authzid; the server's answer
(empty) ends the exchange. SCRAM (RFC 5802, SHA-256/512 per RFC 7677) runs the usual
client-first / server-first / client-final / server-final exchange without channel binding
(gs2 header ``n,,``). Like Apache Kafka, user names and passwords are used as UTF-8 without
SASLprep, and the server must ask for at least 4096 PBKDF2 iterations. SCRAM-SHA-1 exists only so
that RFC 5802's own test vector can be checked; :func:`create_mechanism` does not offer it.

Computing the salted password (PBKDF2) is CPU work of a few milliseconds at 4096 iterations, and a
server could ask for any count: more than :data:`MAX_SCRAM_ITERATIONS` (100,000) is refused, and
:func:`respond_off_loop` runs a SCRAM ``respond`` in a worker thread (``asyncio.to_thread``) so the event
loop never computes PBKDF2.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Protocol

__all__ = [
    "KAFKA_MIN_SCRAM_ITERATIONS",
    "MAX_SCRAM_ITERATIONS",
    "SUPPORTED_MECHANISMS",
    "PlainMechanism",
    "SaslAuthenticationError",
    "SaslMechanism",
    "SaslStateError",
    "ScramMechanism",
    "create_mechanism",
    "escape_saslname",
    "respond_off_loop",
    "scram_keys",
    "unescape_saslname",
]

KAFKA_MIN_SCRAM_ITERATIONS = 4096
# A server (or a man in the middle on SASL_PLAINTEXT) asking for more would make every connection cost
# seconds of CPU; Kafka's default is 4096 and its own upper bound 16384.
MAX_SCRAM_ITERATIONS = 100_000
SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# SCRAM mechanism name -> hashlib name. SHA-1 is for RFC 5802's test vector only.
_SCRAM_HASHES = {"SCRAM-SHA-1": "sha1", "SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_GS2_HEADER = "n,,"  # no channel binding, no authorization identity


class SaslAuthenticationError(Exception):
    """SASL authentication failed or the server's messages are not acceptable.

    ``mechanism`` names the mechanism; ``server_error`` holds a SCRAM server's ``e=`` value if it sent
    one. Messages name the user at most, never the password.
    """

    def __init__(self, message: str, *, mechanism: str | None = None, server_error: str | None = None) -> None:
        super().__init__(message)
        self.mechanism = mechanism
        self.server_error = server_error


class SaslStateError(SaslAuthenticationError):
    """A mechanism method was called out of order (a bug in the caller, or a server that keeps talking)."""


class SaslMechanism(Protocol):
    """What the connection layer needs from a client mechanism."""

    name: str

    @property
    def complete(self) -> bool: ...

    def initial_response(self) -> bytes: ...

    def respond(self, server_bytes: bytes) -> bytes | None: ...


def create_mechanism(name: str, username: str, password: str, *, nonce: str | None = None) -> SaslMechanism:
    """A fresh client mechanism for one authentication exchange.

    ``name`` is ``"PLAIN"``, ``"SCRAM-SHA-256"`` or ``"SCRAM-SHA-512"`` (case-insensitive). ``nonce``
    fixes the SCRAM client nonce (tests only); it is ignored by PLAIN. Raises ``ValueError`` for an
    unknown mechanism or unusable credentials.
    """
    mech = name.upper()
    if mech == "PLAIN":
        return PlainMechanism(username, password)
    if mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        return ScramMechanism(mech, username, password, nonce=nonce)
    raise ValueError(f"unsupported SASL mechanism {name!r}; supported: {', '.join(SUPPORTED_MECHANISMS)}")


# -- PLAIN -----------------------------------------------------------------------------------------
class PlainMechanism:
    """RFC 4616 PLAIN with an empty authorization identity."""

    __slots__ = ("_password", "_state", "username")
    name = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        if not username:
            raise ValueError("SASL PLAIN needs a user name")
        if "\0" in username or "\0" in password:
            raise ValueError("SASL PLAIN credentials cannot contain NUL characters")
        self.username = username
        self._password = password
        self._state = "initial"  # initial -> sent -> done

    def __repr__(self) -> str:
        return f"PlainMechanism(username={self.username!r}, state={self._state!r})"

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def initial_response(self) -> bytes:
        if self._state != "initial":
            raise SaslStateError("PLAIN initial response already sent", mechanism=self.name)
        self._state = "sent"
        return b"\0" + self.username.encode() + b"\0" + self._password.encode()

    def respond(self, server_bytes: bytes) -> bytes | None:
        if self._state != "sent":
            raise SaslStateError(f"PLAIN got a server message in state {self._state}", mechanism=self.name)
        # A successful PLAIN exchange ends with an empty server message; anything else is odd but
        # harmless (failure is signalled by the SaslAuthenticate error code, not by these bytes).
        self._state = "done"
        return None


# -- SCRAM helpers -----------------------------------------------------------------------------------
def escape_saslname(name: str) -> str:
    """RFC 5802 saslname: ``=`` becomes ``=3D`` and ``,`` becomes ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_saslname(value: str) -> str:
    """Inverse of :func:`escape_saslname`; raises ``ValueError`` on a stray ``=``."""
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "=":
            code = value[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise ValueError("invalid escape in SCRAM saslname")
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def scram_keys(hash_name: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes, bytes]:
    """``(ClientKey, StoredKey, ServerKey)`` derived from a password (RFC 5802 section 3)."""
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
    client_key = _hmac(hash_name, salted, b"Client Key")
    stored_key = hashlib.new(hash_name, client_key).digest()
    server_key = _hmac(hash_name, salted, b"Server Key")
    return client_key, stored_key, server_key


def _parse_attributes(message: str) -> list[tuple[str, str]] | None:
    """``a=1,b=2`` → ``[("a", "1"), ("b", "2")]``; None if malformed."""
    attrs: list[tuple[str, str]] = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not ("a" <= part[0].lower() <= "z"):
            return None
        attrs.append((part[0], part[2:]))
    return attrs


def _valid_nonce(nonce: str) -> bool:
    # printable ASCII except ','
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


# -- SCRAM -----------------------------------------------------------------------------------------
class ScramMechanism:
    """Client side of SCRAM-SHA-256 / SCRAM-SHA-512 (and SCRAM-SHA-1 for RFC 5802's test vector).

    States: ``initial`` → (initial_response) ``first-sent`` → (respond server-first) ``final-sent`` →
    (respond server-final) ``done``. Any failure moves to ``failed``; the object is then unusable.
    """

    __slots__ = (
        "_auth_message",
        "_client_first_bare",
        "_hash",
        "_max_iterations",
        "_min_iterations",
        "_nonce",
        "_password",
        "_server_key",
        "_state",
        "name",
        "username",
    )

    def __init__(
        self,
        mechanism: str,
        username: str,
        password: str,
        *,
        nonce: str | None = None,
        min_iterations: int = KAFKA_MIN_SCRAM_ITERATIONS,
        max_iterations: int = MAX_SCRAM_ITERATIONS,
    ) -> None:
        hash_name = _SCRAM_HASHES.get(mechanism.upper())
        if hash_name is None:
            raise ValueError(f"unsupported SCRAM mechanism {mechanism!r}")
        if not username:
            raise ValueError("SCRAM needs a user name")
        if nonce is None:
            nonce = secrets.token_urlsafe(24)
        elif not _valid_nonce(nonce):
            raise ValueError("a SCRAM nonce is printable ASCII without ','")
        self.name = mechanism.upper()
        self.username = username
        self._password = password
        self._hash = hash_name
        self._nonce = nonce
        self._min_iterations = min_iterations
        self._max_iterations = max_iterations
        self._client_first_bare = ""
        self._auth_message = b""
        self._server_key = b""
        self._state = "initial"

    def __repr__(self) -> str:
        return f"ScramMechanism(name={self.name!r}, username={self.username!r}, state={self._state!r})"

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def _fail(self, message: str, server_error: str | None = None) -> SaslAuthenticationError:
        self._state = "failed"
        self._password = ""
        return SaslAuthenticationError(message, mechanism=self.name, server_error=server_error)

    def initial_response(self) -> bytes:
        if self._state != "initial":
            raise SaslStateError(f"{self.name} initial response already sent", mechanism=self.name)
        self._client_first_bare = f"n={escape_saslname(self.username)},r={self._nonce}"
        self._state = "first-sent"
        return (_GS2_HEADER + self._client_first_bare).encode()

    def respond(self, server_bytes: bytes) -> bytes | None:
        if self._state == "first-sent":
            return self._client_final(server_bytes)
        if self._state == "final-sent":
            self._verify_server_final(server_bytes)
            return None
        raise SaslStateError(f"{self.name} got a server message in state {self._state}", mechanism=self.name)

    # client-final from server-first
    def _client_final(self, server_bytes: bytes) -> bytes:
        try:
            server_first = server_bytes.decode()
        except UnicodeDecodeError:
            raise self._fail(f"{self.name} server-first message is not UTF-8") from None
        if server_first.startswith("e="):
            raise self._fail(f"{self.name} server error: {server_first[2:]}", server_first[2:])
        attrs = _parse_attributes(server_first)
        if attrs is None:
            raise self._fail(f"malformed {self.name} server-first message")
        if attrs[0][0] == "m":
            raise self._fail(f"{self.name} server requires an unsupported extension")
        if len(attrs) < 3 or [k for k, _ in attrs[:3]] != ["r", "s", "i"]:
            raise self._fail(f"malformed {self.name} server-first message")
        server_nonce, salt_b64, iter_text = attrs[0][1], attrs[1][1], attrs[2][1]
        if not server_nonce.startswith(self._nonce):
            raise self._fail(f"{self.name} server nonce does not extend the client nonce")
        if not _valid_nonce(server_nonce):
            raise self._fail(f"{self.name} server nonce has invalid characters")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
        except (binascii.Error, ValueError):
            raise self._fail(f"{self.name} server salt is not base64") from None
        if not salt:
            raise self._fail(f"{self.name} server sent an empty salt")
        if not iter_text.isascii() or not iter_text.isdigit():
            raise self._fail(f"{self.name} server iteration count {iter_text!r} is not a number")
        iterations = int(iter_text)
        if iterations < self._min_iterations:
            raise self._fail(
                f"{self.name} server asked for {iterations} iterations; at least {self._min_iterations} are required"
            )
        if iterations > self._max_iterations:
            raise self._fail(
                f"{self.name} server asked for {iterations} iterations; more than {self._max_iterations} are refused"
            )
        client_key, stored_key, server_key = scram_keys(self._hash, self._password, salt, iterations)
        self._password = ""  # no longer needed
        without_proof = f"c={base64.b64encode(_GS2_HEADER.encode()).decode()},r={server_nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        client_signature = _hmac(self._hash, stored_key, auth_message)
        proof = base64.b64encode(_xor(client_key, client_signature)).decode()
        self._auth_message = auth_message
        self._server_key = server_key
        self._state = "final-sent"
        return f"{without_proof},p={proof}".encode()

    def _verify_server_final(self, server_bytes: bytes) -> None:
        try:
            server_final = server_bytes.decode()
        except UnicodeDecodeError:
            raise self._fail(f"{self.name} server-final message is not UTF-8") from None
        if server_final.startswith("e="):
            err = server_final[2:].split(",", 1)[0]
            raise self._fail(f"{self.name} server error: {err}", err)
        if not server_final.startswith("v="):
            raise self._fail(f"malformed {self.name} server-final message")
        verifier_b64 = server_final[2:].split(",", 1)[0]
        try:
            verifier = base64.b64decode(verifier_b64, validate=True)
        except (binascii.Error, ValueError):
            raise self._fail(f"{self.name} server signature is not base64") from None
        expected = _hmac(self._hash, self._server_key, self._auth_message)
        if not hmac.compare_digest(verifier, expected):
            raise self._fail(f"{self.name} server signature does not match: the server does not know the credentials")
        self._server_key = b""
        self._state = "done"


async def respond_off_loop(mechanism: SaslMechanism, server_bytes: bytes) -> bytes | None:
    """``mechanism.respond(server_bytes)``; for SCRAM (PBKDF2 on the server-first message) in a worker thread,
    off the event loop."""
    if isinstance(mechanism, ScramMechanism):
        return await asyncio.to_thread(mechanism.respond, server_bytes)
    return mechanism.respond(server_bytes)
