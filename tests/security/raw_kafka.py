"""Raw Kafka requests the security tests send past the gateway's own client (straight to the broker)."""

from __future__ import annotations

from typing import Any

from service.protocol import messages as M


def produce_request(topic: str, partition: int, batch: bytes) -> Any:
    """A ProduceRequest (acks=all) carrying one already-built record batch for one partition."""
    topic_data = M.struct("ProduceRequest", "TopicProduceData")
    part_data = M.struct("ProduceRequest", "PartitionProduceData")
    return M.ProduceRequest(acks=-1, timeout_ms=10000, topic_data=[
        topic_data(name=topic, partition_data=[part_data(index=partition, records=batch)])])
