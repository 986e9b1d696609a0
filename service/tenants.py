"""Tenants: who may call the gateway, with which Kafka connection, on which topics and groups, how often.

Tenants come from a YAML file (``GATEWAY_TENANTS_FILE``, format in ``docs/tenants.md``) validated with
pydantic models. Each tenant has credentials (API keys stored as SHA-256 hashes and/or trusted JWT
issuers), its own Kafka connection settings (bootstrap, SASL, TLS; secrets read from environment
variables or files, never inline), allowed topic and group patterns and quotas (instances, concurrent
polls, a requests-per-second token bucket).

Without a tenants file, :meth:`TenantRegistry.single_default` serves everything as tenant ``default``
without authentication (and says so once, loudly).

Secrets (API keys, JWTs, HMAC secrets, SASL and TLS key passwords) never appear in ``repr``/``str`` of
these objects, in exceptions or in log records. This module has no HTTP framework imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import hmac
import logging
import math
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jwt
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.client.connection import ConnectionConfig, SaslConfig

log = logging.getLogger(__name__)

DEFAULT_TENANT_ID = "default"

# Error codes (HTTP status * 100 + n), Confluent REST Proxy style.
UNAUTHENTICATED = 40101
FORBIDDEN = 40301
RATE_LIMITED = 42901


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------
class TenantError(Exception):
    """A request-level refusal: 401/40101 unauthenticated, 403/40301 forbidden, 429/42901 rate limited.

    ``message`` is safe to return to the client: it never contains a credential. ``retry_after`` (whole
    seconds) is set for 429s and belongs in a ``Retry-After`` header; :attr:`headers` has the headers
    the response should carry.
    """

    def __init__(self, status: int, error_code: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        if self.status == 401:
            return {"WWW-Authenticate": 'Bearer realm="kafka-consumer-gateway"'}
        if self.retry_after is not None:
            return {"Retry-After": str(self.retry_after)}
        return {}

    def __repr__(self) -> str:
        return f"TenantError({self.status}, {self.error_code}, {self.message!r})"


def _unauthenticated(message: str) -> TenantError:
    return TenantError(401, UNAUTHENTICATED, message)


class TenantConfigError(ValueError):
    """The tenants file is missing, unreadable or invalid (raised at startup)."""


# ---------------------------------------------------------------------------------------------------------
# Quotas, patterns, tenants
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quotas:
    """Per-tenant limits; ``None`` means unlimited. ``burst`` (token-bucket size) defaults to
    ``ceil(requests_per_second)``."""

    max_instances: int | None = None
    max_concurrent_polls: int | None = None
    requests_per_second: float | None = None
    burst: int | None = None


_REGEX_PREFIX = "re:"


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``re:<regex>`` is a Python regular expression that must match the whole name; anything else is a
    case-sensitive shell-style glob (``*``, ``?``, ``[seq]``, ``[!seq]``; ``*`` also matches dots)."""
    if pattern.startswith(_REGEX_PREFIX):
        return re.compile(pattern[len(_REGEX_PREFIX):])
    return re.compile(fnmatch.translate(pattern))


class _Patterns:
    def __init__(self, patterns: Sequence[str] | None) -> None:
        self.patterns = None if patterns is None else tuple(patterns)
        self._compiled = None if patterns is None else [compile_pattern(p) for p in patterns]

    def matches(self, name: str) -> bool:
        if self._compiled is None:
            return True
        return any(rx.fullmatch(name) for rx in self._compiled)


class Tenant:
    """One tenant: its Kafka connection, what it may touch and its quotas. Holds runtime quota state (the
    token bucket and the number of polls in flight)."""

    def __init__(
        self,
        id: str,
        bootstrap: str,
        connection_config: ConnectionConfig,
        quotas: Quotas | None = None,
        *,
        topics: Sequence[str] | None = None,
        groups: Sequence[str] | None = None,
        description: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.id = id
        self.bootstrap = bootstrap
        self.connection_config = connection_config
        self.quotas = quotas or Quotas()
        self.description = description
        self._topics = _Patterns(topics)
        self._groups = _Patterns(groups)
        self._clock = clock
        rps = self.quotas.requests_per_second
        self._bucket_size = float(self.quotas.burst or (max(1, math.ceil(rps)) if rps else 1))
        self._tokens = self._bucket_size
        self._refilled = clock()
        self._bucket_lock = threading.Lock()
        self._active_polls = 0

    def __repr__(self) -> str:
        return f"Tenant(id={self.id!r}, bootstrap={self.bootstrap!r}, quotas={self.quotas!r})"

    __str__ = __repr__

    # -- patterns ---------------------------------------------------------------------------------------
    @property
    def topic_patterns(self) -> tuple[str, ...] | None:
        """The configured topic patterns; ``None`` when every topic is allowed."""
        return self._topics.patterns

    @property
    def group_patterns(self) -> tuple[str, ...] | None:
        return self._groups.patterns

    def allows_topic(self, topic: str) -> bool:
        return self._topics.matches(topic)

    def allows_group(self, group: str) -> bool:
        return self._groups.matches(group)

    def require_topic(self, topic: str) -> None:
        """Raise 403/40301 unless the topic matches one of the tenant's topic patterns."""
        if not self.allows_topic(topic):
            raise TenantError(403, FORBIDDEN, f"topic {topic!r} is not allowed for tenant {self.id!r}")

    def require_group(self, group: str) -> None:
        if not self.allows_group(group):
            raise TenantError(403, FORBIDDEN, f"consumer group {group!r} is not allowed for tenant {self.id!r}")

    # -- quotas ---------------------------------------------------------------------------------------
    def check_rate(self) -> None:
        """Take one token from the tenant's bucket (``requests_per_second`` refill, ``burst`` size) or
        raise 429/42901 with ``retry_after`` = whole seconds until a token is available."""
        rate = self.quotas.requests_per_second
        if rate is None:
            return
        with self._bucket_lock:
            now = self._clock()
            elapsed = max(0.0, now - self._refilled)
            self._refilled = now
            self._tokens = min(self._bucket_size, self._tokens + elapsed * rate)
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            wait = (1.0 - self._tokens) / rate
        raise TenantError(
            429, RATE_LIMITED,
            f"tenant {self.id!r} exceeded its rate limit of {rate:g} requests per second",
            retry_after=max(1, math.ceil(wait)),
        )

    def check_instance_quota(self, current: int) -> None:
        """Raise 429/42901 when a tenant that already has ``current`` consumer instances may not create
        another one."""
        limit = self.quotas.max_instances
        if limit is not None and current >= limit:
            raise TenantError(
                429, RATE_LIMITED,
                f"tenant {self.id!r} already has {current} consumer instances (limit {limit})",
                retry_after=1,
            )

    @property
    def active_polls(self) -> int:
        return self._active_polls

    def poll_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one of the tenant's ``max_concurrent_polls`` slots for the duration of a poll; when all
        are taken, entering raises 429/42901 at once (no queueing)."""
        return self._poll_slot()

    @contextlib.asynccontextmanager
    async def _poll_slot(self) -> AsyncIterator[None]:
        limit = self.quotas.max_concurrent_polls
        if limit is not None and self._active_polls >= limit:
            raise TenantError(
                429, RATE_LIMITED,
                f"tenant {self.id!r} has too many concurrent polls (limit {limit})",
                retry_after=1,
            )
        self._active_polls += 1
        try:
            yield
        finally:
            self._active_polls -= 1


# ---------------------------------------------------------------------------------------------------------
# JWT issuers
# ---------------------------------------------------------------------------------------------------------
_HMAC_ALGS = {"HS256": 32, "HS384": 48, "HS512": 64}  # minimum secret length (RFC 7518 §3.2)
_RSA_ALGS = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
_EC_ALGS = {"ES256", "ES384", "ES512"}
JwtAlgorithm = Literal["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                       "ES256", "ES384", "ES512"]


@dataclass(frozen=True, eq=False)
class JwtIssuer:
    """A trusted token issuer with its verification key, accepted by ``tenant_ids``."""

    issuer: str
    audience: tuple[str, ...]
    algorithms: tuple[str, ...]
    tenant_claim: str
    tenant_ids: frozenset[str]
    key: Any = field(repr=False)  # HMAC secret (bytes) or a cryptography public key


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
        cls, *, bootstrap: str, connection: ConnectionConfig, clock: Callable[[], float] = time.monotonic
    ) -> TenantRegistry:
        """One tenant ``default`` without authentication, limits or patterns. Logs one warning."""
        log.warning(
            "GATEWAY_TENANTS_FILE is not set: every request is served as tenant %r WITHOUT authentication, "
            "with full access to the Kafka cluster at %s. Set GATEWAY_TENANTS_FILE to require API keys or "
            "JWTs (see docs/tenants.md).",
            DEFAULT_TENANT_ID, bootstrap,
        )
        tenant = Tenant(DEFAULT_TENANT_ID, bootstrap, connection, Quotas(), clock=clock)
        return cls({DEFAULT_TENANT_ID: tenant}, auth_required=False)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        default_bootstrap: str,
        default_connection: ConnectionConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> TenantRegistry:
        """Load and validate a tenants file; raises :class:`TenantConfigError` naming the file and field."""
        return _load(Path(path), default_bootstrap, default_connection, clock)

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
            log.debug("authentication failed: malformed JWT (%s)", type(exc).__name__)
            raise _unauthenticated("malformed JWT") from None
        issuer = claims.get("iss")
        if not isinstance(issuer, str):
            raise _unauthenticated("JWT has no 'iss' claim")
        candidates = self._jwt_by_issuer.get(issuer)
        if not candidates:
            log.debug("authentication failed: JWT from an untrusted issuer")
            raise _unauthenticated("JWT issuer is not trusted")
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
            log.debug("authentication failed: JWT names no tenant that accepts its issuer")
            claim_names = sorted({c.tenant_claim for c in candidates})
            raise _unauthenticated(
                f"JWT claim {' / '.join(repr(c) for c in claim_names)} does not name a tenant that accepts this issuer"
            )
        message = min(failures)[1]
        log.debug("authentication failed: %s", message)
        raise _unauthenticated(message)


# ---------------------------------------------------------------------------------------------------------
# The tenants file
# ---------------------------------------------------------------------------------------------------------
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _one_of(model: BaseModel, *names: str, required: bool) -> None:
    given = [n for n in names if getattr(model, n) is not None]
    if len(given) > 1:
        raise ValueError(f"give only one of {', '.join(names)}")
    if required and not given:
        raise ValueError(f"one of {', '.join(names)} is required")


class SaslModel(_Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str = Field(min_length=1)
    password_env: str | None = Field(None, pattern=_ENV_NAME)
    password_file: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _check(self) -> SaslModel:
        _one_of(self, "password_env", "password_file", required=True)
        return self


class TlsModel(_Model):
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    key_password_env: str | None = Field(None, pattern=_ENV_NAME)
    key_password_file: str | None = None
    check_hostname: bool = True
    server_hostname: str | None = None

    @model_validator(mode="after")
    def _check(self) -> TlsModel:
        _one_of(self, "key_password_env", "key_password_file", required=False)
        if self.keyfile and not self.certfile:
            raise ValueError("keyfile needs certfile")
        return self


class KafkaModel(_Model):
    bootstrap: str | None = Field(None, min_length=1)
    client_id: str | None = Field(None, min_length=1)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    sasl: SaslModel | None = None
    tls: TlsModel | None = None

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, value: str | None) -> str | None:
        if value is not None:
            from service.client.client import parse_bootstrap

            parse_bootstrap(value)
        return value

    @model_validator(mode="after")
    def _check(self) -> KafkaModel:
        proto = self.security_protocol
        if proto is None:
            return self
        if proto.startswith("SASL") and self.sasl is None:
            raise ValueError(f"security_protocol {proto} needs a sasl section")
        if not proto.startswith("SASL") and self.sasl is not None:
            raise ValueError(f"a sasl section needs security_protocol SASL_PLAINTEXT or SASL_SSL, not {proto}")
        if not proto.endswith("SSL") and self.tls is not None:
            raise ValueError(f"a tls section needs security_protocol SSL or SASL_SSL, not {proto}")
        return self

    def effective_protocol(self) -> str:
        if self.security_protocol:
            return self.security_protocol
        if self.sasl is not None:
            return "SASL_SSL" if self.tls is not None else "SASL_PLAINTEXT"
        return "SSL" if self.tls is not None else "PLAINTEXT"


class QuotasModel(_Model):
    max_instances: int | None = Field(None, ge=1)
    max_concurrent_polls: int | None = Field(None, ge=1)
    requests_per_second: float | None = Field(None, gt=0)
    burst: int | None = Field(None, ge=1)


class JwtIssuerModel(_Model):
    issuer: str = Field(min_length=1)
    audience: str | list[str]
    algorithms: list[JwtAlgorithm] = Field(min_length=1)
    secret_env: str | None = Field(None, pattern=_ENV_NAME)
    secret_file: str | None = Field(None, min_length=1)
    public_key: str | None = Field(None, min_length=1)
    public_key_file: str | None = Field(None, min_length=1)
    tenant_claim: str | None = Field(None, min_length=1)

    @field_validator("audience")
    @classmethod
    def _audience(cls, value: str | list[str]) -> str | list[str]:
        values = [value] if isinstance(value, str) else value
        if not values or not all(values):
            raise ValueError("audience must be a non-empty string or list of non-empty strings")
        return value

    @model_validator(mode="after")
    def _check(self) -> JwtIssuerModel:
        hmac_algs = [a for a in self.algorithms if a in _HMAC_ALGS]
        if hmac_algs and len(hmac_algs) != len(self.algorithms):
            raise ValueError("do not mix HMAC (HS*) and public-key algorithms in one issuer entry")
        if hmac_algs:
            _one_of(self, "secret_env", "secret_file", required=True)
            if self.public_key or self.public_key_file:
                raise ValueError("HS* algorithms verify with secret_env/secret_file, not a public key")
        else:
            _one_of(self, "public_key", "public_key_file", required=True)
            if self.secret_env or self.secret_file:
                raise ValueError("RS*/PS*/ES* algorithms verify with public_key/public_key_file, not a secret")
            families = {"EC" if a in _EC_ALGS else "RSA" for a in self.algorithms}
            if len(families) > 1:
                raise ValueError("do not mix RSA (RS*/PS*) and EC (ES*) algorithms in one issuer entry")
        return self


class JwtModel(_Model):
    tenant_claim: str = Field("tenant", min_length=1)
    leeway_seconds: float = Field(10.0, ge=0, le=300)
    issuers: list[JwtIssuerModel] = []


class TenantJwtModel(_Model):
    issuers: list[JwtIssuerModel]


class ApiKeyModel(_Model):
    hash: str = Field(pattern=r"^sha256:[0-9a-fA-F]{64}$")
    name: str | None = None


def _check_patterns(values: list[str] | None) -> list[str] | None:
    for pattern in values or ():
        if not pattern:
            raise ValueError("empty pattern")
        try:
            compile_pattern(pattern)
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
    return values


class TenantModel(_Model):
    id: str = Field(pattern=_ID_PATTERN)
    description: str | None = None
    api_keys: list[ApiKeyModel] = []
    jwt: TenantJwtModel | None = None
    kafka: KafkaModel | None = None
    topics: list[str] | None = None
    groups: list[str] | None = None
    quotas: QuotasModel = QuotasModel()

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"hash": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("topics", "groups")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        return _check_patterns(value)


class DefaultsModel(_Model):
    quotas: QuotasModel = QuotasModel()


class TenantsFileModel(_Model):
    version: Literal[1] = 1
    defaults: DefaultsModel = DefaultsModel()
    jwt: JwtModel = JwtModel()
    tenants: list[TenantModel] = Field(min_length=1)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys in a mapping (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _format_loc(loc: Sequence[int | str], raw: Any) -> str:
    """``tenants[1] (id 'b').kafka.sasl.mechanism`` from pydantic's location tuple."""
    out = ""
    node = raw
    for depth, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            if depth == 1 and loc[0] == "tenants" and isinstance(node, dict) and isinstance(node.get("id"), str):
                out += f" (id {node['id']!r})"
        else:
            out += ("." if out else "") + part
            node = node.get(part) if isinstance(node, dict) else None
    return out or "(top level)"


def _describe_validation_error(exc: ValidationError, raw: Any) -> list[str]:
    """Error lines with the field path and pydantic's message — never the offending input value, which
    could be a secret someone pasted inline."""
    lines = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = [p for p in err["loc"] if p not in ("str", "list[str]")]
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        lines.append(f"{_format_loc(loc, raw)}: {msg}")
    return lines


def _load(path: Path, default_bootstrap: str, default_connection: ConnectionConfig,
          clock: Callable[[], float]) -> TenantRegistry:
    where = f"tenants file {path}"
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise TenantConfigError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or type(exc).__name__
        pos = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise TenantConfigError(f"{where} is not valid YAML{pos}: {problem}") from None
    if not isinstance(raw, dict):
        raise TenantConfigError(f"{where} must be a YAML mapping with a 'tenants' list")
    try:
        model = TenantsFileModel.model_validate(raw)
    except ValidationError as exc:
        lines = _describe_validation_error(exc, raw)
        raise TenantConfigError(f"{where} is invalid:\n  " + "\n  ".join(lines)) from None

    base = path.parent
    seen_ids: set[str] = set()
    for t in model.tenants:
        if t.id in seen_ids:
            raise TenantConfigError(f"{where}: duplicate tenant id {t.id!r}")
        seen_ids.add(t.id)
    key_owner: dict[str, str] = {}
    api_keys: list[tuple[str, str]] = []
    for t in model.tenants:
        for k in t.api_keys:
            digest = k.hash.lower()
            if digest in key_owner:
                other = key_owner[digest]
                raise TenantConfigError(
                    f"{where}: the same API key hash is listed "
                    + (f"twice for tenant {t.id!r}" if other == t.id else f"for tenants {other!r} and {t.id!r}")
                )
            key_owner[digest] = t.id
            api_keys.append((digest, t.id))

    tenants: dict[str, Tenant] = {}
    for t in model.tenants:
        what = f"{where}: tenant {t.id!r}"
        bootstrap, connection = _tenant_connection(t.kafka, default_bootstrap, default_connection, base, what)
        tenants[t.id] = Tenant(
            t.id, bootstrap, connection, _merge_quotas(model.defaults.quotas, t.quotas),
            topics=t.topics, groups=t.groups, description=t.description, clock=clock,
        )

    issuers: list[JwtIssuer] = []
    global_users = frozenset(t.id for t in model.tenants if t.jwt is None)
    for i, m in enumerate(model.jwt.issuers):
        if global_users:
            issuers.append(_issuer(m, model.jwt, global_users, base, f"{where}: jwt.issuers[{i}]"))
    for t in model.tenants:
        for i, m in enumerate(t.jwt.issuers if t.jwt else ()):
            issuers.append(_issuer(m, model.jwt, frozenset({t.id}), base, f"{where}: tenant {t.id!r} jwt.issuers[{i}]"))

    jwt_tenants = {tid for iss in issuers for tid in iss.tenant_ids}
    for tid in tenants:
        if tid not in key_owner.values() and tid not in jwt_tenants:
            log.warning("%s: tenant %r has no API keys and accepts no JWT issuer; nobody can authenticate as it",
                        where, tid)
    log.info("loaded %d tenant(s) from %s: %s", len(tenants), path, ", ".join(tenants))
    return TenantRegistry(tenants, auth_required=True, api_keys=api_keys, jwt_issuers=issuers,
                          jwt_leeway=model.jwt.leeway_seconds, source=str(path))


def _merge_quotas(defaults: QuotasModel, own: QuotasModel) -> Quotas:
    values = {
        name: getattr(own, name) if name in own.model_fields_set else getattr(defaults, name)
        for name in QuotasModel.model_fields
    }
    return Quotas(**values)


def _resolve(base: Path, file: str | None) -> str | None:
    if file is None:
        return None
    p = Path(file).expanduser()
    return str(p if p.is_absolute() else base / p)


def _read_secret(env: str | None, file: str | None, base: Path, what: str) -> str:
    if env is not None:
        value = os.environ.get(env)
        if not value:
            raise TenantConfigError(f"{what}: environment variable {env} is not set or empty")
        return value
    assert file is not None
    path = _resolve(base, file)
    try:
        value = Path(path).read_text("utf-8").rstrip("\r\n")  # type: ignore[arg-type]
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise TenantConfigError(f"{what}: cannot read secret file {path}: {reason}") from None
    if not value:
        raise TenantConfigError(f"{what}: secret file {path} is empty")
    return value


def _tenant_connection(kafka: KafkaModel | None, default_bootstrap: str, default: ConnectionConfig,
                       base: Path, what: str) -> tuple[str, ConnectionConfig]:
    if kafka is None:
        return default_bootstrap, default
    bootstrap = kafka.bootstrap or default_bootstrap
    client_id = kafka.client_id or default.client_id
    own_security = (kafka.bootstrap is not None or kafka.security_protocol is not None
                    or kafka.sasl is not None or kafka.tls is not None)
    if not own_security:
        return bootstrap, dataclasses.replace(default, client_id=client_id)
    protocol = kafka.effective_protocol()
    ssl_context = None
    server_hostname = None
    if protocol in ("SSL", "SASL_SSL"):
        from service.settings import build_ssl_context

        tls = kafka.tls or TlsModel()
        key_password = None
        if tls.key_password_env or tls.key_password_file:
            key_password = _read_secret(tls.key_password_env, tls.key_password_file, base,
                                        f"{what} kafka.tls key password")
        try:
            ssl_context = build_ssl_context(_resolve(base, tls.cafile), _resolve(base, tls.certfile),
                                            _resolve(base, tls.keyfile), key_password, tls.check_hostname)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise TenantConfigError(f"{what}: cannot set up TLS (kafka.tls): {reason}") from None
        server_hostname = tls.server_hostname
    sasl = None
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        assert kafka.sasl is not None
        password = _read_secret(kafka.sasl.password_env, kafka.sasl.password_file, base,
                                f"{what} kafka.sasl password")
        sasl = SaslConfig(kafka.sasl.mechanism, kafka.sasl.username, password)
    return bootstrap, dataclasses.replace(default, client_id=client_id, ssl_context=ssl_context,
                                          ssl_server_hostname=server_hostname, sasl=sasl)


def _issuer(m: JwtIssuerModel, defaults: JwtModel, tenant_ids: frozenset[str], base: Path,
            what: str) -> JwtIssuer:
    key: Any
    if m.algorithms[0] in _HMAC_ALGS:
        secret = _read_secret(m.secret_env, m.secret_file, base, f"{what} secret").encode("utf-8")
        needed = max(_HMAC_ALGS[a] for a in m.algorithms)
        if len(secret) < needed:
            raise TenantConfigError(
                f"{what}: the HMAC secret is shorter than {needed} bytes, too short for {', '.join(m.algorithms)}"
            )
        key = secret
    else:
        if m.public_key is not None:
            pem = m.public_key.encode()
        else:
            path = _resolve(base, m.public_key_file)
            try:
                pem = Path(path).read_bytes()  # type: ignore[arg-type]
            except OSError as exc:
                raise TenantConfigError(f"{what}: cannot read public key file {path}: {exc.strerror}") from None
        try:
            key = serialization.load_pem_public_key(pem)
        except (ValueError, TypeError) as exc:
            raise TenantConfigError(f"{what}: the public key is not a PEM public key ({type(exc).__name__})") from None
        want = ec.EllipticCurvePublicKey if m.algorithms[0] in _EC_ALGS else rsa.RSAPublicKey
        if not isinstance(key, want):
            raise TenantConfigError(f"{what}: the public key does not fit {', '.join(m.algorithms)}")
    audience = (m.audience,) if isinstance(m.audience, str) else tuple(m.audience)
    return JwtIssuer(m.issuer, audience, tuple(m.algorithms), m.tenant_claim or defaults.tenant_claim,
                     tenant_ids, key)
