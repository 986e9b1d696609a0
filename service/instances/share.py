"""The registry of share consumer instances (share groups, KIP-932): tenants → share groups → instances.

A share consumer instance is one member of a share group, driven by the engine's ShareConsumer
(service/share/consumer.py) over its tenant's Kafka client. Like a consumer instance it is named by its client
(or gets a generated name), expires after the idle timeout (then a request for it answers 410), and is closed
on shutdown; closing releases every record it still holds, so other members get them at once.

On top of the engine it keeps what HTTP needs: the records it handed out with their delivery count and lock
deadline (an acknowledgement of a record not held, or whose lock ran out, is reported not applied and never
sent), the acknowledgement mode (implicit: each poll accepts what the previous one returned), and the answers to
acknowledgements that rode on a ShareFetch or went out later (``wait`` false), kept for ``GET
.../acknowledgements``. Queued acknowledgements ride on the next ShareFetch; when no poll comes within
``ack_linger`` they go out alone (ShareAcknowledge), so an idle client's outcomes are never left waiting.

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
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from service.client.client import KafkaClient
from service.errors import GatewayError
from service.instances.registry import NAME_PLACEMENT_TRIES
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.share.consumer import ShareConsumer, ShareRecord
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

Key = tuple[str, int, int]  # topic, partition, offset
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


@dataclass
class Held:
    delivery_count: int
    deadline: float  # monotonic


@dataclass(frozen=True)
class AckOutcome:
    topic: str
    partition: int
    offset: int
    type: str
    applied: bool
    error: str | None = None
    lock_deadline: float | None = None  # monotonic; renewals that applied


@dataclass
class ShareInstance:
    tenant: str
    group: str
    name: str
    options: ShareOptions
    client: KafkaClient
    consumer: ShareConsumer | None = None
    topics: list[str] = field(default_factory=list)
    held: dict[Key, Held] = field(default_factory=dict)
    previous: list[Key] = field(default_factory=list)  # implicit mode: what the last poll returned
    outcomes: OrderedDict[tuple[str, int, int, str], AckOutcome] = field(default_factory=OrderedDict)
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
    _awaited: dict[tuple[str, int, int, str], AckOutcome | None] = field(default_factory=dict)

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
                self._queue([(t, p, o, AckType.ACCEPT) for t, p, o in self.previous])
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
            for r in out:
                self.held[(r.topic, r.partition, r.offset)] = Held(r.delivery_count, r.lock_deadline)
            if self.options.ack_mode == "implicit":
                self.previous = [(r.topic, r.partition, r.offset) for r in out]
            if self.metrics is not None and out:
                self.metrics.share_acquired.labels(self.tenant).inc(len(out))
                again = sum(1 for r in out if r.delivery_count > 1)
                if again:
                    self.metrics.share_redelivered.labels(self.tenant).inc(again)
            return out, charge

    def _expire(self) -> None:
        now = time.monotonic()
        gone = [k for k, h in self.held.items() if h.deadline <= now]
        for k in gone:
            del self.held[k]
        if gone and self.metrics is not None:
            self.metrics.share_lock_expiries.labels(self.tenant).inc(len(gone))

    # -- acknowledging --------------------------------------------------------------------------------------------
    def _queue(self, acks: Iterable[tuple[str, int, int, AckType]]) -> list[AckOutcome]:
        """Queue acknowledgements with the engine; the ones refused at once (not held, lock expired)."""
        consumer = self.consumer
        refused: list[AckOutcome] = []
        now = time.monotonic()
        for topic, partition, offset, type in acks:
            key = (topic, partition, offset)
            held = self.held.get(key)
            name = TYPE_NAMES[type]
            if held is None or consumer is None:
                refused.append(AckOutcome(topic, partition, offset, name, False, NOT_HELD))
                continue
            if held.deadline <= now:
                del self.held[key]
                if self.metrics is not None:
                    self.metrics.share_lock_expiries.labels(self.tenant).inc()
                refused.append(AckOutcome(topic, partition, offset, name, False, LOCK_EXPIRED))
                continue
            at_once = consumer.acknowledge(topic, partition, offset, type)
            if at_once is not None:
                self.held.pop(key, None)
                refused.append(AckOutcome(topic, partition, offset, name, False, EC.describe(at_once.error_code).name))
                continue
            if type != AckType.RENEW:
                del self.held[key]
        self._count(refused)
        return refused

    def _count(self, outcomes: Iterable[AckOutcome]) -> None:
        """kcg_share_acknowledgements_total: one increment per (type, outcome) of a batch, not per record."""
        if self.metrics is None:
            return
        counts: dict[tuple[str, bool], int] = {}
        for o in outcomes:
            counts[(o.type, o.applied)] = counts.get((o.type, o.applied), 0) + 1
        for (type, applied), n in counts.items():
            self.metrics.share_acks.labels(self.tenant, type, "applied" if applied else "refused").inc(n)

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
            key = (topic, r.partition, r.offset)
            deadline = None
            if r.type == AckType.RENEW:
                held = self.held.get(key)
                if r.applied and held is not None:
                    held.deadline = deadline = now + lock / 1000
                elif not r.applied:
                    self.held.pop(key, None)
            o = AckOutcome(topic, r.partition, r.offset, name, r.applied,
                           None if r.applied else EC.describe(r.error_code).name, deadline)
            answered.append(o)
            okey = (topic, r.partition, r.offset, name)
            if okey in self._awaited:
                self._awaited[okey] = o
            else:
                self.outcomes[okey] = o
                self.outcomes.move_to_end(okey)
                while len(self.outcomes) > MAX_KEPT_OUTCOMES:
                    self.outcomes.popitem(last=False)
        self._count(answered)

    async def acknowledge(self, acks: list[tuple[str, int, int, AckType]], *, wait: bool,
                          linger: float) -> list[AckOutcome]:
        """Queue ``acks``; with ``wait`` send them now (ShareAcknowledge, unless a ShareFetch in flight takes
        them) and answer each with the broker's word; without, answer the refused ones and let the rest ride on
        the next poll, or go out alone after ``linger`` seconds."""
        consumer = self.consumer
        keys = [(t, p, o, TYPE_NAMES[ty]) for t, p, o, ty in acks]
        if wait:
            for k in keys:
                self._awaited[k] = None
        try:
            refused = {(o.topic, o.partition, o.offset, o.type): o for o in self._queue(acks)}
            if not wait:
                if consumer is not None and len(refused) < len(keys):
                    self._schedule_flush(linger)
                return list(refused.values())
            out: list[AckOutcome] = []
            for _ in range(20):
                if consumer is not None:
                    self._absorb(await consumer.commit())
                if all(k in refused or self._awaited.get(k) is not None for k in keys):
                    break
                await asyncio.sleep(0.05)  # an answer still on its way (a ShareFetch in flight carries it)
            for k in keys:
                got = refused.get(k) or self._awaited.get(k)
                out.append(got if got is not None else AckOutcome(k[0], k[1], k[2], k[3], False, "NO_ANSWER"))
            return out
        finally:
            for k in keys:
                self._awaited.pop(k, None)

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
        out = list(self.outcomes.values())
        self.outcomes.clear()
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
            self._queue([(t, p, o, AckType.ACCEPT) for t, p, o in self.previous])
            self.previous = []
        try:
            self._absorb(await consumer.close())
        finally:
            self.held.clear()
            self.release_charge(consumer.take_charged())  # a poll cancelled before it took its charge


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
