"""A group leader outside the gateway may assign any topic: the consumer keeps only topics its tenant may read."""

from __future__ import annotations

import logging

import pytest

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from service.consumer.subscription import TopicPartition as TP


async def test_assigned_topics_the_tenant_may_not_read_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    client = KafkaClient("127.0.0.1:1")
    consumer = Consumer(client, ConsumerConfig(group_id="g"))
    consumer.subs.topic_filter = lambda topic: not topic.startswith("__") and topic != "secret"
    try:
        assigned = [TP("orders", 0), TP("__consumer_offsets", 3), TP("secret", 0), TP("orders", 1)]
        with caplog.at_level(logging.WARNING, logger="service.consumer.consumer"):
            await consumer._on_assign(assigned, assigned)
        assert set(consumer.subs.assigned()) == {TP("orders", 0), TP("orders", 1)}
        assert "__consumer_offsets" in caplog.text and "secret" in caplog.text
        # without a filter (no tenant patterns) the assignment is taken as it is
        consumer.subs.topic_filter = None
        await consumer._on_assign(assigned, [])
        assert set(consumer.subs.assigned()) == set(assigned)
    finally:
        await consumer.close()
        await client.close()
