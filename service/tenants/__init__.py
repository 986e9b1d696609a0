"""Tenants: who may call the gateway, with which Kafka connection, on which topics and groups, how often.

Tenants come from a YAML file (``GATEWAY_TENANTS_FILE``, format in ``docs/tenants.md``) validated with
pydantic models. Each tenant has credentials (API keys stored as SHA-256 hashes and/or trusted JWT
issuers), its own Kafka connection settings (bootstrap, SASL, TLS; secrets read from environment
variables or files, never inline), allowed topic and group patterns and quotas (instances, concurrent
polls, a requests-per-second token bucket).

Without a tenants file, :meth:`TenantRegistry.single_default` serves everything as tenant ``default``
without authentication (and says so once, loudly).

Secrets (API keys, JWTs, HMAC secrets, SASL and TLS key passwords) never appear in ``repr``/``str`` of
these objects, in exceptions or in log records. This package has no HTTP framework imports.

Modules, each importing only those above it:

- :mod:`.errors` — error codes, :class:`TenantError` (401/403/429), :class:`TenantConfigError`;
- :mod:`.patterns` — topic/group pattern matching on RE2 (:func:`compile_pattern`), the operator's deny-list
  of internal topics (:class:`TopicDenyList`) and the tenant's checks;
- :mod:`.quotas` — :class:`Quotas` and their enforcement (token bucket, instance limit, poll slots);
- :mod:`.tenant` — :class:`Tenant`, made of its connection, patterns and quotas;
- :mod:`.config` — the tenants file: loading, validation, tenants' Kafka connections, JWT issuers;
- :mod:`.auth` — :class:`TenantRegistry` and its authentication (API keys, JWTs).

All log records go to the ``service.tenants`` logger.
"""

from .auth import DEFAULT_TENANT_ID, TenantRegistry, hash_api_key
from .config import JwtIssuer
from .errors import FORBIDDEN, RATE_LIMITED, UNAUTHENTICATED, TenantConfigError, TenantError
from .patterns import DEFAULT_DENIED_TOPICS, PatternError, TopicDenyList, compile_pattern
from .quotas import Quotas
from .tenant import Tenant

__all__ = [
    "DEFAULT_DENIED_TOPICS",
    "DEFAULT_TENANT_ID",
    "FORBIDDEN",
    "RATE_LIMITED",
    "UNAUTHENTICATED",
    "JwtIssuer",
    "PatternError",
    "Quotas",
    "Tenant",
    "TenantConfigError",
    "TenantError",
    "TenantRegistry",
    "TopicDenyList",
    "compile_pattern",
    "hash_api_key",
]
