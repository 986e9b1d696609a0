"""``TestCluster``: n test brokers on 127.0.0.1 sharing one :class:`ClusterState`, fault injectors and a
request log. Use it as ``async with TestCluster(n_brokers=3, topics={"t": 6}) as cluster: ...``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import ssl
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType

from service.protocol.records import build_batch
from tests.fakes.broker.faults import Fault, FaultInjector, RequestPredicate
from tests.fakes.broker.fetch_sessions import (
    DEFAULT_CACHE_SLOTS,
    DEFAULT_EVICTION_MS,
    BrokerFetchSession,
    FetchSessionCache,
    FetchSessions,
    FetchSessionStats,
)
from tests.fakes.broker.handlers import default_registry
from tests.fakes.broker.handlers.fetch import EXTENSION_KEY as FETCH_SESSIONS_KEY
from tests.fakes.broker.handlers.fetch import PARTIAL_BATCHES_KEY, ZERO_TOPIC_IDS_KEY
from tests.fakes.broker.log import Predicate, RequestLog, RequestLogEntry
from tests.fakes.broker.partition_log import PartitionLog, RecordLike
from tests.fakes.broker.registry import HandlerRegistry
from tests.fakes.broker.sasl_server import ALL_MECHANISMS, CredentialStore
from tests.fakes.broker.server import MAX_REQUEST_SIZE, BrokerServer, ClientConnection
from tests.fakes.broker.state import BrokerInfo, ClusterState, PartitionState, TopicState

VersionRange = tuple[int, int]


class BrokerHandlerError(AssertionError):
    """A handler (or the broker itself) raised while serving a request; the test should not pass."""


class TestCluster:
    """A cluster of protocol-level test brokers.

    Example::

        async with TestCluster(3, topics={"orders": 6}, sasl_mechanisms=["SCRAM-SHA-512"],
                               users={"alice": "secret"}) as cluster:
            cluster.error(ApiKey.METADATA, EC.LEADER_NOT_AVAILABLE, node_id=0)
            cluster.drop_connection(ApiKey.FETCH, count=2)
            ... point the client under test at cluster.bootstrap_servers ...
            await cluster.wait_for_requests(ApiKey.METADATA, count=2)
            assert cluster.api_keys(node_id=1) == [ApiKey.API_VERSIONS, ...]
            cluster.move_leader("orders", 0, to=2)          # leader epoch + 1
            await cluster.stop_broker(1)                      # fail-over; start_broker(1) brings it back

    Args:
        n_brokers: number of brokers; node ids are ``node_ids`` or ``0..n-1``.
        topics: topics to create up front, name -> partition count.
        sasl_mechanisms: enable SASL on every broker with these mechanisms (``"PLAIN"``,
            ``"SCRAM-SHA-256"``, ``"SCRAM-SHA-512"``); ``None`` disables SASL.
        users: user name -> password, for PLAIN and SCRAM.
        scram_iterations: PBKDF2 iterations of the stored SCRAM credentials.
        api_versions: cluster-wide ApiVersions override, api key -> (min, max) to narrow the advertised
            range or ``None`` to remove the API; per broker: ``set_api_versions(..., node_id=)``.
        cluster_id, controller_id: reported in Metadata (defaults: random id, lowest live node id).
        auto_create_topics: Metadata creates unknown topics (``default_partitions`` partitions) when the
            request allows it.
        replication_factor: default replication factor (default ``min(3, n_brokers)``).
        racks: node id -> rack, reported in Metadata.
        registry: handler registry (default :func:`tests.fakes.broker.handlers.default_registry`).
        advertise_all_codecs: ApiVersions lists every API our codecs implement, not only the ones with
            a handler (a request for an API without a handler closes the connection).
        raise_handler_errors: leaving ``async with`` raises :class:`BrokerHandlerError` if a handler
            crashed during the test (and the test itself did not fail).
        fetch_sessions: brokers create incremental fetch sessions (False: always answer session id 0,
            like Tansu); see :mod:`tests.fakes.broker.fetch_sessions`.
        fetch_session_cache_slots, fetch_session_eviction_ms: the per-broker session cache size and the
            idle time after which a session may be evicted (Kafka: 1,000 and 120 s).
        fetch_session_clock: milliseconds clock of the session caches (e.g. a
            :class:`tests.fakes.broker.fetch_sessions.ManualClock`); default: monotonic time.
        fetch_session_ids: source of new session ids (default: random in 1..2^31-2).
        fetch_partial_batches: a Fetch partition whose next batch does not fit also returns the leading
            bytes that fit (Kafka's byte-range reads); default: whole batches only.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        n_brokers: int = 1,
        *,
        node_ids: Sequence[int] | None = None,
        host: str = "127.0.0.1",
        topics: Mapping[str, int] | None = None,
        sasl_mechanisms: Sequence[str] | None = None,
        users: Mapping[str, str] | None = None,
        scram_iterations: int = 4096,
        api_versions: Mapping[int, VersionRange | None] | None = None,
        cluster_id: str | None = None,
        controller_id: int | None = None,
        auto_create_topics: bool = False,
        default_partitions: int = 1,
        replication_factor: int | None = None,
        racks: Mapping[int, str] | None = None,
        registry: HandlerRegistry | None = None,
        advertise_all_codecs: bool = False,
        max_request_size: int = MAX_REQUEST_SIZE,
        raise_handler_errors: bool = True,
        ssl_context: ssl.SSLContext | None = None,
        fetch_sessions: bool = True,
        fetch_session_cache_slots: int = DEFAULT_CACHE_SLOTS,
        fetch_session_eviction_ms: float = DEFAULT_EVICTION_MS,
        fetch_session_clock: Callable[[], float] | None = None,
        fetch_session_ids: Callable[[], int] | None = None,
        fetch_partial_batches: bool = False,
    ) -> None:
        ids = list(node_ids) if node_ids is not None else list(range(n_brokers))
        if len(ids) != n_brokers or len(set(ids)) != len(ids) or n_brokers < 1:
            raise ValueError("need n_brokers >= 1 distinct node ids")
        if sasl_mechanisms is not None:
            unknown = set(sasl_mechanisms) - set(ALL_MECHANISMS)
            if unknown:
                raise ValueError(f"unsupported SASL mechanisms {sorted(unknown)}")
        self.host = host
        self.state = ClusterState(
            cluster_id=cluster_id,
            controller_id=controller_id,
            auto_create_topics=auto_create_topics,
            default_partitions=default_partitions,
            default_replication_factor=replication_factor,
        )
        self.registry = registry if registry is not None else default_registry()
        self.credentials = CredentialStore(scram_iterations)
        for name, password in (users or {}).items():
            self.credentials.add_user(name, password)
        self.api_versions_override: dict[int, VersionRange | None] = dict(api_versions or {})
        self.faults = FaultInjector()  # cluster-wide faults; each broker has its own too
        self.log = RequestLog()
        self.errors: list[BaseException] = []
        self.max_request_size = max_request_size
        self.advertise_all_codecs = advertise_all_codecs
        self.raise_handler_errors = raise_handler_errors
        self._conn_ids = itertools.count(1)
        self.brokers: dict[int, BrokerServer] = {}
        for node_id in ids:
            mechs = list(sasl_mechanisms) if sasl_mechanisms is not None else None
            self.brokers[node_id] = BrokerServer(self, node_id, host, 0, sasl_mechanisms=mechs,
                                                 ssl_context=ssl_context)
            self.state.add_broker(BrokerInfo(node_id, host, 0, rack=(racks or {}).get(node_id), alive=True))
        self.state.extensions[FETCH_SESSIONS_KEY] = FetchSessions(
            enabled=fetch_sessions, max_entries=fetch_session_cache_slots, eviction_ms=fetch_session_eviction_ms,
            clock=fetch_session_clock, id_factory=fetch_session_ids)
        self.state.extensions[PARTIAL_BATCHES_KEY] = fetch_partial_batches
        for name, partitions in (topics or {}).items():
            self.state.create_topic(name, partitions)

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> TestCluster:
        try:
            for node_id, broker in self.brokers.items():
                await broker.start()
                self.state.brokers[node_id].port = broker.port
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        for broker in self.brokers.values():
            await broker.stop()

    async def __aenter__(self) -> TestCluster:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
        if exc_type is None and self.errors and self.raise_handler_errors:
            raise BrokerHandlerError(f"test broker handler errors: {self.errors!r}") from self.errors[0]

    def next_connection_id(self) -> int:
        return next(self._conn_ids)

    # -- brokers -------------------------------------------------------------------------------------
    def broker(self, node_id: int) -> BrokerServer:
        return self.brokers[node_id]

    @property
    def node_ids(self) -> list[int]:
        return sorted(self.brokers)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [self.brokers[n].address for n in self.node_ids]

    @property
    def bootstrap_servers(self) -> str:
        """``host:port,host:port,...`` of every broker (running or not)."""
        return ",".join(f"{h}:{p}" for h, p in self.addresses)

    async def stop_broker(self, node_id: int, *, failover: bool = True) -> list[tuple[str, int]]:
        """Stop one broker's listener and close its connections. With ``failover`` the partitions it led
        move to another in-sync replica (leader epoch bumped) or become leaderless; without, they stay
        leaderless until it is back. Returns the (topic, partition) pairs whose leader changed."""
        changed = self.state.broker_stopped(node_id, failover=failover)
        await self.brokers[node_id].stop()
        return changed

    async def start_broker(self, node_id: int) -> list[tuple[str, int]]:
        """Start a stopped broker again on the same port; it rejoins ISRs and leads leaderless partitions."""
        broker = self.brokers[node_id]
        await broker.start()
        self.state.brokers[node_id].port = broker.port
        return self.state.broker_started(node_id)

    async def restart_broker(self, node_id: int, *, failover: bool = True) -> None:
        await self.stop_broker(node_id, failover=failover)
        await self.start_broker(node_id)

    def connections(self, node_id: int | None = None) -> list[ClientConnection]:
        brokers = [self.brokers[node_id]] if node_id is not None else list(self.brokers.values())
        return [c for b in brokers for c in b.connections]

    async def close_connections(self, node_id: int | None = None) -> int:
        """Close every current client connection (of one broker, or all); returns how many."""
        brokers = [self.brokers[node_id]] if node_id is not None else list(self.brokers.values())
        n = 0
        for b in brokers:
            n += await b.close_connections()
        return n

    def set_api_versions(self, overrides: Mapping[int, VersionRange | None], *, node_id: int | None = None) -> None:
        """Replace the ApiVersions override of one broker (or the cluster-wide one)."""
        target = self.brokers[node_id].api_versions_override if node_id is not None else self.api_versions_override
        target.clear()
        target.update(overrides)

    # -- topics --------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int | None = None, *, replication_factor: int | None = None,
                     topic_id: uuid.UUID | None = None, assignments: Mapping[int, Sequence[int]] | None = None,
                     internal: bool = False, configs: Mapping[str, str] | None = None) -> TopicState:
        return self.state.create_topic(name, partitions, replication_factor=replication_factor, topic_id=topic_id,
                                       assignments=assignments, internal=internal, configs=configs)

    def delete_topic(self, name: str) -> TopicState:
        return self.state.delete_topic(name)

    def topic(self, name: str) -> TopicState:
        return self.state.topic(name)

    def partition(self, topic: str, partition: int) -> PartitionState:
        return self.state.partition(topic, partition)

    def leader_of(self, topic: str, partition: int) -> int:
        return self.state.partition(topic, partition).leader

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader node id (-1: none)."""
        return {p.index: p.leader for p in self.state.topic(topic).partitions}

    def move_leader(self, topic: str, partition: int, to: int | None = None) -> PartitionState:
        """Move a partition's leadership (default: to the next live replica) and bump its leader epoch."""
        return self.state.move_leader(topic, partition, to)

    # -- partition logs ------------------------------------------------------------------------------
    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        """The stored batches, offsets and transaction state of one partition."""
        return self.state.partition(topic, partition).log

    def _append_time(self, topic: str) -> int | None:
        ts_type = self.state.topic(topic).configs.get("message.timestamp.type", "")
        return int(time.time() * 1000) if ts_type.lower() == "logappendtime" else None

    def append(self, topic: str, partition: int, records: Iterable[RecordLike], *, compression: int = 0,
               producer_id: int = -1, producer_epoch: int = 0, transactional: bool = False,
               timestamp: int | None = None, base_sequence: int = -1) -> int:
        """Append one batch of ``records`` (values, or ``(key, value[, headers[, timestamp]])`` tuples) to
        the partition's log as a producer would; returns its base offset. ``timestamp``: the batch's
        base timestamp (default: the records' own, else now). A transactional batch opens a transaction
        for ``producer_id`` (if none is open) until :meth:`end_txn`."""
        p = self.state.partition(topic, partition)
        stored = p.log.append_records(records, leader_epoch=p.leader_epoch, compression=compression,
                                      producer_id=producer_id, producer_epoch=producer_epoch,
                                      base_sequence=base_sequence, transactional=transactional,
                                      timestamp=timestamp, log_append_time=self._append_time(topic))
        return stored.base_offset

    def append_batch(self, topic: str, partition: int, batch: bytes) -> int:
        """Append one encoded batch (e.g. from ``records.build_batch``); returns the assigned base offset."""
        p = self.state.partition(topic, partition)
        return p.log.append_batch(batch, leader_epoch=p.leader_epoch,
                                  log_append_time=self._append_time(topic)).base_offset

    def append_empty_batch(self, topic: str, partition: int, *, offsets: int = 1, control: bool = True,
                           producer_id: int = 1000, producer_epoch: int = 0) -> int:
        """Append a batch with records count 0 spanning ``offsets`` offsets, as Kafka's log cleaner leaves
        one on a compacted topic (by default a cleaned transaction marker: control + transactional);
        returns its base offset."""
        if offsets < 1:
            raise ValueError("an empty batch still spans at least one offset")
        raw = build_batch([], control=control, transactional=control, producer_id=producer_id,
                          producer_epoch=producer_epoch, last_offset_delta=offsets - 1)
        p = self.state.partition(topic, partition)
        return p.log.append_batch(raw, leader_epoch=p.leader_epoch, allow_empty=True).base_offset

    def append_txn(self, topic: str, partition: int, records: Iterable[RecordLike], *, producer_id: int,
                   producer_epoch: int = 0, compression: int = 0, timestamp: int | None = None) -> int:
        """:meth:`append` of a transactional batch; returns its base offset."""
        return self.append(topic, partition, records, compression=compression, producer_id=producer_id,
                           producer_epoch=producer_epoch, transactional=True, timestamp=timestamp)

    def end_txn(self, topic: str, partition: int, producer_id: int, commit: bool, *,
                producer_epoch: int | None = None, coordinator_epoch: int = 0, timestamp: int | None = None) -> int:
        """Write a COMMIT (``commit=True``) or ABORT control batch for ``producer_id``: the transaction
        ends, the last stable offset moves, an abort enters the aborted-transaction index. Returns the
        marker's offset."""
        p = self.state.partition(topic, partition)
        return p.log.end_txn(producer_id, commit, producer_epoch=producer_epoch, leader_epoch=p.leader_epoch,
                             coordinator_epoch=coordinator_epoch, timestamp=timestamp).base_offset

    def truncate_start(self, topic: str, partition: int, offset: int) -> None:
        """Move the log start offset to ``offset`` (<= high watermark), dropping the batches below it."""
        self.state.partition(topic, partition).log.truncate_start(offset)

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.partition_log(topic, partition).high_watermark

    def last_stable_offset(self, topic: str, partition: int) -> int:
        return self.partition_log(topic, partition).last_stable_offset

    def log_start_offset(self, topic: str, partition: int) -> int:
        return self.partition_log(topic, partition).log_start_offset

    # -- fetch sessions ------------------------------------------------------------------------------
    @property
    def fetch_session_state(self) -> FetchSessions:
        """Settings and per-broker caches of the brokers' fetch sessions."""
        return self.state.extensions[FETCH_SESSIONS_KEY]

    def configure_fetch_sessions(self, *, enabled: bool | None = None, slots: int | None = None,
                                 eviction_ms: float | None = None, clock: Callable[[], float] | None = None,
                                 id_factory: Callable[[], int] | None = None) -> None:
        self.fetch_session_state.configure(enabled=enabled, max_entries=slots, eviction_ms=eviction_ms,
                                           clock=clock, id_factory=id_factory)

    @property
    def fetch_partial_batches(self) -> bool:
        return bool(self.state.extensions.get(PARTIAL_BATCHES_KEY, False))

    @fetch_partial_batches.setter
    def fetch_partial_batches(self, value: bool) -> None:
        self.state.extensions[PARTIAL_BATCHES_KEY] = value

    @property
    def fetch_zero_topic_ids(self) -> bool:
        """When set, Fetch responses v13+ carry the all-zero uuid as every topic id (a broker whose topic-id
        support is broken); the request is still resolved by the ids it names."""
        return bool(self.state.extensions.get(ZERO_TOPIC_IDS_KEY, False))

    @fetch_zero_topic_ids.setter
    def fetch_zero_topic_ids(self, value: bool) -> None:
        self.state.extensions[ZERO_TOPIC_IDS_KEY] = value

    def fetch_session_cache(self, node_id: int) -> FetchSessionCache:
        return self.fetch_session_state.cache(node_id)

    def fetch_sessions(self, node_id: int | None = None) -> list[BrokerFetchSession]:
        """The live fetch sessions (of one broker, or all)."""
        return self.fetch_session_state.sessions(node_id)

    def fetch_session(self, session_id: int) -> BrokerFetchSession | None:
        return self.fetch_session_state.find(session_id)

    def fetch_session_stats(self, node_id: int | None = None) -> FetchSessionStats:
        """Counters (created, evicted, closed, errors by code, ...) summed over brokers (or one)."""
        return self.fetch_session_state.stats(node_id)

    def expire_fetch_sessions(self, node_id: int | None = None) -> int:
        """Drop every fetch session (of one broker, or all), as if evicted; their next incremental
        request gets FETCH_SESSION_ID_NOT_FOUND. Returns how many were dropped."""
        fs = self.fetch_session_state
        n = 0
        for nid, cache in fs.caches.items():
            if node_id is None or nid == node_id:
                dropped = cache.clear()
                cache.stats.evicted += dropped
                n += dropped
        return n

    # -- users ---------------------------------------------------------------------------------------
    def add_user(self, username: str, password: str, *, iterations: int | None = None) -> None:
        self.credentials.add_user(username, password, iterations=iterations)

    def remove_user(self, username: str) -> None:
        self.credentials.remove_user(username)

    # -- faults --------------------------------------------------------------------------------------
    def _injector(self, node_id: int | None) -> FaultInjector:
        return self.faults if node_id is None else self.brokers[node_id].faults

    def drop_connection(self, api_key: int, count: int = 1, *, node_id: int | None = None,
                        when: RequestPredicate | None = None) -> Fault:
        """Close the connection on the next ``count`` requests of ``api_key`` (on one broker or any)."""
        return self._injector(node_id).drop_connection(api_key, count, when=when)

    def delay(self, api_key: int, seconds: float = math.inf, count: int = 1, *, node_id: int | None = None,
              until: asyncio.Event | None = None, when: RequestPredicate | None = None) -> Fault:
        """Answer the next ``count`` requests of ``api_key`` late (see :meth:`FaultInjector.delay`)."""
        return self._injector(node_id).delay(api_key, seconds, count, until=until, when=when)

    def error(self, api_key: int, error_code: int, count: int = 1, *, node_id: int | None = None,
              depth: int | None = None, when: RequestPredicate | None = None) -> Fault:
        """Answer the next ``count`` requests of ``api_key`` with ``error_code`` (see :meth:`FaultInjector.error`)."""
        return self._injector(node_id).error(api_key, error_code, count, depth=depth, when=when)

    def clear_faults(self) -> None:
        self.faults.clear()
        for b in self.brokers.values():
            b.faults.clear()

    # -- request log ---------------------------------------------------------------------------------
    def requests(self, api_key: int | None = None, *, node_id: int | None = None, since: int = 0,
                 where: Predicate | None = None) -> list[RequestLogEntry]:
        return self.log.select(api_key, node_id=node_id, since=since, where=where)

    def api_keys(self, *, node_id: int | None = None, since: int = 0) -> list[int]:
        """The api keys of the logged requests, in arrival order."""
        return [e.api_key for e in self.requests(node_id=node_id, since=since)]

    async def wait_for_requests(self, api_key: int | None = None, *, count: int = 1, node_id: int | None = None,
                                since: int = 0, where: Predicate | None = None,
                                timeout: float = 10.0) -> list[RequestLogEntry]:
        return await self.log.wait_for(api_key, count=count, node_id=node_id, since=since, where=where,
                                       timeout=timeout)


__all__ = ["BrokerHandlerError", "TestCluster"]
