"""Request handlers of the test broker, one module per API (or family of APIs).

Each module has ``register(registry)``; :func:`default_registry` registers them all. A new subsystem
(fetch sessions, groups, transactions) adds a module here and a line to :func:`default_registry`.
"""

from __future__ import annotations

from tests.broker.handlers import api_versions, metadata, sasl
from tests.broker.registry import HandlerRegistry


def default_registry() -> HandlerRegistry:
    registry = HandlerRegistry()
    for module in (api_versions, metadata, sasl):
        module.register(registry)
    return registry


__all__ = ["default_registry"]
