"""Heartbeats of stable members sent in batches per coordinator connection (service/group/heartbeats.py) and
the batched send underneath (service/client/connection.py send_frames_nowait)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from service.client.connection import BrokerConnection, ConnectionConfig, send_frames_nowait
from service.client.errors import KafkaConnectionError, RequestTimeoutError
from service.client.versions import NegotiatedVersions
from service.group.assignors import RangeAssignor
from service.group.coordinator import HEARTBEAT_TICK_S, GroupCoordinator
from service.group.heartbeats import (
    HeartbeatWheel,
    encoded_group,
    heartbeat_body,
    heartbeat_error_code,
    heartbeat_wheel,
)
from service.group.member import GroupMember, MemberState
from service.protocol import error_codes as EC
from service.protocol import frames
from service.protocol import messages as M
from service.protocol.errors import ProtocolDecodeError


class FakeWriter:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.reading = True
        self.resumed = 0

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.resumed += not self.reading
        self.reading = True

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def connection(loop: asyncio.AbstractEventLoop, version: int = 4) -> tuple[BrokerConnection, FakeWriter]:
    conn = BrokerConnection("127.0.0.1", 1, ConnectionConfig(client_id="cid"))
    writer = FakeWriter()
    conn._writer = writer  # type: ignore[assignment]
    conn._loop = loop
    conn.versions = NegotiatedVersions({M.ApiKey.HEARTBEAT: (0, version)})
    return conn, writer


def split_frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    assert pos == len(data)
    return out


def sent_requests(writer: FakeWriter) -> list[tuple[int, Any]]:
    """(correlation id, decoded request) of every frame written."""
    out = []
    for frame in split_frames(b"".join(writer.writes)):
        hdr, req = frames.decode_request(frame)
        assert hdr.client_id == "cid"
        out.append((hdr.correlation_id, req))
    return out


def answer(conn: BrokerConnection, corr: int, version: int, code: int) -> None:
    frame = frames.encode_response(M.HeartbeatResponse(throttle_time_ms=0, error_code=code), version, corr)
    conn._on_frame(frame[4:], len(frame) - 4)


# -- encoding ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", range(5))
@pytest.mark.parametrize("instance", [None, "replica-0/inst", "ünïcode-✓"])
def test_heartbeat_body_matches_the_generic_encoder(version: int, instance: str | None) -> None:
    for group, gen, member in [("g", 0, ""), ("grøup-" + "x" * 200, 2**31 - 1, "m-" + "é" * 70), ("g", -1, "m")]:
        req = M.HeartbeatRequest(group_id=group, generation_id=gen, member_id=member, group_instance_id=instance)
        generic = frames.encode_request(req, version, 7, "cid")
        head = frames.encode_request(M.HeartbeatRequest(group_id="", generation_id=0, member_id=""), version, 7,
                                     "cid")
        # the header is the same for every heartbeat of a version; the body follows it
        header_len = len(head) - len(heartbeat_body(version, encoded_group(version, ""), 0, "", None))
        assert generic[header_len:] == heartbeat_body(version, encoded_group(version, group), gen, member, instance)


@pytest.mark.parametrize("version", range(5))
@pytest.mark.parametrize("code", [0, EC.REBALANCE_IN_PROGRESS, EC.UNKNOWN_MEMBER_ID, -1])
def test_heartbeat_error_code_reads_every_version(version: int, code: int) -> None:
    frame = frames.encode_response(M.HeartbeatResponse(throttle_time_ms=5, error_code=code), version, 9)
    assert heartbeat_error_code(version, frame[4:]) == code


def test_heartbeat_error_code_refuses_short_frames_and_header_tags() -> None:
    with pytest.raises(ProtocolDecodeError):
        heartbeat_error_code(4, b"\x00\x00\x00\x09\x00\x00")
    with pytest.raises(ProtocolDecodeError):
        heartbeat_error_code(4, b"\x00\x00\x00\x09\x01\x00\x01x\x00\x00\x00\x00\x00\x00\x00")


# -- send_frames_nowait ----------------------------------------------------------------------------------------
def bodies(n: int, version: int = 4) -> list[bytes]:
    return [heartbeat_body(version, encoded_group(version, "g"), 1, f"m{i}", None) for i in range(n)]


async def test_a_batch_leaves_in_one_write_and_answers_find_their_items() -> None:
    conn, writer = connection(asyncio.get_running_loop())
    conn._next_corr = 0x7FFFFFFE  # the correlation ids wrap inside the batch
    got: list[tuple[Any, bytes | None, BaseException | None]] = []
    send_frames_nowait(conn, M.ApiKey.HEARTBEAT, 4, bodies(4), ["a", "b", "c", "d"],
                       lambda item, payload, exc: got.append((item, payload, exc)))
    await asyncio.sleep(0)  # the connection's write of this loop iteration
    assert len(writer.writes) == 1 and conn.in_flight == 4
    reqs = sent_requests(writer)
    assert [c for c, _ in reqs] == [0x7FFFFFFE, 0x7FFFFFFF, 0, 1]
    assert [r.member_id for _, r in reqs] == ["m0", "m1", "m2", "m3"]
    answer(conn, 0, 4, 0)
    answer(conn, 0x7FFFFFFE, 4, EC.REBALANCE_IN_PROGRESS)
    assert [(item, heartbeat_error_code(4, p or b""), e) for item, p, e in got] == [
        ("c", 0, None), ("a", EC.REBALANCE_IN_PROGRESS, None)]
    answer(conn, 0, 4, 0)  # a stray repeat: ignored
    assert len(got) == 2 and conn.in_flight == 2
    answer(conn, 1, 4, 0)
    answer(conn, 0x7FFFFFFF, 4, 0)
    assert [item for item, _, _ in got] == ["c", "a", "d", "b"] and conn.in_flight == 0


async def test_a_timeout_fails_what_is_unanswered_at_once() -> None:
    conn, _writer = connection(asyncio.get_running_loop())
    got: list[tuple[Any, BaseException | None]] = []
    send_frames_nowait(conn, M.ApiKey.HEARTBEAT, 4, bodies(3), [0, 1, 2],
                       lambda item, _p, exc: got.append((item, exc)), timeout=0.0)
    answer(conn, 1, 4, 0)
    conn._sweep()  # the deadline (now) has passed
    assert [i for i, _ in got] == [1, 0, 2] and got[0][1] is None
    assert all(isinstance(e, RequestTimeoutError) and "HeartbeatRequest v4" in str(e) for _, e in got[1:])
    assert conn.in_flight == 0
    answer(conn, 2, 4, 0)  # too late: dropped
    assert len(got) == 3


async def test_a_broken_connection_fails_the_batch_and_a_closed_one_calls_back_at_once() -> None:
    conn, _writer = connection(asyncio.get_running_loop())
    got: list[tuple[Any, BaseException | None]] = []
    send_frames_nowait(conn, M.ApiKey.HEARTBEAT, 4, bodies(2), ["x", "y"],
                       lambda item, _p, exc: got.append((item, exc)))
    conn._fail(KafkaConnectionError("broker went away"))
    assert [(i, str(e)) for i, e in got] == [("x", "broker went away"), ("y", "broker went away")]
    send_frames_nowait(conn, M.ApiKey.HEARTBEAT, 4, bodies(1), ["z"], lambda item, _p, exc: got.append((item, exc)))
    assert got[2][0] == "z" and isinstance(got[2][1], KafkaConnectionError)


async def test_a_failing_batch_callback_does_not_break_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    conn, writer = connection(asyncio.get_running_loop())
    got: list[Any] = []

    def callback(item: Any, _payload: bytes | None, _exc: BaseException | None) -> None:
        if item == "boom":
            raise RuntimeError("callback bug")
        got.append(item)

    send_frames_nowait(conn, M.ApiKey.HEARTBEAT, 4, bodies(2), ["boom", "fine"], callback)
    answer(conn, 0, 4, 0)
    answer(conn, 1, 4, 0)
    assert got == ["fine"] and conn.connected and not writer.closed
    assert "callback of HeartbeatRequest v4" in caplog.text


# -- the wheel -------------------------------------------------------------------------------------------------
class _MC:
    def __init__(self, conn: BrokerConnection | None) -> None:
        self.current = conn


class _Meta:
    def broker(self, _node: int) -> None:
        return None

    def mark_stale(self, *_a: Any) -> None:
        pass


class FakeClient:
    """connection(node) -> the fake connection of that node (None: not connected); heartbeat_connection(node)
    -> its fake heartbeat connection (none unless given)."""

    def __init__(self, conns: dict[int, BrokerConnection | None],
                 hb_conns: dict[int, BrokerConnection] | None = None) -> None:
        self.conns = conns
        self.hb_conns = hb_conns or {}
        self.metadata = _Meta()

    def connection(self, node: int) -> _MC:
        return _MC(self.conns[node])

    def heartbeat_connection(self, node: int) -> _MC:
        return _MC(self.hb_conns.get(node))


def stable_member(client: FakeClient, group: str, member_id: str, node: int,
                  loop: asyncio.AbstractEventLoop, instance: str | None = None) -> GroupCoordinator:
    m = GroupMember(group, [RangeAssignor()], group_instance_id=instance)
    m.member_id, m.generation_id, m.state, m.rejoin_needed = member_id, 3, MemberState.STABLE, False

    async def nothing(*_a: Any) -> Any:
        return None

    c = GroupCoordinator(client, m, heartbeat_interval_ms=1000, partition_counts=nothing,  # type: ignore[arg-type]
                         on_revoke=nothing, on_assign=nothing, topics=lambda: ["t"])
    c.coordinator_id = node
    c._loop = loop
    return c


def fire_now(wheel: HeartbeatWheel) -> None:
    """Run the wheel's due tick now (instead of waiting for its timer)."""
    assert wheel._handle is not None
    wheel._handle.cancel()
    wheel._handle = None
    wheel._armed = max(wheel._heap)
    wheel._fire()


async def test_the_heartbeats_of_a_tick_leave_as_one_batch_per_coordinator_connection() -> None:
    loop = asyncio.get_running_loop()
    (c1, w1), (c2, w2) = connection(loop), connection(loop, version=3)
    client = FakeClient({1: c1, 2: c2, 3: None})
    a = stable_member(client, "g1", "a", 1, loop)
    b = stable_member(client, "g1", "b", 1, loop, instance="static-b")
    c = stable_member(client, "g2", "c", 2, loop)
    d = stable_member(client, "g2", "d", 3, loop)  # its coordinator is not connected: its task must act
    stale = stable_member(client, "g1", "stale", 1, loop)
    wheel = heartbeat_wheel(loop, HEARTBEAT_TICK_S)
    for coord in (a, b, c, d, stale):
        wheel.add(coord, loop.time())
    stale.heartbeat_epoch += 1  # its task took over after the heartbeat was scheduled
    fire_now(wheel)
    await asyncio.sleep(0)
    assert (len(w1.writes), len(w2.writes)) == (1, 1) and wheel.batches == 2 and wheel.sent == 3
    r1, r2 = sent_requests(w1), sent_requests(w2)
    assert [(r.group_id, r.member_id, r.generation_id, r.group_instance_id) for _, r in r1] == [
        ("g1", "a", 3, None), ("g1", "b", 3, "static-b")]
    assert [(r.group_id, r.member_id) for _, r in r2] == [("g2", "c")]
    assert d._wake.is_set() and not a._wake.is_set() and len(wheel) == 0
    # answers: OK reschedules the member on the wheel (no task involved); an error wakes the member's task
    answer(c1, r1[0][0], 4, 0)
    answer(c1, r1[1][0], 4, EC.REBALANCE_IN_PROGRESS)
    answer(c2, r2[0][0], 3, 0)
    assert (a.heartbeats, b.heartbeats, c.heartbeats) == (1, 1, 1)
    assert {coord.member.member_id for coord, _ in wheel.entries()} == {"a", "c"}
    assert not a._wake.is_set() and b._wake.is_set() and b._hb_result is not None
    assert b.member.rejoin_needed and a.heartbeat_latency is not None and a.heartbeat_latency >= 0


async def test_a_failed_or_undecodable_heartbeat_wakes_the_members_task() -> None:
    loop = asyncio.get_running_loop()
    conn, writer = connection(loop)
    client = FakeClient({1: conn})
    a, b = stable_member(client, "g", "a", 1, loop), stable_member(client, "g", "b", 1, loop)
    wheel = heartbeat_wheel(loop, HEARTBEAT_TICK_S)
    wheel.add(a, loop.time())
    wheel.add(b, loop.time())
    fire_now(wheel)
    await asyncio.sleep(0)
    (ca, _), (cb, _) = sent_requests(writer)
    conn._on_frame(struct.pack(">i", ca) + b"\x00\x00", 6)  # truncated body
    assert a._wake.is_set() and isinstance(a._hb_result, ProtocolDecodeError)
    conn._fail(KafkaConnectionError("gone"))
    assert b._wake.is_set() and isinstance(b._hb_result, KafkaConnectionError)
    assert cb != ca and len(wheel) == 0 and a.heartbeats == b.heartbeats == 0


async def test_the_loop_has_one_wheel_per_tick() -> None:
    loop = asyncio.get_running_loop()
    assert heartbeat_wheel(loop, 0.02) is heartbeat_wheel(loop, 0.02)
    assert heartbeat_wheel(loop, 0.05) is not heartbeat_wheel(loop, 0.02)


async def test_a_dedicated_heartbeat_connection_is_read_once_per_tick() -> None:
    loop = asyncio.get_running_loop()
    (main, main_w), (hb, hb_w) = connection(loop), connection(loop)
    client = FakeClient({1: main}, {1: hb})
    members = [stable_member(client, "g", f"m{i}", 1, loop) for i in range(3)]
    wheel = heartbeat_wheel(loop, HEARTBEAT_TICK_S)
    for coord in members:
        wheel.add(coord, loop.time())
    fire_now(wheel)
    await asyncio.sleep(0)
    assert main_w.writes == [] and len(hb_w.writes) == 1  # the heartbeats go over the dedicated connection
    corrs = [c for c, _ in sent_requests(hb_w)]
    answer(hb, corrs[0], 4, 0)  # what one read brought: the first answer stops further reads ...
    answer(hb, corrs[1], 4, 0)  # ... but every answer already read is handled
    assert not hb_w.reading and [m.heartbeats for m in members] == [1, 1, 0]
    # one answer still in flight: the wheel comes back at the next tick to read it (its timer is armed)
    assert wheel._handle is not None and wheel._armed is not None
    wheel._handle.cancel()
    wheel._handle = None
    wheel._fire()
    assert hb_w.reading and hb_w.resumed == 1
    answer(hb, corrs[2], 4, 0)
    assert not hb_w.reading and [m.heartbeats for m in members] == [1, 1, 1] and hb.in_flight == 0
    assert wheel._handle is not None and len(wheel) == 3  # the members' next heartbeats wait on the wheel
