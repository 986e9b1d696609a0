"""Authentication: the :class:`TenantRegistry` (all tenants, built from the tenants file or as the single
unauthenticated ``default`` tenant) and its :meth:`~TenantRegistry.authenticate` — API keys compared as
SHA-256 digests, JWTs verified against the trusted issuers."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import jwt

from service.client.connection import ConnectionConfig

from .config import JwtIssuer, _load
from .errors import UNAUTHENTICATED, TenantError
from .patterns import DEFAULT_DENY_LIST, TopicDenyList
from .quotas import Quotas
from .tenant import Tenant

log = logging.getLogger(__package__)  # "service.tenants", the logger of the module before the split

DEFAULT_TENANT_ID = "default"


def _unauthenticated(message: str) -> TenantError:
    return TenantError(401, UNAUTHENTICATED, message)


#: The one answer to every refused JWT: which check failed (unknown issuer, no such tenant, signature,
#: audience, expiry...) would tell an outsider which issuers and tenants exist. The reason is logged.
JWT_REFUSED = "invalid JWT: the token was not accepted (the gateway's log has the reason)"


class JwtRefused(TenantError):
    """401/40101 with :data:`JWT_REFUSED` as its message; ``reason`` (for the log and tests only) says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(401, UNAUTHENTICATED, JWT_REFUSED)
        self.reason = reason


def _jwt_refused(reason: str) -> JwtRefused:
    log.info("authentication failed: %s", reason)
    return JwtRefused(reason)


# ---------------------------------------------------------------------------------------------------------
# JWT verification
# ---------------------------------------------------------------------------------------------------------
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")

_SIGNATURE_INVALID = "JWT signature is invalid"
_ALGORITHM_REFUSED = "JWT algorithm is not accepted for this issuer"
# (exception, message, rank): when several keys of one issuer were tried, the lowest rank is reported;
# rank 0 means a key verified the signature and a claim was wrong, which is the useful answer.
_JWT_ERRORS: list[tuple[type[Exception], str, int]] = [
    (jwt.ExpiredSignatureError, "JWT has expired", 0),
    (jwt.ImmatureSignatureError, "JWT is not valid yet (nbf/iat in the future)", 0),
    (jwt.InvalidAudienceError, "JWT audience is not accepted", 0),
    (jwt.InvalidIssuerError, "JWT issuer is not trusted", 0),
    (jwt.MissingRequiredClaimError, "JWT is missing a required claim (exp, iss, aud and the tenant claim)", 0),
    (jwt.InvalidSignatureError, _SIGNATURE_INVALID, 1),
    (jwt.InvalidAlgorithmError, _ALGORITHM_REFUSED, 2),
    (jwt.InvalidKeyError, _ALGORITHM_REFUSED, 2),
    (jwt.DecodeError, "malformed JWT", 3),
]


def _jwt_error(exc: Exception) -> tuple[int, str]:
    for cls, message, rank in _JWT_ERRORS:
        if isinstance(exc, cls):
            return rank, message
    return 3, "invalid JWT"


# ---------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------
def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lname = name.lower()
    for key, val in headers.items():
        if key.lower() == lname:
            return val
    return None


def hash_api_key(key: str) -> str:
    """The ``sha256:<hex>`` form of an API key, as stored in the tenants file."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


class TenantRegistry:
    """All tenants, and authentication of requests to one of them."""

    def __init__(
        self,
        tenants: Mapping[str, Tenant],
        *,
        auth_required: bool = True,
        api_keys: Iterable[tuple[str, str]] = (),
        jwt_issuers: Iterable[JwtIssuer] = (),
        jwt_leeway: float = 10.0,
        source: str | None = None,
    ) -> None:
        """``api_keys`` are ``(sha256:<hex>, tenant id)`` pairs."""
        self.tenants: dict[str, Tenant] = dict(tenants)
        self.auth_required = auth_required
        self.source = source
        self._api_keys: list[tuple[bytes, str]] = []
        for stored, tenant_id in api_keys:
            self._api_keys.append((bytes.fromhex(stored.removeprefix("sha256:")), tenant_id))
        self._jwt_by_issuer: dict[str, list[JwtIssuer]] = {}
        for issuer in jwt_issuers:
            self._jwt_by_issuer.setdefault(issuer.issuer, []).append(issuer)
        self._jwt_leeway = jwt_leeway
        if not auth_required and len(self.tenants) != 1:
            raise ValueError("a registry without authentication has exactly one tenant")

    def __repr__(self) -> str:
        return f"TenantRegistry(tenants={sorted(self.tenants)}, auth_required={self.auth_required})"

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def single_default(
        cls, *, bootstrap: str, connection: ConnectionConfig, clock: Callable[[], float] = time.monotonic,
        denied_topics: TopicDenyList = DEFAULT_DENY_LIST, default_quotas: Quotas | None = None,
    ) -> TenantRegistry:
        """One tenant ``default`` without authentication or patterns (the operator's deny-list of internal
        topics still applies), with ``default_quotas`` (the gateway's default limits). Logs one warning."""
        log.warning(
            "GATEWAY_TENANTS_FILE is not set: every request is served as tenant %r WITHOUT authentication, "
            "with full access to the Kafka cluster at %s. Set GATEWAY_TENANTS_FILE to require API keys or "
            "JWTs (see docs/tenants.md).",
            DEFAULT_TENANT_ID, bootstrap,
        )
        tenant = Tenant(DEFAULT_TENANT_ID, bootstrap, connection, default_quotas or Quotas(),
                        denied_topics=denied_topics, clock=clock)
        return cls({DEFAULT_TENANT_ID: tenant}, auth_required=False)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        default_bootstrap: str,
        default_connection: ConnectionConfig,
        clock: Callable[[], float] = time.monotonic,
        denied_topics: TopicDenyList = DEFAULT_DENY_LIST,
        default_quotas: Quotas | None = None,
    ) -> TenantRegistry:
        """Load and validate a tenants file; raises :class:`TenantConfigError` naming the file and field.
        ``denied_topics`` (the operator's deny-list) is checked before every tenant's own topic patterns;
        ``default_quotas`` (the gateway's settings) apply where the file sets no quota."""
        loaded = _load(Path(path), default_bootstrap, default_connection, clock, denied_topics, default_quotas)
        return cls(loaded.tenants, auth_required=True, api_keys=loaded.api_keys, jwt_issuers=loaded.jwt_issuers,
                   jwt_leeway=loaded.jwt_leeway, source=loaded.source)

    # -- lookup -----------------------------------------------------------------------------------------
    def get(self, tenant_id: str) -> Tenant:
        """The tenant with this id; ``KeyError`` when there is none."""
        return self.tenants[tenant_id]

    def __contains__(self, tenant_id: object) -> bool:
        return tenant_id in self.tenants

    # -- authentication -----------------------------------------------------------------------------------
    def authenticate(self, headers: Mapping[str, str]) -> Tenant:
        """The tenant the request's credentials belong to, or 401/40101.

        ``Authorization: Bearer <token>``: a token shaped like a JWT (three base64url parts separated by
        dots) is verified as a JWT, anything else is an API key. ``X-API-Key: <key>``: an API key.
        Sending a bearer token and X-API-Key together is refused; an Authorization header with another
        scheme is ignored when X-API-Key is present (a proxy in front may have added it).
        """
        if not self.auth_required:
            return next(iter(self.tenants.values()))
        authorization = _header(headers, "authorization")
        api_key = _header(headers, "x-api-key")
        if authorization is not None:
            scheme, _, credential = authorization.strip().partition(" ")
            if scheme.lower() == "bearer":
                if api_key is not None:
                    raise _unauthenticated("send either 'Authorization: Bearer' or 'X-API-Key', not both")
                credential = credential.strip()
                if not credential:
                    raise _unauthenticated("the bearer token is empty")
                if _JWT_SHAPE.fullmatch(credential):
                    return self._authenticate_jwt(credential)
                return self._authenticate_api_key(credential)
            if api_key is None:
                raise _unauthenticated(
                    "unsupported Authorization scheme: use 'Authorization: Bearer <API key or JWT>' or 'X-API-Key'"
                )
        if api_key is not None:
            return self._authenticate_api_key(api_key.strip())
        raise _unauthenticated(
            "authentication required: send 'Authorization: Bearer <API key or JWT>' or 'X-API-Key: <API key>'"
        )

    def _authenticate_api_key(self, key: str) -> Tenant:
        if not key:
            raise _unauthenticated("the API key is empty")
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found: str | None = None
        for stored, tenant_id in self._api_keys:  # compare with every key: no early exit
            if hmac.compare_digest(stored, digest) and found is None:
                found = tenant_id
        if found is None or found not in self.tenants:
            log.debug("authentication failed: unknown API key")
            raise _unauthenticated("invalid API key")
        return self.tenants[found]

    def _authenticate_jwt(self, token: str) -> Tenant:
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise _jwt_refused(f"malformed JWT ({type(exc).__name__})") from None
        issuer = claims.get("iss")
        if not isinstance(issuer, str):
            raise _jwt_refused("JWT has no 'iss' claim")
        candidates = self._jwt_by_issuer.get(issuer)
        if not candidates:
            raise _jwt_refused("JWT issuer is not trusted")
        failures: list[tuple[int, str]] = []
        for cfg in candidates:
            tenant_id = claims.get(cfg.tenant_claim)
            if not isinstance(tenant_id, str) or tenant_id not in cfg.tenant_ids or tenant_id not in self.tenants:
                continue
            if header.get("alg") not in cfg.algorithms:
                failures.append((2, _ALGORITHM_REFUSED))
                continue
            try:
                verified = jwt.decode(
                    token, cfg.key, algorithms=list(cfg.algorithms), audience=list(cfg.audience),
                    issuer=cfg.issuer, leeway=self._jwt_leeway,
                    options={"require": ["exp", "iss", "aud", cfg.tenant_claim]},
                )
            except jwt.PyJWTError as exc:
                failures.append(_jwt_error(exc))
                continue
            if verified.get(cfg.tenant_claim) == tenant_id:
                return self.tenants[tenant_id]
        if not failures:
            claim_names = sorted({c.tenant_claim for c in candidates})
            raise _jwt_refused(
                f"JWT claim {' / '.join(repr(c) for c in claim_names)} does not name a tenant that accepts this issuer"
            )
        raise _jwt_refused(min(failures)[1])

