"""Server side of SASL for the test broker: credentials, PLAIN and SCRAM-SHA-256/512 verifiers, and the
per-connection authentication state machine.

Credentials are kept the way a Kafka broker keeps SCRAM credentials: per user and mechanism a salt, an
iteration count, StoredKey and ServerKey (never the password). PLAIN needs the password itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from service.client.sasl import scram_keys, unescape_saslname
from service.protocol.messages import ApiKey

SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
ALL_MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
_GS2_NO_BINDING = ("n", "y")


class SaslServerError(Exception):
    """Authentication failed. ``str()`` is what the broker puts into the SaslAuthenticate error message."""


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class CredentialStore:
    """Users of the test cluster. ``add_user`` derives SCRAM credentials for both SHA variants."""

    def __init__(self, default_iterations: int = 4096) -> None:
        self.default_iterations = default_iterations
        self._plain: dict[str, str] = {}
        self._scram: dict[tuple[str, str], ScramCredential] = {}

    def add_user(self, username: str, password: str, *, iterations: int | None = None,
                 salt: bytes | None = None) -> None:
        self._plain[username] = password
        for mech, hash_name in SCRAM_MECHANISMS.items():
            s = salt if salt is not None else secrets.token_bytes(16)
            n = iterations if iterations is not None else self.default_iterations
            _ck, stored, server = scram_keys(hash_name, password, s, n)
            self._scram[(mech, username)] = ScramCredential(s, n, stored, server)

    def remove_user(self, username: str) -> None:
        self._plain.pop(username, None)
        for mech in SCRAM_MECHANISMS:
            self._scram.pop((mech, username), None)

    def check_plain(self, username: str, password: str) -> bool:
        expected = self._plain.get(username)
        return expected is not None and hmac.compare_digest(expected.encode(), password.encode())

    def scram(self, mechanism: str, username: str) -> ScramCredential | None:
        return self._scram.get((mechanism, username))

    def new_mechanism(self, name: str, *, nonce: str | None = None) -> ServerMechanism:
        if name == "PLAIN":
            return PlainServer(self)
        if name in SCRAM_MECHANISMS:
            return ScramServer(self, name, nonce=nonce)
        raise ValueError(f"unsupported mechanism {name}")


class ServerMechanism(Protocol):
    name: str
    complete: bool
    username: str | None

    def step(self, client_bytes: bytes) -> bytes:
        """Next server message for ``client_bytes``; raises :class:`SaslServerError` on failure."""
        ...


class PlainServer:
    name = "PLAIN"

    def __init__(self, store: CredentialStore) -> None:
        self._store = store
        self.complete = False
        self.username: str | None = None

    def step(self, client_bytes: bytes) -> bytes:
        if self.complete:
            raise SaslServerError("PLAIN exchange is already complete")
        try:
            authzid, authcid, password = client_bytes.decode().split("\0")
        except (UnicodeDecodeError, ValueError):
            raise SaslServerError("invalid PLAIN message: expected authzid NUL authcid NUL password") from None
        if not authcid:
            raise SaslServerError("invalid PLAIN message: empty user name")
        if authzid and authzid != authcid:
            raise SaslServerError("PLAIN authorization id must be empty or equal the user name")
        if not self._store.check_plain(authcid, password):
            raise SaslServerError("authentication failed: invalid user name or password (PLAIN)")
        self.username = authcid
        self.complete = True
        return b""


def _attributes(text: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=":
            raise SaslServerError("malformed SCRAM message")
        out.append((part[0], part[2:]))
    return out


class ScramServer:
    """One SCRAM exchange: client-first → server-first, client-final → server-final."""

    def __init__(self, store: CredentialStore, mechanism: str, *, nonce: str | None = None) -> None:
        self.name = mechanism
        self._hash = SCRAM_MECHANISMS[mechanism]
        self._store = store
        self._server_nonce_part = nonce if nonce is not None else secrets.token_urlsafe(18)
        self._state = "first"
        self._cred: ScramCredential | None = None
        self._gs2 = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self.complete = False
        self.username: str | None = None

    def step(self, client_bytes: bytes) -> bytes:
        try:
            text = client_bytes.decode()
        except UnicodeDecodeError:
            raise SaslServerError(f"{self.name} message is not UTF-8") from None
        if self._state == "first":
            return self._first(text)
        if self._state == "final":
            return self._final(text)
        raise SaslServerError(f"{self.name} exchange is already complete")

    def _fail(self, message: str) -> SaslServerError:
        self._state = "failed"
        return SaslServerError(message)

    def _first(self, text: str) -> bytes:
        # gs2-header: cbind-flag "," [authzid] ","
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in _GS2_NO_BINDING:
            raise self._fail(f"{self.name}: channel binding is not supported or the message is malformed")
        authzid = parts[1]
        if authzid and not authzid.startswith("a="):
            raise self._fail(f"{self.name}: malformed authorization identity")
        self._gs2 = f"{parts[0]},{authzid},"
        bare = parts[2]
        attrs = _attributes(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise self._fail(f"{self.name}: malformed client-first message")
        try:
            username = unescape_saslname(attrs[0][1])
        except ValueError:
            raise self._fail(f"{self.name}: malformed user name") from None
        try:
            authz_user = unescape_saslname(authzid[2:]) if authzid else username
        except ValueError:
            authz_user = None
        if authz_user != username:
            raise self._fail(f"{self.name}: authorization id must equal the user name")
        client_nonce = attrs[1][1]
        if not client_nonce or any(not (0x21 <= ord(c) <= 0x7E) or c == "," for c in client_nonce):
            raise self._fail(f"{self.name}: invalid client nonce")
        cred = self._store.scram(self.name, username)
        if cred is None:
            raise self._fail(f"authentication failed: unknown user or invalid credentials ({self.name})")
        self._cred = cred
        self.username = username
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce_part
        self._server_first = f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _final(self, text: str) -> bytes:
        assert self._cred is not None
        head, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise self._fail(f"{self.name}: client-final message has no proof")
        attrs = _attributes(head)
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise self._fail(f"{self.name}: malformed client-final message")
        if attrs[0][1] != base64.b64encode(self._gs2.encode()).decode():
            raise self._fail(f"{self.name}: channel binding data does not match the gs2 header")
        if attrs[1][1] != self._nonce:
            raise self._fail(f"{self.name}: nonce mismatch")
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except (binascii.Error, ValueError):
            raise self._fail(f"{self.name}: proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{head}".encode()
        signature = hmac.new(self._cred.stored_key, auth_message, self._hash).digest()
        if len(proof) != len(signature):
            raise self._fail(f"authentication failed: invalid credentials ({self.name})")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), self._cred.stored_key):
            raise self._fail(f"authentication failed: invalid credentials ({self.name})")
        verifier = hmac.new(self._cred.server_key, auth_message, self._hash).digest()
        self._state = "done"
        self.complete = True
        return b"v=" + base64.b64encode(verifier)


# -- per-connection state machine ---------------------------------------------------------------------
class SaslPhase(Enum):
    START = "start"  # ApiVersions or SaslHandshake allowed
    HANDSHAKE = "handshake"  # ApiVersions done: only SaslHandshake
    AUTHENTICATE = "authenticate"  # handshake v1 done: only SaslAuthenticate
    RAW = "raw"  # handshake v0 done: the next frames are bare SASL tokens
    DONE = "done"  # authenticated (or SASL disabled): everything allowed
    FAILED = "failed"


class SaslSession:
    """Where one connection stands in SASL authentication."""

    def __init__(self, enabled: bool) -> None:
        self.phase = SaslPhase.START if enabled else SaslPhase.DONE
        self.enabled = enabled
        self.mechanism: ServerMechanism | None = None
        self.principal: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.enabled and self.phase is SaslPhase.DONE

    def permits(self, api_key: int) -> bool:
        """Whether a Kafka request with this key may arrive now (if not, the broker closes)."""
        if self.phase is SaslPhase.DONE:
            return True
        if self.phase is SaslPhase.START:
            return api_key in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE)
        if self.phase is SaslPhase.HANDSHAKE:
            return api_key == ApiKey.SASL_HANDSHAKE
        if self.phase is SaslPhase.AUTHENTICATE:
            return api_key == ApiKey.SASL_AUTHENTICATE
        return False

    def api_versions_answered(self) -> None:
        if self.phase is SaslPhase.START:
            self.phase = SaslPhase.HANDSHAKE

    def begin(self, mechanism: ServerMechanism, handshake_version: int) -> None:
        self.mechanism = mechanism
        self.phase = SaslPhase.AUTHENTICATE if handshake_version >= 1 else SaslPhase.RAW

    def step(self, client_bytes: bytes) -> bytes:
        """Feed one client token; on the final step the session becomes authenticated."""
        assert self.mechanism is not None
        try:
            reply = self.mechanism.step(client_bytes)
        except SaslServerError:
            self.phase = SaslPhase.FAILED
            raise
        if self.mechanism.complete:
            self.phase = SaslPhase.DONE
            self.principal = self.mechanism.username
        return reply


__all__ = [
    "ALL_MECHANISMS",
    "SCRAM_MECHANISMS",
    "CredentialStore",
    "PlainServer",
    "SaslPhase",
    "SaslServerError",
    "SaslSession",
    "ScramCredential",
    "ScramServer",
    "ServerMechanism",
]
