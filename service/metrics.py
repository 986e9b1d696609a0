"""Prometheus metrics of the gateway, on an explicit registry (one per app).

Counters on the request path are cheap (label lookups only). Per-consumer state (fetch sessions,
rebalances, heartbeat latency, lag, prefetch bytes) is read at scrape time by a custom collector, so
the hot path pays nothing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import Info as PromInfo
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from service.gateway import Gateway

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.info = PromInfo("kcg_build", "Gateway build information", registry=registry)
        self.info.info({"version": "0.1.0"})
        self.http_seconds = Histogram("kcg_http_request_duration_seconds", "HTTP request duration",
                                      ["tenant", "route", "method", "status"], buckets=LATENCY_BUCKETS,
                                      registry=registry)
        self.records = Counter("kcg_records_delivered_total", "Records delivered over HTTP", ["tenant"],
                               registry=registry)
        self.bytes = Counter("kcg_record_bytes_delivered_total", "Key+value bytes delivered over HTTP", ["tenant"],
                             registry=registry)
        self.poll_wait = Histogram("kcg_poll_wait_seconds", "Time a records request waited for data", ["tenant"],
                                   buckets=LATENCY_BUCKETS, registry=registry)
        self.commit_seconds = Histogram("kcg_commit_duration_seconds", "Offset commit latency", ["tenant"],
                                        buckets=LATENCY_BUCKETS, registry=registry)
        self.commit_failures = Counter("kcg_commit_failures_total", "Failed offset commits", ["tenant"],
                                       registry=registry)
        self.produced_records = Counter("kcg_records_produced_total",
                                        "Records produced over HTTP and acknowledged by the broker", ["tenant"],
                                        registry=registry)
        self.produced_bytes = Counter("kcg_record_bytes_produced_total", "Key+value bytes produced over HTTP",
                                      ["tenant"], registry=registry)
        self.produce_failures = Counter("kcg_produce_failures_total",
                                        "Records produced over HTTP that the broker did not acknowledge",
                                        ["tenant"], registry=registry)
        # The largest lag since the previous scrape (reset by each scrape), so that a stall shorter than
        # the scrape interval is still visible; 0 when no tick ended since the previous scrape.
        self._loop_lag_max = 0.0
        self.event_loop_lag = Gauge("kcg_event_loop_lag_seconds",
                                    "Largest delay of a periodic event-loop tick since the previous scrape "
                                    "(reset by every scrape)", registry=registry)
        self.event_loop_lag.set_function(self._take_event_loop_lag)

    def observe_event_loop_lag(self, seconds: float) -> None:
        if seconds > self._loop_lag_max:
            self._loop_lag_max = seconds

    def _take_event_loop_lag(self) -> float:
        """Called at scrape time: report the maximum since the previous scrape and start over."""
        lag, self._loop_lag_max = self._loop_lag_max, 0.0
        return lag

    async def watch_event_loop(self, interval: float = 0.5) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(interval)
            self.observe_event_loop_lag(max(0.0, loop.time() - start - interval))


class GatewayCollector(Collector):
    """Per-tenant aggregates and per-partition lag read from the live consumers at scrape time."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._prepared: list[GaugeMetricFamily | CounterMetricFamily] | None = None
        self._families: list[GaugeMetricFamily | CounterMetricFamily] = []
        self.lock = asyncio.Lock()  # one scrape at a time: prepare() and the collect() it feeds pair up

    async def prepare(self, batch: int = 256) -> None:
        """Read the live consumers now, yielding to the event loop every ``batch`` instances; the next
        collect() (e.g. generate_latest in a worker thread) returns what was read. With 10,000 instances
        a scrape would otherwise hold the event loop for a few hundred milliseconds."""
        steps = self._read()
        n = 0
        for _ in steps:
            n += 1
            if n % batch == 0:
                await asyncio.sleep(0)
        self._prepared = self._families

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        prepared, self._prepared = self._prepared, None
        if prepared is None:
            for _ in self._read():
                pass
            prepared = self._families
        yield from prepared

    def _read(self) -> Iterator[None]:
        """Build ``self._families`` from the live state, yielding after each instance."""
        fetch = CounterMetricFamily("kcg_fetch_requests", "Fetch requests by kind", labels=["tenant", "kind"])
        session_err = CounterMetricFamily("kcg_fetch_session_errors", "Fetch session errors", labels=["tenant"])
        wakeups = CounterMetricFamily("kcg_long_poll_wakeups", "Long polls woken by arriving data", labels=["tenant"])
        rebalances = CounterMetricFamily("kcg_rebalances", "Completed rebalances", labels=["tenant"])
        aborted = CounterMetricFamily("kcg_aborted_after_delivery",
                                      "ABORT markers for transactions whose records were already delivered "
                                      "(broker without aborted-transaction index)", labels=["tenant"])
        hb = GaugeMetricFamily("kcg_heartbeat_latency_seconds", "Latest heartbeat round trip (max per tenant)",
                               labels=["tenant"])
        prefetch = GaugeMetricFamily("kcg_prefetch_buffer_bytes", "Prefetched bytes not yet delivered",
                                     labels=["tenant"])
        instances = GaugeMetricFamily("kcg_consumer_instances", "Consumer instances", labels=["tenant"])
        task_failures = CounterMetricFamily("kcg_background_task_failures",
                                            "Unexpected errors of consumer background tasks (each logged, the task "
                                            "restarted)", labels=["tenant", "task"])
        lag = GaugeMetricFamily("kcg_consumer_lag", "Records behind the end (LSO under read_committed)",
                                labels=["tenant", "group", "topic", "partition"])
        for tid, rt in list(self.gateway.tenants.items()):
            instances.add_metric([tid], len(rt.instances))
            full = inc = errs = wk = reb = ab = 0
            hb_max = 0.0
            pre = 0
            lags: dict[tuple[str, str, int], int] = {}
            failures: dict[str, int] = {}
            for inst in list(rt.instances.values()):
                yield
                c = inst.consumer
                fs = c.fetcher.stats
                full += fs.full_fetches
                inc += fs.incremental_fetches
                errs += fs.session_errors
                ab += fs.aborted_after_delivery
                wk += c.stats.wakeups
                reb += c.stats.rebalances
                for task, n in c.stats.task_failures.items():
                    failures[task] = failures.get(task, 0) + n
                pre += c.fetcher.buffered_bytes
                if c.coordinator is not None and c.coordinator.heartbeat_latency is not None:
                    hb_max = max(hb_max, c.coordinator.heartbeat_latency)
                for tp, v in c.lag().items():
                    if v is not None:
                        lags[(inst.group, tp.topic, tp.partition)] = v
            fetch.add_metric([tid, "full"], full)
            fetch.add_metric([tid, "incremental"], inc)
            session_err.add_metric([tid], errs)
            wakeups.add_metric([tid], wk)
            rebalances.add_metric([tid], reb)
            aborted.add_metric([tid], ab)
            hb.add_metric([tid], hb_max)
            for task, n in sorted(failures.items()):
                task_failures.add_metric([tid, task], n)
            prefetch.add_metric([tid], pre)
            for (g, t, p), v in lags.items():
                lag.add_metric([tid, g, t, str(p)], v)
        self._families = [instances, fetch, session_err, wakeups, rebalances, aborted, hb, prefetch, lag,
                          task_failures]


@contextlib.contextmanager
def timed(hist: Histogram, *labels: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        hist.labels(*labels).observe(time.perf_counter() - start)
