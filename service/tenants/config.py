"""The tenants file: YAML loading (duplicate keys refused), pydantic validation with error messages that
name the field but never the value, and construction of what it configures: the tenants (quotas merged with
the defaults, each tenant's Kafka connection with its SASL/TLS secrets) and the trusted JWT issuers with
their verification keys."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.client.client import parse_bootstrap
from service.client.connection import ConnectionConfig, SaslConfig
from service.lib.tls import build_ssl_context
from service.schemas.registry import RegistryConfig

from .errors import TenantConfigError
from .patterns import DEFAULT_DENY_LIST, PatternError, TopicDenyList, compile_pattern
from .quotas import Quotas
from .tenant import Tenant

log = logging.getLogger(__package__)  # "service.tenants", the logger of the module before the split


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


# ---------------------------------------------------------------------------------------------------------
# The tenants file
# ---------------------------------------------------------------------------------------------------------
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_CONFIG_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,254}")


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


class SchemaRegistryModel(_Model):
    """A tenant's own Schema Registry; unset: the gateway-wide GATEWAY_SCHEMA_REGISTRY_URL."""

    url: str = Field(min_length=1, pattern=r"^https?://")
    basic_auth_env: str | None = Field(None, pattern=_ENV_NAME)  # "user:password"
    basic_auth_file: str | None = Field(None, min_length=1)
    bearer_token_env: str | None = Field(None, pattern=_ENV_NAME)
    bearer_token_file: str | None = Field(None, min_length=1)
    ca_file: str | None = Field(None, min_length=1)
    tls_verify: bool = True
    timeout_s: float = Field(5.0, gt=0, le=300)
    cache_size: int = Field(1000, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SchemaRegistryModel:
        given = [n for n in ("basic_auth_env", "basic_auth_file", "bearer_token_env", "bearer_token_file")
                 if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"at most one of basic_auth_env, basic_auth_file, bearer_token_env, bearer_token_file "
                             f"(got {', '.join(given)})")
        return self


class QuotasModel(_Model):
    """A quotas section: a key left out inherits (tenant → file ``defaults`` → the gateway's
    ``GATEWAY_DEFAULT_*`` settings); an explicit ``null`` means unlimited."""

    max_instances: int | None = Field(None, ge=1)
    max_concurrent_polls: int | None = Field(None, ge=1)
    requests_per_second: float | None = Field(None, gt=0)
    burst: int | None = Field(None, ge=1)
    max_streams: int | None = Field(None, ge=1)
    max_range_reads: int | None = Field(None, ge=1)
    max_topics_per_subscription: int | None = Field(None, ge=1)


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
        except PatternError as exc:
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
    schema_registry: SchemaRegistryModel | None = None
    #: topics the tenant may create, delete and alter (v3, and produce's auto-creation); unset: none
    admin_topics: list[str] | None = None
    #: the topic configs it may set on create (names; "*": any); unset: GATEWAY_TOPIC_CONFIGS_ALLOWED
    admin_topic_configs: list[str] | None = None
    #: schema subjects of its own besides <topic>-<suffix> of its topics; unset: "<id>.*" with the shared
    #: registry, every subject with a registry of its own
    subjects: list[str] | None = None

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"hash": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("topics", "groups", "admin_topics", "subjects")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        return _check_patterns(value)

    @field_validator("admin_topic_configs")
    @classmethod
    def _config_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            if name != "*" and not _CONFIG_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a topic config name (lower-case words separated by '.', or '*')")
        return value


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


@dataclass(frozen=True)
class _LoadedTenants:
    """What a valid tenants file configures: the arguments of :class:`~service.tenants.auth.TenantRegistry`."""

    tenants: dict[str, Tenant]
    api_keys: list[tuple[str, str]]  # (sha256:<hex>, tenant id)
    jwt_issuers: list[JwtIssuer]
    jwt_leeway: float
    source: str


def _load(path: Path, default_bootstrap: str, default_connection: ConnectionConfig,
          clock: Callable[[], float], denied_topics: TopicDenyList = DEFAULT_DENY_LIST,
          default_quotas: Quotas | None = None) -> _LoadedTenants:
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
            t.id, bootstrap, connection, _merge_quotas(model.defaults.quotas, t.quotas, default_quotas),
            topics=t.topics, groups=t.groups, description=t.description, denied_topics=denied_topics, clock=clock,
            schema_registry=_registry(t.schema_registry, base, f"{what} schema_registry"),
            admin_topics=t.admin_topics or (), admin_topic_configs=t.admin_topic_configs,
            subjects=default_subjects(t.id, t.subjects, own_registry=t.schema_registry is not None),
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
    return _LoadedTenants(tenants, api_keys, issuers, model.jwt.leeway_seconds, str(path))


def default_subjects(tenant_id: str, subjects: Sequence[str] | None, *, own_registry: bool) -> tuple[str, ...] | None:
    """A tenant's ``subjects`` patterns: the file's, else ``<id>.*`` (record names in the tenant's namespace)
    when it uses the gateway-wide registry, else ``None`` (a registry of its own: every subject). Subjects
    ``<topic>-<suffix>`` of the tenant's topics are its own besides these (see ``Tenant.allows_subject``)."""
    if subjects is not None:
        return tuple(subjects)
    return None if own_registry else (f"{tenant_id}.*",)


def _merge_quotas(defaults: QuotasModel, own: QuotasModel, gateway: Quotas | None = None) -> Quotas:
    """A tenant's quotas: each key from the most specific level that sets it (the tenant, the file's
    ``defaults``, the gateway's ``GATEWAY_DEFAULT_*`` settings); an explicit ``null`` is unlimited. The
    gateway's default ``burst`` goes with its default rate: a file that sets ``requests_per_second`` but no
    ``burst`` gets ``ceil(requests_per_second)``."""
    base = gateway or Quotas()
    values: dict[str, object] = {}
    for name in QuotasModel.model_fields:
        for level in (own, defaults):
            if name in level.model_fields_set:
                values[name] = getattr(level, name)
                break
        else:
            values[name] = getattr(base, name)
    if not any("burst" in m.model_fields_set for m in (own, defaults)) and \
            any("requests_per_second" in m.model_fields_set for m in (own, defaults)):
        values["burst"] = None
    return Quotas(**values)  # type: ignore[arg-type]


def _registry(m: SchemaRegistryModel | None, base: Path, what: str) -> RegistryConfig | None:
    if m is None:
        return None
    basic = bearer = None
    if m.basic_auth_env or m.basic_auth_file:
        basic = _read_secret(m.basic_auth_env, m.basic_auth_file, base, what + " basic auth")
    if m.bearer_token_env or m.bearer_token_file:
        bearer = _read_secret(m.bearer_token_env, m.bearer_token_file, base, what + " bearer token")
    try:
        return RegistryConfig(m.url, basic_auth=basic, bearer_token=bearer, ca_file=_resolve(base, m.ca_file),
                              verify=m.tls_verify, timeout_s=m.timeout_s, cache_size=m.cache_size)
    except ValueError as exc:
        raise TenantConfigError(f"{what}: {exc}") from None


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
