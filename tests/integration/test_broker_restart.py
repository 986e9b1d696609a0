"""Broker kill -9 and restart with durable (S3) storage: the consumer resumes from committed offsets
and nothing is lost. Tansu's memory:// storage forgets everything on restart, so this broker stores
its log in a local moto S3 server."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from service.consumer.subscription import TopicPartition
from service.embedded import EmbeddedBroker, free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def s3_env(tmp_path) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    port = free_port()
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    assert exe, "moto[server] is a test dependency"
    proc = subprocess.Popen([exe, "-p", str(port), "-H", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(endpoint, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)  # waiting for an external process to bind its port
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"}
        r = httpx.put(f"{endpoint}/tansu")  # create the bucket (moto accepts unsigned requests)
        assert r.status_code == 200, r.text
        yield env
    finally:
        proc.terminate()
        proc.wait(10)


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
