"""The I/O around :mod:`service.durable.descriptors`: one tenant's descriptor topic, read at start, followed,
written.

``DescriptorStore(client, topic)`` is per tenant runtime (the tenant's own cluster holds its descriptors).
:meth:`start` creates the topic if it is missing (``cleanup.policy=compact``; one partition: descriptors are
few and small, and one partition keeps every replica's view in one order), reads it to its end and then
follows it in the background (a long-polling range read every ``follow_wait_ms``), so a replica sees the
instances other replicas create within about a second. Writes (:meth:`put`, :meth:`tombstone`) are
acknowledged by the broker (acks=all, idempotent) before they return, and enter the local table at once.

Failures never take the gateway down: a store that cannot reach its topic logs, counts and retries; while it
is behind, re-creation answers what it knows (an instance it has no descriptor for is a 404, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from service.client.client import KafkaClient
from service.client.errors import KafkaError
from service.consumer.subscription import TopicPartition
from service.durable.descriptors import DEFAULT_TOPIC, DescriptorTable, InstanceDescriptor, encode_key
from service.fetch.ranges import OffsetOutOfRange, read_page
from service.fetch.read_committed import READ_UNCOMMITTED
from service.producer import Producer, ProducerConfig
from service.producer.errors import ProduceFailure

log = logging.getLogger(__name__)

TOPIC_CONFIGS = {"cleanup.policy": "compact"}


class DescriptorStoreError(KafkaError):
    """A descriptor could not be written (the instance is served, but would not survive its replica)."""


class DescriptorStore:
    def __init__(self, client: KafkaClient, topic: str = DEFAULT_TOPIC, *, replica_id: str = "",
                 follow_wait_ms: int = 500, page_bytes: int = 1024 * 1024) -> None:
        self.client = client
        self.topic = topic
        self.replica_id = replica_id
        self.table = DescriptorTable()
        self.follow_wait_ms = follow_wait_ms
        self.page_bytes = page_bytes
        self._producer: Producer | None = None
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()
        self.writes = 0
        self.write_failures = 0
        self.read_failures = 0
        self.lag = -1  # records of the topic not read yet (-1: not read once)

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    def start(self) -> None:
        """Start following the topic (created if missing) in the background, in the running loop;
        :meth:`wait_caught_up` waits for the catch-up."""
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name=f"descriptors-{self.topic}")

    async def wait_caught_up(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._caught_up.wait(), timeout)
        return self._caught_up.is_set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.close()
            self._producer = None

    # -- writes ---------------------------------------------------------------------------------------
    def _producer_for(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self.client, ProducerConfig(linger_ms=0))
        return self._producer

    async def _ensure_topic(self) -> None:
        md = self.client.metadata
        if self.topic in md.topics and md.topics[self.topic].partitions:
            return
        await self.client.refresh_metadata([self.topic])
        t = md.topics.get(self.topic)
        if t is not None and t.partitions and not t.error_code:
            return
        try:
            await self.client.create_topics({self.topic: 1}, replication_factor=-1,
                                            configs={self.topic: TOPIC_CONFIGS})
        except KafkaError as exc:  # e.g. a broker that refuses the config: create it plain
            log.warning("creating %s with cleanup.policy=compact failed (%s); creating it without configs",
                        self.topic, exc)
            await self.client.create_topics({self.topic: 1}, replication_factor=-1)
        log.info("created the instance descriptor topic %s", self.topic)

    async def _write(self, key: bytes, value: bytes | None) -> None:
        await self._ensure_topic()
        results = await self._producer_for().send_many(self.topic, [(key, value, (), 0, None)])
        res = results[0]
        if isinstance(res, ProduceFailure):
            self.write_failures += 1
            raise DescriptorStoreError(f"writing an instance descriptor to {self.topic} failed: {res.message}",
                                       retriable=True)
        self.writes += 1

    async def put(self, desc: InstanceDescriptor) -> None:
        desc.replica = self.replica_id or desc.replica
        self.table.put(desc)
        await self._write(desc.key, desc.encode())

    async def tombstone(self, tenant: str, group: str, name: str) -> None:
        self.table.remove(tenant, group, name)
        await self._write(encode_key(tenant, group, name), None)

    def get(self, tenant: str, group: str, name: str) -> InstanceDescriptor | None:
        return self.table.get(tenant, group, name)

    # -- reads ----------------------------------------------------------------------------------------
    async def _follow(self) -> None:
        tp = TopicPartition(self.topic, 0)
        backoff = 0.2
        while True:
            try:
                await self._ensure_topic()
                pos = self.table.position.get(0, 0)
                page = await read_page(self.client, tp, pos, isolation_level=READ_UNCOMMITTED,
                                       max_bytes=self.page_bytes)
                for r in page.records:
                    self.table.apply(0, r.offset, r.key, r.value)
                if page.next_offset > pos:
                    self.table.position[0] = max(self.table.position.get(0, 0), page.next_offset)
                if page.high_watermark >= 0:
                    self.lag = max(0, page.high_watermark - self.table.position.get(0, 0))
                backoff = 0.2
                if page.next_offset >= page.high_watermark >= 0:
                    if not self._caught_up.is_set():
                        self._caught_up.set()
                        log.info("instance descriptors of %s read: %d live", self.topic, len(self.table))
                    await asyncio.sleep(self.follow_wait_ms / 1000)
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRange as exc:  # compaction or retention removed the start: from the log start
                headers = exc.headers or {}
                start = int(headers.get("X-Log-Start-Offset", "0"))
                hw = int(headers.get("X-High-Watermark", "0"))
                pos = self.table.position.get(0, 0)
                # below the log start (compaction, retention): from the start; past the end (the topic was
                # re-created): from the start of the new log, keeping what was read
                self.table.position[0] = max(0, start) if pos < start or pos > hw else pos
                await asyncio.sleep(backoff)
            except Exception as exc:  # never dies: log, count, back off
                self.read_failures += 1
                log.warning("reading instance descriptors from %s: %s", self.topic, exc)
                await asyncio.sleep(backoff)
                backoff = min(5.0, backoff * 2)

    def snapshot(self) -> dict[str, Any]:
        return {"topic": self.topic, "live": len(self.table), "caught_up": self.caught_up,
                "position": self.table.position.get(0, 0), "writes": self.writes,
                "write_failures": self.write_failures, "read_failures": self.read_failures,
                "at": time.time()}
