"""A share-group member (KIP-932 ShareGroupHeartbeat), as a pure state machine.

The member names itself (a random id kept for its whole life), joins by heartbeating with epoch 0 and its
subscription, and from then on heartbeats with the epoch the coordinator gave it. The coordinator computes the
assignment; a member only applies it: there is nothing to revoke or commit first, since acquired records are
settled per record, not by offsets. Leaving is a heartbeat with epoch -1.

No I/O: the driver builds each heartbeat here, sends it to the group coordinator and hands the answer back.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M

JOIN_EPOCH = 0
LEAVE_EPOCH = -1

#: the coordinator moved or is not ready: find it again (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE) or retry
COORDINATOR_ERRORS = frozenset({EC.NOT_COORDINATOR, EC.COORDINATOR_NOT_AVAILABLE, EC.COORDINATOR_LOAD_IN_PROGRESS})
#: the coordinator no longer knows this member (or its epoch): rejoin from epoch 0 under the same id
FENCED_ERRORS = frozenset({EC.FENCED_MEMBER_EPOCH, EC.UNKNOWN_MEMBER_ID})


class MemberState(enum.Enum):
    JOINING = "joining"  # the next heartbeat has epoch 0
    STABLE = "stable"
    LEAVING = "leaving"  # the next heartbeat has epoch -1
    LEFT = "left"
    FAILED = "failed"  # a fatal error (authorization, group full, invalid request): see ``error``


class ShareMemberError(Exception):
    def __init__(self, code: int, message: str | None) -> None:
        super().__init__(f"{EC.describe(code).name}: {message or ''}".rstrip(": "))
        self.code = code


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    """What one answer changed."""

    error_code: int
    assignment_changed: bool = False
    find_coordinator: bool = False  # the driver must look the coordinator up again
    fenced: bool = False  # the member lost its assignment and rejoins


class ShareMember:
    def __init__(self, group_id: str, topics: Iterable[str], *, member_id: str | None = None,
                 rack_id: str | None = None) -> None:
        self.group_id = group_id
        self.member_id = member_id or str(uuid.uuid4())
        self.rack_id = rack_id
        self.epoch = JOIN_EPOCH
        self.state = MemberState.JOINING
        self.heartbeat_interval_ms = 5000
        self.assignment: dict[uuid.UUID, frozenset[int]] = {}
        self.error: ShareMemberError | None = None
        self._topics = sorted(set(topics))
        self._send_full = True  # the next heartbeat repeats the subscription (and rack)
        self._in_flight = False

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    def subscribe(self, topics: Iterable[str]) -> None:
        new = sorted(set(topics))
        if new != self._topics:
            self._topics = new
            self._send_full = True

    def assigned(self) -> list[tuple[uuid.UUID, int]]:
        return sorted((tid, p) for tid, ps in self.assignment.items() for p in ps)

    # -- requests -------------------------------------------------------------------------------------------------
    def build_heartbeat(self) -> Any:
        if self._in_flight:
            raise RuntimeError("a heartbeat is already in flight")
        if self.state in (MemberState.LEFT, MemberState.FAILED):
            raise RuntimeError(f"the member has {self.state.value}")
        self._in_flight = True
        if self.state == MemberState.LEAVING:
            return M.ShareGroupHeartbeatRequest(group_id=self.group_id, member_id=self.member_id,
                                                member_epoch=LEAVE_EPOCH)
        full = self._send_full or self.epoch == JOIN_EPOCH
        return M.ShareGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch,
            rack_id=self.rack_id if full else None, subscribed_topic_names=list(self._topics) if full else None)

    def leave(self) -> bool:
        """Ask for the leaving heartbeat; False when there is nothing to leave (never joined, or gone)."""
        if self.state in (MemberState.LEFT, MemberState.FAILED):
            return False
        if self.epoch == JOIN_EPOCH and self.state == MemberState.JOINING:
            self.state = MemberState.LEFT
            self.assignment = {}
            return False
        self.state = MemberState.LEAVING
        return True

    # -- answers --------------------------------------------------------------------------------------------------
    def handle_response(self, resp: Any) -> HeartbeatOutcome:
        self._in_flight = False
        code = resp.error_code
        if self.state == MemberState.LEAVING:
            # Whatever the answer, the member is gone: the coordinator drops it on leave or after its session.
            self.state = MemberState.LEFT
            changed = bool(self.assignment)
            self.assignment = {}
            return HeartbeatOutcome(code, assignment_changed=changed)
        if code in COORDINATOR_ERRORS:
            return HeartbeatOutcome(code, find_coordinator=code != EC.COORDINATOR_LOAD_IN_PROGRESS)
        if code in FENCED_ERRORS:
            changed = bool(self.assignment)
            self._rejoin()
            return HeartbeatOutcome(code, assignment_changed=changed, fenced=True)
        if code != EC.NONE:
            self.state = MemberState.FAILED
            self.error = ShareMemberError(code, resp.error_message)
            changed = bool(self.assignment)
            self.assignment = {}
            return HeartbeatOutcome(code, assignment_changed=changed)
        self._send_full = False
        self.epoch = resp.member_epoch
        if resp.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = resp.heartbeat_interval_ms
        self.state = MemberState.STABLE
        changed = False
        if resp.assignment is not None:  # null: unchanged since the last answer
            new = {tp.topic_id: frozenset(tp.partitions) for tp in resp.assignment.topic_partitions if tp.partitions}
            changed = new != self.assignment
            self.assignment = new
        return HeartbeatOutcome(code, assignment_changed=changed)

    def heartbeat_failed(self) -> None:
        """No answer (connection lost, timeout): the next heartbeat repeats the whole subscription."""
        self._in_flight = False
        self._send_full = True
        if self.state == MemberState.LEAVING:
            self.state = MemberState.LEFT
            self.assignment = {}

    def _rejoin(self) -> None:
        self.epoch = JOIN_EPOCH
        self.state = MemberState.JOINING
        self.assignment = {}
        self._send_full = True
