"""Prometheus metrics of the gateway, on an explicit registry (one per app).

Counters on the request path are cheap (label lookups only). Per-consumer state (fetch sessions,
rebalances, heartbeats, lag, prefetch bytes) is read at scrape time by a custom collector, so the hot
path pays nothing for it; the counters among them keep the last counts of closed instances, so they never
go down. Readiness (``kcg_ready``, ``kcg_broker_reachable``) comes from the same broker
probe as ``/readyz``, run in the background by scrapes (at most every ``READINESS_PROBE_INTERVAL_S``).
The dashboard and alert rules built on these names are in ``dashboards/``; docs/monitoring.md lists them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import Info as PromInfo
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from service.schemas.ecma_regex import PATTERNS

if TYPE_CHECKING:
    from service.instances.registry import Gateway

#: background tasks of a consumer (service/consumer/consumer.py); each gets a 0 series per tenant so that
#: the failure panel and alert have data before the first failure
BACKGROUND_TASKS = ("fetcher", "membership", "positions", "autocommit", "pattern")
#: per-instance counters the collector sums per tenant (keys of its count dicts; "task:<name>" besides)
COUNTERS = ("full", "incremental", "session_errors", "session_resets", "aborted", "wakeups", "rebalances", "heartbeats",
            "stall_recoveries")
#: scrapes start a readiness probe (Metadata of every tenant's brokers, as /readyz) at most this often ...
READINESS_PROBE_INTERVAL_S = 5.0
#: ... and a tenant whose probe takes longer than this is unreachable
READINESS_PROBE_TIMEOUT_S = 5.0

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


_CHILDREN: dict[tuple[object, tuple[str, ...]], Any] = {}
_CHILDREN_MAX = 16_384


def labelled(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, remembered: prometheus_client's ``labels`` costs a few µs (a lock, label
    checks) and hot paths (every HTTP request, every produce) ask for the same few children again and again.
    Label sets are never removed from these metrics, so a remembered child stays the live one."""
    key = (metric, values)
    child = _CHILDREN.get(key)
    if child is None:
        if len(_CHILDREN) >= _CHILDREN_MAX:
            _CHILDREN.clear()
        child = _CHILDREN[key] = metric.labels(*values)
    return child


class TallyCounter(Collector):
    """A counter with one label for the hottest paths: ``add`` is one dict update (a prometheus_client Counter
    child's ``inc`` is four Python calls and a lock: ~4% of the gateway's CPU when it counted three per produce
    request). Scrapes export it as that Counter would: ``<name>_total{<label>="..."}``, one sample per value
    seen; values are never removed, so the counts never go down."""

    def __init__(self, name: str, documentation: str, label: str, registry: CollectorRegistry | None) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.label = label
        self.counts: dict[str, float] = {}
        if registry is not None:
            registry.register(self)

    def add(self, value: str, amount: float) -> None:
        counts = self.counts
        counts[value] = counts.get(value, 0) + amount

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, amount in dict(self.counts).items():  # (a copy: scrapes may run in a worker thread)
            family.add_metric([value], amount)
        yield family


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
        # counted on every produce request: plain additions, exported at scrape time
        self.produced_records = TallyCounter("kcg_records_produced_total",
                                             "Records produced over HTTP and acknowledged by the broker", "tenant",
                                             registry)
        self.produced_bytes = TallyCounter("kcg_record_bytes_produced_total", "Key+value bytes produced over HTTP",
                                           "tenant", registry)
        self.produce_failures = TallyCounter("kcg_produce_failures_total",
                                             "Records produced over HTTP that the broker did not acknowledge", "tenant",
                                             registry)
        # schema'd formats: keys/values delivered with key_error/value_error, polls given back
        self.schema_decode_errors = Counter("kcg_schema_decode_errors_total",
                                            "Keys and values of schema'd consumers delivered as null with an error "
                                            "field (not in the wire format, unknown schema id, undecodable)",
                                            ["tenant", "format"], registry=registry)
        self.schema_registry_unavailable = Counter("kcg_schema_registry_unavailable_total",
                                                   "Polls and streams of schema'd consumers that failed (503/50307) "
                                                   "because the schema registry could not answer; their records "
                                                   "were given back", ["tenant"], registry=registry)
        # share groups (KIP-932; service/instances/share.py)
        self.share_acquired = Counter("kcg_share_records_acquired_total",
                                      "Records acquired by share consumer instances and delivered over HTTP",
                                      ["tenant"], registry=registry)
        self.share_redelivered = Counter("kcg_share_records_redelivered_total",
                                         "Share records delivered again (delivery_count > 1: released earlier, "
                                         "or their acquisition lock ran out)", ["tenant"], registry=registry)
        self.share_acks = Counter("kcg_share_acknowledgements_total",
                                  "Share record acknowledgements by type (accept, release, reject, renew) and "
                                  "outcome (applied, refused)", ["tenant", "type", "outcome"], registry=registry)
        self.share_lock_expiries = Counter("kcg_share_lock_expiries_total",
                                           "Records whose acquisition lock ran out while a share consumer instance "
                                           "held them unacknowledged", ["tenant"], registry=registry)
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

    def __init__(self, gateway: Gateway, clock: Callable[[], float] = time.monotonic, *,
                 readyz_tenants: str = "all") -> None:
        self.gateway = gateway
        self.clock = clock
        self.readyz_tenants = readyz_tenants  # GATEWAY_READYZ_TENANTS: see brokers_ready
        self._prepared: list[GaugeMetricFamily | CounterMetricFamily] | None = None
        self._families: list[GaugeMetricFamily | CounterMetricFamily] = []
        self.lock = asyncio.Lock()  # one scrape at a time: prepare() and the collect() it feeds pair up
        # Heartbeats by coordinator, as seen by the previous scrape: id -> (coordinator, heartbeat count,
        # since when that count has not moved, whether the member was stable). Only the coordinators of
        # the last scrape are kept.
        self._heartbeats: dict[int, tuple[object, int, float, bool]] = {}
        # The counters of each instance at the previous scrape (id -> (instance, tenant, counts)), and per
        # tenant the sums of the instances that have gone since (counts between their last scrape and
        # their close are not counted)
        self._live: dict[int, tuple[object, str, dict[str, int]]] = {}
        self._retired: dict[str, dict[str, int]] = {}
        # Readiness: the result of the latest completed probe per tenant (None: no probe completed yet)
        self._reachable: dict[str, bool] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._probe_started = float("-inf")

    async def prepare(self, batch: int = 256) -> None:
        """Read the live consumers now, yielding to the event loop every ``batch`` instances; the next
        collect() (e.g. generate_latest in a worker thread) returns what was read. With 10,000 instances
        a scrape would otherwise hold the event loop for a few hundred milliseconds.

        Also starts the background readiness probe when the previous one is older than
        READINESS_PROBE_INTERVAL_S (its result shows in a later scrape)."""
        self.start_readiness_probe()
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

    # -- readiness -----------------------------------------------------------------------------------
    def start_readiness_probe(self) -> asyncio.Task[None] | None:
        """Start a probe of every tenant's brokers unless one runs or started less than
        READINESS_PROBE_INTERVAL_S ago; the task (or None)."""
        now = self.clock()
        if (self._probe_task is not None and not self._probe_task.done()) or (
                now - self._probe_started < READINESS_PROBE_INTERVAL_S):
            return None
        self._probe_started = now
        self._probe_task = asyncio.create_task(self._probe(), name="readiness-probe")
        return self._probe_task

    async def _probe(self) -> None:
        """What /readyz checks: a Metadata request to each tenant's brokers answers within the timeout."""
        runtimes = list(self.gateway.tenants.items())

        async def reachable(client: object) -> bool:
            try:
                await asyncio.wait_for(client.refresh_metadata(), READINESS_PROBE_TIMEOUT_S)  # type: ignore[attr-defined]
            except Exception as exc:  # any failure (KafkaError, timeout, connection) means not reachable
                log.debug("readiness probe: %s", exc)
                return False
            return True

        results = await asyncio.gather(*(reachable(rt.client) for _, rt in runtimes))
        self._reachable = {tid: ok for (tid, _), ok in zip(runtimes, results, strict=True)}

    def _readiness(self) -> list[GaugeMetricFamily]:
        policy = self.readyz_tenants
        ready = GaugeMetricFamily("kcg_ready", "1 when the gateway is ready (not draining and the brokers of "
                                  "every tenant, or with GATEWAY_READYZ_TENANTS=any of one, answered the latest "
                                  "background probe, as /readyz checks), "
                                  "else 0; absent until the first probe completed")
        reachable = GaugeMetricFamily("kcg_broker_reachable", "1 when the tenant's brokers answered the latest "
                                      "readiness probe, else 0", labels=["tenant"])
        draining = bool(getattr(self.gateway, "draining", False))
        if self._reachable is not None:
            for tid, ok in sorted(self._reachable.items()):
                reachable.add_metric([tid], 1 if ok else 0)
            ready.add_metric([], 0 if draining or not brokers_ready(self._reachable, policy) else 1)
        elif draining:
            ready.add_metric([], 0)
        return [ready, reachable]

    def _budget(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """The process memory budget (service/instances/budget.py): bytes in use by kind, the total, refusals."""
        budget = getattr(self.gateway, "budget", None)
        if budget is None or not hasattr(budget, "by_kind"):
            return []
        used = GaugeMetricFamily("kcg_memory_budget_used_bytes", "Bytes charged to GATEWAY_MEMORY_BUDGET_BYTES by "
                                 "kind (prefetch: buffered records; fetch: in-flight fetch grants; share: records "
                                 "acquired by share instances, until answered; range: range pages; body: request "
                                 "bodies; send: answers not yet sent)", labels=["kind"])
        for kind, n in budget.by_kind.items():
            used.add_metric([kind], n)
        total = GaugeMetricFamily("kcg_memory_budget_bytes", "GATEWAY_MEMORY_BUDGET_BYTES", value=budget.total)
        refused = CounterMetricFamily("kcg_memory_budget_refusals", "Requests refused with 503/50305 (range, body) "
                                      "and fetches deferred (fetch) for want of memory", labels=["kind"])
        for kind, n in budget.refused.items():
            refused.add_metric([kind], n)
        return [used, total, refused]

    def _durable(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """Durable instances (service/durable): re-creations, hand-offs, descriptor write failures and how far
        each tenant's descriptor follower is behind its topic."""
        gw = self.gateway
        if not getattr(gw, "durable_instances", False):
            return []
        recreated = CounterMetricFamily("kcg_instances_recreated", "Consumer instances re-created from their "
                                        "descriptors (their replica died, stopped or restarted)",
                                        value=getattr(gw, "recreated_total", 0))
        handed = CounterMetricFamily("kcg_instances_handed_off", "Consumer instances this replica closed for "
                                     "another replica to re-create: reason=shutdown (SIGTERM), moved (the replica "
                                     "set changed and another replica owns it now)", labels=["reason"])
        moved = getattr(gw, "moved_total", 0)
        handed.add_metric(["shutdown"], getattr(gw, "handed_off_total", 0) - moved)
        handed.add_metric(["moved"], moved)
        failures = CounterMetricFamily("kcg_descriptor_failures", "Instance descriptor writes or deletes that "
                                       "failed (the instance would not survive its replica)",
                                       value=getattr(gw, "descriptor_failures", 0))
        lag = GaugeMetricFamily("kcg_descriptor_topic_lag", "Descriptor records this replica has not read yet "
                                "(per tenant; -1 before the first read)", labels=["tenant"])
        for tid, rt in list(gw.tenants.items()):
            store = getattr(rt, "descriptors", None)
            if store is not None:
                lag.add_metric([tid], store.lag)
        return [recreated, handed, failures, lag]

    def _heartbeat_age(self, coordinator: object, now: float, seen: dict[int, tuple[object, int, float, bool]]
                       ) -> float | None:
        """Seconds since ``coordinator`` last completed a heartbeat, as far as scrapes can tell (the count
        moved between two scrapes: 0), for a stable member; None for a member that is not stable (joining,
        left, unsubscribed: it is not expected to heartbeat)."""
        count = int(getattr(coordinator, "heartbeats", 0))
        stable = bool(getattr(coordinator, "stable", False))
        prev = self._heartbeats.get(id(coordinator))
        since = now
        if prev is not None and prev[0] is coordinator and prev[1] == count and prev[3] and stable:
            since = prev[2]
        seen[id(coordinator)] = (coordinator, count, since, stable)
        return now - since if stable else None

    def _read(self) -> Iterator[None]:
        """Build ``self._families`` from the live state, yielding after each instance."""
        fetch = CounterMetricFamily("kcg_fetch_requests", "Fetch requests by kind", labels=["tenant", "kind"])
        session_err = CounterMetricFamily("kcg_fetch_session_errors", "Fetch session errors", labels=["tenant"])
        session_resets = CounterMetricFamily("kcg_fetch_session_resets",
                                             "Full fetches that re-created a fetch session (KIP-227) the broker "
                                             "had lost or refused (broker restart, session error, failed fetch)",
                                             labels=["tenant"])
        wakeups = CounterMetricFamily("kcg_long_poll_wakeups", "Long polls woken by arriving data", labels=["tenant"])
        rebalances = CounterMetricFamily("kcg_rebalances", "Completed rebalances", labels=["tenant"])
        aborted = CounterMetricFamily("kcg_aborted_after_delivery",
                                      "ABORT markers for transactions whose records were already delivered "
                                      "(broker without aborted-transaction index)", labels=["tenant"])
        hb = GaugeMetricFamily("kcg_heartbeat_latency_seconds", "Latest heartbeat round trip (max per tenant)",
                               labels=["tenant"])
        heartbeats = CounterMetricFamily("kcg_heartbeats", "Heartbeats completed by group members",
                                         labels=["tenant"])
        hb_age = GaugeMetricFamily("kcg_heartbeat_age_seconds",
                                   "Longest time since a stable group member last completed a heartbeat (max per "
                                   "tenant; resolution: the scrape interval). Well above the heartbeat interval: "
                                   "heartbeats are missed and the broker will evict the member at the session "
                                   "timeout", labels=["tenant"])
        unassigned = GaugeMetricFamily("kcg_unassigned_consumer_instances",
                                       "Consumer instances subscribed but owning no partition for longer than their "
                                       "session timeout (a stalled rebalance, or more members than partitions)",
                                       labels=["tenant"])
        stalls = CounterMetricFamily("kcg_group_stall_recoveries",
                                     "Times a group member found its rebalance stalled for a session timeout and "
                                     "rejoined to complete it (docs/groups.md)", labels=["tenant"])
        seen: dict[int, tuple[object, int, float, bool]] = {}
        prefetch = GaugeMetricFamily("kcg_prefetch_buffer_bytes", "Prefetched bytes not yet delivered",
                                     labels=["tenant"])
        instances = GaugeMetricFamily("kcg_consumer_instances", "Consumer instances", labels=["tenant"])
        task_failures = CounterMetricFamily("kcg_background_task_failures",
                                            "Unexpected errors of consumer background tasks (each logged, the task "
                                            "restarted)", labels=["tenant", "task"])
        lag = GaugeMetricFamily("kcg_consumer_lag", "Records behind the end (LSO under read_committed)",
                                labels=["tenant", "group", "topic", "partition"])
        # group protocols (docs/consumer-protocol.md): what a join or leave costs each protocol's members
        revoked = CounterMetricFamily("kcg_group_partitions_revoked", "Partitions group members gave up in "
                                      "hand-overs, by group protocol (classic: every member gives up everything "
                                      "at each rebalance; consumer: only the partitions that move)",
                                      labels=["tenant", "protocol"])
        changes = CounterMetricFamily("kcg_group_assignment_changes", "Assignments group members took (a "
                                      "rebalance, or a consumer-protocol reconciliation), by group protocol",
                                      labels=["tenant", "protocol"])
        converge = GaugeMetricFamily("kcg_group_converge_seconds", "How long the latest assignment change of a "
                                     "member took to settle (max per tenant and group protocol; classic: first "
                                     "revocation to new assignment, consumer: new target to stable)",
                                     labels=["tenant", "protocol"])
        epoch = GaugeMetricFamily("kcg_group_member_epoch", "Highest member epoch of the consumer-protocol "
                                  "(KIP-848) members of a group in this replica", labels=["tenant", "group"])
        live: dict[int, tuple[object, str, dict[str, int]]] = {}
        per_tenant: list[tuple[str, dict[str, int], float, float, int]] = []
        for tid, rt in list(self.gateway.tenants.items()):
            instances.add_metric([tid], len(rt.instances))
            stuck = 0
            sums: dict[str, int] = {}
            hb_max = age_max = 0.0
            pre = 0
            lags: dict[tuple[str, str, int], int] = {}
            slowest: dict[str, float] = {}
            epochs: dict[str, int] = {}
            for inst in list(rt.instances.values()):
                yield
                c = inst.consumer
                fs = c.fetcher.stats
                counts = {"full": fs.full_fetches, "incremental": fs.incremental_fetches,
                          "session_errors": fs.session_errors, "session_resets": fs.session_resets,
                          "aborted": fs.aborted_after_delivery,
                          "wakeups": c.stats.wakeups, "rebalances": c.stats.rebalances, "heartbeats": 0}
                for task, n in c.stats.task_failures.items():
                    counts["task:" + task] = n
                proto = getattr(c, "group_protocol", "classic")
                if c.coordinator is not None:
                    counts["revoked:" + proto] = getattr(c.stats, "partitions_revoked", 0)
                    counts["changes:" + proto] = c.stats.rebalances
                    took = (getattr(c.coordinator, "converge_seconds", None)
                            or getattr(c.stats, "last_converge_seconds", None))
                    if took is not None:
                        slowest[proto] = max(slowest.get(proto, 0.0), took)
                    if proto == "consumer" and c.member is not None:
                        epochs[inst.group] = max(epochs.get(inst.group, 0), int(getattr(c.member, "member_epoch", 0)))
                pre += c.fetcher.buffered_bytes
                if c.coordinator is not None:
                    if c.coordinator.heartbeat_latency is not None:
                        hb_max = max(hb_max, c.coordinator.heartbeat_latency)
                    counts["heartbeats"] = c.coordinator.heartbeats
                    counts["stall_recoveries"] = int(getattr(c.coordinator, "stall_recoveries", 0))
                    too_long = getattr(c.coordinator, "unassigned_too_long", None)
                    if too_long is not None and too_long(self.clock()):
                        stuck += 1
                    age = self._heartbeat_age(c.coordinator, self.clock(), seen)
                    if age is not None:
                        age_max = max(age_max, age)
                for key, n in counts.items():
                    sums[key] = sums.get(key, 0) + n
                live[id(inst)] = (inst, tid, counts)
                for tp, v in c.lag().items():
                    if v is not None:
                        lags[(inst.group, tp.topic, tp.partition)] = v
            per_tenant.append((tid, sums, hb_max, age_max, pre))
            for proto, took in sorted(slowest.items()):
                converge.add_metric([tid, proto], took)
            for g, e in sorted(epochs.items()):
                epoch.add_metric([tid, g], e)
            unassigned.add_metric([tid], stuck)
            for (g, t, p), v in lags.items():
                lag.add_metric([tid, g, t, str(p)], v)
        # Instances gone since the previous scrape (deleted, expired): their last counts stay in the tenant's
        # totals, so that the counters never go down (a drop would read as a counter reset to rate()).
        for iid, (old, old_tid, old_counts) in self._live.items():
            if iid not in live or live[iid][0] is not old:
                retired = self._retired.setdefault(old_tid, {})
                for name, n in old_counts.items():
                    retired[name] = retired.get(name, 0) + n
        self._live = live
        for tid, sums, hb_max, age_max, pre in per_tenant:
            totals = dict.fromkeys(COUNTERS, 0) | {"task:" + task: 0 for task in BACKGROUND_TASKS}
            for part in (self._retired.get(tid, {}), sums):
                for key, n in part.items():
                    totals[key] = totals.get(key, 0) + n
            fetch.add_metric([tid, "full"], totals["full"])
            fetch.add_metric([tid, "incremental"], totals["incremental"])
            session_err.add_metric([tid], totals["session_errors"])
            session_resets.add_metric([tid], totals["session_resets"])
            wakeups.add_metric([tid], totals["wakeups"])
            rebalances.add_metric([tid], totals["rebalances"])
            aborted.add_metric([tid], totals["aborted"])
            hb.add_metric([tid], hb_max)
            heartbeats.add_metric([tid], totals["heartbeats"])
            stalls.add_metric([tid], totals["stall_recoveries"])
            hb_age.add_metric([tid], age_max)
            for key, n in sorted(totals.items()):
                if key.startswith("task:"):
                    task_failures.add_metric([tid, key[5:]], n)
                elif key.startswith("revoked:"):
                    revoked.add_metric([tid, key[8:]], n)
                elif key.startswith("changes:"):
                    changes.add_metric([tid, key[8:]], n)
            prefetch.add_metric([tid], pre)
        self._heartbeats = seen
        self._families = [instances, fetch, session_err, session_resets, wakeups, rebalances, aborted, hb, heartbeats,
                          hb_age,
                          prefetch, lag, task_failures, unassigned, stalls, *self._readiness(), *self._budget(),
                          *self._durable(), revoked, changes, converge, epoch]


def brokers_ready(reachable: Mapping[str, bool], policy: str = "all") -> bool:
    """Whether the tenants' broker checks make the replica ready (GATEWAY_READYZ_TENANTS): ``all`` every tenant's
    brokers answered, ``any`` at least one tenant's did (no tenants: ready)."""
    if not reachable:
        return True
    return any(reachable.values()) if policy == "any" else all(reachable.values())


class SchemaCacheCollector(Collector):
    """The bytes the schema caches hold (``kcg_schema_cache_bytes``): ``cache="registries"`` what is charged to
    the byte budgets of the registries (GATEWAY_SCHEMA_CACHE_MAX_BYTES each), ``cache="patterns"`` the compiled
    JSON Schema patterns (one bound per process)."""

    def __init__(self, schemas: Any) -> None:
        self.schemas = schemas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        used = GaugeMetricFamily("kcg_schema_cache_bytes", "Bytes held by the schema caches: registries (charged to "
                                 "GATEWAY_SCHEMA_CACHE_MAX_BYTES, summed over registries), patterns (compiled JSON "
                                 "Schema patterns, at most 32 MiB)", labels=["cache"])
        used.add_metric(["registries"], self.schemas.cache_bytes())
        used.add_metric(["patterns"], PATTERNS.used)
        yield used


@contextlib.contextmanager
def timed(hist: Histogram, *labels: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        hist.labels(*labels).observe(time.perf_counter() - start)
