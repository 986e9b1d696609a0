"""What a consumer is subscribed to and where it stands in each assigned partition (pure).

Mirrors the Java consumer's subscription state: one subscription mode at a time (topics, pattern or
manual assignment); per assigned partition a position, a fetch state (needs committed offset, needs
reset, fetching), pause flag and the latest high watermark / last stable offset / log start offset
reported by fetches.

It lives below ``consumer/``, ``fetch/`` and ``group/`` (all three use it, with the engine's single
``TopicPartition`` type), so every import in the engine looks down.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import re2

from service.lib.java_regex import JavaRegexError, java_to_re2, re2_compile, re2_refusal


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class SubscriptionType(enum.Enum):
    NONE = "none"
    TOPICS = "topics"
    PATTERN = "pattern"
    ASSIGNED = "assigned"


class OffsetResetStrategy(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"

    @classmethod
    def parse(cls, value: str | OffsetResetStrategy) -> OffsetResetStrategy:
        if isinstance(value, OffsetResetStrategy):
            return value
        v = value.strip().lower()
        aliases = {"smallest": "earliest", "beginning": "earliest", "largest": "latest", "end": "latest"}
        return cls(aliases.get(v, v))


class FetchState(enum.Enum):
    INITIALIZING = "initializing"  # needs its committed offset
    AWAIT_RESET = "await_reset"  # needs a ListOffsets lookup (earliest/latest/timestamp)
    FETCHING = "fetching"


class SubscriptionError(Exception):
    """Misuse of the subscription API (mixing modes, unknown partition, …)."""


class InvalidPatternError(SubscriptionError):
    """A topic pattern that does not compile (or uses what RE2 cannot run in linear time)."""


MAX_PATTERN_LENGTH = 1000
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 logs every parse error to stderr otherwise
_RE2_OPTIONS.max_mem = 8 << 20  # bounds the compiled program (a pattern too big fails to compile)
# Markers in RE2's parse errors of constructs Java (and Python) accept and RE2 refuses by design.
_UNSUPPORTED = (("(?=", "lookahead"), ("(?!", "negative lookahead"), ("(?<=", "lookbehind"),
                ("(?<!", "negative lookbehind"), ("(?>", "atomic group"), ("*+", "possessive quantifier"),
                ("++", "possessive quantifier"), ("?+", "possessive quantifier"), ("}+", "possessive quantifier"))


def compile_topic_pattern(pattern: str) -> Any:
    """Compile a client's topic pattern with RE2 (linear-time matching: no regex can stall the event loop).

    The syntax is Java's (``java.util.regex``) as far as RE2 can run it: Java-only spellings (POSIX
    ``\\p{Lower}``, ``\\uXXXX``, ``(?<name>…)``, …) are rewritten by :func:`java_to_re2`; backreferences,
    lookaround, atomic groups, possessive quantifiers, class intersections and Unicode blocks are refused
    with :class:`InvalidPatternError` naming the construct. The pattern must
    match a whole topic name (Java's ``Pattern.matcher(topic).matches()``)."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidPatternError(f"the topic pattern is longer than {MAX_PATTERN_LENGTH} characters")
    try:
        translated = java_to_re2(pattern)
    except JavaRegexError as exc:
        raise InvalidPatternError(f"invalid topic pattern {pattern!r}: {exc}") from None
    try:
        return re2_compile(translated, _RE2_OPTIONS)
    except re2.error as exc:
        what, detail = re2_refusal(exc, _UNSUPPORTED)
        if what is not None:
            verb = "are" if what == "backreferences" else "is"
            raise InvalidPatternError(
                f"invalid topic pattern {pattern!r}: {what} {verb} not supported (patterns run on RE2: no "
                f"backreferences, lookaround, atomic groups or possessive quantifiers)") from None
        raise InvalidPatternError(f"invalid topic pattern {pattern!r}: {detail}") from None


class NoOffsetForPartitionError(Exception):
    """auto.offset.reset=none and no committed offset (or the position fell out of range)."""

    def __init__(self, partitions: Iterable[TopicPartition], reason: str = "no committed offset") -> None:
        self.partitions = sorted(partitions)
        names = ", ".join(str(tp) for tp in self.partitions)
        super().__init__(f"{reason} for {names} and auto.offset.reset is none")


@dataclass(slots=True)
class PartitionState:
    position: int | None = None
    leader_epoch: int | None = None  # epoch of the last consumed record, when known
    state: FetchState = FetchState.INITIALIZING
    reset_strategy: OffsetResetStrategy | None = None
    reset_timestamp: int | None = None  # seek-to-timestamp target
    paused: bool = False
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # bumped by every seek or reset request: a lookup started before it must not overwrite the result
    epoch: int = 0

    @property
    def has_valid_position(self) -> bool:
        return self.state is FetchState.FETCHING and self.position is not None


class SubscriptionState:
    def __init__(self, default_reset: OffsetResetStrategy | str = OffsetResetStrategy.LATEST) -> None:
        self.default_reset = OffsetResetStrategy.parse(default_reset)
        self.type = SubscriptionType.NONE
        self.topics: set[str] = set()
        self.pattern: Any = None  # a compiled RE2 pattern (see compile_topic_pattern)
        # Topics a pattern may ever match (the tenant's allowed topics): applied to every match, also of
        # topics created later. None: no restriction.
        self.topic_filter: Callable[[str], bool] | None = None
        self.assignment: dict[TopicPartition, PartitionState] = {}
        self.version = 0  # bumps whenever the assignment changes

    # -- subscription --------------------------------------------------------------------------
    def _set_type(self, t: SubscriptionType) -> None:
        if self.type is SubscriptionType.NONE:
            self.type = t
        elif self.type is not t:
            raise SubscriptionError(
                f"subscription to topics, to a pattern and manual assignment are mutually exclusive "
                f"(current mode: {self.type.value}); unsubscribe first"
            )

    def subscribe(self, topics: Iterable[str]) -> bool:
        """Subscribe to these topics; returns True if the subscription changed."""
        new = {t for t in topics}
        if not new or any(not t or not t.strip() for t in new):
            raise SubscriptionError("topic names must be non-empty")
        self._set_type(SubscriptionType.TOPICS)
        changed = new != self.topics
        self.topics = new
        return changed

    def subscribe_pattern(self, pattern: str) -> None:
        compiled = compile_topic_pattern(pattern)
        self._set_type(SubscriptionType.PATTERN)
        self.pattern = compiled
        self.topics = set()

    def match_pattern(self, all_topics: Iterable[str]) -> bool:
        """Recompute the pattern's topics from the cluster's topic list; True if they changed."""
        if self.pattern is None:
            return False
        allowed = self.topic_filter
        matched = {t for t in all_topics if not t.startswith("__") and self.pattern.fullmatch(t) is not None
                   and (allowed is None or allowed(t))}
        changed = matched != self.topics
        self.topics = matched
        return changed

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        parts = [TopicPartition(*tp) for tp in partitions]
        self._set_type(SubscriptionType.ASSIGNED)
        self.topics = {tp.topic for tp in parts}
        self.set_assignment(parts)
        if not parts:
            self.type = SubscriptionType.NONE

    def unsubscribe(self) -> None:
        self.type = SubscriptionType.NONE
        self.topics = set()
        self.pattern = None
        self.set_assignment([])

    @property
    def is_group_managed(self) -> bool:
        return self.type in (SubscriptionType.TOPICS, SubscriptionType.PATTERN)

    # -- assignment -------------------------------------------------------------------------------
    def set_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment, keeping state of partitions that stay."""
        new: dict[TopicPartition, PartitionState] = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            new[tp] = self.assignment.get(tp) or PartitionState()
        self.assignment = new
        self.version += 1

    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.assignment.setdefault(TopicPartition(*tp), PartitionState())
        self.version += 1

    def remove_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.assignment.pop(TopicPartition(*tp), None)
        self.version += 1

    def assigned(self) -> list[TopicPartition]:
        return list(self.assignment)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self.assignment

    def _state(self, tp: TopicPartition) -> PartitionState:
        try:
            return self.assignment[tp]
        except KeyError:
            raise SubscriptionError(f"partition {tp} is not assigned to this consumer") from None

    # -- positions -----------------------------------------------------------------------------
    def seek(self, tp: TopicPartition, offset: int, leader_epoch: int | None = None) -> None:
        if offset < 0:
            raise SubscriptionError(f"offset {offset} for {tp} must be >= 0")
        st = self._state(tp)
        st.epoch += 1
        st.position = offset
        st.leader_epoch = leader_epoch
        st.state = FetchState.FETCHING
        st.reset_strategy = None
        st.reset_timestamp = None

    def request_reset(self, tp: TopicPartition, strategy: OffsetResetStrategy | None = None,
                      timestamp: int | None = None) -> None:
        st = self._state(tp)
        st.epoch += 1
        st.state = FetchState.AWAIT_RESET
        st.reset_strategy = strategy or self.default_reset
        st.reset_timestamp = timestamp
        st.position = None

    def epoch(self, tp: TopicPartition) -> int:
        st = self.assignment.get(tp)
        return -1 if st is None else st.epoch

    def position(self, tp: TopicPartition) -> int | None:
        return self._state(tp).position

    def advance(self, tp: TopicPartition, next_offset: int, leader_epoch: int | None = None) -> None:
        """Move the position forward after records (or skipped batches) were consumed."""
        st = self.assignment.get(tp)
        if st is None or st.position is None or next_offset <= st.position:
            return
        st.position = next_offset
        if leader_epoch is not None and leader_epoch >= 0:
            st.leader_epoch = leader_epoch

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._state(TopicPartition(*tp)).paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._state(TopicPartition(*tp)).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self.assignment.items() if st.paused}

    def initializing(self) -> list[TopicPartition]:
        return [tp for tp, st in self.assignment.items() if st.state is FetchState.INITIALIZING]

    def awaiting_reset(self) -> list[TopicPartition]:
        return [tp for tp, st in self.assignment.items() if st.state is FetchState.AWAIT_RESET]

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, st in self.assignment.items() if st.has_valid_position and not st.paused]

    def has_all_positions(self) -> bool:
        return all(st.has_valid_position for st in self.assignment.values())

    def all_consumed(self) -> dict[TopicPartition, tuple[int, int | None]]:
        """Positions to commit: next offset to consume and the leader epoch of the last record."""
        return {tp: (st.position, st.leader_epoch) for tp, st in self.assignment.items()
                if st.has_valid_position and st.position is not None}

    def update_marks(self, tp: TopicPartition, *, high_watermark: int | None = None,
                     last_stable_offset: int | None = None, log_start_offset: int | None = None) -> None:
        st = self.assignment.get(tp)
        if st is None:
            return
        if high_watermark is not None and high_watermark >= 0:
            st.high_watermark = high_watermark
        if last_stable_offset is not None and last_stable_offset >= 0:
            st.last_stable_offset = last_stable_offset
        if log_start_offset is not None and log_start_offset >= 0:
            st.log_start_offset = log_start_offset

    def lag(self, tp: TopicPartition, read_committed: bool) -> int | None:
        st = self.assignment.get(tp)
        if st is None or st.position is None:
            return None
        end = st.last_stable_offset if read_committed else st.high_watermark
        if end < 0:
            return None
        return max(0, end - st.position)
