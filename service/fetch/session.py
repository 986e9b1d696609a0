"""Client side of incremental fetch sessions (KIP-227), without any I/O.

One :class:`FetchSessionHandler` exists per (consumer, broker). Every fetch round the owner opens a
:meth:`FetchSessionHandler.builder`, adds each partition it wants from that broker, and calls
:meth:`FetchRequestBuilder.build`. The result (:class:`FetchRequestData`) says which partitions go on the
wire, which are to be forgotten by the broker, and which session id/epoch to send. The owner turns it into
a message with :func:`to_fetch_request` (at a version picked by :func:`choose_version`), sends it, and reports
the outcome with :meth:`FetchSessionHandler.handle_response` or :meth:`FetchSessionHandler.handle_error`.

The state machine reproduces the decisions of the Java consumer's session handler
(``org.apache.kafka.clients.FetchSessionHandler`` and ``FetchMetadata``), so a broker sees the same
sequence of session ids and epochs it would see from the Java client:

* ``(0, 0)`` (:data:`INITIAL`): full request; asks the broker to create a session.
* ``(id, 0)``: full request; closes session ``id`` and asks for a new one.
* ``(id, n > 0)``: incremental request within session ``id``.
* ``(id, -1)``: closes session ``id`` without creating another (used on shutdown).

Every fetch, the main fetcher's and the one-shot ones (:mod:`service.fetch.oneshot`), goes through
:meth:`FetchSessionHandler.request`: it builds the request data, picks the version, makes the message and
holds the fetch "in flight" only within its ``with`` block, so a failure anywhere between building and the
response (a message that cannot be built, a connection that fails, a cancelled send) ends the flight with
:meth:`FetchSessionHandler.handle_error` and the session's next fetch goes out as usual.

A broker that never creates sessions (Tansu answers session id 0 every time) keeps the handler at
:data:`INITIAL`: every request is a full one, and no extra requests are made. A handler made with
``sessionless=True`` (one-off fetches) sends every request at :data:`LEGACY`, (0, -1), for which a broker
creates no session.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from service.consumer.subscription import TopicPartition  # one definition for the whole engine
from service.protocol import error_codes as EC
from service.protocol import messages as M

__all__ = [
    "FINAL_EPOCH",
    "INITIAL",
    "INITIAL_EPOCH",
    "INVALID_SESSION_ID",
    "LAST_VERSION_WITH_TOPIC_NAMES",
    "LEGACY",
    "MIN_SESSION_VERSION",
    "MIN_TOPIC_ID_VERSION",
    "ZERO_UUID",
    "FetchMetadata",
    "FetchPartitionData",
    "FetchRequestBuilder",
    "FetchRequestData",
    "FetchSessionHandler",
    "FetchSessionStateError",
    "FetchSessionStats",
    "PreparedFetch",
    "TopicIdPartition",
    "TopicPartition",
    "choose_version",
    "next_epoch",
    "sessions_supported",
    "to_fetch_request",
]

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INT32_MAX = 2**31 - 1
ZERO_UUID = uuid.UUID(int=0)

MIN_SESSION_VERSION = 7  # first Fetch version with session_id/session_epoch/forgotten topics
MIN_TOPIC_ID_VERSION = 13  # first Fetch version that names topics by id only
LAST_VERSION_WITH_TOPIC_NAMES = MIN_TOPIC_ID_VERSION - 1

_FetchTopic = M.struct("FetchRequest", "FetchTopic")
_FetchPartition = M.struct("FetchRequest", "FetchPartition")
_ForgottenTopic = M.struct("FetchRequest", "ForgottenTopic")
_ReplicaState = M.struct("FetchRequest", "ReplicaState")


class FetchSessionStateError(RuntimeError):
    """The owner used the handler out of order (e.g. a second build while a fetch is in flight)."""


def next_epoch(prev: int) -> int:
    """The epoch that follows ``prev``: +1, wrapping from INT32 max to 1; a negative epoch stays final."""
    if prev < 0:
        return FINAL_EPOCH
    if prev == INT32_MAX:
        return 1
    return prev + 1


def sessions_supported(version: int) -> bool:
    return version >= MIN_SESSION_VERSION


@dataclass(frozen=True, slots=True)
class FetchMetadata:
    """Session id and epoch carried by one fetch request."""

    session_id: int
    epoch: int

    @property
    def is_full(self) -> bool:
        """Epoch 0 or -1: the request lists every partition the client wants."""
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)

    @property
    def is_final(self) -> bool:
        return self.epoch == FINAL_EPOCH

    @staticmethod
    def new_incremental(session_id: int) -> FetchMetadata:
        """What follows a full response that created ``session_id``."""
        return FetchMetadata(session_id, next_epoch(INITIAL_EPOCH))

    def next_incremental(self) -> FetchMetadata:
        return FetchMetadata(self.session_id, next_epoch(self.epoch))

    def next_close_existing(self) -> FetchMetadata:
        """Same id, epoch 0: a full request that drops the old session and asks for a new one.

        (Java calls this ``nextCloseExistingAttemptNew``; older Java releases named it ``nextCloseExisting``.)
        """
        return FetchMetadata(self.session_id, INITIAL_EPOCH)

    def next_final(self) -> FetchMetadata:
        """Same id, epoch -1: drop the session and do not open another."""
        return FetchMetadata(self.session_id, FINAL_EPOCH)

    def __str__(self) -> str:
        sid = "none" if self.session_id == INVALID_SESSION_ID else str(self.session_id)
        ep = {INITIAL_EPOCH: "initial", FINAL_EPOCH: "final"}.get(self.epoch, str(self.epoch))
        return f"(session={sid}, epoch={ep})"


INITIAL = FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)
LEGACY = FetchMetadata(INVALID_SESSION_ID, FINAL_EPOCH)


class TopicIdPartition(NamedTuple):
    topic_id: uuid.UUID
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class FetchPartitionData:
    """What the client asks of one partition. Any change of any field makes it resend the partition."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    fetch_offset: int
    log_start_offset: int = -1
    partition_max_bytes: int = 1024 * 1024
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def has_topic_id(self) -> bool:
        return self.topic_id != ZERO_UUID


@dataclass(frozen=True, slots=True)
class FetchRequestData:
    """One built request: what to send, what to forget, and the session metadata to attach.

    ``to_forget`` are partitions dropped from the session. ``to_replace`` are partitions whose topic id
    changed: they are also in ``to_send`` with the new id, and are forgotten under the old id only when the
    request names topics by id (v13+); with names the new entry overwrites the old one on the broker.
    ``session_partitions`` is the handler's view of the session once this request is sent.
    """

    to_send: Mapping[TopicPartition, FetchPartitionData]
    to_forget: tuple[TopicIdPartition, ...]
    to_replace: tuple[TopicIdPartition, ...]
    session_partitions: Mapping[TopicPartition, FetchPartitionData]
    metadata: FetchMetadata
    can_use_topic_ids: bool
    #: a full request that re-creates a session the broker had created for this handler and that ended
    #: without a clean close (a session error, an invalid response, a failed send, a dropped session)
    resets_session: bool = False

    @property
    def is_full(self) -> bool:
        return self.metadata.is_full

    @property
    def is_empty(self) -> bool:
        """Nothing to send and nothing to forget (the steady state of an incremental session)."""
        return not self.to_send and not self.to_forget and not self.to_replace


@dataclass(slots=True)
class FetchSessionStats:
    """Counters of one handler. ``request_bytes`` is fed by the I/O layer via ``add_request_bytes``."""

    full_requests: int = 0
    incremental_requests: int = 0
    final_requests: int = 0
    sessions_created: int = 0
    session_resets: int = 0  # answered full requests flagged FetchRequestData.resets_session
    session_errors: Counter[int] = field(default_factory=Counter)  # top-level error code -> count
    invalid_responses: int = 0
    send_errors: int = 0
    request_bytes: int = 0

    def add_request_bytes(self, n: int) -> None:
        self.request_bytes += n


@dataclass(frozen=True, slots=True)
class PreparedFetch:
    """One request of :meth:`FetchSessionHandler.request`: the built session data, the Fetch version it goes
    out at and the message to send."""

    data: FetchRequestData
    version: int
    message: Any


class FetchRequestBuilder:
    """Collects the partitions wanted in one fetch round; single use."""

    __slots__ = ("_built", "_handler", "_next", "_topic_names")

    def __init__(self, handler: FetchSessionHandler) -> None:
        self._handler = handler
        self._next: dict[TopicPartition, FetchPartitionData] = {}
        self._topic_names: dict[uuid.UUID, str] = {}
        self._built = False

    def add(self, data: FetchPartitionData) -> None:
        """Ask for ``data.partition`` in the coming request; adding a partition again replaces it.

        Insertion order matters: in a full request a broker short of response space serves the earliest
        partitions first.
        """
        if self._built:
            raise FetchSessionStateError("builder already built")
        self._next[data.tp] = data
        if data.has_topic_id:
            self._topic_names.setdefault(data.topic_id, data.topic)

    def __len__(self) -> int:
        return len(self._next)

    def build(self, max_version: int | None = None) -> FetchRequestData:
        """The request to send. ``max_version``: the highest Fetch version the connection allows (the
        request goes out at ``choose_version(max_version, data)``). Below 7 there are no sessions: a
        session held so far is abandoned and the request is a full one (see
        :meth:`FetchSessionHandler.drop_session`)."""
        if self._built:
            raise FetchSessionStateError("builder already built")
        self._built = True
        return self._handler._build(self._next, self._topic_names, max_version)


class FetchSessionHandler:
    """Session state for fetching from one broker; exactly one fetch may be in flight at a time."""

    def __init__(self, node_id: int = -1, *, sessionless: bool = False) -> None:
        self.node_id = node_id
        # sessionless: every request is a full one at (0, -1), which a broker answers without creating a
        # session (one-off fetches: a (0, 0) request would take a slot of the broker's session cache for
        # nothing, and enough of them evict the sessions of real consumers, ours and other clients').
        self.sessionless = sessionless
        self._metadata = LEGACY if sessionless else INITIAL
        # What the broker holds in our session (or would, once the in-flight request lands); insertion order
        # is kept so that added partitions line up after the existing ones.
        self._session: dict[TopicPartition, FetchPartitionData] = {}
        # topic id -> name for the session's topics; empty whenever some topic lacks an id.
        self._session_topic_names: dict[uuid.UUID, str] = {}
        self._in_flight = False
        # True from a response that created a session until a full response that creates none or a close
        # request: a full request built meanwhile re-creates a lost session (FetchRequestData.resets_session).
        self._established = False
        self._resetting = False  # the in-flight request is such a full request
        # Set once the broker answered a v13+ request with the all-zero topic id: its topic ids cannot be
        # trusted, so from then on this handler names topics (requests capped at v12).
        self._names_only = False
        self.stats = FetchSessionStats()
        self.last_problem: str | None = None

    # -- state ----------------------------------------------------------------------------------
    @property
    def metadata(self) -> FetchMetadata:
        """Metadata of the next request (or, while a fetch is in flight, of that request)."""
        return self._metadata

    @property
    def session_id(self) -> int:
        return self._metadata.session_id

    @property
    def epoch(self) -> int:
        return self._metadata.epoch

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    @property
    def session_partitions(self) -> Mapping[TopicPartition, FetchPartitionData]:
        return MappingProxyType(self._session)

    @property
    def session_topic_names(self) -> Mapping[uuid.UUID, str]:
        return MappingProxyType(self._session_topic_names)

    @property
    def names_only(self) -> bool:
        """True once the broker sent zero topic ids in a v13+ response (see :meth:`handle_response`)."""
        return self._names_only

    def add_request_bytes(self, n: int) -> None:
        self.stats.add_request_bytes(n)

    def drop_session(self, reason: str) -> None:
        """Forget the session without telling the broker: the next request is a full one at (0, 0).

        Used when the Fetch version falls below 7 (ApiVersions renegotiated after a reconnect to a broker
        that now supports less): such a request cannot carry session fields, and the broker answers it
        sessionless (session id 0), so the handler stays on full requests until sessions are possible
        again. A session the broker may still hold is evicted by its cache, as with Java's client.
        """
        if self._in_flight:
            raise FetchSessionStateError("resolve the in-flight fetch (handle_response/handle_error) first")
        if self._metadata not in (INITIAL, LEGACY):
            self.last_problem = f"session {self._metadata} dropped: {reason}"
        self._metadata = LEGACY if self.sessionless else INITIAL

    def __repr__(self) -> str:
        return (f"FetchSessionHandler(node={self.node_id}, next={self._metadata}, "
                f"partitions={len(self._session)}, in_flight={self._in_flight})")

    # -- building -------------------------------------------------------------------------------
    def builder(self) -> FetchRequestBuilder:
        return FetchRequestBuilder(self)

    @contextlib.contextmanager
    def request(self, builder: FetchRequestBuilder, *, max_version: int, max_wait_ms: int, min_bytes: int,
                max_bytes: int = 0x7FFFFFFF, isolation_level: int = 0,
                rack_id: str = "") -> Iterator[PreparedFetch]:
        """Build ``builder`` (see :meth:`FetchRequestBuilder.build`), choose the version
        (:func:`choose_version`) and make the message (:func:`to_fetch_request`); the block sends it and
        hands the answer to :meth:`handle_response`.

        The fetch is in flight from the build to the end of the block. Whatever raises in between (the
        message cannot be made, the connection or the send fails, the task is cancelled) ends the flight
        with :meth:`handle_error` before it propagates, and a block left without a response does the
        same, so the handler never stays "in flight" (which would refuse the session's later fetches). A
        build refused because another fetch is in flight leaves that other fetch alone."""
        if builder._handler is not self:
            raise ValueError("the builder belongs to another session handler")
        was_in_flight = self._in_flight
        try:
            data = builder.build(max_version=max_version)
            version = choose_version(max_version, data)
            message = to_fetch_request(data, version=version, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                       max_bytes=max_bytes, isolation_level=isolation_level, rack_id=rack_id)
            yield PreparedFetch(data, version, message)
        except BaseException as exc:
            if self._in_flight and not was_in_flight:
                self.handle_error(exc)
            raise
        if self._in_flight:
            self.handle_error(None)  # the block ended without handle_response: as if the answer was lost

    def _build(self, wanted: dict[TopicPartition, FetchPartitionData],
               topic_names: dict[uuid.UUID, str], max_version: int | None = None) -> FetchRequestData:
        if self._in_flight:
            raise FetchSessionStateError(f"a fetch to node {self.node_id} is already in flight")
        if max_version is not None and not sessions_supported(max_version):
            self.drop_session(f"Fetch v{max_version} has no sessions")
        can_use_ids = not self._names_only and all(d.has_topic_id for d in wanted.values())
        meta = self._metadata

        if meta.is_full:
            self._session = dict(wanted)
            self._session_topic_names = dict(topic_names) if can_use_ids else {}
            self._in_flight = True
            if meta.is_final and meta != LEGACY:
                self.stats.final_requests += 1
            else:
                self.stats.full_requests += 1
            self._resetting = self._established and not meta.is_final
            snapshot = MappingProxyType(dict(self._session))
            return FetchRequestData(snapshot, (), (), snapshot, meta, can_use_ids, self._resetting)

        # Incremental: compare every session partition with what is wanted now.
        remaining = dict(wanted)  # wanted partitions not yet matched against the session
        changed: dict[TopicPartition, FetchPartitionData] = {}
        forgotten: list[TopicIdPartition] = []
        replaced: list[TopicIdPartition] = []
        for tp, before in list(self._session.items()):
            now = remaining.pop(tp, None)
            if now is None:
                del self._session[tp]
                forgotten.append(TopicIdPartition(before.topic_id, tp.topic, tp.partition))
                # The broker must be told which id to forget; without one we must speak names.
                if not before.has_topic_id:
                    can_use_ids = False
            elif before.has_topic_id and now.has_topic_id and before.topic_id != now.topic_id:
                # Same name, new id (topic recreated): forget the old incarnation, fetch the new one.
                self._session[tp] = now
                changed[tp] = now
                replaced.append(TopicIdPartition(before.topic_id, tp.topic, tp.partition))
            elif before != now:
                self._session[tp] = now
                changed[tp] = now
        # Whatever is left was not in the session: it joins at the end, in the order the owner added it.
        for tp, now in remaining.items():
            self._session[tp] = now
        to_send = {**remaining, **changed}
        self._session_topic_names = dict(topic_names) if can_use_ids else {}
        self._in_flight = True
        self._resetting = False
        self.stats.incremental_requests += 1
        return FetchRequestData(MappingProxyType(to_send), tuple(forgotten), tuple(replaced),
                                MappingProxyType(dict(self._session)), meta, can_use_ids)

    def close_request(self) -> FetchRequestData | None:
        """A request with epoch -1 that frees this session's slot on the broker; None without a session.

        The request carries no partitions. After it the handler starts over (next request: full, (0, 0));
        its response is not meant for :meth:`handle_response`.
        """
        if self._in_flight:
            raise FetchSessionStateError("resolve the in-flight fetch (handle_response/handle_error) first")
        if self._metadata.session_id == INVALID_SESSION_ID:
            return None
        meta = self._metadata.next_final()
        self._metadata = INITIAL
        self._established = False
        self._session = {}
        self._session_topic_names = {}
        self.stats.final_requests += 1
        empty: Mapping[TopicPartition, FetchPartitionData] = MappingProxyType({})
        return FetchRequestData(empty, (), (), empty, meta, True)

    # -- responses ------------------------------------------------------------------------------
    def response_partitions(self, response: Any, version: int) -> dict[TopicPartition, Any]:
        """The response's partitions keyed by name; from v13 names come from the session's topic ids
        (partitions of unknown ids are left out). The all-zero uuid is no topic id (as in Java's
        ``FetchResponse.topicIds()``): such an entry is matched by its name if it carries one of the
        session's topics, else left out."""
        out: dict[TopicPartition, Any] = {}
        for topic in response.responses:
            name = self._topic_name(topic, version)
            if name is None:
                continue
            for p in topic.partitions:
                out[TopicPartition(name, p.partition_index)] = p
        return out

    def _topic_name(self, topic: Any, version: int) -> str | None:
        if version < MIN_TOPIC_ID_VERSION:
            name: str | None = topic.topic
            return name
        if topic.topic_id != ZERO_UUID:
            return self._session_topic_names.get(topic.topic_id)
        named: str | None = getattr(topic, "topic", None)
        if named and any(tp.topic == named for tp in self._session):
            return named
        return None

    def handle_response(self, response: Any, version: int) -> bool:
        """Advance the session after a FetchResponse to the in-flight request.

        Returns True if the response's partitions may be processed; False if it must be ignored (a
        top-level error, or partitions that do not match the request/session). ``version`` is the
        version the request was sent with.
        """
        ok = self._handle_response(response, version)
        if self.sessionless:
            self._metadata = LEGACY
        return ok

    def _handle_response(self, response: Any, version: int) -> bool:
        self._end_flight()
        meta = self._metadata
        if self._resetting:
            self.stats.session_resets += 1
        error = response.error_code if version >= MIN_SESSION_VERSION else 0
        if error != EC.NONE:
            self.stats.session_errors[error] += 1
            self.last_problem = f"top-level error {EC.describe(error).name} ({error})"
            # Like Java: only an unknown session id makes the client start from scratch. For every other
            # top-level error (71 wrong epoch, 106 topic id mismatch, anything else) the broker may still
            # hold our session, so the next full request names it with epoch 0 to free it.
            if error == EC.FETCH_SESSION_ID_NOT_FOUND:
                self._metadata = INITIAL
            else:
                self._metadata = meta.next_close_existing()
            return False

        tps = set(self.response_partitions(response, version))
        ids: set[uuid.UUID] = set()
        unnamed = 0  # v13+ topic entries with the zero uuid that no name matched
        if version >= MIN_TOPIC_ID_VERSION:
            for t in response.responses:
                if t.topic_id != ZERO_UUID:
                    ids.add(t.topic_id)
                    continue
                self._names_only = True  # the broker's topic ids are unreliable: name topics from now on
                if self._topic_name(t, version) is None:
                    unnamed += 1
        session_id = response.session_id if version >= MIN_SESSION_VERSION else INVALID_SESSION_ID
        if unnamed:
            # Partitions we cannot attribute: the response is unusable. The next request is full and, as
            # _names_only is now set, names topics (v12), so the broker's answer can be matched.
            self.stats.invalid_responses += 1
            self.last_problem = f"fetch response names {unnamed} topic(s) by the zero topic id"
            self._metadata = INITIAL if meta.is_full else meta.next_close_existing()
            return False

        if meta.is_full:
            if not tps and response.throttle_time_ms > 0:
                # KIP-219: a throttled broker may answer a full request with nothing; not an error,
                # but there is nothing to process either.
                self.last_problem = f"empty full response, throttled for {response.throttle_time_ms} ms"
                self._metadata = INITIAL
                return False
            problem = self._check_full(tps, ids)
            if problem is not None:
                self.stats.invalid_responses += 1
                self.last_problem = f"invalid full fetch response: {problem}"
                self._metadata = INITIAL
                return False
            self._established = session_id != INVALID_SESSION_ID
            if session_id == INVALID_SESSION_ID:
                self._metadata = INITIAL  # sessionless broker (or no free slot): stay on full requests
            else:
                self.stats.sessions_created += 1
                self._metadata = FetchMetadata.new_incremental(session_id)
            self.last_problem = None
            return True

        problem = self._check_incremental(tps, ids)
        if problem is not None:
            self.stats.invalid_responses += 1
            self.last_problem = f"invalid incremental fetch response: {problem}"
            self._metadata = meta.next_close_existing()
            return False
        if session_id == INVALID_SESSION_ID:
            self._metadata = INITIAL  # the broker ended the session; its answer is still valid
        else:
            self._metadata = meta.next_incremental()
        self.last_problem = None
        return True

    def handle_error(self, exc: BaseException | None = None) -> None:
        """The in-flight request failed without a response (network error, timeout, cancellation).

        Reproduces Java's choice: the broker may or may not have applied the request, so the next request
        is full, names the old session (same id, epoch 0) so the broker drops it, and asks for a new one.
        """
        self._end_flight()
        self.stats.send_errors += 1
        self.last_problem = f"send failed: {exc!r}" if exc is not None else "send failed"
        self._metadata = LEGACY if self.sessionless else self._metadata.next_close_existing()

    def _end_flight(self) -> None:
        if not self._in_flight:
            raise FetchSessionStateError(f"no fetch to node {self.node_id} is in flight")
        self._in_flight = False

    def _check_full(self, tps: set[TopicPartition], ids: set[uuid.UUID]) -> str | None:
        # A full response must answer for exactly the partitions that were requested.
        extra = [tp for tp in tps if tp not in self._session]
        omitted = [tp for tp in self._session if tp not in tps]
        extra_ids = [i for i in ids if i not in self._session_topic_names]
        return _describe_problem(extra=extra, omitted=omitted, extra_ids=extra_ids)

    def _check_incremental(self, tps: set[TopicPartition], ids: set[uuid.UUID]) -> str | None:
        # An incremental response may leave partitions out, but may not mention any outside the session.
        extra = [tp for tp in tps if tp not in self._session]
        extra_ids = [i for i in ids if i not in self._session_topic_names]
        return _describe_problem(extra=extra, omitted=[], extra_ids=extra_ids)


def _describe_problem(*, extra: list[TopicPartition], omitted: list[TopicPartition],
                      extra_ids: list[uuid.UUID]) -> str | None:
    parts = []
    if omitted:
        parts.append("omitted " + ", ".join(f"{t}-{p}" for t, p in omitted[:10]))
    if extra:
        parts.append("unexpected " + ", ".join(f"{t}-{p}" for t, p in extra[:10]))
    if extra_ids:
        parts.append("unknown topic ids " + ", ".join(str(i) for i in extra_ids[:10]))
    return "; ".join(parts) if parts else None


# -- versions and messages --------------------------------------------------------------------------
def choose_version(max_negotiated: int, partitions: FetchRequestData | Iterable[FetchPartitionData]) -> int:
    """The Fetch version to send: ``max_negotiated``, capped at 12 when some topic id is unknown."""
    if isinstance(partitions, FetchRequestData):
        can_use_ids = partitions.can_use_topic_ids
    else:
        can_use_ids = all(p.has_topic_id for p in partitions)
    if not can_use_ids:
        return min(max_negotiated, LAST_VERSION_WITH_TOPIC_NAMES)
    return max_negotiated


def to_fetch_request(
    data: FetchRequestData,
    *,
    version: int,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int = 0x7FFFFFFF,
    isolation_level: int = 0,
    rack_id: str = "",
    replica_id: int = -1,
) -> Any:
    """A ``messages.FetchRequest`` for ``data`` at ``version`` (4-17)."""
    uses_ids = version >= MIN_TOPIC_ID_VERSION
    if version < MIN_SESSION_VERSION and not data.is_full:
        raise ValueError(f"Fetch v{version} has no sessions; an incremental request cannot be sent")
    if version < MIN_SESSION_VERSION and (data.to_forget or data.to_replace):
        raise ValueError(f"Fetch v{version} cannot forget partitions")
    if uses_ids and not data.can_use_topic_ids:
        raise ValueError(f"Fetch v{version} needs topic ids for every partition; use choose_version()")

    topics: list[Any] = []
    current: Any = None
    current_key: object = None
    for tp, d in data.to_send.items():
        # Consecutive partitions of one topic share a FetchTopic; the order of to_send is preserved.
        key = d.topic_id if uses_ids else tp.topic
        if current is None or key != current_key:
            current = _FetchTopic(topic=tp.topic, topic_id=d.topic_id, partitions=[])
            current_key = key
            topics.append(current)
        current.partitions.append(_FetchPartition(
            partition=tp.partition,
            current_leader_epoch=d.current_leader_epoch,
            fetch_offset=d.fetch_offset,
            last_fetched_epoch=d.last_fetched_epoch,
            log_start_offset=d.log_start_offset,
            partition_max_bytes=d.partition_max_bytes,
        ))

    forgotten: dict[object, Any] = {}
    # With names, a replaced partition is not forgotten: that would also drop the entry just re-sent.
    to_forget = data.to_forget + data.to_replace if uses_ids else data.to_forget
    for tip in to_forget:
        key = tip.topic_id if uses_ids else tip.topic
        ft = forgotten.get(key)
        if ft is None:
            ft = forgotten[key] = _ForgottenTopic(topic=tip.topic, topic_id=tip.topic_id, partitions=[])
        ft.partitions.append(tip.partition)

    return M.FetchRequest(
        replica_id=replica_id,
        replica_state=_ReplicaState(replica_id=replica_id, replica_epoch=-1),
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=data.metadata.session_id,
        session_epoch=data.metadata.epoch,
        topics=topics,
        forgotten_topics_data=list(forgotten.values()),
        rack_id=rack_id,
    )
