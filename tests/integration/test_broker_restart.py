"""Broker kill -9 and restart on its data, on Tansu and on Apache Kafka: the consumer resumes from committed
offsets and nothing is lost. Tansu's memory:// storage forgets everything on restart, so that broker stores its
log in a local moto S3 server (the ``s3_env`` fixture, tests/integration/conftest.py); Kafka keeps its log
directory (``kill(keep_data=True)``). Each test starts a broker of its own: the session's must not be killed.
The HTTP consumers of the gateway under a continuous producer through a Kafka kill -9:
test_kafka_broker_restart.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from service.consumer.subscription import TopicPartition
from service.embedded.kafka import EmbeddedKafka
from service.embedded.tansu import EmbeddedBroker
from tests.conftest import BROKERS, AnyBroker

pytestmark = pytest.mark.integration


@pytest.fixture(params=BROKERS)
def restartable(request: pytest.FixtureRequest, tmp_path) -> Iterator[AnyBroker]:  # type: ignore[no-untyped-def]
    """A broker of the test's own, not started, that ``kill()`` then ``start()`` restarts on its data and port."""
    if request.param == "tansu":
        tansu = EmbeddedBroker(storage="s3://tansu/", env=request.getfixturevalue("s3_env"),
                               log_file=tmp_path / "tansu.log")
        try:
            yield tansu
        finally:
            tansu.stop()
        return
    # keep_data: kill() keeps its directory; a killed Kafka serves again once its old registration expired (2 s
    # here, not the launcher's 4 s)
    kafka = EmbeddedKafka(log_file=tmp_path / "kafka.log", keep_data=True,
                          overrides={"broker.session.timeout.ms": "2000", "broker.heartbeat.interval.ms": "250"})
    try:
        yield kafka
    finally:
        kafka.stop(keep_data=False)


def produce(bootstrap: str, topic: str, start: int, n: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(topic, value=b"v%d" % i, partition=i % 3)
    assert p.flush(30) == 0


async def test_kill_and_restart_resumes_from_committed_offsets(restartable: AnyBroker) -> None:
    broker = restartable
    broker.start()
    port = broker.bootstrap
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

        broker.kill()  # kill -9: no clean shutdown (Kafka keeps its directory: keep_data)
        broker.start()  # same port, same bucket or directory
        assert broker.bootstrap == port
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
