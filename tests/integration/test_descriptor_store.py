"""Instance descriptors in a compacted topic, against Tansu: written by one replica's store,
read at start and followed by another's; tombstones remove; garbage records are skipped."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from service.client.client import KafkaClient
from service.durable.descriptors import InstanceDescriptor, encode_key
from service.durable.store import DescriptorStore
from service.embedded.tansu import EmbeddedBroker
from service.producer import Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _until(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)  # the follower polls the topic; there is no event to await across stores


async def test_descriptors_are_shared_through_the_topic(tansu: EmbeddedBroker) -> None:
    topic = f"__kcg_instances_{uuid.uuid4().hex[:8]}"
    a_client, b_client = KafkaClient(tansu.bootstrap), KafkaClient(tansu.bootstrap)
    a = DescriptorStore(a_client, topic, replica_id="a", follow_wait_ms=50)
    b = DescriptorStore(b_client, topic, replica_id="b", follow_wait_ms=50)
    try:
        a.start()
        assert await a.wait_caught_up(20)
        assert len(a.table) == 0
        d1 = InstanceDescriptor("t1", "g", "c1", options={"format": "json"}, group_instance_id="gi-1",
                                subscription={"topics": ["x", "y"]})
        d2 = InstanceDescriptor("t2", "g", "c1", subscription={"pattern": "x.*"})
        await a.put(d1)
        await a.put(d2)
        # garbage on the topic (another writer, a future format) is skipped, not fatal
        p = Producer(a_client)
        await p.send_many(topic,
                          [(b"junk", b"{}", (), 0, None), (encode_key("t1", "g", "zz"), b"not json", (), 0, None)])
        await p.close()
        d1.subscription = {"partitions": [["x", 0]]}
        await a.put(d1)
        # a replica started later reads everything there is
        b.start()
        assert await b.wait_caught_up(20)
        got = b.get("t1", "g", "c1")
        assert got is not None and got.subscription == {"partitions": [["x", 0]]} and got.group_instance_id == "gi-1"
        assert got.options == {"format": "json"} and got.replica == "a"
        assert b.get("t2", "g", "c1") is not None and b.get("t1", "g", "zz") is None
        assert b.table.skipped == 2
        # and follows what is written afterwards
        await a.tombstone("t2", "g", "c1")
        await a.put(InstanceDescriptor("t1", "g2", "c9"))
        await _until(lambda: b.get("t2", "g", "c1") is None and b.get("t1", "g2", "c9") is not None)
        assert a.get("t2", "g", "c1") is None and len(b.table) == 2
    finally:
        await a.stop()
        await b.stop()
        await a_client.close()
        await b_client.close()
