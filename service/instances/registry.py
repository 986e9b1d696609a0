"""The registry of consumer instances: tenants → groups → instances, lifecycle, idle expiry, budgets.

An instance's id is the name its client chose (as in the Confluent REST Proxy, whose clients build URLs
from that name); without a name the gateway generates one that names this replica
(``rest-consumer-<replica>-<uuid>``), but nothing relies on an id's text to find its owner. An instance
that was not used for ``idle_timeout`` is closed (leaving its group) and remembered for a while, so a late
request gets a distinct "expired" error instead of a plain "not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import re
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

from service.client.client import KafkaClient
from service.client.connection import ConnectionConfig
from service.client.errors import KafkaError
from service.cluster.topics import TopicCatalog
from service.consumer.consumer import Consumer, ConsumerConfig
from service.durable.descriptors import DEFAULT_TOPIC as DEFAULT_INSTANCES_TOPIC
from service.durable.descriptors import InstanceDescriptor
from service.durable.store import DescriptorStore
from service.errors import GatewayError
from service.group.coordinator_consumer import consumer_protocol_supported
from service.instances.budget import MemoryBudget
from service.producer.producer import Producer
from service.tenants.quotas import InstanceQuotaCoordinator

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
MAX_GROUP_ID_LENGTH = 249  # Kafka's limit on group ids (as on topic names)
# Control, format, surrogate and line/paragraph separator characters (no group id needs them; in logs,
# headers and URLs they forge lines or hide text).
_FORBIDDEN_GROUP_CLASS = (r"\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                          r"\u2060-\u206f\ufeff\ufff9-\ufffb")
# (surrogates too, which no UTF-8 URL can carry and which JSON Schema's regex dialects cannot name)
_FORBIDDEN_GROUP_CHARS = re.compile(f"[{_FORBIDDEN_GROUP_CLASS}\\ud800-\\udfff]")
GROUP_ID_PATTERN = f"^[^{_FORBIDDEN_GROUP_CLASS}]{{1,{MAX_GROUP_ID_LENGTH}}}$"  # the same rule, for the contract
# After the shutdown deadline: how long cancelled instance closes and the hard close of the broker
# connections may take before Gateway.close() returns anyway.
HARD_CLOSE_GRACE_S = 1.0
MAX_GROUP_INSTANCE_ID_LENGTH = 249  # Kafka's limit on group.instance.id (as on group ids)
_GROUP_INSTANCE_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
# A generated name must hash to the replica that creates it (service/ring.py): how many to try.
NAME_PLACEMENT_TRIES = 1000
NOT_FOUND_HINT = ("it may have been held by a gateway replica that stopped or restarted, or it was deleted: "
                  "create the consumer instance again")


def validate_group_id(group: str) -> None:
    """Raise 422/42206 unless ``group`` is a usable Kafka group id: 1-249 characters, none of them a control
    (or invisible formatting / line separator) character."""
    if not group:
        raise GatewayError("the consumer group id is empty", status=422, error_code=42206)
    if len(group) > MAX_GROUP_ID_LENGTH:
        raise GatewayError(f"the consumer group id is longer than {MAX_GROUP_ID_LENGTH} characters",
                           status=422, error_code=42206)
    bad = _FORBIDDEN_GROUP_CHARS.search(group)
    if bad is not None:
        raise GatewayError(f"the consumer group id contains the control character U+{ord(bad.group()):04X}",
                           status=422, error_code=42206)


class InstanceNotFound(GatewayError):
    status = 404
    error_code = 40403


def static_group_instance_id(replica_id: str, tenant: str, name: str) -> str:
    """The group.instance.id of an instance created with static membership and no id of its own:
    ``<replica_id>.<tenant>.<name>``. Kafka takes at most 249 of ``[A-Za-z0-9._-]``: a longer id, or one with
    other characters (from the tenant id), is cut and sanitised and ends with a hash of the full id, so
    distinct instances never share one."""
    raw = f"{replica_id}.{tenant}.{name}"
    if _GROUP_INSTANCE_ID_RE.fullmatch(raw):
        return raw
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:MAX_GROUP_INSTANCE_ID_LENGTH - len(digest) - 1]
    return f"{clean}-{digest}"


class GroupProtocolUnsupported(GatewayError):
    """group.protocol=consumer on a broker without the consumer group protocol (KIP-848), e.g. Tansu."""

    status = 409
    error_code = 40913


#: how long the create of a group.protocol=consumer instance waits for the broker's API versions
PROTOCOL_PROBE_TIMEOUT_S = 5.0
GROUP_PROTOCOLS = ("classic", "consumer")


class InstanceExpired(GatewayError):
    status = 410
    error_code = 41001


class InstanceExists(GatewayError):
    status = 409
    error_code = 40902


class TooManyInstances(GatewayError):
    status = 429
    error_code = 42901


class ShuttingDown(GatewayError):
    """New instances are refused while the gateway drains before exiting (SIGTERM)."""

    status = 503
    error_code = 50301


SHUTDOWN_MESSAGE = "gateway shutting down: commit your offsets and reconnect"


@dataclass
class InstanceOptions:
    format: str = "binary"  # binary | json | avro | protobuf | jsonschema
    avro_rendering: str | None = None  # avro's JSON rendering (confluent | karapace); None: the gateway's
    auto_offset_reset: str = "latest"
    auto_commit: bool = True
    # Confluent's instance configs, None when the client did not set them (api/v2/consumer_config.py:
    # poll_timeout_ms; Consumer.poll_batches' min_bytes): a records request returns once more than
    # fetch_min_bytes bytes are buffered; request_timeout_ms is the default and the cap of its timeout
    fetch_min_bytes: int | None = None
    request_timeout_ms: int | None = None
    isolation_level: str = "read_uncommitted"
    group_instance_id: str | None = None
    session_timeout_ms: int | None = None
    max_poll_records: int | None = None  # default max_records of a records request
    max_bytes: int | None = None  # default max_bytes of a records request
    # Kafka consumer properties the client set, as ConsumerConfig fields (heartbeat, fetch sizes, ...)
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class ConsumerInstance:
    tenant: str
    group: str
    instance_id: str
    name: str
    options: InstanceOptions
    consumer: Consumer
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    active_requests: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    #: the reservation of this instance with the tenant's owner of record (max_instances across replicas)
    quota_token: str | None = None
    #: what its descriptor records as the subscription ({"topics"} | {"pattern"} | {"partitions"} | None)
    subscription: dict[str, Any] | None = None
    created_wall: float = field(default_factory=time.time)
    described_at: float = 0.0  # when its descriptor was last written (monotonic; 0: never)
    recreated: bool = False  # re-created from its descriptor (durable instances)
    #: how many stream resumes took the instance over (an older stream ends before its next poll; api/v2/streams.py)
    stream_epoch: int = 0

    def touch(self) -> None:
        self.last_used = time.monotonic()


@dataclass
class TenantRuntime:
    """A tenant's own Kafka client (broker connections) and its instances."""

    tenant_id: str
    client: KafkaClient
    instances: dict[tuple[str, str], ConsumerInstance] = field(default_factory=dict)  # (group, id)
    # The tenant's producer (created on the first produce request; see service/producer); closed with the
    # gateway before the client.
    producer: Producer | None = None
    # The tenant's TopicCatalog (service/cluster/topics.py: cached topic metadata for /topics), created on first use.
    topics: TopicCatalog | None = None
    # The tenant's instance descriptors (service/durable: durable instances), started on first use.
    descriptors: DescriptorStore | None = None


class Gateway:
    def __init__(
        self,
        *,
        replica_id: str = "r0",
        idle_timeout: float = 300.0,
        max_poll_timeout: float = 30.0,
        prefetch_bytes: int = 16 * 1024 * 1024,
        memory_budget_bytes: int = 512 * 1024 * 1024,
        consumer_defaults: dict[str, Any] | None = None,
        client_factory: Callable[[str], KafkaClient] | None = None,
        max_instances: int | None = None,
        shutdown_timeout: float = 10.0,
        shutdown_concurrency: int = 256,
        static_membership: bool = False,
        durable_instances: bool = False,
        instances_topic: str = DEFAULT_INSTANCES_TOPIC,
        descriptor_timeout: float = 5.0,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9-]{1,40}", replica_id):
            raise ValueError("replica id must be 1-40 letters, digits or '-'")
        self.replica_id = replica_id
        self.idle_timeout = idle_timeout
        self.max_poll_timeout = max_poll_timeout
        self.prefetch_bytes = prefetch_bytes
        self.budget = MemoryBudget(memory_budget_bytes)
        self.consumer_defaults = consumer_defaults or {}
        self.max_instances = max_instances
        if shutdown_timeout <= 0 or shutdown_concurrency < 1:
            raise ValueError("the shutdown timeout must be > 0 and the shutdown concurrency >= 1")
        self.shutdown_timeout = shutdown_timeout
        self.shutdown_concurrency = shutdown_concurrency
        #: instances created without group.instance.id get one derived from this replica's id (KIP-345)
        self.static_membership = static_membership
        #: set by the routing layer (api/routing.py): whether this replica owns (group, name) in the ring;
        #: generated names are drawn until one it owns, so an unnamed instance stays where it was created
        self.name_placement: Callable[[str, str], bool] | None = None
        #: set by the routing layer with peers: counts each tenant's instances across the replica set
        #: (service/tenants/quotas.py); None: this replica's count is the tenant's count
        self.instance_quota: InstanceQuotaCoordinator | None = None
        self._client_factory = client_factory
        self.tenants: dict[str, TenantRuntime] = {}
        self._expired: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self.created_total = 0
        self.closed_total = 0
        self.expired_total = 0
        #: set at SIGTERM (start_draining): no record is handed out any more, streams end, new instances
        #: are refused, while commits and other requests for existing instances are still served
        self.draining = False
        self._pollers: set[asyncio.Task[Any]] = set()  # requests waiting in a poll (woken by draining)
        self._drain_cancelled: set[asyncio.Task[Any]] = set()
        self._drain_listeners: set[Callable[[], None]] = set()  # see on_drain
        #: durable instances (service/durable): every instance has a descriptor in the tenant's cluster, and
        #: an instance this replica is asked for but does not hold is re-created from it (see find_instance)
        self.durable_instances = durable_instances
        self.instances_topic = instances_topic
        self.descriptor_timeout = descriptor_timeout
        self.recreated_total = 0
        self.handed_off_total = 0
        self.moved_total = 0  # of handed_off_total: moved to a new ring owner (scale-out/in), not at SIGTERM
        self.descriptor_failures = 0
        # moves (move_instance): (group, name) being handed off here → set when done; requests for it wait
        # (serving), and how many requests for (group, name) are inside the app here
        self._moving: dict[tuple[str, str], asyncio.Event] = {}
        self._serving: dict[tuple[str, str], int] = {}
        self._idle: dict[tuple[str, str], asyncio.Event] = {}
        self._recreating: dict[tuple[str, str, str], asyncio.Lock] = {}

    # -- tenants -------------------------------------------------------------------------------------
    def register_tenant(self, tenant_id: str, client: KafkaClient) -> TenantRuntime:
        rt = self.tenants.get(tenant_id)
        if rt is None:
            rt = self.tenants[tenant_id] = TenantRuntime(tenant_id, client)
        return rt

    def tenant(self, tenant_id: str, bootstrap: str | None = None,
               connection: ConnectionConfig | None = None) -> TenantRuntime:
        rt = self.tenants.get(tenant_id)
        if rt is None:
            if self._client_factory is not None:
                client = self._client_factory(tenant_id)
            elif bootstrap is not None:
                client = KafkaClient(bootstrap, connection)
            else:
                raise GatewayError(f"tenant {tenant_id!r} has no Kafka connection", status=500, error_code=50001)
            rt = self.register_tenant(tenant_id, client)
        return rt

    @property
    def instance_count(self) -> int:
        return sum(len(rt.instances) for rt in self.tenants.values())

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_loop(), name="instance-reaper")

    def start_draining(self) -> None:
        """Stop handing out records (SIGTERM): fetching stops (every assigned partition is paused), polls in
        progress return [] at once and open streams end with a final shutdown line; idempotent."""
        if self.draining:
            return
        self.draining = True
        for rt in self.tenants.values():
            for inst in rt.instances.values():
                with contextlib.suppress(Exception):
                    inst.consumer.pause(inst.consumer.assignment())
        for task in self._pollers:
            if not task.done():
                self._drain_cancelled.add(task)
                task.cancel(msg="gateway draining")
        self._pollers.clear()
        for listener in list(self._drain_listeners):
            with contextlib.suppress(Exception):
                listener()

    def on_drain(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` when draining starts (at once if it has: e.g. a v3 produce stream stops reading
        records); returns the function that removes it."""
        if self.draining:
            listener()
            return lambda: None
        self._drain_listeners.add(listener)
        return lambda: self._drain_listeners.discard(listener)

    async def poll(self, inst: ConsumerInstance, max_records: int, max_bytes: int | None, timeout: float, *,
                   min_bytes: int | None = None, linger: float | None = None) -> list[tuple[Any, list[Any]]]:
        """``inst.consumer.poll_batches``, but [] at once when the gateway starts draining meanwhile.

        The waiting task itself is cancelled by :meth:`start_draining` (no extra task per poll): a poll is
        cancelled only while it waits, never after it took records from the buffer, so nothing is lost."""
        if self.draining:
            return []
        task = asyncio.current_task()
        assert task is not None
        self._pollers.add(task)
        try:
            return await inst.consumer.poll_batches(max_records, max_bytes, timeout, min_bytes=min_bytes,
                                                    linger=linger)
        except asyncio.CancelledError:
            if task in self._drain_cancelled and task.cancelling() == 1:
                task.uncancel()  # only our wake-up: not the client's disconnect nor the server's deadline
                return []
            raise
        finally:
            self._pollers.discard(task)
            self._drain_cancelled.discard(task)

    async def close(self) -> int:
        """Close every instance (final commit, LeaveGroup, fetch sessions), then the tenants' clients.

        Instances close concurrently (at most ``shutdown_concurrency`` at a time) within an overall
        deadline of ``shutdown_timeout`` seconds. Closes still running then are cancelled and every
        broker connection is closed hard; the brokers expire those members after their session timeout.
        Returns how many instances did not close cleanly (also logged as a warning).
        """
        deadline = time.monotonic() + self.shutdown_timeout
        self.start_draining()
        reaper = self._reaper
        if reaper is not None:
            reaper.cancel()  # it may be closing expired instances: bounded by the deadline below too
        instances = [i for rt in self.tenants.values() for i in rt.instances.values()]
        for rt in self.tenants.values():
            rt.instances.clear()
        slots = asyncio.Semaphore(self.shutdown_concurrency)

        async def close_one(inst: ConsumerInstance) -> bool:
            async with slots:
                return await self._close_instance(inst, hand_off=self.durable_instances)

        tasks = [asyncio.create_task(close_one(i), name=f"close-{i.instance_id}") for i in instances]
        waiting: set[asyncio.Task[Any]] = set(tasks)
        if reaper is not None and not reaper.done():
            waiting.add(reaper)
        pending: set[asyncio.Task[Any]] = set()
        if waiting:
            _, pending = await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
        for t in pending:
            t.cancel()
        producers = [rt.producer for rt in self.tenants.values() if rt.producer is not None]
        stores = [rt.descriptors for rt in self.tenants.values() if rt.descriptors is not None]
        for store in stores:  # descriptors stay: the instances are re-created elsewhere from them
            with contextlib.suppress(Exception):
                await asyncio.wait_for(store.stop(), 1.0)
        if producers:
            _, stuck = await asyncio.wait([asyncio.create_task(p.close()) for p in producers],
                                          timeout=max(0.1, deadline - time.monotonic()))
            for t in stuck:
                t.cancel()
        # Hard close: fails every request still waiting for an answer, so that cancelled closes stuck in
        # broker I/O end now. Bounded too: a connection's close waits at most 1 s for its socket.
        hard = {asyncio.create_task(rt.client.close(), name=f"close-client-{rt.tenant_id}")
                for rt in self.tenants.values()}
        if hard or pending:
            _, stuck = await asyncio.wait(hard | pending, timeout=HARD_CLOSE_GRACE_S)
            if stuck:
                log.warning("%d shutdown tasks (instance or connection closes) were still running %.1f s "
                            "into the hard close; abandoning them", len(stuck), HARD_CLOSE_GRACE_S)
        if reaper is not None:
            pending.discard(reaper)
        done = [t for t in tasks if t not in pending]
        failed = sum(1 for t in done if t.exception() is not None or not t.result())
        unclean = len(pending) + failed
        if unclean:
            log.warning("%d of %d consumer instances did not close cleanly within the %.1f s shutdown "
                        "timeout (%d still closing, cancelled; %d failed); their broker connections were "
                        "closed hard and their groups will expire them after the session timeout",
                        unclean, len(instances), self.shutdown_timeout, len(pending), failed)
        return unclean

    def generate_name(self, group: str | None = None) -> str:
        """An id for an instance created without a name (Confluent: ``rest-consumer-<server id>-<uuid>``).

        With routing (:attr:`name_placement`), one this replica owns in the ring (bounded number of draws:
        about N for N replicas; after that the last one, which the peers find by lookup)."""
        name = f"rest-consumer-{self.replica_id}-{uuid.uuid4()}"
        placement = self.name_placement
        if placement is None or group is None:
            return name
        for _ in range(NAME_PLACEMENT_TRIES):
            if placement(group, name):
                break
            name = f"rest-consumer-{self.replica_id}-{uuid.uuid4()}"
        return name

    def holds(self, group: str, instance_id: str) -> bool:
        """Whether a live instance (group, instance_id) of any tenant is in this replica (or being handed off
        from it: requests for it wait here until it is gone, see :meth:`serving`)."""
        key = (group, instance_id)
        return key in self._moving or any(key in rt.instances for rt in self.tenants.values())

    async def create_instance(self, rt: TenantRuntime, group: str, options: InstanceOptions,
                              name: str | None = None, tenant_max_instances: int | None = None,
                              recreated: bool = False) -> ConsumerInstance:
        if self.draining:
            raise ShuttingDown("the gateway is shutting down; create the instance again (on another replica)",
                               headers={"Retry-After": "1"})
        validate_group_id(group)
        group = sys.intern(group)  # one string per group, not per instance (memory per idle instance)
        if name is None:
            name = self.generate_name(group)
        elif not NAME_RE.fullmatch(name):
            raise GatewayError("name must be 1-200 characters of letters, digits, '.', '_' or '-'",
                               status=422, error_code=42206)
        instance_id = name
        key = (group, instance_id)
        if key in rt.instances:
            raise InstanceExists(f"consumer instance {name!r} already exists in group {group!r}")
        limit = tenant_max_instances
        if limit is not None and len(rt.instances) >= limit:
            raise TooManyInstances(f"tenant {rt.tenant_id!r} reached its limit of {limit} consumer instances",
                                   headers={"Retry-After": "1"})
        if self.max_instances is not None and self.instance_count >= self.max_instances:
            raise TooManyInstances(f"this gateway replica reached its limit of {self.max_instances} instances",
                                   headers={"Retry-After": "1"})
        # the protocol is resolved here (the gateway's default unless the client set one) and kept in the
        # options, so the instance's descriptor records it and a re-created instance keeps it
        protocol = options.overrides.get("group_protocol") or self.consumer_defaults.get("group_protocol", "classic")
        options.overrides["group_protocol"] = protocol
        if protocol == "consumer":
            await self._check_consumer_protocol(rt)
        token = None
        if limit is not None and self.instance_quota is not None:
            # one of the tenant's slots across the replica set, from its owner of record (429 / 503)
            token = await self.instance_quota.acquire(rt.tenant_id, limit)
            if key in rt.instances or self.draining:  # created meanwhile / SIGTERM meanwhile
                await self.instance_quota.release(rt.tenant_id, token)
                if self.draining:
                    raise ShuttingDown("the gateway is shutting down; create the instance again (on another "
                                       "replica)", headers={"Retry-After": "1"})
                raise InstanceExists(f"consumer instance {name!r} already exists in group {group!r}")
        try:
            inst = self._new_instance(rt, group, name, options)
        except BaseException:
            if token is not None and self.instance_quota is not None:
                await self.instance_quota.release(rt.tenant_id, token)
            raise
        inst.quota_token = token
        rt.instances[key] = inst
        if token is not None and self.instance_quota is not None:
            self.instance_quota.settle(rt.tenant_id, token)
        self._expired.pop((rt.tenant_id, group, instance_id), None)
        self.created_total += 1
        if not recreated:
            await self.describe(rt, inst)
        return inst

    async def _check_consumer_protocol(self, rt: TenantRuntime) -> None:
        """Refuse a consumer-protocol instance (409/40913) when the tenant's broker lacks the protocol (its API
        versions). A broker not reachable now does not refuse it: the instance's first records request then
        reports the same problem (the member checks its coordinator before joining)."""
        try:
            problem = await asyncio.wait_for(consumer_protocol_supported(rt.client), PROTOCOL_PROBE_TIMEOUT_S)
        except (KafkaError, TimeoutError, OSError) as exc:
            log.info("tenant %s: could not probe the broker for the consumer group protocol (%s); the instance's "
                     "first poll will tell", rt.tenant_id, exc)
            return
        if problem is not None:
            raise GroupProtocolUnsupported(
                f"group.protocol 'consumer' (KIP-848) is not available on this Kafka cluster: {problem}; "
                "create the instance with group.protocol 'classic'")

    def _new_instance(self, rt: TenantRuntime, group: str, name: str, options: InstanceOptions) -> ConsumerInstance:
        defaults = dict(self.consumer_defaults)
        if options.session_timeout_ms is not None:
            defaults["session_timeout_ms"] = options.session_timeout_ms
        defaults.update(options.overrides)
        if defaults.get("heartbeat_interval_ms", 0) >= defaults.get("session_timeout_ms", 45000):
            # A heartbeat interval must be below the session timeout: beat at a third of it, as Kafka advises
            defaults["heartbeat_interval_ms"] = max(1, defaults["session_timeout_ms"] // 3)
        group_instance_id = options.group_instance_id
        if group_instance_id is None and self.static_membership:
            group_instance_id = static_group_instance_id(self.replica_id, rt.tenant_id, name)
        cfg = ConsumerConfig(
            group_id=group,
            client_id=defaults.pop("client_id", None) or f"kcg-{rt.tenant_id}-{name}"[:200],
            group_instance_id=group_instance_id,
            auto_offset_reset=options.auto_offset_reset,
            enable_auto_commit=options.auto_commit,
            isolation_level=options.isolation_level,
            prefetch_max_bytes=self.prefetch_bytes,
            **defaults,
        )
        consumer = Consumer(rt.client, cfg)
        consumer.fetcher.budget = self.budget
        return ConsumerInstance(rt.tenant_id, group, name, name, options, consumer)

    async def _release_quota(self, inst: ConsumerInstance) -> None:
        """Give the instance's slot back to its tenant's owner of record (best effort: its sync corrects)."""
        token, inst.quota_token = inst.quota_token, None
        if token is not None and self.instance_quota is not None:
            try:
                await self.instance_quota.release(inst.tenant, token)
            except Exception:  # never fails a delete or the reaper
                log.exception("releasing the quota slot of consumer instance %s failed", inst.instance_id)

    def get_instance(self, rt: TenantRuntime, group: str, instance_id: str) -> ConsumerInstance:
        inst = rt.instances.get((group, instance_id))
        if inst is None:
            if (rt.tenant_id, group, instance_id) in self._expired:
                raise InstanceExpired(
                    f"consumer instance {instance_id!r} of group {group!r} expired after "
                    f"{self.idle_timeout:.0f} s without requests; create a new instance")
            raise InstanceNotFound(
                f"consumer instance {instance_id!r} not found in group {group!r}; {NOT_FOUND_HINT}")
        inst.touch()
        return inst

    async def delete_instance(self, rt: TenantRuntime, group: str, instance_id: str, *,
                              orphans: bool = False) -> None:
        """Close and forget the instance. With durable instances its descriptor gets a tombstone; with
        ``orphans`` (no replica holds it: the routing layer checked, or there are no peers) an instance that
        is only a descriptor (its replica died) is deleted too."""
        if orphans and (group, instance_id) not in rt.instances and await self._descriptor_of(rt, group, instance_id):
            await self._forget(rt, group, instance_id)
            return
        inst = self.get_instance(rt, group, instance_id)
        rt.instances.pop((group, instance_id), None)
        await self._release_quota(inst)
        await self._close_instance(inst)
        await self._forget(rt, group, instance_id)

    # -- durable instances ----------------------------------------------------------------------------
    def descriptors(self, rt: TenantRuntime) -> DescriptorStore | None:
        """The tenant's descriptor store (in the tenant's own cluster), started on first use; None without
        durable instances."""
        if not self.durable_instances:
            return None
        if rt.descriptors is None:
            rt.descriptors = DescriptorStore(rt.client, self.instances_topic, replica_id=self.replica_id)
            rt.descriptors.start()
        return rt.descriptors

    def _descriptor(self, inst: ConsumerInstance) -> InstanceDescriptor:
        return InstanceDescriptor(
            inst.tenant, inst.group, inst.name, options=dataclasses.asdict(inst.options),
            group_instance_id=inst.consumer.config.group_instance_id, subscription=inst.subscription,
            created=inst.created_wall, last_used=time.time() - max(0.0, time.monotonic() - inst.last_used))

    async def describe(self, rt: TenantRuntime, inst: ConsumerInstance,
                       subscription: dict[str, Any] | EllipsisType | None = ...) -> None:
        """Write the instance's descriptor (at creation, at each subscription change, and now and then
        while it is used). A failure is logged and counted, never raised: the instance works, it would
        just not survive its replica."""
        if subscription is not ...:
            inst.subscription = subscription
        store = self.descriptors(rt)
        if store is None or inst.closed:
            return
        try:
            await asyncio.wait_for(store.put(self._descriptor(inst)), self.descriptor_timeout)
            inst.described_at = time.monotonic()
        except Exception as exc:
            self.descriptor_failures += 1
            log.warning("could not write the descriptor of consumer instance %s (group %s): %s; it will not "
                        "survive this replica", inst.instance_id, inst.group, exc)

    async def _forget(self, rt: TenantRuntime, group: str, name: str) -> None:
        store = self.descriptors(rt)
        if store is None:
            return
        try:
            await asyncio.wait_for(store.tombstone(rt.tenant_id, group, name), self.descriptor_timeout)
        except Exception as exc:
            self.descriptor_failures += 1
            log.warning("could not delete the descriptor of consumer instance %s (group %s): %s", name, group, exc)

    async def _descriptor_of(self, rt: TenantRuntime, group: str, name: str) -> InstanceDescriptor | None:
        store = self.descriptors(rt)
        if store is None:
            return None
        if not await store.wait_caught_up(self.descriptor_timeout):
            log.warning("instance descriptors of tenant %s not read within %.0f s", rt.tenant_id,
                        self.descriptor_timeout)
            return None
        return store.get(rt.tenant_id, group, name)

    async def _expire_orphans(self, now: float | None = None) -> int:
        """Tombstone descriptors nobody used for twice the idle timeout (their replica died and their client never
        came back; a live instance's descriptor is refreshed every idle timeout / 4, an idle one is expired by its
        holder). Only the ring owner of a name does it (every replica without peers)."""
        now = time.time() if now is None else now
        placement = self.name_placement
        gone = 0
        for rt in list(self.tenants.values()):
            store = rt.descriptors
            if store is None or not store.caught_up:
                continue
            for desc in list(store.table.of_tenant(rt.tenant_id)):
                if (desc.group, desc.name) in rt.instances or now - desc.last_used <= 2 * self.idle_timeout:
                    continue
                if placement is not None and not placement(desc.group, desc.name):
                    continue
                log.info("consumer instance %s (tenant %s, group %s) unused for %.0f s and held by no replica: "
                         "its descriptor is deleted", desc.name, rt.tenant_id, desc.group, now - desc.last_used)
                await self._forget(rt, desc.group, desc.name)
                self._expired[(rt.tenant_id, desc.group, desc.name)] = time.monotonic()
                gone += 1
        return gone

    async def find_instance(self, rt: TenantRuntime, group: str, instance_id: str, *, recreate: bool = False,
                            resubscribe: Callable[[ConsumerInstance, dict[str, Any]], Awaitable[None]] | None = None
                            ) -> ConsumerInstance:
        """The instance, as :meth:`get_instance`; with ``recreate`` (no replica holds it: the routing layer
        checked, or there are no peers) an instance known only by its descriptor is re-created first: same
        options and static member id, its subscription or assignment applied by ``resubscribe`` (the API
        layer, which checks the tenant's topics), positions from the group's committed offsets."""
        key = (rt.tenant_id, group, instance_id)
        if recreate and self.durable_instances and (group, instance_id) not in rt.instances and not self.draining:
            lock = self._recreating.setdefault(key, asyncio.Lock())
            try:
                async with lock:
                    if (group, instance_id) not in rt.instances:
                        await self._recreate(rt, group, instance_id, resubscribe)
            finally:
                if not lock.locked():
                    self._recreating.pop(key, None)
        return self.get_instance(rt, group, instance_id)

    async def _recreate(self, rt: TenantRuntime, group: str, name: str,
                        resubscribe: Callable[[ConsumerInstance, dict[str, Any]], Awaitable[None]] | None) -> None:
        desc = await self._descriptor_of(rt, group, name)
        if desc is None:
            return
        fields = {f.name for f in dataclasses.fields(InstanceOptions)}
        opts = {k: v for k, v in desc.options.items() if k in fields}
        overrides = dict(opts.get("overrides") or {})
        if isinstance(overrides.get("assignment_strategies"), list):
            overrides["assignment_strategies"] = tuple(overrides["assignment_strategies"])
        opts["overrides"] = overrides
        opts["group_instance_id"] = desc.group_instance_id
        inst = await self.create_instance(rt, group, InstanceOptions(**opts), name, recreated=True)
        inst.recreated = True
        inst.created_wall = desc.created
        inst.subscription = desc.subscription
        self._expired.pop((rt.tenant_id, group, name), None)
        self.recreated_total += 1
        log.info("re-created consumer instance %s (tenant %s, group %s, static member %s) from its descriptor; "
                 "last held by replica %s", name, rt.tenant_id, group, desc.group_instance_id or "-",
                 desc.replica or "?")
        if desc.subscription and resubscribe is not None:
            try:
                await resubscribe(inst, desc.subscription)
            except Exception:
                log.exception("re-created consumer instance %s: its subscription %s could not be applied", name,
                              desc.subscription)
        await self.describe(rt, inst)

    async def _close_instance(self, inst: ConsumerInstance, *, hand_off: bool = False) -> bool:
        """Close the instance's consumer; False if that failed (it is never raised to the caller).
        ``hand_off``: the instance lives on (durable instances, this replica stops): a static member leaves its
        group too, so the replica that re-creates it joins a group without a departed member in it (a static
        member that stays behind stalls rebalances on some brokers: docs/groups.md)."""
        if inst.closed:
            return True
        inst.closed = True
        self.closed_total += 1
        if hand_off:
            self.handed_off_total += 1
        try:
            await inst.consumer.close(force_static_leave=hand_off)
        except Exception:  # closing must never fail the caller
            log.exception("closing consumer instance %s failed", inst.instance_id)
            return False
        return True

    # -- moves: the ring owner of a held instance changed (durable instances; api/replicas/moves.py) --------
    @contextlib.asynccontextmanager
    async def serving(self, group: str, name: str) -> AsyncIterator[None]:
        """Around a request for (group, name) that this replica's routes serve (the routing layer): it waits
        while the instance is being handed off here (afterwards it is gone and the request goes on to the new
        owner), and it is counted, so that a hand-off starts only between requests."""
        key = (group, name)
        while (gate := self._moving.get(key)) is not None:
            await gate.wait()
        self._serving[key] = self._serving.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._serving[key] - 1
            if left:
                self._serving[key] = left
            else:
                del self._serving[key]
                idle = self._idle.get(key)
                if idle is not None:
                    idle.set()

    async def move_instance(self, tenant: str, group: str, name: str, target: str, *,
                            wait: float | None = None) -> bool:
        """Hand the instance off because ``target`` became its ring owner (the replica set changed), the same
        way as at SIGTERM: closed with a LeaveGroup (static members too), its descriptor kept, so that its
        next request reaches ``target``, which re-creates it (same static member id, positions from the
        committed offsets). Only between requests: new requests for it wait meanwhile (:meth:`serving`), a
        poll or a commit in progress finishes first, an open stream ends before its next poll (at a record
        boundary, as when a resume takes the instance over). False (it stays) when it is gone, this replica
        drains, its descriptor is not current, or its requests did not end within ``wait`` seconds (default:
        the poll timeout cap + 5 s)."""
        key = (group, name)
        rt = self.tenants.get(tenant)
        inst = rt.instances.get(key) if rt is not None else None
        if rt is None or inst is None or not self.durable_instances or self.draining or key in self._moving:
            return False
        if not await self._descriptor_current(rt, inst):
            log.warning("consumer instance %s (tenant %s, group %s) stays here although replica %s owns it now: "
                        "its descriptor could not be written", name, tenant, group, target)
            return False
        if rt.instances.get(key) is not inst or self.draining or key in self._moving:
            return False
        deadline = time.monotonic() + (self.max_poll_timeout + 5.0 if wait is None else wait)
        gate = self._moving[key] = asyncio.Event()
        try:
            while self._serving.get(key):
                left = deadline - time.monotonic()
                if self.draining:
                    return False  # SIGTERM meanwhile: the shutdown hands it off
                if left <= 0:
                    log.info("consumer instance %s (tenant %s, group %s) stays here for now: its requests did not "
                             "end within %.0f s", name, tenant, group,
                             self.max_poll_timeout + 5.0 if wait is None else wait)
                    return False
                idle = self._idle[key] = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._end_streams(inst), left)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(idle.wait(), min(left, 0.5))
            if rt.instances.get(key) is not inst or self.draining:
                return False
            rt.instances.pop(key)
            log.info("consumer instance %s (tenant %s, group %s) moves to replica %s, its new ring owner: handed "
                     "off here (LeaveGroup), re-created there at its next request", name, tenant, group, target)
            await asyncio.shield(self._hand_off_moved(inst))
            return True
        finally:
            self._idle.pop(key, None)
            del self._moving[key]
            gate.set()

    async def _hand_off_moved(self, inst: ConsumerInstance) -> None:
        self.moved_total += 1
        await self._close_instance(inst, hand_off=True)
        await self._release_quota(inst)

    @staticmethod
    async def _end_streams(inst: ConsumerInstance) -> None:
        """An open stream of the instance ends before its next poll (after the one in progress, if any)."""
        async with inst.lock:
            inst.stream_epoch += 1

    async def _descriptor_current(self, rt: TenantRuntime, inst: ConsumerInstance) -> bool:
        """Whether the tenant's descriptors have the instance as it is now (else its new owner could not
        re-create it, or would re-create an older subscription); written again when they do not."""
        store = self.descriptors(rt)
        if store is None:
            return False

        def current() -> bool:
            desc = store.get(rt.tenant_id, inst.group, inst.name)
            return (desc is not None and desc.subscription == inst.subscription
                    and desc.group_instance_id == inst.consumer.config.group_instance_id)

        if not current():
            await self.describe(rt, inst)
        return bool(current())

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(5.0, self.idle_timeout / 4)))
            await self.reap()

    async def reap(self, now: float | None = None) -> int:
        """Close instances idle for longer than the idle timeout; returns how many."""
        now = time.monotonic() if now is None else now
        victims: list[tuple[TenantRuntime, ConsumerInstance]] = []
        for rt in self.tenants.values():
            for inst in rt.instances.values():
                if inst.active_requests == 0 and now - inst.last_used > self.idle_timeout:
                    victims.append((rt, inst))
        for rt, inst in victims:
            rt.instances.pop((inst.group, inst.instance_id), None)
            self._expired[(inst.tenant, inst.group, inst.instance_id)] = now
            log.info("consumer instance %s (tenant %s, group %s) expired after %.0f s idle",
                     inst.instance_id, inst.tenant, inst.group, self.idle_timeout)
            await self._release_quota(inst)
            await self._close_instance(inst)
            await self._forget(rt, inst.group, inst.instance_id)
            self.expired_total += 1
        if self.durable_instances:
            # a descriptor's last-used time follows the instance's (at most every idle timeout / 4), so the
            # descriptor of an instance in use never looks abandoned
            mono = time.monotonic()
            for rt in list(self.tenants.values()):
                for inst in list(rt.instances.values()):
                    if inst.last_used > inst.described_at and mono - inst.described_at > self.idle_timeout / 4:
                        await self.describe(rt, inst)
            await self._expire_orphans()
        while len(self._expired) > 100_000:
            self._expired.popitem(last=False)
        return len(victims)
