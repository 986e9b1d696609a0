"""Consumer protocol (KIP-848) members on the shared heartbeat wheel (service/group/heartbeats.py): the idle
ConsumerGroupHeartbeat encoded by hand and its plain answer read from the raw frame, both checked against the
generic codec; and the driver (service.group.coordinator_consumer) handing its stable member's heartbeats to the
wheel, the task asleep, and taking over for a new assignment, fencing and leaving."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from service.client.connection import BrokerConnection
from service.client.errors import KafkaConnectionError
from service.client.versions import NegotiatedVersions
from service.group.coordinator import HEARTBEAT_TICK_S
from service.group.heartbeats import (
    consumer_heartbeat_body,
    consumer_heartbeat_idle_answer,
    encoded_group,
    heartbeat_wheel,
)
from service.group.member_consumer import ConsumerGroupMember, ConsumerMemberState
from service.protocol import error_codes as EC
from service.protocol import frames
from service.protocol import messages as M
from tests.unit.group.driver_fakes import T1, fake_client, recording_hooks, scripted_driver
from tests.unit.group.test_heartbeat_batches import FakeWriter, split_frames

ReqTopic = M.struct("ConsumerGroupHeartbeatRequest", "TopicPartitions")
RespTopic = M.struct("ConsumerGroupHeartbeatResponse", "TopicPartitions")
RespAssignment = M.struct("ConsumerGroupHeartbeatResponse", "Assignment")
CGH = M.ApiKey.CONSUMER_GROUP_HEARTBEAT
BROKER = {M.ApiKey.HEARTBEAT: (0, 4), CGH: (0, 1), M.ApiKey.OFFSET_COMMIT: (2, 10)}


def response(epoch: int, parts: list[int] | None = None, error: int = 0, interval_ms: int = 20,
             member_id: str | None = "m", message: str | None = None) -> Any:
    asg = None if parts is None else RespAssignment(topic_partitions=[RespTopic(topic_id=T1, partitions=parts)])
    return M.ConsumerGroupHeartbeatResponse(error_code=error, error_message=message, member_id=member_id,
                                            member_epoch=epoch, heartbeat_interval_ms=interval_ms, assignment=asg)


# -- encoding ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("instance", [None, "replica-0.default.c", "ünïcode-✓" * 30])
def test_consumer_heartbeat_body_matches_the_generic_encoder(version: int, instance: str | None) -> None:
    idle = dict(group_id="grøup-" + "x" * 150, member_id="AAAAAAAAAAAAAAAAAAAAAA", member_epoch=2**31 - 1,
                instance_id=instance)
    busy = [dict(rack_id="r1"), dict(rebalance_timeout_ms=300000), dict(subscribed_topic_names=["a", "b"]),
            dict(server_assignor="uniform"), dict(topic_partitions=[ReqTopic(topic_id=T1, partitions=[0, 3])])]
    if version >= 1:
        busy.append(dict(subscribed_topic_regex="a.*"))
    for extra in [{}, *busy]:
        req = M.ConsumerGroupHeartbeatRequest(**idle, **extra)  # type: ignore[arg-type]
        generic = frames.encode_request(req, version, 7, "cid")
        header = len(frames.encode_request(M.ConsumerGroupHeartbeatRequest(group_id="", member_id=""), version, 7,
                                           "cid")) - len(consumer_heartbeat_body(
                                               version, encoded_group(4, ""),
                                               M.ConsumerGroupHeartbeatRequest(group_id="", member_id="")))
        assert generic[header:] == consumer_heartbeat_body(version, encoded_group(4, req.group_id), req), extra


@pytest.mark.parametrize("version", [0, 1])
def test_the_plain_answer_is_read_from_the_frame_and_any_other_is_left_to_the_decoder(version: int) -> None:
    def frame(resp: Any) -> bytes:
        return frames.encode_response(resp, version, 9)[4:]

    assert consumer_heartbeat_idle_answer(frame(response(12, interval_ms=5000))) == (12, 5000)
    assert consumer_heartbeat_idle_answer(frame(response(3, member_id=None))) == (3, 20)
    assert consumer_heartbeat_idle_answer(frame(response(3, member_id="x" * 126))) == (3, 20)
    for other in [response(3, parts=[0]), response(3, parts=[]), response(0, error=EC.UNKNOWN_MEMBER_ID),
                  response(3, message="hm"), response(3, member_id="x" * 127)]:
        assert consumer_heartbeat_idle_answer(frame(other)) is None, other
    assert consumer_heartbeat_idle_answer(frame(response(3))[:-1]) is None  # truncated
    assert consumer_heartbeat_idle_answer(frame(response(3)) + b"\x00") is None


def test_the_member_reads_a_plain_answer_as_the_whole_one() -> None:
    a, b = ConsumerGroupMember("g", member_id="m"), ConsumerGroupMember("g", member_id="m")
    for m in (a, b):
        m.subscribe(["t"])
        m.heartbeat_request(0.0)
        m.on_heartbeat_response(response(4, parts=[]), 0.0)  # stable with nothing
        m.heartbeat_request(1.0)
        assert m.heartbeat_in_flight
    a.on_heartbeat_response(response(5, interval_ms=300), 2.0)
    b.on_heartbeat_ok(5, 300, 2.0)
    for m in (a, b):
        assert (m.member_epoch, m.heartbeat_interval_s, m.state, m.heartbeat_in_flight) == (
            5, 0.3, ConsumerMemberState.STABLE, False)
        assert m.next_heartbeat_in(2.0) == pytest.approx(0.3) and not m.heartbeat_due(2.1)


# -- the driver on the wheel -----------------------------------------------------------------------------------
def broker_connection(loop: asyncio.AbstractEventLoop) -> tuple[BrokerConnection, FakeWriter]:
    conn = BrokerConnection("127.0.0.1", 1, SimpleNamespace(client_id="cid", request_timeout=30.0))  # type: ignore
    writer = FakeWriter()
    conn._writer = writer  # type: ignore[assignment]
    conn._loop = loop
    conn.versions = NegotiatedVersions(BROKER)
    return conn, writer


class Wire:
    """The heartbeats the wheel writes on the coordinator's heartbeat connection, answered by the test."""

    def __init__(self, conn: BrokerConnection, writer: FakeWriter) -> None:
        self.conn, self.writer, self.seen = conn, writer, 0

    async def next(self, timeout: float = 5.0) -> tuple[int, Any]:
        """The next ConsumerGroupHeartbeat written (correlation id, request)."""
        deadline = time.monotonic() + timeout
        while True:
            reqs = [frames.decode_request(f) for f in split_frames(b"".join(self.writer.writes))]
            if len(reqs) > self.seen:
                hdr, req = reqs[self.seen]
                self.seen += 1
                assert hdr.api_key == CGH
                return hdr.correlation_id, req
            assert time.monotonic() < deadline, "no heartbeat from the wheel"
            await asyncio.sleep(0.002)  # the wheel's next tick (20 ms grid)

    def answer(self, corr: int, resp: Any) -> None:
        frame = frames.encode_response(resp, 1, corr)
        self.conn._on_frame(frame[4:], len(frame) - 4)


def wheel_client(loop: asyncio.AbstractEventLoop) -> tuple[Any, BrokerConnection, Wire]:
    """The driver's client, its coordinator's main and heartbeat connections writing to fakes: the client, the
    heartbeat connection and what the wheel writes there."""
    main, _ = broker_connection(loop)
    hb, hb_writer = broker_connection(loop)
    return fake_client(main, hb), hb, Wire(hb, hb_writer)


class Scripted:
    """The task's own heartbeats (through the driver's _send), answered from a list; records the hooks too."""

    def __init__(self) -> None:
        self.answers: list[Callable[[Any], Any]] = []
        self.events: list[str] = []
        self.sent = asyncio.Event()

    async def send(self, req: Any, timeout: float | None = None, blocking: bool = False,
                   deadline: float | None = None) -> Any:
        owned = None if req.topic_partitions is None else [p for t in req.topic_partitions for p in t.partitions]
        self.events.append(f"task hb epoch={req.member_epoch} owned={owned}")
        self.sent.set()
        assert self.answers, self.events
        return self.answers.pop(0)(req)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.002)  # polling the driver's state (it runs on this loop)


async def test_a_stable_member_heartbeats_from_the_wheel_and_its_task_takes_over_for_changes() -> None:
    loop = asyncio.get_running_loop()
    client, hb, wire = wheel_client(loop)
    script = Scripted()
    member = ConsumerGroupMember("g", member_id="m")
    coord = scripted_driver(client, member, script.send, **recording_hooks(script.events))
    script.answers += [lambda r: response(1, [0, 1]), lambda r: response(1)]  # join, acknowledgement
    coord.start()
    try:
        # stable: the wheel heartbeats (the idle request), plain answers only schedule the next one
        wheel = heartbeat_wheel(loop, HEARTBEAT_TICK_S)
        sent_before = wheel.sent
        for _ in range(3):
            corr, req = await wire.next()
            assert (req.member_id, req.member_epoch, req.topic_partitions, req.subscribed_topic_names) == (
                "m", 1, None, None)
            assert coord.heartbeat_route() is None, "one heartbeat in flight at a time"
            wire.answer(corr, response(1))
        assert wheel.sent - sent_before >= 3
        assert script.events == ["task hb epoch=0 owned=[]", "assign [0, 1]", "task hb epoch=1 owned=[0, 1]"]
        assert coord.heartbeats >= 5 and coord.stable

        # a new target in a wheel answer: the task revokes, assigns and acknowledges at once, then the wheel again
        script.answers.append(lambda r: response(2))
        corr, _ = await wire.next()
        wire.answer(corr, response(2, [1]))
        corr, req = await wire.next()
        assert script.events[3:] == ["revoke [0]", "assign [1]", "task hb epoch=2 owned=[1]"]
        assert req.member_epoch == 2

        # fenced in a wheel answer: the partitions are lost (not revoked), the member rejoins with epoch 0
        script.answers += [lambda r: response(3, [1]), lambda r: response(3)]
        wire.answer(corr, response(0, error=EC.BY_NAME["FENCED_MEMBER_EPOCH"], member_id=None))
        corr, req = await wire.next()
        assert script.events[6:] == ["lost [1]", "task hb epoch=0 owned=[]", "assign [1]",
                                     "task hb epoch=3 owned=[1]"]
        assert req.member_epoch == 3 and member.fencings == 1

        # a wheel heartbeat failing (connection lost) wakes the task, which heartbeats itself
        script.sent.clear()
        script.answers.append(lambda r: response(3))
        hb._fail(KafkaConnectionError("gone"))
        await asyncio.wait_for(script.sent.wait(), 5)
        assert script.events[-1].startswith("task hb epoch=3")
        assert coord.coordinator_id is None or coord.last_error is not None
    finally:
        coord.coordinator_id = 1
        script.answers.append(lambda r: response(-1))
        await coord.close()
    assert script.events[-2:] == ["revoke [1]", "task hb epoch=-1 owned=None"]
    assert member.state is ConsumerMemberState.UNSUBSCRIBED


async def test_closing_waits_for_the_wheels_heartbeat_in_flight_before_leaving() -> None:
    client, _, wire = wheel_client(asyncio.get_running_loop())
    script = Scripted()
    member = ConsumerGroupMember("g", member_id="m", group_instance_id="pod-1")

    async def nothing(*_a: Any) -> None:
        return None

    coord = scripted_driver(client, member, script.send, on_revoke=nothing, on_assign=nothing)
    script.answers += [lambda r: response(1, [0]), lambda r: response(1), lambda r: response(-2)]
    coord.start()
    corr, _ = await wire.next()  # in flight from the wheel
    closing = asyncio.create_task(coord.close())
    await until(lambda: member.state is ConsumerMemberState.PREPARE_LEAVING)
    await asyncio.sleep(0.05)
    assert not closing.done() and script.events[-1] == "task hb epoch=1 owned=[0]", "the leave waits"
    wire.answer(corr, response(1))
    await asyncio.wait_for(closing, 5)
    assert script.events[-1] == "task hb epoch=-2 owned=None" and member.state is ConsumerMemberState.UNSUBSCRIBED
