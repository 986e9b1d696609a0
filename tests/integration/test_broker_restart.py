"""Broker kill -9 and restart with durable (S3) storage: the consumer resumes from committed offsets
and nothing is lost. Tansu's memory:// storage forgets everything on restart, so this broker stores
its log in a local moto S3 server (the ``s3_env`` fixture, tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from service.embedded import EmbeddedBroker
from service.subscription import TopicPartition

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, start: int, n: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(topic, value=b"v%d" % i, partition=i % 3)
    assert p.flush(30) == 0


async def test_kill_and_restart_resumes_from_committed_offsets(s3_env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    broker = EmbeddedBroker(storage="s3://tansu/", env=s3_env, log_file=tmp_path / "tansu.log")
    broker.start()
    client = KafkaClient(broker.bootstrap)
    consumer = Consumer(client, ConsumerConfig(group_id="restart-group", enable_auto_commit=False,
                                               session_timeout_ms=3000, heartbeat_interval_ms=300,
                                               auto_offset_reset="earliest", fetch_max_wait_ms=100))
    try:
        await client.create_topics({"durable": 3})
        await asyncio.to_thread(produce, broker.bootstrap, "durable", 0, 300)
        await consumer.subscribe(["durable"])
        seen: list[bytes] = []
        while len(seen) < 150:
            seen += [r.value for r in await consumer.poll(max_records=50, timeout=5)]  # type: ignore[misc]
        await consumer.commit()
        committed = await consumer.committed([TopicPartition("durable", p) for p in range(3)])
        assert sum(om.offset for om in committed.values() if om) == len(seen)

        broker.kill()  # kill -9: no clean shutdown
        broker.start()  # same port, same bucket
        await asyncio.to_thread(produce, broker.bootstrap, "durable", 300, 300)

        after: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(set(seen) | set(after)) < 600:
            after += [r.value for r in await consumer.poll(max_records=200, timeout=1)]  # type: ignore[misc]
        everything = set(seen) | set(after)
        assert everything == {b"v%d" % i for i in range(600)}, f"lost {600 - len(everything)} records"
        # it resumed where it had committed: nothing before the committed offsets came again
        assert not set(after) & set(seen), "records before the committed offsets were delivered again"
    finally:
        await consumer.close()
        await client.close()
        broker.stop()
