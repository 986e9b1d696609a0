"""A share consumer within the process memory budget (service/share/consumer.py, service/instances/budget.py): each
ShareFetch's max_bytes is a grant (kind ``fetch``) held while it is in flight; the record bytes of its answer are
then charged as ``share`` for the caller to release; with no room no ShareFetch is sent and a poll waits until
memory is released."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from service.instances.budget import MIN_GRANT, MemoryBudget
from service.protocol import records as R
from service.share.consumer import ShareConsumer
from tests.unit.share.test_share_session import fetch_resp

T = uuid.UUID(int=7)
MiB = 1024 * 1024


class Metadata:
    topic_names = {T: "t"}


class Answers:
    """A client whose ShareFetch is answered ``resp`` once ``go`` is set."""

    def __init__(self, resp: Any) -> None:
        self.resp = resp
        self.metadata = Metadata()
        self.sent: list[Any] = []
        self.go = asyncio.Event()
        self.started = asyncio.Event()

    async def send_blocking(self, node: int, req: Any, timeout: float | None = None) -> Any:
        self.sent.append(req)
        self.started.set()
        await self.go.wait()
        return self.resp

    send = send_blocking

    def handle_error_code(self, code: int, topic: str | None) -> None:
        raise AssertionError(f"unexpected error {code}")


def consumer_with(client: Answers, budget: MemoryBudget) -> ShareConsumer:
    consumer = ShareConsumer(client, "g", ["t"], max_bytes=8 * MiB)  # type: ignore[arg-type]
    consumer.budget = budget
    consumer._session(1).set_partitions([(T, 0)])
    return consumer


async def test_a_share_fetch_is_granted_then_its_records_are_charged_until_released() -> None:
    batch = R.build_batch([(None, b"v%d" % i) for i in range(3)])
    client = Answers(fetch_resp({(T, 0): {"acquired": [(0, 2, 1)], "records": batch}}))
    budget = MemoryBudget(16 * MiB)
    consumer = consumer_with(client, budget)
    task = asyncio.ensure_future(consumer._fetch(1, 500))
    await client.started.wait()
    grant = client.sent[0].max_bytes
    assert MIN_GRANT <= grant <= 8 * MiB and budget.by_kind["fetch"] == grant  # a grant, not the asked 8 MiB
    client.go.set()
    recs = await task
    assert [r.value for r in recs] == [b"v0", b"v1", b"v2"]
    assert budget.by_kind["fetch"] == 0 and budget.by_kind["share"] == len(batch) == consumer.charged
    assert consumer.take_charged() == len(batch) and consumer.charged == 0
    budget.release(len(batch), "share")
    assert budget.used == 0


async def test_without_room_no_share_fetch_is_sent_and_a_poll_waits_for_memory() -> None:
    client = Answers(fetch_resp({}))
    budget = MemoryBudget(4 * MiB)
    held = budget.total - MIN_GRANT // 2
    assert budget.try_reserve(held, "body")
    consumer = consumer_with(client, budget)
    assert await consumer._fetch(1, 500) == [] and client.sent == []
    assert consumer._starved and budget.refused["fetch"] == 1 and budget.by_kind["fetch"] == 0
    waiting = asyncio.ensure_future(consumer._memory_freed(30))
    await asyncio.sleep(0)
    assert not waiting.done()
    budget.release(held, "body")
    await asyncio.wait_for(waiting, 5)  # woken by the release, long before its 30 s
    client.go.set()
    assert await consumer._fetch(1, 500) == [] and len(client.sent) == 1
    assert budget.used == 0
