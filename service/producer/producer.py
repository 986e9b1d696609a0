"""The asyncio producer: a thin driver around the pure :class:`~service.producer.accumulator.Accumulator`.

``Producer(client, config)`` shares a tenant's :class:`KafkaClient` (metadata cache, broker addresses)
but sends its Produce requests on connections of its own (up to ``max_in_flight_per_broker`` per broker,
kept open between requests), so large produce requests never queue behind, or in front of, the consumers'
heartbeats and commits on the pipelined control connections.

One background task (the sender) loops: expire old records, obtain a producer id when needed
(InitProducerId, no transactional id), refresh metadata when leadership changed, then take one batch
per ready partition, group the batches by leader and send one Produce request (acks=all) per leader,
at most ``max_in_flight_per_broker`` at a time. A request is written at once on an idle connection of the
producer to that broker (or pipelined behind another, when all are busy), encoded by hand
(:mod:`service.protocol.produce_codec`), and its answer is handled from the connection's read callback: no
task, future or message objects per request. Only a request that needs a connection opened
first runs in a task. The broker's answer goes to the accumulator, which decides success, retry, split,
reset or failure; callers of ``send_many`` are answered once each of their records was acknowledged or
failed. A request that times out closes its connection (its other requests fail as ambiguous, like a
lost connection), as the Java client does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from service.client.client import KafkaClient
from service.client.connection import BrokerConnection, ManagedConnection, send_frames_nowait
from service.client.errors import BrokerResponseError, KafkaConnectionError, KafkaError, RequestTimeoutError
from service.producer import encoding
from service.producer.accumulator import (
    INT32_MAX,
    RECORD_OVERHEAD,
    Accumulator,
    Delivery,
    ProducerBatch,
    ProducerConfig,
    Run,
    record_size,
)
from service.producer.errors import (
    NETWORK_EXCEPTION,
    ProduceFailure,
    ProducerClosedError,
    ProduceResult,
    UnknownTopicError,
    failure,
)
from service.producer.partitioner import StickyPartitioner, partition_for_key
from service.protocol import error_codes as EC
from service.protocol import frames, produce_codec
from service.protocol import messages as M

log = logging.getLogger(__name__)

_TopicData = M.struct("ProduceRequest", "TopicProduceData")
_PartitionData = M.struct("ProduceRequest", "PartitionProduceData")
_MetaTopic = M.struct("MetadataRequest", "MetadataRequestTopic")
_MISSING_TOPIC_CODES = frozenset({EC.UNKNOWN_TOPIC_OR_PARTITION, 17})  # 17: INVALID_TOPIC_EXCEPTION
_INVALID_RECORD = 87
_PRODUCE = M.ApiKey.PRODUCE


class OutgoingRecord(NamedTuple):
    """One record for ``send_many``; a plain 5-tuple in this order works too."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()
    partition: int | None = None
    timestamp: int | None = None  # ms since the epoch; None: the time of the send_many call


class Producer:
    def __init__(self, client: KafkaClient, config: ProducerConfig | None = None) -> None:
        self.client = client
        self.config = config or ProducerConfig()
        self.acc = Accumulator(self.config)
        self.sticky = StickyPartitioner(self.config.sticky_bytes)
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._task: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[None]] = set()
        self._node_in_flight: dict[int, int] = {}
        self._conns: dict[int, list[ManagedConnection]] = {}  # the producer's own connections per broker
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._closed = False
        self._refresh_wanted = False
        self._meta_retry_at = 0.0
        self._pid_retry_at = 0.0
        self._pid_failures = 0
        self._timeout = self.config.request_timeout_ms / 1000
        # counters (tests, logs)
        self.requests_sent = 0
        self.records_acked = 0
        self.records_failed = 0

    # -- public API ------------------------------------------------------------------------------------
    async def partition_count(self, topic: str) -> int:
        """The number of partitions of ``topic`` from (fresh enough) metadata. Raises UnknownTopicError if
        it does not exist (an unknown name never joins the client's metadata interest), or a
        BrokerResponseError (e.g. TOPIC_AUTHORIZATION_FAILED, or retriable LEADER_NOT_AVAILABLE)."""
        cached = self.cached_partition_count(topic)
        if cached is not None:
            return cached
        md = self.client.metadata
        t = md.topics.get(topic)
        if t is None or t.error_code not in (0, EC.LEADER_NOT_AVAILABLE):
            await self._probe_topic(topic)
        await self.client.refresh_metadata([topic])
        t = md.topics.get(topic)
        if t is None or t.error_code in _MISSING_TOPIC_CODES:
            raise UnknownTopicError(topic)
        if t.error_code not in (0, EC.LEADER_NOT_AVAILABLE):
            raise BrokerResponseError(t.error_code, f"topic {topic!r}")
        if not t.partitions:
            raise BrokerResponseError(EC.LEADER_NOT_AVAILABLE, f"topic {topic!r} has no partitions yet")
        return len(t.partitions)

    def cached_partition_count(self, topic: str) -> int | None:
        """:meth:`partition_count` when fresh enough metadata has it, else None (nothing asked)."""
        md = self.client.metadata
        t = md.topics.get(topic)
        if (t is not None and t.partitions and t.error_code in (0, EC.LEADER_NOT_AVAILABLE)
                and time.monotonic() - md.updated_at < self.config.metadata_max_age_ms / 1000):
            return len(t.partitions)
        return None

    async def partitions(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (see :meth:`partition_count` for errors)."""
        await self.partition_count(topic)
        return self.client.metadata.partitions(topic)

    async def create_topic(self, topic: str, num_partitions: int, replication_factor: int = -1) -> list[int]:
        """Create ``topic`` (CreateTopics; one created meanwhile by someone else is fine) for a produce that
        found it missing, and return its partition numbers once its metadata shows them. Raises
        BrokerResponseError when the broker refuses (e.g. TOPIC_AUTHORIZATION_FAILED, POLICY_VIOLATION)."""
        await self.client.create_topics({topic: num_partitions}, replication_factor=replication_factor,
                                        timeout_ms=self.config.request_timeout_ms)
        log.info("created topic %r (%d partitions) for a produce request", topic, num_partitions)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        backoff = self.config.retry_backoff_ms / 1000
        while True:  # a new topic's leaders can take a moment to appear in metadata
            try:
                return await self.partitions(topic)
            except (UnknownTopicError, BrokerResponseError) as exc:
                retry = isinstance(exc, UnknownTopicError) or exc.retriable
                if not retry or loop.time() + backoff > deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.config.retry_backoff_max_ms / 1000)

    async def send_many(self, topic: str, records: Sequence[Any]) -> list[ProduceResult]:
        """Produce ``records`` (``OutgoingRecord`` or ``(key, value, headers, partition, timestamp)``
        tuples) to ``topic``; returns one result per record, in order, once every record was acknowledged
        by the broker (acks=all) or failed. Records with a partition that does not exist fail alone.
        Raises UnknownTopicError / BrokerResponseError when the topic cannot be used at all, and
        ProducerClosedError after close()."""
        if self._closing:
            raise ProducerClosedError("the producer is closed")
        if not records:
            return []
        num = await self.partition_count(topic)
        while self.acc.queued_bytes >= self.config.buffer_bytes and not self._closing:
            self._space.clear()
            await self._space.wait()
        if self._closing:
            raise ProducerClosedError("the producer is closed")
        loop = self._running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def done() -> None:
            if not fut.done():
                fut.set_result(None)

        delivery = self._enqueue(topic, records, num, done)
        if not delivery.done:
            await fut  # a cancelled caller cancels only its own future (done() then skips it)
        return self._settled(delivery)

    def submit(self, topic: str, records: Sequence[Any], on_done: Callable[[Delivery], None],
               partition_count: int | None = None) -> bool:
        """:meth:`send_many` for a caller that answers from a callback (the protocol-level produce path, issue
        24: no task, future or await per request). When nothing must be awaited first — the topic's partition
        count is in fresh metadata, the buffer has room, the producer is open — ``records`` are queued and True
        is returned; ``on_done(delivery)`` is then called once, from the event loop, when every record was
        acknowledged or failed (possibly before this returns, for records failed at once). The delivery keeps
        acknowledged runs in ``delivery.offsets`` (first index, partition, base offset, count) rather than a
        RecordMetadata per record: ``delivery.metadata()`` gives the per-record results. Otherwise nothing is
        done and False is returned: use send_many. ``partition_count``: what :meth:`cached_partition_count` just
        gave the caller (not asked again)."""
        if not records:
            return False
        num = partition_count if partition_count is not None else self.cached_partition_count(topic)
        if num is None or self._closing or self.acc.queued_bytes >= self.config.buffer_bytes:
            return False
        queued: list[Delivery] = []

        def done() -> None:
            if queued:  # (records failed at once, while being queued, are answered below)
                delivery = queued.pop()
                self._count(delivery)
                try:
                    on_done(delivery)
                except Exception:  # never into the answer loop: the other callers of the batch wait for it
                    log.exception("a produce callback failed")

        delivery = self._enqueue(topic, records, num, done, offsets=True)
        queued.append(delivery)
        if delivery.done:
            done()
        return True

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():  # asyncio.get_running_loop() is a getpid() call on 3.11
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _enqueue(self, topic: str, records: Sequence[Any], num: int, on_done: Callable[[], None],
                 offsets: bool = False) -> Delivery:
        """Queue ``records`` (partitions chosen) and wake the sender; ``on_done`` once all are answered;
        ``offsets``: acknowledged runs kept as Delivery.offsets."""
        loop = self._running_loop()
        n = len(records)
        parts = self.client.metadata.topics[topic].partitions
        delivery = Delivery(n, on_done)
        if offsets:
            delivery.offsets = []
        now = loop.time()
        now_ms = int(time.time() * 1000)
        acc = self.acc
        if type(records) is not list:
            records = list(records)
        sizes = encoding.plain_sizes(records, RECORD_OVERHEAD)
        if sizes is None and not all(isinstance(r, tuple) for r in records):
            records = [tuple(r) for r in records]
            sizes = encoding.plain_sizes(records, RECORD_OVERHEAD)
        if sizes is not None:
            # the common case, no key, partition or headers: sticky partitions, one run per partition switch
            available = {p for p, pi in parts.items() if pi.leader >= 0}
            for p, a, b, size in self.sticky.runs(topic, sizes, num, available):
                acc.extend((topic, p), Run(records[a:b], range(a, b), now_ms, delivery, size, now))
        else:
            self._queue_records(topic, records, num, parts, delivery, now, now_ms)
        if not delivery.done:
            self._ensure_running()
            self._wake.set()
        return delivery

    def _settled(self, delivery: Delivery) -> list[ProduceResult]:
        """A completed delivery's results, counted."""
        self._count(delivery)
        return delivery.results  # type: ignore[return-value]  # all set when done

    def _count(self, delivery: Delivery) -> None:
        failed = delivery.failed
        self.records_failed += failed
        self.records_acked += len(delivery.results) - failed

    def _queue_records(self, topic: str, records: list[Any], num: int, parts: dict[int, Any], delivery: Delivery,
                       now: float, now_ms: int) -> None:
        """Queue records with keys, partitions or headers: one run per partition (in the records' order)."""
        available: set[int] | None = None
        groups: dict[int, tuple[list[Any], list[int]]] = {}
        sizes: dict[int, int] = {}
        for i, rec in enumerate(records):
            key, value, headers, partition, _ts = rec
            size = RECORD_OVERHEAD + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
            if headers:
                size = record_size(key, value, headers)
            if partition is None:
                if key is not None:
                    partition = partition_for_key(key, num)
                else:
                    if available is None:
                        available = {p for p, pi in parts.items() if pi.leader >= 0}
                    partition = self.sticky.partition(topic, size, num, available)
            elif partition not in parts:
                delivery.resolve(i, failure(EC.UNKNOWN_TOPIC_OR_PARTITION,
                                            f"partition {partition} of topic {topic!r} does not exist",
                                            partition, retriable=False))
                continue
            group = groups.get(partition)
            if group is None:
                groups[partition] = ([rec], [i])
                sizes[partition] = size
            else:
                group[0].append(rec)
                group[1].append(i)
                sizes[partition] += size
        for partition, (recs, indices) in groups.items():
            self.acc.extend((topic, partition), Run(recs, indices, now_ms, delivery, sizes[partition], now))

    async def close(self, timeout: float | None = None) -> None:
        """Stop taking records, send what is queued (waiting at most ``timeout`` seconds, default the
        delivery timeout), then fail whatever is left (retriable) and stop. Never closes the client."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        self._space.set()
        limit = self.config.delivery_timeout_ms / 1000 if timeout is None else timeout
        try:
            task = self._task
            if task is not None and not task.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), limit)
        finally:
            self._closed = True
            if self._task is not None:
                self._task.cancel()
            for t in list(self._requests):
                t.cancel()
            left = self.acc.fail_all(ProduceFailure(
                NETWORK_EXCEPTION, "the producer closed before these records were acknowledged (if a request "
                "was in flight, they may have been written)", True), in_flight=True)
            if left:
                self.records_failed += left
                log.warning("producer closed with %d records not acknowledged", left)
            conns = [mc for mcs in self._conns.values() for mc in mcs]
            self._conns.clear()
            await asyncio.gather(*(mc.close() for mc in conns), return_exceptions=True)

    @property
    def closed(self) -> bool:
        return self._closing

    # -- the sender --------------------------------------------------------------------------------------
    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            loop = self._loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="producer-sender")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            now = loop.time()
            try:
                wake_at = await self._step(now)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: never let the sender die silently with callers waiting
                log.exception("producer sender step failed")
                wake_at = now + self.config.retry_backoff_ms / 1000
            if self._closing and self.acc.empty:
                return
            if self._wake.is_set():
                continue
            handle = loop.call_at(wake_at, self._wake.set) if wake_at is not None else None
            try:
                await self._wake.wait()
            finally:
                if handle is not None:
                    handle.cancel()

    async def _step(self, now: float) -> float | None:
        acc = self.acc
        _, wake_at = acc.expire(now)
        self._settle_space()
        if acc.needs_producer_id:
            if acc.in_flight or acc.empty:
                return wake_at  # a reset waits for in-flight batches; no need for an id without records
            if now < self._pid_retry_at:
                return _earliest(wake_at, self._pid_retry_at)
            await self._init_producer_id()
            return asyncio.get_running_loop().time()  # go round again at once
        if self._refresh_wanted and now >= self._meta_retry_at:
            await self._refresh_metadata()
            now = asyncio.get_running_loop().time()
        return _earliest(wake_at, self._send_ready(now))

    def _send_ready(self, now: float) -> float | None:
        """Send what is ready to every broker with room in its in-flight window; returns when something else
        becomes ready (a backoff or linger ending), if anything does."""
        acc = self.acc
        cfg = self.config
        ready, wake_at = acc.ready(now)
        if not ready:
            return wake_at
        md = self.client.metadata
        groups: dict[int, list[tuple[str, int]]] = {}
        leaderless = False
        for tp in ready:
            leader = md.leader(tp[0], tp[1])
            if leader is None or md.broker(leader) is None:
                leaderless = True
                continue
            groups.setdefault(leader, []).append(tp)
        if leaderless:
            self._refresh_wanted = True
            wake_at = _earliest(wake_at, max(now, self._meta_retry_at))
        for node, tps in groups.items():
            if self._node_in_flight.get(node, 0) >= cfg.max_in_flight_per_broker:
                continue  # a completion wakes the sender
            batches: list[ProducerBatch] = []
            total = 0
            for tp in tps:
                if total >= cfg.max_request_bytes:
                    self._wake.set()  # the rest goes in the next request
                    break
                b = acc.next_batch(tp, now, cfg.max_request_bytes - total)
                if b is not None:
                    batches.append(b)
                    total += len(b.payload or b"")
            if batches:
                self._node_in_flight[node] = self._node_in_flight.get(node, 0) + 1
                self._dispatch(node, batches)
        return wake_at

    def _settle_space(self) -> None:
        if self.acc.queued_bytes < self.config.buffer_bytes:
            self._space.set()

    async def _refresh_metadata(self) -> None:
        self._refresh_wanted = False
        loop = asyncio.get_running_loop()
        try:
            await self.client.refresh_metadata()
        except KafkaError as exc:
            self._refresh_wanted = True
            log.info("producer metadata refresh failed: %s", exc)
        # at most one refresh per backoff period, however many partitions lack a leader
        self._meta_retry_at = loop.time() + self.config.retry_backoff_ms / 1000

    async def _probe_topic(self, topic: str) -> None:
        """Ask a broker about one topic without adding it to the client's metadata interest (so that
        requests for names that do not exist leave no trace)."""
        req = M.MetadataRequest(topics=[_MetaTopic(name=topic)], allow_auto_topic_creation=False)
        resp = await self.client.send_any(req)
        for t in resp.topics:
            if t.name == topic:
                if t.error_code in _MISSING_TOPIC_CODES:
                    raise UnknownTopicError(topic)
                if t.error_code not in (0, EC.LEADER_NOT_AVAILABLE):
                    raise BrokerResponseError(t.error_code, f"topic {topic!r}")
                return
        raise UnknownTopicError(topic)

    async def _init_producer_id(self) -> None:
        acc = self.acc
        loop = asyncio.get_running_loop()
        req = M.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=INT32_MAX,
                                      producer_id=-1, producer_epoch=-1)
        try:
            resp = await self.client.send_any(req, timeout=self._timeout)
            if resp.error_code:
                raise BrokerResponseError(resp.error_code, "InitProducerId")
        except KafkaError as exc:
            self._pid_failures += 1
            backoff = min(self.config.retry_backoff_max_ms,
                          self.config.retry_backoff_ms * 2 ** min(self._pid_failures - 1, 16)) / 1000
            self._pid_retry_at = loop.time() + backoff
            if not exc.retriable:
                code = exc.code if isinstance(exc, BrokerResponseError) and exc.code is not None else -1
                n = acc.fail_all(failure(code, f"cannot obtain a producer id for the idempotent producer: {exc}",
                                         retriable=False))
                self.records_failed += n
                log.warning("InitProducerId failed (%s); %d records failed", exc, n)
            else:
                log.info("InitProducerId failed (%s); retrying in %.2f s", exc, backoff)
            return
        self._pid_failures = 0
        first = acc.producer_id < 0
        acc.set_producer_id(resp.producer_id, resp.producer_epoch)
        if first:
            log.info("idempotent producer id %d epoch %d", resp.producer_id, resp.producer_epoch)
        else:
            log.warning("producer id reset: now %d epoch %d", resp.producer_id, resp.producer_epoch)

    # -- requests ------------------------------------------------------------------------------------------
    def _dispatch(self, node: int, batches: list[ProducerBatch]) -> None:
        """Send one Produce request with ``batches`` to ``node`` (counted in ``_node_in_flight`` by the caller;
        uncounted, and the sender woken, once it is answered or failed): written at once on an idle live
        connection, else on a new connection (opened in a task), else pipelined on the least busy one."""
        mcs = self._conns.get(node)
        broker = self.client.metadata.broker(node)
        if mcs and broker is not None and (mcs[0].host, mcs[0].port) != (broker.host, broker.port):
            loop = self._loop or asyncio.get_running_loop()
            for old in mcs:  # the broker moved: drop the old connections (their requests fail, ambiguous)
                self._spawn(loop, old.close())
            mcs = None
            del self._conns[node]
        best: BrokerConnection | None = None
        if mcs:
            for mc in mcs:
                conn = mc.current
                if conn is not None and (best is None or conn.in_flight < best.in_flight):
                    best = conn
                    if not conn.in_flight:
                        break
        if best is not None and (not best.in_flight or len(mcs) >= self.config.max_in_flight_per_broker):  # type: ignore[arg-type]
            self._write(best, node, batches)
            return
        if broker is None:
            self._request_failed(node, batches, KafkaConnectionError(
                f"broker {node} is not in the cluster metadata"), sent=False)
            return
        if mcs is None:
            mcs = self._conns[node] = []
        for mc in mcs:  # a broken one is reopened before a new one is added
            if mc.current is None:
                break
        else:
            mc = ManagedConnection(broker.host, broker.port, self.client.config, node)
            mcs.append(mc)
        self._spawn(self._loop or asyncio.get_running_loop(), self._connect_and_send(mc, node, batches))

    def _spawn(self, loop: asyncio.AbstractEventLoop, coro: Any) -> None:
        task = loop.create_task(coro)
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _connect_and_send(self, mc: ManagedConnection, node: int, batches: list[ProducerBatch]) -> None:
        try:
            conn = await mc.get()
        except KafkaError as exc:
            self._request_failed(node, batches, exc, sent=False)
            return
        except asyncio.CancelledError:
            self._node_in_flight[node] -= 1  # close(): fail_all settles the batches
            raise
        except Exception as exc:  # a bug: never leave batches in flight
            log.exception("connecting to broker %d for a produce request failed", node)
            self._request_failed(node, batches, exc, sent=False)
            return
        self._write(conn, node, batches)

    def _write(self, conn: BrokerConnection, node: int, batches: list[ProducerBatch]) -> None:
        if not conn.connected:
            self._request_failed(node, batches, KafkaConnectionError(
                f"connection to {conn.address} is closed"), sent=False)
            return
        try:
            version = conn.version_for(_PRODUCE)
            body = self._body(version, batches)
        except Exception as exc:  # NoCommonVersionError (a KafkaError), or a bug
            self._request_failed(node, batches, exc, sent=False)
            return
        self.requests_sent += 1
        send_frames_nowait(conn, _PRODUCE, version, [body], [(node, batches, version, conn)], self._on_answer,
                           self._timeout, immediate=True)

    def _body(self, version: int, batches: list[ProducerBatch]) -> bytes:
        """The request body: by hand for the versions produce_codec writes, else by the generated encoder."""
        by_topic: dict[str, list[tuple[int, bytes | None]]] = {}
        for b in batches:
            tp = b.tp
            parts = by_topic.get(tp[0])
            if parts is None:
                by_topic[tp[0]] = [(tp[1], b.payload)]
            else:
                parts.append((tp[1], b.payload))
        acks, timeout_ms = -1, self.config.request_timeout_ms
        if produce_codec.MIN_VERSION <= version <= produce_codec.MAX_VERSION:
            return produce_codec.produce_body(version, acks, timeout_ms, list(by_topic.items()))
        req = M.ProduceRequest(transactional_id=None, acks=acks, timeout_ms=timeout_ms, topic_data=[
            _TopicData(name=t, partition_data=[_PartitionData(index=i, records=r) for i, r in pd])
            for t, pd in by_topic.items()])
        out = bytearray()
        M.REQUESTS[_PRODUCE].encoder(version)(req, out)
        return bytes(out)

    def _on_answer(self, item: tuple[int, list[ProducerBatch], int, BrokerConnection], payload: bytes | None,
                   error: BaseException | None) -> None:
        """The answer to a Produce request, or its failure (from the connection's read callback or timeout
        sweep, or at once when the connection is closed)."""
        node, batches, version, conn = item
        if error is not None:
            if isinstance(error, RequestTimeoutError):
                # Nothing on this connection is answered any more in order: drop it (its other requests fail
                # as ambiguous); the next request opens a new one.
                conn.abort(KafkaConnectionError(f"connection to {conn.address} closed after a Produce request "
                                                "timed out"))
            self._request_failed(node, batches, error, sent=True)
            return
        assert payload is not None
        try:
            answers = produce_codec.decode_produce_ok(version, payload)
            if answers is None:  # an error or anything unusual: the generated decoder reads it all
                resp = frames.decode_response(_PRODUCE, version, payload)
        except Exception as exc:  # a malformed answer (KafkaProtocolError) or a bug
            self._request_failed(node, batches, exc, sent=True)
            return
        counted = answers is None  # else _on_ok uncounts the request itself, before the callbacks
        try:
            if answers is not None:
                self._on_ok(answers, batches, node)
            else:
                self._on_response(resp, batches, node)
        except Exception as exc:  # a bug: never leave batches in flight forever
            log.exception("handling the produce answer of broker %d failed", node)
            now = (self._loop or asyncio.get_running_loop()).time()
            for b in batches:  # those already settled are ignored
                self.acc.on_request_error(b, now, f"internal error: {exc!r}", retriable=False)
        finally:
            if counted:
                self._node_in_flight[node] -= 1
            self._wake.set()

    def _request_failed(self, node: int, batches: list[ProducerBatch], exc: BaseException, *, sent: bool) -> None:
        """The request got no answer (or an unreadable one): every batch goes back to the accumulator."""
        try:
            now = (self._loop or asyncio.get_running_loop()).time()
            if isinstance(exc, KafkaError):
                retriable = exc.retriable or isinstance(exc, KafkaConnectionError | RequestTimeoutError)
                for b in batches:
                    self.acc.on_request_error(b, now, f"Produce to broker {node}: {exc}", retriable=retriable,
                                              ambiguous=sent)
                self.client.metadata.mark_stale()
                self._refresh_wanted = True
            else:  # a bug or a malformed answer: fail these records, keep going
                log.error("produce request to broker %d failed", node, exc_info=exc)
                for b in batches:
                    self.acc.on_request_error(b, now, f"internal error: {exc!r}", retriable=False, ambiguous=sent)
        finally:
            self._node_in_flight[node] -= 1
            self._wake.set()

    def _on_ok(self, answers: list[tuple[str, int, int]], batches: list[ProducerBatch], node: int) -> None:
        """Every partition of the request answered without an error (``(topic, partition, base_offset)``).

        The next request to the broker leaves before the completed deliveries' callbacks run (they write the
        HTTP answers): the broker works on it meanwhile instead of waiting for those writes and for the sender
        task's next turn of the loop (one request in flight per broker)."""
        now = (self._loop or asyncio.get_running_loop()).time()
        on_response = self.acc.on_response
        completed: list[Delivery] = []
        uncounted = False
        try:
            if len(answers) == len(batches) and all(a[0] == b.tp[0] and a[1] == b.tp[1]
                                                    for a, b in zip(answers, batches, strict=True)):
                for a, b in zip(answers, batches, strict=True):  # the usual order: the request's
                    on_response(b, 0, a[2], now, None, completed)
            else:
                offsets = {(a[0], a[1]): a[2] for a in answers}
                for b in batches:
                    off = offsets.get(b.tp)
                    if off is None:
                        self.acc.on_request_error(b, now, f"broker {node} answered without partition "
                                                  f"{b.tp[0]}-{b.tp[1]}")
                        continue
                    on_response(b, 0, off, now, None, completed)
            self._node_in_flight[node] -= 1
            uncounted = True
            if not self._closing and not self._refresh_wanted:
                self._send_ready(now)
        finally:
            if not uncounted:
                self._node_in_flight[node] -= 1
            for d in completed:
                if d.on_done is not None:
                    d.on_done()

    def _on_response(self, resp: Any, batches: list[ProducerBatch], node: int) -> None:
        answers: dict[tuple[str, int], Any] = {}
        for t in resp.responses:
            for p in t.partition_responses:
                answers[(t.name, p.index)] = p
        now = (self._loop or asyncio.get_running_loop()).time()
        for b in batches:
            pr = answers.get(b.tp)
            if pr is None:
                self.acc.on_request_error(b, now, f"broker {node} answered without partition {b.tp[0]}-{b.tp[1]}")
                continue
            code = pr.error_code
            message = getattr(pr, "error_message", None)
            if code == _INVALID_RECORD and getattr(pr, "record_errors", None):
                details = "; ".join(f"record {e.batch_index}: {e.batch_index_error_message}" for e in pr.record_errors)
                message = f"{message}; {details}" if message else details
            out = self.acc.on_response(b, code, pr.base_offset, now, message)
            if out.refresh_metadata:
                self.client.handle_error_code(code, b.tp[0])
                self._refresh_wanted = True
            if code and code not in (46,):
                log.debug("produce %s-%d: error %d (attempt %d)", b.tp[0], b.tp[1], code, b.attempts)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a < b else b
