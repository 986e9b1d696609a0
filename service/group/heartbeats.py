"""Heartbeats of stable members, batched per coordinator connection (cheap idle instances).

Ten thousand idle members of a gateway each heartbeat every few seconds. One :class:`HeartbeatWheel` per
event loop keeps every stable member's next heartbeat on a grid of ``tick`` seconds with one loop timer for
all of them. When a tick fires, the heartbeats due in it are grouped by the coordinator connection they go
to, and each group leaves as one batch of pipelined requests (:func:`send_frames_nowait`: no task, future
or timer per heartbeat, one write per connection). The request bodies are encoded here by hand (only the
generation changes between a member's heartbeats; checked against the generic encoder in the unit tests)
and the answers are read straight from the raw frames: an error code of 0 just schedules the member's next
heartbeat; anything else goes through the member's state machine and wakes its task.

Members of the consumer group protocol (KIP-848, :mod:`service.group.coordinator_consumer`) ride the same
wheel with ConsumerGroupHeartbeat: their requests come from the member's state machine (the idle ones, which
carry only the group, member id and epoch, are encoded here by hand, the others by the generic encoder), and
an answer that changes nothing (no error, no new assignment: read straight from the raw frame) only schedules
the next heartbeat at the interval the broker gave; any other answer goes to the member's state machine and,
unless it is still stable, wakes its task.

The coordinator (:mod:`service.group.coordinator`) decides whether a heartbeat may go from here at all
(``heartbeat_route``) and handles what an answer other than OK asks for.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import weakref
from typing import Any, Protocol, cast

from service.client.connection import BrokerConnection, pause_reading, resume_reading, send_frames_nowait
from service.client.errors import KafkaError
from service.group.member import GroupMember
from service.lib.aio import TickGrid
from service.protocol import frames
from service.protocol import messages as M
from service.protocol.errors import KafkaProtocolError, ProtocolDecodeError

HEARTBEAT = int(M.ApiKey.HEARTBEAT)
CONSUMER_GROUP_HEARTBEAT = int(M.ApiKey.CONSUMER_GROUP_HEARTBEAT)
_HB_SCHEMA = M.REQUESTS[HEARTBEAT].schema
_CGH = M.REQUESTS[CONSUMER_GROUP_HEARTBEAT]
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_NULL16 = b"\xff\xff"  # a null string (non-flexible versions)


class HeartbeatTarget(Protocol):
    """What the wheel needs of a member's driver (service.group.coordinator.GroupCoordinator implements it):
    the wheel never reaches into the coordinator otherwise."""

    heartbeat_epoch: int  # moves on when the member's task takes over: entries of an older epoch are dropped
    heartbeat_sent_at: float  # loop time the wheel last sent this member's heartbeat
    heartbeat_api: int  # HEARTBEAT (classic), or CONSUMER_GROUP_HEARTBEAT: a ConsumerHeartbeatTarget

    @property
    def member(self) -> GroupMember: ...

    def heartbeat_route(self) -> tuple[BrokerConnection, bool] | None:
        """The connection for a due heartbeat (True: a dedicated one), or None: the wheel may not send it."""
        ...

    def heartbeat_blocked(self) -> None:
        """A due heartbeat could not go from the wheel (heartbeat_route gave None): the member's task decides."""
        ...

    def on_heartbeat_ok(self, epoch: int) -> None:
        """A heartbeat of ``epoch`` was answered without error."""
        ...

    def on_heartbeat_answer(self, epoch: int, started: float, resp: Any, exc: BaseException | None) -> None:
        """A heartbeat of ``epoch`` sent at loop time ``started`` was answered (``resp``) or failed (``exc``)."""
        ...


class ConsumerHeartbeatTarget(HeartbeatTarget, Protocol):
    """What the wheel needs beyond :class:`HeartbeatTarget` of a consumer protocol member's driver
    (service.group.coordinator_consumer.ConsumerProtocolCoordinator)."""

    def consumer_heartbeat_request(self) -> Any:
        """The member's next ConsumerGroupHeartbeatRequest, sent from the wheel now (in flight from here on)."""
        ...

    def on_consumer_heartbeat_ok(self, epoch: int, member_epoch: int, interval_ms: int) -> None:
        """A heartbeat of ``epoch`` was answered without error, assignment or member id change."""
        ...


def _string(s: str, flexible: bool) -> bytes:
    b = s.encode()
    if flexible:
        return _uvarint(len(b) + 1) + b
    return _I16.pack(len(b)) + b


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def heartbeat_body(version: int, group: bytes, generation: int, member_id: str, instance_id: str | None) -> bytes:
    """HeartbeatRequest ``version`` (0-4) without its header; ``group`` is :func:`encoded_group`'s bytes."""
    flexible = version >= 4
    body = group + _I32.pack(generation) + _string(member_id, flexible)
    if version >= 3:
        if instance_id is not None:
            body += _string(instance_id, flexible)
        else:
            body += b"\x00" if flexible else _NULL16
    if flexible:
        body += b"\x00"  # no tagged fields
    return body


def encoded_group(version: int, group_id: str) -> bytes:
    return _string(group_id, version >= 4)


def heartbeat_error_code(version: int, payload: bytes) -> int:
    """The error code of a raw HeartbeatResponse frame (correlation id first). Raises ProtocolDecodeError for
    a frame too short to hold one, or a header with tagged fields (none are defined: left to the generic
    decoder of the caller)."""
    pos = 4
    if version >= 4:
        if len(payload) < 5 or payload[4] != 0:
            raise ProtocolDecodeError("HeartbeatResponse header with tagged fields")
        pos = 5
    if version >= 1:
        pos += 4  # throttle_time_ms
    if len(payload) < pos + 2:
        raise ProtocolDecodeError(f"HeartbeatResponse v{version} of {len(payload)} bytes")
    return int(_I16.unpack_from(payload, pos)[0])


def consumer_heartbeat_body(version: int, group: bytes, req: Any) -> bytes:
    """ConsumerGroupHeartbeatRequest ``req`` at ``version`` (0-1) without its header; ``group`` is
    :func:`encoded_group`'s bytes for a flexible version. The idle request (every optional field at its default)
    is encoded by hand, any other by the generic encoder."""
    if (req.rack_id is None and req.rebalance_timeout_ms == -1 and req.subscribed_topic_names is None
            and req.subscribed_topic_regex is None and req.server_assignor is None and req.topic_partitions is None):
        instance = req.instance_id
        # nulls: rack, then (-1) rebalance timeout, topic names, [regex (v1+)], assignor, partitions; no tags
        tail = _IDLE_TAIL_V1 if version >= 1 else _IDLE_TAIL_V0
        return b"".join((group, _string(req.member_id, True), _I32.pack(req.member_epoch),
                         b"\x00" if instance is None else _string(instance, True), tail))
    out = bytearray()
    _CGH.encoder(version)(req, out)
    return bytes(out)


_IDLE_TAIL_V0 = b"\x00" + _I32.pack(-1) + b"\x00\x00\x00\x00"
_IDLE_TAIL_V1 = b"\x00" + _I32.pack(-1) + b"\x00\x00\x00\x00\x00"


def consumer_heartbeat_idle_answer(payload: bytes) -> tuple[int, int] | None:
    """(member epoch, heartbeat interval ms) of a raw ConsumerGroupHeartbeatResponse frame (correlation id first)
    that says nothing but that (error 0, no message, no assignment, no header or body tagged fields; a member id
    is skipped: the driver's stays), else None (left to the generic decoder)."""
    n = len(payload)
    # corr id, header tags, throttle, error code, error message (null)
    if n < 13 or payload[4] != 0 or payload[9] != 0 or payload[10] != 0 or payload[11] != 0:
        return None
    pos = 12
    b = payload[pos]  # member id: compact nullable string, its length + 1 as an unsigned varint (< 128 here)
    if b >= 0x80:
        return None
    pos += 1 + max(0, b - 1)
    if n != pos + 10:  # epoch, interval, null assignment (-1), no tagged fields
        return None
    if payload[pos + 8] != 0xFF or payload[pos + 9] != 0:
        return None
    return int(_I32.unpack_from(payload, pos)[0]), int(_I32.unpack_from(payload, pos + 4)[0])


class _Link:
    """A dedicated heartbeat connection (KafkaClient.heartbeat_connection) as the wheel drives it: its reads
    are paused as soon as answers were read, and resumed at the next tick, so that the answers to a tick's
    batch, which a broker writes one by one as it handles them, are read together in one wake-up of the loop
    (instead of one wake-up, read and context switch per answer: most of an idle heartbeat's cost)."""

    __slots__ = ("conn", "on_consumer_done", "on_done", "reading", "version")

    def __init__(self, conn: BrokerConnection, version: int) -> None:
        self.conn = conn
        self.version = version
        self.reading = True  # a new connection reads
        self.on_done = _answered_v4 if version >= 4 else _answered_by_version[version]
        self.on_consumer_done: Any = None  # set on the first ConsumerGroupHeartbeat batch (its version)

    def _paused(self) -> None:
        if self.reading:
            self.reading = False
            pause_reading(self.conn)  # the rest of what was read is still handed out; nothing more is read

    def answered(self, entry: tuple[HeartbeatTarget, int], payload: bytes | None,
                 exc: BaseException | None) -> None:
        self._paused()
        self.on_done(entry, payload, exc)

    def consumer_answered(self, entry: tuple[Any, int], payload: bytes | None, exc: BaseException | None) -> None:
        self._paused()
        self.on_consumer_done(entry, payload, exc)


class HeartbeatWheel(TickGrid[tuple["HeartbeatTarget", int]]):
    """The heartbeats due of one loop's stable members, on a grid of ``tick`` seconds, sent in batches.

    An entry is ``(coordinator, epoch)``: when its tick comes it is sent unless the coordinator's heartbeat
    epoch moved on meanwhile (its task took over). A tick's entries are appended to one list; the loop has one
    timer armed, for the earliest tick (or the next one while answers wait to be read)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float) -> None:
        super().__init__(loop, tick)
        self._groups: dict[tuple[int, str], bytes] = {}  # encoded group ids, shared by a group's members
        self._links: dict[BrokerConnection, _Link] = {}  # the dedicated connections in use
        self.batches = 0  # batches sent (one per connection and tick)
        self.sent = 0  # heartbeats sent

    def entries(self) -> list[tuple[HeartbeatTarget, int]]:
        return [e for b in self._buckets.values() for e in b]

    def add(self, coord: HeartbeatTarget, when: float) -> None:  # type: ignore[override]
        super().add((coord, coord.heartbeat_epoch), when)

    def _fire(self) -> None:
        due = self._begin_fire()
        # answers to earlier batches: read what arrived (in this loop iteration, before anything is sent)
        links = self._links
        for conn, link in list(links.items()):
            if not conn.connected:
                del links[conn]  # what was in flight was failed by the connection
            elif not link.reading and conn.in_flight:
                link.reading = True
                resume_reading(conn)
        heap = self._heap
        batches: dict[BrokerConnection, list[tuple[HeartbeatTarget, int]]] = {}
        consumer_batches: dict[BrokerConnection, list[tuple[HeartbeatTarget, int]]] = {}
        dedicated: dict[BrokerConnection, bool] = {}
        for bucket in self._pop_due(due):
            for entry in bucket:
                coord = entry[0]
                if coord.heartbeat_epoch != entry[1]:
                    continue  # the member's task took over since
                found = coord.heartbeat_route()
                if found is None:
                    coord.heartbeat_blocked()  # the task decides: rejoin, leave, rediscover, reconnect ...
                    continue
                conn = found[0]
                by_conn = batches if coord.heartbeat_api == HEARTBEAT else consumer_batches
                batch = by_conn.get(conn)
                if batch is None:
                    by_conn[conn] = [entry]
                    dedicated[conn] = found[1]
                else:
                    batch.append(entry)
        for conn, entries in batches.items():
            self._send(conn, entries, dedicated[conn])
        for conn, entries in consumer_batches.items():
            self._send_consumer(conn, entries, dedicated[conn])
        if any(conn.in_flight for conn in links):  # come back next tick to read the answers
            self._arm(due + 1 if not heap else min(due + 1, heap[0]))
        elif heap:
            self._arm(heap[0])

    def _send(self, conn: BrokerConnection, entries: list[tuple[HeartbeatTarget, int]], dedicated: bool) -> None:
        version = conn.version_for(HEARTBEAT)
        groups = self._groups
        now = self.loop.time()
        bodies = []
        for coord, _epoch in entries:
            m = coord.member
            key = (version, m.group_id)
            group = groups.get(key)
            if group is None:
                if len(groups) >= 100_000:
                    groups.clear()
                group = groups[key] = encoded_group(version, m.group_id)
            bodies.append(heartbeat_body(version, group, m.generation_id, m.member_id, m.group_instance_id))
            coord.heartbeat_sent_at = now
        self.batches += 1
        self.sent += len(entries)
        if dedicated:
            link = self._links.get(conn)
            if link is None:
                link = self._links[conn] = _Link(conn, version)
            on_done: Any = link.answered
        else:
            on_done = _answered_v4 if version >= 4 else _answered_by_version[version]
        send_frames_nowait(conn, HEARTBEAT, version, bodies, entries, on_done)

    def _send_consumer(self, conn: BrokerConnection, entries: list[tuple[HeartbeatTarget, int]],
                       dedicated: bool) -> None:
        """ConsumerGroupHeartbeats of consumer protocol members: each request is the member's own."""
        try:
            version = conn.version_for(CONSUMER_GROUP_HEARTBEAT)
        except KafkaError:
            for coord, _epoch in entries:
                coord.heartbeat_blocked()  # the member's task finds out and says why
            return
        groups = self._groups
        now = self.loop.time()
        bodies = []
        for coord, _epoch in entries:
            req = cast("ConsumerHeartbeatTarget", coord).consumer_heartbeat_request()
            key = (-1, req.group_id)
            group = groups.get(key)
            if group is None:
                if len(groups) >= 100_000:
                    groups.clear()
                group = groups[key] = _string(req.group_id, True)
            bodies.append(consumer_heartbeat_body(version, group, req))
            coord.heartbeat_sent_at = now
        self.batches += 1
        self.sent += len(entries)
        on_done: Any = _consumer_answered_by_version[version]
        if dedicated:
            link = self._links.get(conn)
            if link is None:
                link = self._links[conn] = _Link(conn, conn.version_for(HEARTBEAT))
            link.on_consumer_done = on_done
            on_done = link.consumer_answered
        send_frames_nowait(conn, CONSUMER_GROUP_HEARTBEAT, version, bodies, entries, on_done)


def _to_machine(api: int, version: int, entry: tuple[Any, int], payload: bytes | None,
                exc: BaseException | None) -> None:
    """An answer the raw frame does not settle, or a failure, through the member's state machine: decoded by the
    generic decoder (an undecodable answer fails the heartbeat, as from the connection)."""
    coord, epoch = entry
    resp: Any = None
    if exc is None and payload is not None:
        try:
            resp = frames.decode_response(api, version, payload)
        except KafkaProtocolError as e:
            exc = e
    coord.on_heartbeat_answer(epoch, coord.heartbeat_sent_at, resp, exc)


def _consumer_answered(version: int, entry: tuple[Any, int], payload: bytes | None,
                       exc: BaseException | None) -> None:
    if exc is None and payload is not None:
        idle = consumer_heartbeat_idle_answer(payload)
        if idle is not None:
            coord, epoch = entry
            coord.on_consumer_heartbeat_ok(epoch, idle[0], idle[1])
            return
    _to_machine(CONSUMER_GROUP_HEARTBEAT, version, entry, payload, exc)


_consumer_answered_by_version = [functools.partial(_consumer_answered, v) for v in range(_CGH.schema.versions[1] + 1)]


def _answered(version: int, entry: tuple[HeartbeatTarget, int], payload: bytes | None,
              exc: BaseException | None) -> None:
    if exc is None and payload is not None:
        try:
            code = heartbeat_error_code(version, payload)
        except ProtocolDecodeError:
            code = -1  # left to the generic decoder
        if code == 0:
            coord, epoch = entry
            coord.on_heartbeat_ok(epoch)
            return
    _to_machine(HEARTBEAT, version, entry, payload, exc)


def _answered_v4(entry: tuple[HeartbeatTarget, int], payload: bytes | None, exc: BaseException | None) -> None:
    # the common case (Kafka 2.4+, Tansu) inlined: header tag byte 0, throttle, error code 0
    if payload is not None and len(payload) >= 11 and payload[4] == 0 and payload[9] == 0 and payload[10] == 0:
        coord, epoch = entry
        coord.on_heartbeat_ok(epoch)
        return
    _answered(4, entry, payload, exc)


_answered_by_version = [functools.partial(_answered, v) for v in range(_HB_SCHEMA.versions[1])]

_WHEELS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, HeartbeatWheel]] = (
    weakref.WeakKeyDictionary())


_last: HeartbeatWheel | None = None  # the wheel asked for last (one lookup less per heartbeat)


def heartbeat_wheel(loop: asyncio.AbstractEventLoop, tick: float) -> HeartbeatWheel:
    """The loop's shared :class:`HeartbeatWheel` of ``tick`` seconds."""
    global _last
    w = _last
    if w is not None and w.loop is loop and w.tick == tick:
        return w
    per_loop = _WHEELS.get(loop)
    if per_loop is None:
        per_loop = _WHEELS[loop] = {}
    w = per_loop.get(tick)
    if w is None:
        w = per_loop[tick] = HeartbeatWheel(loop, tick)
    _last = w
    return w
