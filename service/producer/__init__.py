"""The gateway's Kafka producer: an idempotent, batching, ordered producer over our own codecs.

- :mod:`.partitioner`: murmur2 key partitioning (Java/librdkafka compatible) and the sticky partitioner;
- :mod:`.encoding`: fast magic-2 batch encoding;
- :mod:`.accumulator`: the pure state (queues, batches, sequences, retries, expiry);
- :mod:`.producer`: the asyncio driver, ``Producer(client, config)`` with ``send_many`` and ``close``.
"""

from service.producer.accumulator import ProducerConfig, parse_compression
from service.producer.errors import (
    ProduceFailure,
    ProducerClosedError,
    ProduceResult,
    RecordMetadata,
    UnknownTopicError,
)
from service.producer.partitioner import StickyPartitioner, murmur2, partition_for_key
from service.producer.producer import OutgoingRecord, Producer

__all__ = [
    "OutgoingRecord",
    "ProduceFailure",
    "ProduceResult",
    "Producer",
    "ProducerClosedError",
    "ProducerConfig",
    "RecordMetadata",
    "StickyPartitioner",
    "UnknownTopicError",
    "murmur2",
    "parse_compression",
    "partition_for_key",
]
