"""The cluster client: bootstrap with fail-over, one connection per broker, a metadata cache.

Consumers of this class (group coordinators, fetchers) share one ``KafkaClient`` per tenant identity,
so requests of many consumers are pipelined over the same broker connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

from service.client.connection import (
    BrokerConnection,
    ConnectionConfig,
    ManagedConnection,
)
from service.client.errors import (
    BrokerResponseError,
    KafkaConnectionError,
    KafkaError,
    NoBrokersAvailableError,
)
from service.client.metadata import BrokerInfo, ClusterMetadata
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.protocol.dsl import Struct

log = logging.getLogger(__name__)

_MetaTopic = M.struct("MetadataRequest", "MetadataRequestTopic")
_CreatableTopic = M.struct("CreateTopicsRequest", "CreatableTopic")


def _topic_ready(md: ClusterMetadata, topic: str) -> bool:
    """The metadata lists ``topic`` without error and a leader for each of its partitions."""
    parts = md.partitions(topic)
    return not md.topic_error(topic) and bool(parts) and all(md.leader(topic, p) is not None for p in parts)


def parse_bootstrap(bootstrap: str | Iterable[str]) -> list[tuple[str, int]]:
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        for prefix in ("PLAINTEXT://", "SSL://", "SASL_PLAINTEXT://", "SASL_SSL://", "tcp://"):
            if item.upper().startswith(prefix.upper()):
                item = item[len(prefix):]
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bootstrap address {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no bootstrap address given")
    return out


class KafkaClient:
    def __init__(self, bootstrap: str | Iterable[str], config: ConnectionConfig | None = None,
                 metadata_max_age: float = 300.0) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.config = config or ConnectionConfig()
        self.metadata = ClusterMetadata()
        self.metadata_max_age = metadata_max_age
        self._conns: dict[int, ManagedConnection] = {}
        #: a second connection per coordinator for the heartbeats of stable members only
        #: (heartbeat_connection; service/group/heartbeats.py reads its answers once per heartbeat tick)
        self._hb_conns: dict[int, ManagedConnection] = {}
        # Idle connections for requests the broker may hold (JoinGroup, SyncGroup, long-poll Fetch).
        # A Kafka broker reads a connection's next request only after answering the previous one, so
        # such requests must not share the pipelined control connection with heartbeats and commits.
        # Most recently returned last; a connection idle for idle_connection_ttl is closed, so the pool
        # follows the concurrency actually needed (hundreds of consumers long-polling one broker need as
        # many connections; closing and reopening them on every fetch would cost a connect + ApiVersions).
        self._idle: dict[int, list[tuple[float, ManagedConnection]]] = {}
        self.max_idle_per_broker = 10_000
        self.idle_connection_ttl = 30.0
        self._reaper: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.leased = 0
        self._bootstrap_conn: ManagedConnection | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._interest: set[str] = set()
        self._all_topics = False
        self._closed = False
        self.metadata_refreshes = 0

    # -- connections -------------------------------------------------------------------------------
    def connection(self, node_id: int, _pool: dict[int, ManagedConnection] | None = None) -> ManagedConnection:
        conns = self._conns if _pool is None else _pool
        conn = conns.get(node_id)
        broker = self.metadata.broker(node_id)
        if conn is not None and broker is not None and (conn.host, conn.port) != (broker.host, broker.port):
            # The broker moved: drop the old connection.
            asyncio.get_running_loop().create_task(conn.close())
            conn = None
        if conn is None:
            if broker is None:
                raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
            conn = ManagedConnection(broker.host, broker.port, self.config, node_id)
            conns[node_id] = conn
        return conn

    def heartbeat_connection(self, node_id: int) -> ManagedConnection:
        """A connection to ``node_id`` of its own for the heartbeats of stable group members: they
        are answered in bulk once per heartbeat tick (its reads are paused in between, see
        service/group/heartbeats.py), which must not delay the commits and lookups of the main connection."""
        return self.connection(node_id, self._hb_conns)

    async def any_connection(self) -> BrokerConnection:
        """A live connection to some broker: known brokers first, then the bootstrap list."""
        for mc in list(self._conns.values()):
            if mc.current is not None:
                return mc.current
        candidates: list[tuple[str, int, int | None]] = [
            (b.host, b.port, b.node_id) for b in self.metadata.brokers.values()
        ]
        random.shuffle(candidates)
        candidates += [(h, p, None) for h, p in self.bootstrap]
        errors: list[str] = []
        for host, port, node_id in candidates:
            try:
                if node_id is not None:
                    return await self.connection(node_id).get()
                if (self._bootstrap_conn is None
                        or (self._bootstrap_conn.host, self._bootstrap_conn.port) != (host, port)):
                    if self._bootstrap_conn is not None:
                        await self._bootstrap_conn.close()
                    self._bootstrap_conn = ManagedConnection(host, port, self.config)
                return await self._bootstrap_conn.get()
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                errors.append(f"{host}:{port}: {exc}")
                if (self._bootstrap_conn is not None
                        and (self._bootstrap_conn.host, self._bootstrap_conn.port) == (host, port)):
                    await self._bootstrap_conn.close()
                    self._bootstrap_conn = None
        raise NoBrokersAvailableError("no broker reachable: " + "; ".join(errors))

    async def send(self, node_id: int, req: Struct, version: int | None = None,
                   timeout: float | None = None) -> Any:
        try:
            return await self.connection(node_id).send(req, version, timeout)
        except KafkaConnectionError:
            self.metadata.mark_stale()
            raise

    @contextlib.asynccontextmanager
    async def lease(self, node_id: int) -> AsyncIterator[ManagedConnection]:
        """An exclusive connection to ``node_id`` for one blocking request; returned to a pool after."""
        broker = self.metadata.broker(node_id)
        if broker is None:
            raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        idle = self._idle.setdefault(node_id, [])
        mc = None
        while idle:
            _, cand = idle.pop()
            if (cand.host, cand.port) == (broker.host, broker.port) and cand.current is not None:
                mc = cand
                break
            await cand.close()
        if mc is None:
            mc = ManagedConnection(broker.host, broker.port, self.config, node_id)
        self.leased += 1
        ok = False
        try:
            yield mc
            ok = True
        finally:
            self.leased -= 1
            if ok and not self._closed and mc.current is not None and len(idle) < self.max_idle_per_broker:
                idle.append((time.monotonic(), mc))
                if self._reaper is None:
                    self._reaper = asyncio.get_running_loop().call_later(
                        self.idle_connection_ttl / 2, self._reap_idle)
            else:
                await mc.close()

    def _reap_idle(self) -> None:
        """Close pooled connections unused for idle_connection_ttl (the oldest are at the front)."""
        self._reaper = None
        cutoff = time.monotonic() - self.idle_connection_ttl
        loop = asyncio.get_running_loop()
        for idle in self._idle.values():
            n = 0
            while n < len(idle) and idle[n][0] < cutoff:
                n += 1
            for _, mc in idle[:n]:
                task = loop.create_task(mc.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            del idle[:n]
        if any(self._idle.values()) and not self._closed:
            self._reaper = loop.call_later(self.idle_connection_ttl / 2, self._reap_idle)

    def pooled_connections(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def send_blocking(self, node_id: int, req: Struct, version: int | None = None,
                            timeout: float | None = None) -> Any:
        """Send a request the broker may hold for a long time on a leased connection."""
        try:
            async with self.lease(node_id) as mc:
                return await mc.send(req, version, timeout)
        except KafkaConnectionError:
            self.metadata.mark_stale()
            raise

    async def send_any(self, req: Struct, version: int | None = None, timeout: float | None = None) -> Any:
        conn = await self.any_connection()
        return await conn.send(req, version, timeout)

    # -- metadata ----------------------------------------------------------------------------------
    def add_interest(self, topics: Iterable[str]) -> None:
        new = set(topics) - self._interest
        if new:
            self._interest |= new
            for t in new:
                self.metadata.mark_stale(t)

    async def refresh_metadata(self, topics: Iterable[str] | None = None, *,
                               all_topics: bool = False) -> ClusterMetadata:
        """Fetch metadata now; concurrent callers share one request."""
        if topics is not None:
            self.add_interest(topics)
        if all_topics:
            self._all_topics = True
        task = self._refresh_task
        if task is None or task.done():
            task = self._refresh_task = asyncio.create_task(self._refresh())
        await asyncio.shield(task)
        return self.metadata

    async def _refresh(self) -> None:
        requested = None if self._all_topics else sorted(self._interest)
        conn = await self.any_connection()
        version = conn.version_for(M.ApiKey.METADATA)
        topics = None if requested is None else [_MetaTopic(name=t) for t in requested]
        req = M.MetadataRequest(topics=topics, allow_auto_topic_creation=False)
        resp = await conn.send(req, version)
        self.metadata.update(resp, requested_topics=requested)
        self.metadata_refreshes += 1

    async def ensure_metadata(self, topics: Iterable[str] = ()) -> ClusterMetadata:
        topics = list(topics)
        missing = [t for t in topics if t not in self.metadata.topics]
        if missing or self.metadata.needs_refresh or not self.metadata.brokers:
            await self.refresh_metadata(topics)
        return self.metadata

    def invalidate(self, topic: str | None = None) -> None:
        self.metadata.mark_stale(topic)

    def handle_error_code(self, code: int, topic: str | None = None) -> None:
        """Mark metadata stale for errors that mean leadership or topic identity changed."""
        if code in EC.METADATA_REFRESH_CODES:
            self.metadata.mark_stale(topic)

    async def leader_id(self, topic: str, partition: int, *, refresh: bool = False) -> int:
        """The node id of the partition's leader, from the cache (refreshed once if unknown) or, with
        ``refresh``, from fresh metadata; raises BrokerResponseError (the topic's error, else
        LEADER_NOT_AVAILABLE) when there is none."""
        if refresh:
            await self.refresh_metadata([topic])
        else:
            await self.ensure_metadata([topic])
        node = self.metadata.leader(topic, partition)
        if node is None and not refresh:
            await self.refresh_metadata([topic])
            node = self.metadata.leader(topic, partition)
        if node is None:
            code = self.metadata.topic_error(topic) or EC.LEADER_NOT_AVAILABLE
            raise BrokerResponseError(code, f"leader of {topic}-{partition}")
        return node

    async def leader_connection(self, topic: str, partition: int) -> ManagedConnection:
        leader = self.metadata.leader(topic, partition)
        if leader is None:
            await self.refresh_metadata([topic])
            leader = self.metadata.leader(topic, partition)
            if leader is None:
                code = self.metadata.topic_error(topic) or EC.LEADER_NOT_AVAILABLE
                raise BrokerResponseError(code, f"{topic}-{partition}")
        return self.connection(leader)

    # -- admin helpers (used by tests and dev tooling) ------------------------------------------------
    async def create_topics(self, topics: dict[str, int], replication_factor: int = 1,
                            timeout_ms: int = 10000, configs: dict[str, dict[str, str]] | None = None) -> None:
        Cfg = M.struct("CreateTopicsRequest", "CreatableTopicConfig")
        creatable = [
            _CreatableTopic(
                name=name, num_partitions=n, replication_factor=replication_factor,
                configs=[Cfg(name=k, value=v) for k, v in (configs or {}).get(name, {}).items()],
            )
            for name, n in topics.items()
        ]
        await self.ensure_metadata()
        target = self.metadata.controller_id
        req = M.CreateTopicsRequest(topics=creatable, timeout_ms=timeout_ms)
        if target is not None and target >= 0 and self.metadata.broker(target) is not None:
            resp = await self.send(target, req)
        else:
            resp = await self.send_any(req)
        for r in resp.topics:
            if r.error_code and r.error_code != EC.TOPIC_ALREADY_EXISTS:
                raise BrokerResponseError(r.error_code, f"CreateTopics {r.name}", r.error_message)
        # Apache Kafka answers CreateTopics once the controller has the topic; its brokers' metadata follows a
        # moment later, and a Metadata request meanwhile says UNKNOWN_TOPIC_OR_PARTITION (or lists partitions
        # without a leader). Wait, briefly, until the metadata shows every topic with its leaders, so that what
        # comes next (an assign, a produce) sees the topic.
        deadline = time.monotonic() + min(timeout_ms, 5000) / 1000
        while True:
            md = await self.refresh_metadata(list(topics))
            if all(_topic_ready(md, t) for t in topics) or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.02)  # metadata propagation in the cluster: nothing to await from here

    async def close(self) -> None:
        self._closed = True
        if self._refresh_task is not None and not self._refresh_task.done():
            self._refresh_task.cancel()
            with contextlib.suppress(BaseException):
                await self._refresh_task
        conns = list(self._conns.values()) + list(self._hb_conns.values())
        for idle in self._idle.values():
            conns.extend(mc for _, mc in idle)
        self._idle.clear()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self._bootstrap_conn is not None:
            conns.append(self._bootstrap_conn)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        self._conns.clear()
        self._hb_conns.clear()

    def with_config(self, **changes: Any) -> ConnectionConfig:
        return replace(self.config, **changes)


async def find_coordinator(client: KafkaClient, group_id: str) -> int:
    """The node id of ``group_id``'s coordinator (classic, consumer-protocol and share groups
    alike), its address added to the metadata when the broker list lacks it."""
    conn = await client.any_connection()
    req = M.FindCoordinatorRequest(key=group_id, key_type=0, coordinator_keys=[group_id])
    version = conn.version_for(M.ApiKey.FIND_COORDINATOR)
    resp = await conn.send(req, version)
    if version >= 4:
        c = next((c for c in resp.coordinators if c.key == group_id), None)
        if c is None:
            raise BrokerResponseError(EC.COORDINATOR_NOT_AVAILABLE, "FindCoordinator")
        code, node, host, port, msg = c.error_code, c.node_id, c.host, c.port, c.error_message
    else:
        code, node, host, port, msg = resp.error_code, resp.node_id, resp.host, resp.port, resp.error_message
    if code:
        raise BrokerResponseError(code, f"FindCoordinator({group_id})", msg)
    if client.metadata.broker(node) is None:
        client.metadata.brokers[node] = BrokerInfo(node, host, port)
    return int(node)
