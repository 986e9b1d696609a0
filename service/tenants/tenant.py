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
        admin_topics: Sequence[str] | None = None,
        admin_topic_configs: Sequence[str] | None = None,
        subjects: Sequence[str] | None = None,
    ) -> None:
        self.id = id
        #: the tenant's own Schema Registry (tenants file); None: the gateway-wide one
        self.schema_registry = schema_registry
        self.bootstrap = bootstrap
        self.connection_config = connection_config
        self.description = description
        # admin_topics / subjects None: no restriction (open mode); the tenants file passes its own (see config)
        self._init_patterns(topics, groups, denied_topics, admin_topics=admin_topics,
                            admin_topic_configs=admin_topic_configs, subjects=subjects)
        self._init_quotas(quotas, clock)

    def __repr__(self) -> str:
        return f"Tenant(id={self.id!r}, bootstrap={self.bootstrap!r}, quotas={self.quotas!r})"

    __str__ = __repr__
