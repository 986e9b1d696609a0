"""Fetch-session bookkeeping on every fetch path, without sockets: the one-shot fetch
(service/fetch/oneshot.py, used by range reads and topic offsets) and the main fetcher both go through
``FetchSessionHandler.request``, so a failure between building a request and its answer never leaves a
session "in flight" (which made every later fetch of that session fail with FetchSessionStateError)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from service.client.errors import KafkaError
from service.consumer.subscription import OffsetResetStrategy, SubscriptionState, TopicPartition
from service.fetch import session as session_mod
from service.fetch.fetcher import FetchConfig, Fetcher
from service.fetch.oneshot import probe_fetch
from service.fetch.session import ZERO_UUID, FetchMetadata, FetchSessionHandler, FetchSessionStateError
from service.protocol import frames
from service.protocol import messages as M

TP = TopicPartition("t", 0)
VERSION = 12  # topic names: the fakes need no topic ids
_TopicResp = M.struct("FetchResponse", "FetchableTopicResponse")
_PartResp = M.struct("FetchResponse", "PartitionData")


def answer(request: Any, session_id: int) -> Any:
    """The broker's answer to ``request`` at VERSION: every requested partition, no records, session
    ``session_id`` (0: sessionless)."""
    topics = [_TopicResp(topic=t.topic, topic_id=ZERO_UUID, partitions=[
        _PartResp(partition_index=p.partition, error_code=0, high_watermark=7, last_stable_offset=7,
                  log_start_offset=0, records=None) for p in t.partitions]) for t in request.topics]
    resp = M.FetchResponse(throttle_time_ms=0, error_code=0, session_id=session_id, responses=topics)
    frame = frames.encode_response(resp, VERSION, correlation_id=1)
    return frames.decode_response(M.ApiKey.FETCH, VERSION, frame[4:])


class FakeConn:
    def __init__(self, session_id: int = 55) -> None:
        self.session_id = session_id
        self.sent: list[Any] = []
        self.bytes_sent = 0
        self.config = SimpleNamespace(request_timeout=1.0)
        self.block: asyncio.Event | None = None  # while set: sends wait forever (to cancel them)

    def version_for(self, api_key: int) -> int:
        return VERSION

    async def send(self, request: Any, version: int, timeout: float | None = None) -> Any:
        assert version == VERSION
        self.sent.append(request)
        self.bytes_sent += 100
        if self.block is not None:
            await self.block.wait()
        return answer(request, self.session_id)


class FakeClient:
    """What probe_fetch and the Fetcher use of a KafkaClient."""

    def __init__(self, conn: FakeConn) -> None:
        self.conn = conn
        self.fail_connect = 0  # the next n connection attempts fail
        self.metadata = SimpleNamespace(topic_id=lambda topic: ZERO_UUID, leader_epoch=lambda t, p: -1,
                                        leader=lambda t, p: 0, needs_refresh=False)
        self.invalidated = 0

    async def _get(self) -> FakeConn:
        if self.fail_connect:
            self.fail_connect -= 1
            raise KafkaError("connection refused", retriable=True)
        return self.conn

    def connection(self, node: int) -> Any:
        return SimpleNamespace(get=self._get)

    @contextlib.asynccontextmanager
    async def lease(self, node: int) -> AsyncIterator[Any]:
        yield SimpleNamespace(get=self._get)

    def invalidate(self, topic: str | None = None) -> None:
        self.invalidated += 1


def fail_once(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> list[int]:
    """Make the next build of a Fetch message (session.to_fetch_request) raise ``exc``."""
    real: Callable[..., Any] = session_mod.to_fetch_request
    calls = [0]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(session_mod, "to_fetch_request", flaky)
    return calls


async def established(client: FakeClient) -> FetchSessionHandler:
    """A session handler whose first (full) fetch created session 55."""
    handler = FetchSessionHandler(0)
    parts = await probe_fetch(client, 0, {TP: 3}, max_bytes=1, isolation=0, session=handler)  # type: ignore[arg-type]
    assert parts[TP].high_watermark == 7
    assert handler.metadata == FetchMetadata(55, 1) and not handler.in_flight
    return handler


# -- the one-shot fetch ------------------------------------------------------------------------------
async def test_a_failure_building_the_request_does_not_wedge_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(FakeConn())
    handler = await established(client)
    calls = fail_once(monkeypatch, ValueError("cannot encode"))
    with pytest.raises(ValueError, match="cannot encode"):
        await probe_fetch(client, 0, {TP: 4}, max_bytes=1, isolation=0, session=handler)  # type: ignore[arg-type]
    assert calls == [1] and len(client.conn.sent) == 1  # nothing went out
    assert not handler.in_flight
    assert handler.metadata == FetchMetadata(55, 0)  # the next request is full and closes the old session
    # the session's next fetch works (before the fix: FetchSessionStateError, "already in flight")
    parts = await probe_fetch(client, 0, {TP: 4}, max_bytes=1, isolation=0, session=handler)  # type: ignore[arg-type]
    assert parts[TP].high_watermark == 7
    last = client.conn.sent[-1]
    assert (last.session_id, last.session_epoch) == (55, 0)
    assert [(t.topic, p.partition, p.fetch_offset) for t in last.topics for p in t.partitions] == [("t", 0, 4)]
    assert handler.metadata == FetchMetadata(55, 1) and not handler.in_flight


async def test_a_failed_connection_does_not_wedge_the_session() -> None:
    client = FakeClient(FakeConn())
    handler = await established(client)
    client.fail_connect = 1
    with pytest.raises(KafkaError, match="connection refused"):
        await probe_fetch(client, 0, {TP: 4}, max_bytes=1, isolation=0, session=handler)  # type: ignore[arg-type]
    assert not handler.in_flight
    parts = await probe_fetch(client, 0, {TP: 4}, max_bytes=1, isolation=0, session=handler)  # type: ignore[arg-type]
    assert parts[TP].high_watermark == 7 and not handler.in_flight


async def test_a_cancelled_one_shot_fetch_ends_its_flight() -> None:
    conn = FakeConn()
    client = FakeClient(conn)
    handler = await established(client)
    conn.block = asyncio.Event()
    task = asyncio.create_task(probe_fetch(client, 0, {TP: 4}, max_bytes=1, isolation=0,  # type: ignore[arg-type]
                                           session=handler))
    for _ in range(100):  # until the request is on the (fake) wire
        if len(conn.sent) == 2:
            break
        await asyncio.sleep(0)
    assert handler.in_flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not handler.in_flight and handler.metadata == FetchMetadata(55, 0)
    conn.block = None
    parts = await probe_fetch(client, 0, {TP: 4}, max_bytes=1, isolation=0, session=handler)  # type: ignore[arg-type]
    assert parts[TP].high_watermark == 7


# -- the session handler's pairing -------------------------------------------------------------------
def test_request_pairs_build_and_handle_error() -> None:
    handler = FetchSessionHandler(3)
    b = handler.builder()
    b.add(session_mod.FetchPartitionData(topic="t", topic_id=ZERO_UUID, partition=0, fetch_offset=0))
    with pytest.raises(RuntimeError, match="boom"), handler.request(b, max_version=VERSION, max_wait_ms=5,
                                                                    min_bytes=1) as fx:
        assert handler.in_flight and fx.version == VERSION and fx.data.is_full
        assert fx.message.topics[0].topic == "t"
        raise RuntimeError("boom")
    assert not handler.in_flight and handler.stats.send_errors == 1
    # a block that ends without an answer ends the flight too
    b = handler.builder()
    with handler.request(b, max_version=VERSION, max_wait_ms=5, min_bytes=1):
        assert handler.in_flight
    assert not handler.in_flight and handler.stats.send_errors == 2


def test_a_build_refused_while_another_fetch_is_in_flight_leaves_that_fetch_alone() -> None:
    handler = FetchSessionHandler(3)
    first = handler.builder()
    with handler.request(first, max_version=VERSION, max_wait_ms=5, min_bytes=1) as fx:
        with pytest.raises(FetchSessionStateError), handler.request(handler.builder(), max_version=VERSION,
                                                                    max_wait_ms=5, min_bytes=1):
            pass  # pragma: no cover - the build is refused
        assert handler.in_flight  # still the first one's
        assert handler.handle_response(answer(fx.message, 0), fx.version)
    assert not handler.in_flight and handler.stats.send_errors == 0


# -- the main fetcher ----------------------------------------------------------------------------------
async def test_the_fetcher_recovers_from_a_failure_building_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = FakeConn()
    client = FakeClient(conn)
    subs = SubscriptionState(OffsetResetStrategy.EARLIEST)
    subs.assign([TP])
    subs.seek(TP, 3)
    fetcher = Fetcher(client, subs, FetchConfig(max_wait_ms=5))  # type: ignore[arg-type]
    failures: list[Exception] = []
    fetcher.on_error = failures.append
    fail_once(monkeypatch, ValueError("cannot encode"))
    await fetcher._fetch(0, [TP])
    assert [str(e) for e in failures] == ["cannot encode"] and conn.sent == []
    handler = fetcher.sessions[0]
    assert not handler.in_flight
    await fetcher._fetch(0, [TP])
    assert len(conn.sent) == 1 and len(failures) == 1
    assert [(t.topic, p.partition, p.fetch_offset) for t in conn.sent[0].topics for p in t.partitions] == [("t", 0, 3)]
    assert handler.metadata == FetchMetadata(55, 1) and not handler.in_flight
    assert fetcher.stats.fetches == 1


async def test_a_one_off_fetch_asks_for_no_session() -> None:
    """Without a session handler of the caller's, the fetch goes out at (0, -1): a broker creates no session for it
    (at (0, 0) Kafka did, one cache slot per probe, never used again)."""
    client = FakeClient(FakeConn(session_id=0))
    for offset in (3, 4):
        parts = await probe_fetch(client, 0, {TP: offset}, max_bytes=1, isolation=0)  # type: ignore[arg-type]
        assert parts[TP].high_watermark == 7
    assert [(r.session_id, r.session_epoch) for r in client.conn.sent] == [(0, -1), (0, -1)]
