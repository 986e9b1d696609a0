"""Prometheus collectors of the gateway, registered on an explicit registry (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import Info as PromInfo


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.info = PromInfo("kcg_build", "Gateway build information", registry=registry)
        self.info.info({"version": "0.1.0"})
        self.broker_requests = Counter(
            "kcg_broker_requests_total", "Requests sent to Kafka brokers", ["api"], registry=registry
        )
        self.broker_request_errors = Counter(
            "kcg_broker_request_errors_total", "Kafka requests that failed", ["api", "error"], registry=registry
        )
        self.broker_request_seconds = Histogram(
            "kcg_broker_request_seconds", "Kafka request latency", ["api"], registry=registry
        )
        self.connections = Gauge("kcg_broker_connections", "Open broker connections", registry=registry)
