"""The :class:`Tenant`: its Kafka connection, plus its patterns (:mod:`.patterns`) and quotas (:mod:`.quotas`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from service.client.connection import ConnectionConfig
from service.schemas.registry import RegistryConfig

from .patterns import DEFAULT_DENY_LIST, TenantPatterns, TopicDenyList
from .quotas import Quotas, TenantQuotas


class Tenant(TenantPatterns, TenantQuotas):
    """One tenant: its Kafka connection, what it may touch (``denied_topics``, the operator's deny-list, is
    checked before its own patterns) and its quotas. Holds runtime quota state (the
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
        denied_topics: TopicDenyList = DEFAULT_DENY_LIST,
        clock: Callable[[], float] = time.monotonic,
        schema_registry: RegistryConfig | None = None,
    ) -> None:
        self.id = id
        #: the tenant's own Schema Registry (tenants file); None: the gateway-wide one
        self.schema_registry = schema_registry
        self.bootstrap = bootstrap
        self.connection_config = connection_config
        self.description = description
        self._init_patterns(topics, groups, denied_topics)
        self._init_quotas(quotas, clock)

    def __repr__(self) -> str:
        return f"Tenant(id={self.id!r}, bootstrap={self.bootstrap!r}, quotas={self.quotas!r})"

    __str__ = __repr__
