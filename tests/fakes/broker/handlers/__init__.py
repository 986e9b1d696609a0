"""Request handlers of the test broker, one module per API (or family of APIs).

Each module has ``register(registry)``; :func:`default_registry` registers them all. A new subsystem
(fetch sessions, groups, transactions) adds a module here and a line to :func:`default_registry`.
"""

from __future__ import annotations

from tests.fakes.broker.handlers import api_versions, fetch, list_offsets, metadata, produce, sasl
from tests.fakes.broker.handlers import groups as group_handlers
from tests.fakes.broker.handlers import transactions as txn_handlers
from tests.fakes.broker.registry import HandlerRegistry


def default_registry(*, transactions: bool = False, groups: bool = False) -> HandlerRegistry:
    """Every handler; the transaction coordinator APIs (InitProducerId, AddPartitionsToTxn, EndTxn) only
    with ``transactions=True``: ``TestCluster(registry=default_registry(transactions=True))``."""
    registry = HandlerRegistry()
    for module in (api_versions, metadata, sasl, fetch, list_offsets, produce):
        module.register(registry)
    if transactions:
        txn_handlers.register(registry)
    if groups:  # the group coordinator (tests.fakes.broker.group_coordinator): FindCoordinator ... OffsetFetch
        group_handlers.register(registry)
    return registry


__all__ = ["default_registry"]
