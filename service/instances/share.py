"""The registry of share consumer instances (share groups, KIP-932): tenants → share groups → instances.

A share consumer instance is one member of a share group, driven by the engine's ShareConsumer
(service/share/consumer.py) over its tenant's Kafka client. Like a consumer instance it is named by its client
(or gets a generated name), expires after the idle timeout (then a request for it answers 410), and is closed
on shutdown; closing releases every record it still holds, so other members get them at once.

On top of the engine it keeps what HTTP needs: the records it handed out with their delivery count and lock
deadline, as runs of offsets per partition (service/share/ranges.py; an acknowledgement of a record not held, or
whose lock ran out, is reported not applied and never sent), the acknowledgement mode (implicit: each poll
accepts what the previous one returned), and the answers to acknowledgements that rode on a ShareFetch or went
out later (``wait`` false), kept per run for ``GET .../acknowledgements``. Queued acknowledgements ride on the
next ShareFetch; when no poll comes within ``ack_linger`` they go out alone (ShareAcknowledge), so an idle
client's outcomes are never left waiting.

Acquired records are charged to the process memory budget (``budget``, service/instances/budget.py; kind
``share``, see service/share/consumer.py): :meth:`ShareInstance.poll` answers the records with their charge,
which the HTTP layer releases (:meth:`ShareInstance.release_charge`) once the answer carrying them was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
import time
import uuid
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from service.client.client import KafkaClient
from service.errors import GatewayError
from service.instances.registry import NAME_PLACEMENT_TRIES
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.share.consumer import ShareConsumer, ShareRecord
from service.share.ranges import RunMap, subtract
from service.share.session import AckResult, AckType
from service.tenants.quotas import InstanceQuotaCoordinator

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
ACK_TYPES = {"accept": AckType.ACCEPT, "release": AckType.RELEASE, "reject": AckType.REJECT,
             "renew": AckType.RENEW}
TYPE_NAMES = {v: k for k, v in ACK_TYPES.items()}
#: answers to acknowledgements nobody waited for, kept per instance for GET .../acknowledgements
MAX_KEPT_OUTCOMES = 10_000
#: the answer of a record this instance does not hold: never acquired here, already acknowledged
NOT_HELD = "NOT_HELD"
#: the answer of a record whose acquisition lock ran out (the broker hands it out again)
LOCK_EXPIRED = "LOCK_EXPIRED"

Part = tuple[str, int]  # topic, partition
#: an acknowledgement of a run of offsets: topic, partition, first offset, last offset (inclusive), type
AckRange = tuple[str, int, int, int, AckType]
#: a tenant's share instances are counted by the owner of record under this key (tenant ids have no \x1f), apart
#: from its consumer instances: ``max_instances`` caps each kind, across the replica set
SHARE_QUOTA_PREFIX = "\x1fshare\x1f"


def share_quota_key(tenant: str) -> str:
    return SHARE_QUOTA_PREFIX + tenant


def quota_tenant_of(key: str) -> str | None:
    """The tenant whose share instances ``key`` counts (see :func:`share_quota_key`), None for another key."""
    return key[len(SHARE_QUOTA_PREFIX):] if key.startswith(SHARE_QUOTA_PREFIX) else None


class ShareInstanceNotFound(GatewayError):
    status = 404
    error_code = 40410


class ShareInstanceExists(GatewayError):
    status = 409
    error_code = 40910


class ShareInstanceExpired(GatewayError):
    status = 410
    error_code = 41010


class ShareGroupsUnsupported(GatewayError):
    status = 409
    error_code = 40912


async def require_share_groups(client: KafkaClient) -> None:
    """Raise 409/40912 unless the cluster's brokers speak the share-group APIs (ApiVersions: ShareGroupHeartbeat
    and ShareFetch; Tansu and Kafka before 4.x have none)."""
    conn = await client.any_connection()
    versions = conn.versions
    if versions is None or not (versions.has(M.ApiKey.SHARE_GROUP_HEARTBEAT) and versions.has(M.ApiKey.SHARE_FETCH)):
        raise ShareGroupsUnsupported("the Kafka cluster has no share groups (its brokers do not offer "
                                     "ShareGroupHeartbeat and ShareFetch: Apache Kafka 4.x with share groups "
                                     "enabled is needed)")


@dataclass
class ShareOptions:
    format: str = "binary"  # binary | json | avro | protobuf | jsonschema
    avro_rendering: str | None = None
    ack_mode: str = "explicit"  # explicit | implicit


@dataclass(frozen=True, slots=True)
class AckOutcome:
    """What became of the acknowledgement of ``offset`` to ``last_offset`` (inclusive; one record when
    ``last_offset`` is not given), all with the same answer."""

    topic: str
    partition: int
    offset: int
    type: str
    applied: bool
    error: str | None = None
    lock_deadline: float | None = None  # monotonic; renewals that applied
    last_offset: int = -1

    @property
    def last(self) -> int:
        return self.last_offset if self.last_offset >= self.offset else self.offset

    @property
    def count(self) -> int:
        return self.last - self.offset + 1

    def part(self, first: int, last: int) -> AckOutcome:
        """The same answer for ``first..last`` (inside this one's offsets)."""
        return replace(self, offset=first, last_offset=last)


def held_runs(records: Iterable[ShareRecord]) -> dict[Part, list[tuple[int, int, int, float]]]:
    """Records as runs per partition of consecutive offsets with the same delivery count and lock deadline."""
    out: dict[Part, list[tuple[int, int, int, float]]] = {}
    topic, partition, first, last, count, deadline = "", -1, 0, -2, 0, 0.0
    for r in records:
        if r.offset == last + 1 and r.partition == partition and r.topic == topic \
                and r.delivery_count == count and r.lock_deadline == deadline:
            last = r.offset
            continue
        if partition >= 0:
            out.setdefault((topic, partition), []).append((first, last, count, deadline))
        topic, partition, first, last, count, deadline = (r.topic, r.partition, r.offset, r.offset,
                                                          r.delivery_count, r.lock_deadline)
    if partition >= 0:
        out.setdefault((topic, partition), []).append((first, last, count, deadline))
    return out


def ack_ranges(records: Iterable[ShareRecord], type: AckType) -> list[AckRange]:
    """Acknowledgements of ``records`` as runs of consecutive offsets per partition."""
    return [(t, p, f, la, type) for (t, p), runs in held_runs(records).items() for f, la, _, _ in runs]


@dataclass
class _Waiter:
    """An acknowledgements request waiting for the broker's answers: the runs still unanswered per
    (topic, partition, type name), and the answers so far."""

    want: dict[tuple[str, int, str], RunMap[bool]] = field(default_factory=dict)
    got: list[AckOutcome] = field(default_factory=list)

    def take(self, o: AckOutcome) -> list[tuple[int, int]]:
        """Keep the parts of ``o`` this request waits for; returns those parts."""
        want = self.want.get((o.topic, o.partition, o.type))
        if not want:
            return []
        mine = [(f, la) for f, la, _ in want.remove(o.offset, o.last)]
        for f, la in mine:
            self.got.append(o if (f, la) == (o.offset, o.last) else o.part(f, la))
        return mine

    @property
    def done(self) -> bool:
        return not any(self.want.values())


@dataclass
class ShareInstance:
    tenant: str
    group: str
    name: str
    options: ShareOptions
    client: KafkaClient
    consumer: ShareConsumer | None = None
    topics: list[str] = field(default_factory=list)
    #: what this instance handed out and is not settled, per partition: runs of (delivery count, lock deadline)
    held: dict[Part, RunMap[tuple[int, float]]] = field(default_factory=dict)
    previous: list[AckRange] = field(default_factory=list)  # implicit mode: accepting what the last poll returned
    #: answers nobody waited for (oldest first), at most MAX_KEPT_OUTCOMES offsets in all
    outcomes: deque[AckOutcome] = field(default_factory=deque)
    kept: int = 0  # offsets in ``outcomes``
    poll_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    active_requests: int = 0
    closed: bool = False
    flusher: asyncio.Task[None] | None = None
    metrics: Any = None
    #: the process memory budget (service.instances.budget.MemoryBudget), or None
    budget: Any = None
    #: the tenant-wide reservation of this instance with the owner of record (max_instances across replicas)
    quota_token: str | None = None
    _waiters: list[_Waiter] = field(default_factory=list)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    # -- subscription ---------------------------------------------------------------------------------------------
    async def subscribe(self, topics: list[str]) -> None:
        topics = sorted(set(topics))
        if self.consumer is None:
            consumer = ShareConsumer(self.client, self.group, topics, max_wait_ms=500, record_limit=True)
            consumer.budget = self.budget
            await consumer.start()
            self.consumer = consumer
        else:
            await self.consumer.subscribe(topics)
        self.topics = topics

    # -- polling --------------------------------------------------------------------------------------------------
    def release_charge(self, n: int) -> None:
        """Give back to the memory budget what a poll charged for its records (they left the process)."""
        if n and self.budget is not None:
            self.budget.release(n, "share")

    async def poll(self, max_records: int, max_bytes: int | None, timeout: float,
                   stop: Callable[[], bool] = lambda: False) -> tuple[list[ShareRecord], int]:
        """Records acquired within ``timeout`` seconds (returns once some arrived) and the bytes charged to the
        memory budget for them (the caller's to :meth:`release_charge`); implicit mode first accepts what the
        previous poll returned (riding on this poll's ShareFetch). Without room in the budget nothing is acquired:
        the poll waits for memory, up to its timeout, as a consumer instance's poll does."""
        consumer = self.consumer
        if consumer is None:
            raise GatewayError("the share consumer instance is not subscribed to any topic", status=409,
                               error_code=40903)
        async with self.poll_lock:
            if self.options.ack_mode == "implicit" and self.previous:
                self._queue(self.previous)
            self.previous = []
            consumer.max_records = max_records
            if max_bytes is not None:
                consumer.max_bytes = max_bytes
            deadline = time.monotonic() + timeout
            out: list[ShareRecord] = []
            charge = 0
            try:
                while True:
                    self._expire()
                    got = await consumer.poll(max(0.0, deadline - time.monotonic()))
                    charge += consumer.take_charged()
                    self._absorb(consumer.take_results())
                    out += got
                    if out or stop() or time.monotonic() >= deadline:
                        break
            except BaseException:
                self.release_charge(charge + consumer.take_charged())
                raise
            runs = held_runs(out)
            for key, rs in runs.items():
                held = self.held.get(key)
                if held is None:
                    held = self.held[key] = RunMap()
                for f, la, c, d in rs:
                    held.assign(f, la, (c, d))
            if self.options.ack_mode == "implicit":
                self.previous = [(t, p, f, la, AckType.ACCEPT) for (t, p), rs in runs.items() for f, la, _, _ in rs]
            if self.metrics is not None and out:
                self.metrics.share_acquired.labels(self.tenant).inc(len(out))
                again = sum(1 for r in out if r.delivery_count > 1)
                if again:
                    self.metrics.share_redelivered.labels(self.tenant).inc(again)
            return out, charge

    def _expire(self) -> None:
        now = time.monotonic()
        gone = 0
        for held in self.held.values():
            for f, la, _ in held.remove_if(lambda v: v[1] <= now):
                gone += la - f + 1
        if gone and self.metrics is not None:
            self.metrics.share_lock_expiries.labels(self.tenant).inc(gone)

    def holds(self, topic: str, partition: int, offset: int) -> bool:
        """Whether this instance handed out the record and it is not settled (its lock may have run out)."""
        held = self.held.get((topic, partition))
        return held is not None and offset in held

    def held_count(self) -> int:
        return sum(len(h) for h in self.held.values())

    def unhand(self, records: Iterable[ShareRecord]) -> list[AckRange]:
        """Records that did not reach the client: they leave what the next poll accepts (implicit mode); the
        release acknowledgements of those still held."""
        gone = held_runs(records)
        if self.previous:
            kept: list[AckRange] = []
            for t, p, f, la, ty in self.previous:
                drop = [(df, dl) for df, dl, _, _ in gone.get((t, p), ()) if df <= la and dl >= f]
                kept += [(t, p, kf, kl, ty) for kf, kl in subtract(f, la, [(max(df, f), min(dl, la))
                                                                            for df, dl in sorted(drop)])]
            self.previous = kept
        out: list[AckRange] = []
        for (t, p), runs in sorted(gone.items()):
            held = self.held.get((t, p))
            if held is not None:
                for f, la, _, _ in runs:
                    out += [(t, p, hf, hl, AckType.RELEASE) for hf, hl, _ in held.pieces(f, la)]
        return out

    # -- acknowledging --------------------------------------------------------------------------------------------
    def _queue(self, acks: Iterable[AckRange]) -> list[AckOutcome]:
        """Queue acknowledgements with the engine; the runs refused at once (not held, lock expired)."""
        consumer = self.consumer
        refused: list[AckOutcome] = []
        now = time.monotonic()
        expired = 0
        for topic, partition, first, last, type in acks:
            name = TYPE_NAMES[type]
            held = self.held.get((topic, partition))
            pieces = held.pieces(first, last) if held is not None and consumer is not None else []
            if not pieces:
                refused.append(AckOutcome(topic, partition, first, name, False, NOT_HELD, None, last))
                continue
            assert held is not None and consumer is not None
            at = first
            for f, la, (_, deadline) in pieces:
                if f > at:
                    refused.append(AckOutcome(topic, partition, at, name, False, NOT_HELD, None, f - 1))
                at = la + 1
                if deadline <= now:
                    held.remove(f, la)
                    expired += la - f + 1
                    refused.append(AckOutcome(topic, partition, f, name, False, LOCK_EXPIRED, None, la))
                    continue
                for r in consumer.acknowledge_range(topic, partition, f, la, type):
                    held.remove(r.offset, r.last)
                    refused.append(AckOutcome(topic, partition, r.offset, name, False,
                                              EC.describe(r.error_code).name, None, r.last))
                if type != AckType.RENEW:
                    held.remove(f, la)
            if at <= last:
                refused.append(AckOutcome(topic, partition, at, name, False, NOT_HELD, None, last))
        if expired and self.metrics is not None:
            self.metrics.share_lock_expiries.labels(self.tenant).inc(expired)
        self._count(refused)
        return refused

    def _count(self, outcomes: Iterable[AckOutcome]) -> None:
        """kcg_share_acknowledgements_total: one increment per (type, outcome) of a batch, not per record."""
        if self.metrics is None:
            return
        counts: dict[tuple[str, bool], int] = {}
        for o in outcomes:
            counts[(o.type, o.applied)] = counts.get((o.type, o.applied), 0) + o.count
        for (type, applied), n in counts.items():
            self.metrics.share_acks.labels(self.tenant, type, "applied" if applied else "refused").inc(n)

    def _keep(self, o: AckOutcome) -> None:
        """An answer nobody waits for: kept for GET .../acknowledgements (the oldest go beyond the limit)."""
        self.outcomes.append(o)
        self.kept += o.count
        while self.kept > MAX_KEPT_OUTCOMES:
            old = self.outcomes[0]
            over = self.kept - MAX_KEPT_OUTCOMES
            if old.count <= over:
                self.outcomes.popleft()
                self.kept -= old.count
            else:
                self.outcomes[0] = old.part(old.offset + over, old.last)
                self.kept -= over

    def _absorb(self, results: list[AckResult]) -> None:
        """Answers of the broker: renewals move the lock deadline; each answer goes to the request waiting for
        it, else to the kept outcomes."""
        if not results:
            return
        names = self.client.metadata.topic_names
        now = time.monotonic()
        lock = max((s.lock_timeout_ms for s in self.consumer.sessions.values()), default=0) if self.consumer else 0
        answered: list[AckOutcome] = []
        last_id: object = None
        topic = ""
        for r in results:
            if r.topic_id is not last_id:  # answers come in runs per partition: look the name up once per run
                last_id = r.topic_id
                topic = names.get(r.topic_id) or str(r.topic_id)
            name = TYPE_NAMES.get(r.type, r.type.name.lower())
            first, last = r.offset, r.last
            deadline = None
            if r.type == AckType.RENEW:
                held = self.held.get((topic, r.partition))
                if held is not None:
                    if r.applied:
                        deadline = now + lock / 1000
                        for f, la, (c, _) in held.pieces(first, last):
                            held.assign(f, la, (c, deadline))
                    else:
                        held.remove(first, last)
            o = AckOutcome(topic, r.partition, first, name, r.applied,
                           None if r.applied else EC.describe(r.error_code).name, deadline, last)
            answered.append(o)
            taken: list[tuple[int, int]] = []
            for w in self._waiters:
                taken += w.take(o)
            if not taken:
                self._keep(o)
            else:
                for f, la in subtract(first, last, sorted(taken)):
                    self._keep(o.part(f, la))
        self._count(answered)

    async def acknowledge(self, acks: list[AckRange], *, wait: bool, linger: float) -> list[AckOutcome]:
        """Queue ``acks`` (runs of offsets); with ``wait`` send them now (ShareAcknowledge, unless a ShareFetch
        in flight takes them) and answer every offset with the broker's word; without, answer the refused ones
        and let the rest ride on the next poll, or go out alone after ``linger`` seconds. The answers are runs
        of offsets with one outcome each, in the order of ``acks``."""
        consumer = self.consumer
        waiter = None
        if wait:
            waiter = _Waiter()
            for t, p, f, la, ty in acks:
                want = waiter.want.get((t, p, TYPE_NAMES[ty]))
                if want is None:
                    want = waiter.want[(t, p, TYPE_NAMES[ty])] = RunMap()
                want.assign(f, la, True)
            self._waiters.append(waiter)
        try:
            refused = self._queue(acks)
            if waiter is None:
                if consumer is not None and sum(o.count for o in refused) < sum(la - f + 1 for _, _, f, la, _ in acks):
                    self._schedule_flush(linger)
                return refused
            for o in refused:
                waiter.take(o)
            for _ in range(20):
                if waiter.done:
                    break
                if consumer is not None:
                    self._absorb(await consumer.commit())
                if waiter.done:
                    break
                await asyncio.sleep(0.05)  # an answer still on its way (a ShareFetch in flight carries it)
            return _in_order(acks, waiter.got)
        finally:
            if waiter is not None:
                self._waiters.remove(waiter)

    def _schedule_flush(self, linger: float) -> None:
        if self.flusher is not None and not self.flusher.done():
            return

        async def flush() -> None:
            await asyncio.sleep(linger)
            if self.consumer is not None and not self.closed:
                try:
                    self._absorb(await self.consumer.commit())
                except Exception:
                    log.exception("share consumer instance %s: sending acknowledgements failed", self.name)

        self.flusher = asyncio.create_task(flush(), name=f"share-ack-flush-{self.name}")

    def take_outcomes(self) -> list[AckOutcome]:
        out = list(self.outcomes)
        self.outcomes.clear()
        self.kept = 0
        return out

    # -- closing --------------------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Leave the share group: implicit mode accepts what the last poll returned, everything else still held
        is released (redelivered at once, not after its lock)."""
        if self.closed:
            return
        self.closed = True
        if self.flusher is not None and not self.flusher.done():
            self.flusher.cancel()
            with contextlib.suppress(BaseException):
                await self.flusher
        consumer = self.consumer
        if consumer is None:
            return
        if self.options.ack_mode == "implicit" and self.previous:
            self._queue(self.previous)
            self.previous = []
        try:
            self._absorb(await consumer.close())
        finally:
            self.held.clear()
            self.release_charge(consumer.take_charged())  # a poll cancelled before it took its charge


def _in_order(acks: list[AckRange], got: list[AckOutcome]) -> list[AckOutcome]:
    """The answers of a waiting request, in the order of its acknowledgements, each run's offsets in order; an
    offset without an answer is NO_ANSWER."""
    by: dict[tuple[str, int, str], list[AckOutcome]] = {}
    for o in got:
        by.setdefault((o.topic, o.partition, o.type), []).append(o)
    lasts: dict[tuple[str, int, str], list[int]] = {}
    for k, v in by.items():
        v.sort(key=lambda o: o.offset)
        lasts[k] = [o.last for o in v]
    out: list[AckOutcome] = []
    for t, p, f, la, ty in acks:
        name = TYPE_NAMES[ty]
        key = (t, p, name)
        mine = by.get(key, [])
        i = bisect_left(lasts[key], f) if mine else 0
        at = f
        for o in mine[i:]:
            if o.offset > la:
                break
            lo, hi = max(o.offset, f), min(o.last, la)
            if lo > at:
                out.append(AckOutcome(t, p, at, name, False, "NO_ANSWER", None, lo - 1))
            out.append(o if (lo, hi) == (o.offset, o.last) else o.part(lo, hi))
            at = hi + 1
        if at <= la:
            out.append(AckOutcome(t, p, at, name, False, "NO_ANSWER", None, la))
    return out


@dataclass
class _TenantShares:
    instances: dict[tuple[str, str], ShareInstance] = field(default_factory=dict)


class ShareRegistry:
    """Every share consumer instance of this process, per tenant; idle ones expire, all close on shutdown."""

    def __init__(self, *, idle_timeout: float = 300.0, max_poll_timeout: float = 30.0, ack_linger: float = 0.1,
                 max_instances: int | None = None, replica_id: str = "r0", metrics: Any = None,
                 budget: Any = None) -> None:
        self.idle_timeout = idle_timeout
        self.max_poll_timeout = max_poll_timeout
        self.ack_linger = ack_linger
        self.max_instances = max_instances
        self.replica_id = replica_id
        self.metrics = metrics
        self.budget = budget  # the process memory budget, charged for acquired records
        self.tenants: dict[str, _TenantShares] = {}
        self._expired: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self.draining = False
        #: set by the routing layer with peers: whether this replica owns (share group, name) in the ring, so
        #: a generated name is one this replica owns (requests for it reach it without a lookup)
        self.name_placement: Callable[[str, str], bool] | None = None
        #: set by the routing layer with peers: counts each tenant's share instances across the replica set
        #: (under :func:`share_quota_key`); None: this replica's count is the tenant's count
        self.instance_quota: InstanceQuotaCoordinator | None = None

    @property
    def instance_count(self) -> int:
        return sum(len(t.instances) for t in self.tenants.values())

    def start(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_loop(), name="share-instance-reaper")

    async def create(self, tenant: str, client: KafkaClient, group: str, options: ShareOptions,
                     name: str | None, tenant_max_instances: int | None = None) -> ShareInstance:
        if self.draining:
            raise GatewayError("the gateway is shutting down; create the instance again (on another replica)",
                               status=503, error_code=50301, headers={"Retry-After": "1"})
        shares = self.tenants.setdefault(tenant, _TenantShares())
        if name is None:
            name = self._generated_name(group)
        elif not NAME_RE.fullmatch(name):
            raise GatewayError("name must be 1-200 characters of letters, digits, '.', '_' or '-'",
                               status=422, error_code=42206)
        group = sys.intern(group)
        key = (group, name)
        if key in shares.instances:
            raise ShareInstanceExists(f"share consumer instance {name!r} already exists in share group {group!r}")
        for limit, whose in ((tenant_max_instances, f"tenant {tenant!r}"), (self.max_instances, "this replica")):
            count = len(shares.instances) if whose.startswith("tenant") else self.instance_count
            if limit is not None and count >= limit:
                raise GatewayError(f"{whose} reached its limit of {limit} share consumer instances", status=429,
                                   error_code=42901, headers={"Retry-After": "1"})
        token = None
        if tenant_max_instances is not None and self.instance_quota is not None:
            # one of the tenant's share-instance slots across the replica set, from its owner of record (429 / 503)
            token = await self.instance_quota.acquire(share_quota_key(tenant), tenant_max_instances,
                                                      what="share consumer instances")
            if key in shares.instances or self.draining:  # created meanwhile / SIGTERM meanwhile
                await self.instance_quota.release(share_quota_key(tenant), token)
                if self.draining:
                    raise GatewayError("the gateway is shutting down; create the instance again (on another "
                                       "replica)", status=503, error_code=50301, headers={"Retry-After": "1"})
                raise ShareInstanceExists(f"share consumer instance {name!r} already exists in share group "
                                          f"{group!r}")
        inst = ShareInstance(tenant, group, name, options, client, metrics=self.metrics, budget=self.budget,
                             quota_token=token)
        if self.metrics is not None:
            # the tenant's series exist from its first instance on: rate() sees the first event, a panel shows 0
            for counter in (self.metrics.share_acquired, self.metrics.share_redelivered,
                            self.metrics.share_lock_expiries):
                counter.labels(tenant)
        shares.instances[key] = inst
        if token is not None and self.instance_quota is not None:
            self.instance_quota.settle(share_quota_key(tenant), token)
        self._expired.pop((tenant, group, name), None)
        return inst

    def quota_tokens(self, tenant: str) -> list[str]:
        """The reservations of this replica's share instances of ``tenant`` (what it reports to the owner of
        record)."""
        shares = self.tenants.get(tenant)
        return [i.quota_token for i in shares.instances.values() if i.quota_token] if shares is not None else []

    async def _release_quota(self, inst: ShareInstance) -> None:
        """Give the instance's slot back to its tenant's owner of record (best effort: its sync corrects)."""
        token, inst.quota_token = inst.quota_token, None
        if token is not None and self.instance_quota is not None:
            try:
                await self.instance_quota.release(share_quota_key(inst.tenant), token)
            except Exception:  # never fails a delete or the reaper
                log.exception("releasing the quota slot of share consumer instance %s failed", inst.name)

    def _generated_name(self, group: str) -> str:
        name = f"rest-share-{self.replica_id}-{uuid.uuid4()}"
        placement = self.name_placement
        for _ in range(NAME_PLACEMENT_TRIES if placement is not None else 0):
            if placement is not None and placement(group, name):
                break
            name = f"rest-share-{self.replica_id}-{uuid.uuid4()}"
        return name

    def holds(self, group: str, name: str) -> bool:
        """Whether a share instance (group, name) of any tenant lives in this replica (routing)."""
        key = (group, name)
        return any(key in t.instances for t in self.tenants.values())

    def get(self, tenant: str, group: str, name: str) -> ShareInstance:
        shares = self.tenants.get(tenant)
        inst = shares.instances.get((group, name)) if shares is not None else None
        if inst is None:
            if (tenant, group, name) in self._expired:
                raise ShareInstanceExpired(f"share consumer instance {name!r} of share group {group!r} expired "
                                           f"after {self.idle_timeout:.0f} s without requests; create it again")
            raise ShareInstanceNotFound(f"share consumer instance {name!r} not found in share group {group!r}")
        inst.touch()
        return inst

    async def delete(self, tenant: str, group: str, name: str) -> None:
        inst = self.get(tenant, group, name)
        self.tenants[tenant].instances.pop((group, name), None)
        await self._release_quota(inst)
        await inst.close()

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(5.0, self.idle_timeout / 4)))
            with contextlib.suppress(Exception):
                await self.reap()

    async def reap(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        victims = [(tenant, inst) for tenant, shares in self.tenants.items() for inst in shares.instances.values()
                   if inst.active_requests == 0 and now - inst.last_used > self.idle_timeout]
        for tenant, inst in victims:
            self.tenants[tenant].instances.pop((inst.group, inst.name), None)
            self._expired[(tenant, inst.group, inst.name)] = now
            log.info("share consumer instance %s (tenant %s, share group %s) expired after %.0f s idle",
                     inst.name, tenant, inst.group, self.idle_timeout)
            await self._release_quota(inst)
            try:
                await inst.close()
            except Exception:
                log.exception("closing share consumer instance %s failed", inst.name)
        while len(self._expired) > 100_000:
            self._expired.popitem(last=False)
        return len(victims)

    async def close(self, timeout: float = 10.0) -> None:
        """Close every instance (releasing what they hold, leaving their groups), within ``timeout``."""
        self.draining = True
        if self._reaper is not None:
            self._reaper.cancel()
        instances = [i for s in self.tenants.values() for i in s.instances.values()]
        for s in self.tenants.values():
            s.instances.clear()
        if not instances:
            return
        tasks = [asyncio.create_task(i.close(), name=f"close-share-{i.name}") for i in instances]
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        if pending:
            log.warning("%d share consumer instances did not close within %.1f s", len(pending), timeout)
