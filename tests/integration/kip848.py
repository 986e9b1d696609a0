"""What the consumer protocol (KIP-848) integration tests share: a consumer on it, and waiting until a group of
such consumers has settled."""

from __future__ import annotations

import asyncio
import time

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from service.group.coordinator_consumer import ConsumerProtocolCoordinator


def kip848_consumer(client: KafkaClient, group: str) -> Consumer:
    """A Consumer of ``group.protocol=consumer``: its group membership is the consumer protocol's driver (the same
    hooks, commits and committed lookups as the classic one)."""
    c = Consumer(client, ConsumerConfig(group_id=group, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                                        enable_auto_commit=True, auto_commit_interval_ms=200,
                                        group_protocol="consumer", group_remote_assignor="uniform",
                                        rebalance_timeout_ms=10000, retry_backoff_ms=50))
    assert isinstance(c.coordinator, ConsumerProtocolCoordinator)
    return c


async def settled(consumers: list[Consumer], partitions: int, *, each_some: bool = False,
                  timeout: float = 20.0) -> None:
    """Until every consumer is stable and each of the ``partitions`` is owned once, the split balanced (with
    ``each_some``: each consumer owning one at least, balanced or not)."""
    deadline = time.monotonic() + timeout
    while True:
        owned = [set(c.assignment()) for c in consumers]
        spread = all(owned) if each_some else max(map(len, owned)) - min(map(len, owned)) <= 1
        if (spread and sum(map(len, owned)) == partitions and len(set().union(*owned)) == partitions
                and all(c.coordinator is not None and c.coordinator.stable for c in consumers)):
            return
        left = deadline - time.monotonic()
        assert left > 0, owned
        for c in consumers:
            c.assignment_changed.clear()
        waits = [asyncio.ensure_future(c.assignment_changed.wait()) for c in consumers]
        await asyncio.wait(waits, timeout=min(0.1, left), return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
