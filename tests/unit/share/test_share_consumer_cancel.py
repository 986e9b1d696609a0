"""A share consumer whose ShareFetch or ShareAcknowledge is cancelled mid-request (an HTTP client that left a
stream or a long poll) is not left with a share session stuck "in flight": the next request opens a new session
(the broker drops the old one), and acknowledgements that were in the cancelled request are reported not
applied."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from service.share.consumer import ShareConsumer
from service.share.session import NO_ANSWER, AckType
from tests.unit.share.test_share_session import ack_resp, opened

T = uuid.UUID(int=7)


class NeverAnswers:
    """A client whose requests never get an answer (until cancelled)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.started = asyncio.Event()

    async def send_blocking(self, node: int, req: Any, timeout: float | None = None) -> Any:
        self.sent.append(req)
        self.started.set()
        await asyncio.Event().wait()

    send = send_blocking


async def cancelled(coro: Any, client: NeverAnswers) -> None:
    client.started.clear()
    task = asyncio.ensure_future(coro)
    await client.started.wait()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("not cancelled")


async def test_a_cancelled_share_fetch_resets_the_session() -> None:
    client = NeverAnswers()
    consumer = ShareConsumer(client, "g", ["t"])  # type: ignore[arg-type]
    session = consumer._session(1)
    session.set_partitions([(T, 0)])
    await cancelled(consumer._fetch(1, 500), client)
    assert not session.in_flight
    # the next request can be built (a new session: epoch 0 again)
    await cancelled(consumer._fetch(1, 500), client)
    assert not session.in_flight and len(client.sent) == 2
    assert client.sent[1].share_session_epoch == 0


async def test_a_cancelled_share_acknowledge_reports_its_acks_not_applied() -> None:
    client = NeverAnswers()
    consumer = ShareConsumer(client, "g", ["t"])  # type: ignore[arg-type]
    session = consumer.sessions[1] = opened((T, 0), acquired={(T, 0): (3, 4, 1)}, now=time.monotonic())
    consumer._locks[1] = asyncio.Lock()
    assert session.acknowledge((T, 0), 3, AckType.ACCEPT) is None
    await cancelled(consumer.commit(), client)
    assert not session.in_flight
    assert [(r.offset, r.type, r.error_code) for r in consumer.take_results()] == [(3, AckType.ACCEPT, NO_ANSWER)]


class AnswersWhenTold:
    """A client whose ShareAcknowledge is answered (accepting everything) once ``go`` is set."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.started = asyncio.Event()

    async def send(self, node: int, req: Any, timeout: float | None = None) -> Any:
        self.started.set()
        await self.go.wait()
        return ack_resp({(T, 0): 0})


async def test_results_taken_while_an_acknowledgement_is_in_flight_are_not_handed_out_twice() -> None:
    """Results taken (by a poll) while a fetch round's ShareAcknowledge is in flight are not handed out again
    with that request's results."""
    client = AnswersWhenTold()
    consumer = ShareConsumer(client, "g", ["t"])  # type: ignore[arg-type]
    session = consumer.sessions[1] = opened((T, 0), acquired={(T, 0): (3, 4, 1)}, now=time.monotonic())
    consumer._locks[1] = asyncio.Lock()
    consumer._results = [earlier := session.acknowledge_range((T, 0), 9, 9, AckType.ACCEPT)[0]]  # (a refusal)
    session.acknowledge_range((T, 0), 3, 4, AckType.RENEW)  # renewals travel in ShareAcknowledge
    session.set_partitions([])  # (no ShareFetch this round: only the ShareAcknowledge)
    fetching = asyncio.ensure_future(consumer._fetch(1, 0))
    await asyncio.wait_for(client.started.wait(), 5)
    assert consumer.take_results() == [earlier]  # taken meanwhile
    client.go.set()
    await asyncio.wait_for(fetching, 5)
    assert [(r.offset, r.last, r.type) for r in consumer.take_results()] == [(3, 4, AckType.RENEW)]
