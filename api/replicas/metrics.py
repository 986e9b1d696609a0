"""Metrics of the routing layer (forwarded requests by outcome, forward latency, requests in flight)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RoutingMetrics:
    """``kcg_forwarded_requests_total{outcome}`` and ``kcg_forward_duration_seconds`` on the app's registry."""

    OUTCOMES = ("forwarded", "redirected", "owner_unreachable", "absent", "failed", "not_found", "refused")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "kcg_forwarded_requests_total",
            "Requests for consumer instances this replica does not hold, by outcome: forwarded (proxied to "
            "the holder), redirected (307), owner_unreachable (a target could not be connected to; the next "
            "was tried), absent (a target did not hold it; the next was tried), failed (the target failed "
            "mid-request: 503/50303), not_found (no replica holds it: 404/40403), refused (wrong peer token)",
            ["outcome"], registry=registry)
        for outcome in self.OUTCOMES:
            self.requests.labels(outcome)
        self.duration = Histogram(
            "kcg_forward_duration_seconds",
            "Time from forwarding a request to the target's response headers (a long poll includes its wait)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry)

        self.in_flight = Gauge(
            "kcg_forwarded_requests_in_flight",
            "Forwarded requests in progress (open forwarded streams and long polls included): side=out, this "
            "replica proxying to the holder; side=in, this replica serving requests another one forwarded",
            ["side"], registry=registry)
        self.out_flight, self.in_flight_in = self.in_flight.labels("out"), self.in_flight.labels("in")

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

