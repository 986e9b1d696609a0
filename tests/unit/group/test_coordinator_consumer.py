"""The consumer protocol's driver (service.group.coordinator_consumer) against a scripted coordinator: the order of
hooks and heartbeats in a hand-over, fencing, leaving, the commit's member epoch and a broker without the API."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from service.client.errors import KafkaError, NoCommonVersionError
from service.client.versions import NegotiatedVersions
from service.consumer.subscription import TopicPartition
from service.group.coordinator import CommitFailedError, OffsetAndMetadata
from service.group.coordinator_consumer import ConsumerProtocolCoordinator, consumer_protocol_problem
from service.group.member_consumer import ConsumerGroupMember
from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.unit.group.driver_fakes import T1, fake_client, recording_hooks, scripted_driver

RespTopic = M.struct("ConsumerGroupHeartbeatResponse", "TopicPartitions")
RespAssignment = M.struct("ConsumerGroupHeartbeatResponse", "Assignment")
CommitRespTopic = M.struct("OffsetCommitResponse", "OffsetCommitResponseTopic")
CommitRespPart = M.struct("OffsetCommitResponse", "OffsetCommitResponsePartition")


def hb_answer(epoch: int, parts: list[int] | None = None, error: int = 0) -> Any:
    asg = None if parts is None else RespAssignment(topic_partitions=[RespTopic(topic_id=T1, partitions=parts)])
    return M.ConsumerGroupHeartbeatResponse(error_code=error, member_epoch=epoch, heartbeat_interval_ms=20,
                                            assignment=asg)


class Script:
    """Answers the driver's requests from a list of functions (request -> response); records everything."""

    def __init__(self, answers: list[Callable[[Any], Any]]) -> None:
        self.answers = answers
        self.requests: list[Any] = []
        self.events: list[str] = []
        self.done = asyncio.Event()

    async def send(self, req: Any, timeout: float | None = None, blocking: bool = False,
                   deadline: float | None = None) -> Any:
        self.requests.append(req)
        name = type(req).__name__
        if name == "ConsumerGroupHeartbeatRequest":
            owned = None if req.topic_partitions is None else [p for t in req.topic_partitions for p in t.partitions]
            self.events.append(f"hb epoch={req.member_epoch} owned={owned}")
        else:
            self.events.append(name)
        if not self.answers:
            self.done.set()
            await asyncio.sleep(3600)
        return self.answers.pop(0)(req)


KAFKA_44 = {M.ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1), M.ApiKey.OFFSET_COMMIT: (2, 10)}


def driver(script: Script, broker_versions: dict[int, tuple[int, int]] = KAFKA_44,
           **kw: Any) -> tuple[ConsumerProtocolCoordinator, ConsumerGroupMember]:
    member = ConsumerGroupMember("g", **kw)
    # no connection is current: the driver's task heartbeats itself (the wheel is tested elsewhere,
    # test_consumer_heartbeat_wheel.py)
    client = fake_client(SimpleNamespace(versions=NegotiatedVersions(broker_versions)), connected=False)
    return scripted_driver(client, member, script.send, **recording_hooks(script.events, added=True)), member


async def test_hand_over_revokes_then_assigns_then_acknowledges_and_fencing_rejoins() -> None:
    script = Script([
        lambda r: hb_answer(1, [0, 1]),  # join
        lambda r: hb_answer(1),  # the acknowledgement
        lambda r: hb_answer(2, [1]),  # t-0 moves away
        lambda r: hb_answer(2),
        lambda r: hb_answer(0, error=EC.BY_NAME["FENCED_MEMBER_EPOCH"]),
        lambda r: hb_answer(3, [1]),  # rejoined
    ])
    coord, member = driver(script)
    coord.start()
    await asyncio.wait_for(script.done.wait(), 10)
    assert script.events == [
        "hb epoch=0 owned=[]",
        "assign [0, 1] added [0, 1]",
        "hb epoch=1 owned=[0, 1]",
        "hb epoch=1 owned=None",
        "revoke [0]",
        "assign [1] added []",
        "hb epoch=2 owned=[1]",
        "hb epoch=2 owned=None",
        "lost [1]",
        "hb epoch=0 owned=[]",
        "assign [1] added [1]",
        "hb epoch=3 owned=[1]",
    ]
    joins = [r for r in script.requests if r.member_epoch == 0]
    assert {r.member_id for r in joins} == {member.member_id}, "the same member id after fencing"
    script.answers.append(lambda r: hb_answer(-1))
    await coord.close()


async def test_close_releases_then_leaves() -> None:
    script = Script([lambda r: hb_answer(1, [0]), lambda r: hb_answer(1)])
    coord, member = driver(script, group_instance_id="pod-1")
    coord.start()
    await asyncio.wait_for(script.done.wait(), 10)
    script.answers.append(lambda r: hb_answer(-2))
    await coord.close()
    assert script.events[-2:] == ["revoke [0]", "hb epoch=-2 owned=None"]
    assert member.state.value == "unsubscribed"


@pytest.mark.parametrize(("versions", "says"), [
    ({M.ApiKey.OFFSET_COMMIT: (2, 9)}, "no ConsumerGroupHeartbeat API"),  # Tansu, Kafka 3.6
    ({M.ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 0), M.ApiKey.OFFSET_COMMIT: (2, 9)}, "only ConsumerGroupHeartbeat v0"),
])
async def test_a_broker_without_the_api_is_fatal_before_any_heartbeat(versions: dict[int, tuple[int, int]],
                                                                      says: str) -> None:
    script = Script([])
    coord, _ = driver(script, versions)
    fatal: list[KafkaError] = []
    coord._on_fatal = fatal.append
    coord.start()
    assert coord._task is not None
    await asyncio.wait_for(coord._task, 10)
    assert fatal and says in str(fatal[0]) and "consumer protocol" in str(fatal[0]) and coord.fatal is fatal[0]
    assert script.requests == []


def test_consumer_protocol_problem() -> None:
    assert consumer_protocol_problem(NegotiatedVersions(KAFKA_44)) is None
    assert "versions are unknown" in (consumer_protocol_problem(None) or "")
    no_v9 = {M.ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1), M.ApiKey.OFFSET_COMMIT: (2, 8)}
    assert "OffsetCommit v9" in (consumer_protocol_problem(NegotiatedVersions(no_v9)) or "")


async def test_an_unsupported_version_met_while_heartbeating_is_fatal() -> None:
    def unsupported(req: Any) -> Any:
        raise NoCommonVersionError("the broker does not support ConsumerGroupHeartbeat (api key 68)")

    script = Script([unsupported])
    coord, _ = driver(script)
    coord.start()
    assert coord._task is not None
    await asyncio.wait_for(coord._task, 10)
    assert coord.fatal is not None and "consumer group protocol" in str(coord.fatal)


def commit_answer(code: int) -> Callable[[Any], Any]:
    return lambda r: M.OffsetCommitResponse(topics=[CommitRespTopic(
        name="t", partitions=[CommitRespPart(partition_index=0, error_code=code)])])


async def test_commit_carries_the_member_epoch_and_retries_a_stale_one() -> None:
    script = Script([lambda r: hb_answer(4, [0]), lambda r: hb_answer(4)])
    coord, member = driver(script)
    coord.start()
    await asyncio.wait_for(script.done.wait(), 10)
    script.done.clear()
    # The blocked sender answers nothing more: replace the script with the commit's story.
    script.answers[:] = [commit_answer(EC.BY_NAME["STALE_MEMBER_EPOCH"]), lambda r: hb_answer(5),
                         commit_answer(0)]
    coord.wake()  # the task was waiting in the blocked send of its next heartbeat
    coord._task.cancel()  # type: ignore[union-attr]
    with pytest.raises(asyncio.CancelledError):
        await coord._task  # type: ignore[misc]
    coord.start()
    await coord.commit({TopicPartition("t", 0): OffsetAndMetadata(9)}, revoking=True, timeout=5)
    commits = [r for r in script.requests if type(r).__name__ == "OffsetCommitRequest"]
    assert [c.generation_id_or_member_epoch for c in commits] == [4, 5]
    assert {c.member_id for c in commits} == {member.member_id}
    script.answers[:] = [commit_answer(EC.BY_NAME["FENCED_MEMBER_EPOCH"])]
    with pytest.raises(CommitFailedError):
        await coord.commit({TopicPartition("t", 0): OffsetAndMetadata(9)}, revoking=True, timeout=5)
    script.answers[:] = [lambda r: hb_answer(-1)]
    await coord.close()
