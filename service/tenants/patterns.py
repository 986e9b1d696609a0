"""Topic and group patterns: ``re:<regex>`` (RE2) or shell-style globs, compiled once with RE2 (linear-time
matching: no operator pattern can stall the event loop), the operator's deny-list of internal topics
(:class:`TopicDenyList`, checked before any tenant pattern) and the tenant's allow/require checks built on
them (mixed into :class:`~service.tenants.tenant.Tenant`): topics and groups it may use, topics it may
administer (``admin_topics``) and the schema subjects that are its own (``subjects``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import re2

from service.lib.java_regex import re2_refusal

from .errors import ADMIN_FORBIDDEN, FORBIDDEN, SUBJECT_FORBIDDEN, TenantError

_REGEX_PREFIX = "re:"
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 logs every parse error to stderr otherwise
# Markers in RE2's parse errors of constructs Python's re accepts and RE2 refuses by design.
_UNSUPPORTED = (("(?=", "lookahead"), ("(?!", "negative lookahead"), ("(?<=", "lookbehind"),
                ("(?<!", "negative lookbehind"), ("(?>", "an atomic group"), ("(?#", "a comment group"),
                ("(?x", "the verbose flag (?x)"), ("*+", "a possessive quantifier"),
                ("++", "a possessive quantifier"), ("?+", "a possessive quantifier"),
                ("}+", "a possessive quantifier"), ("\\Z", "\\Z (RE2 spells it \\z)"))

#: Topics no tenant may touch, whatever its patterns (Kafka's and Confluent's internal topics).
DEFAULT_DENIED_TOPICS: tuple[str, ...] = ("__*", "_schemas", "_confluent*")
#: Topics the gateway itself writes: always denied, also when the defaults are switched off (none yet).
GATEWAY_OWN_TOPICS: tuple[str, ...] = ()


class PatternError(ValueError):
    """A pattern that does not compile, or uses a construct RE2 cannot run (the message names it)."""


def glob_to_re2(glob: str) -> str:
    """The RE2 regex of a shell-style glob: ``*`` any run of characters (dots too), ``?`` one character,
    ``[seq]`` / ``[!seq]`` a character (not) in seq; a ``[`` without its ``]`` is a literal."""
    out = ["(?s)"]
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            j = glob.find("]", j)
            if j < 0:
                out.append("\\[")
                continue
            body = glob[i:j]
            i = j + 1
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            escaped = "".join("\\" + ch if ch in "\\[]^" else ch for ch in body)
            out.append("[" + ("^" if negate else "") + escaped + "]")
        else:
            out.append("\\" + c if c in "\\.^$|?*+()[]{}" else c)
    return "".join(out)


def compile_pattern(pattern: str) -> Any:
    """Compile a pattern with RE2; it must match the whole name. ``re:<regex>`` is an RE2 regular
    expression (Python's syntax without backreferences, lookaround, atomic groups, possessive quantifiers
    and ``\\Z``); anything else is a case-sensitive shell-style glob (``*``, ``?``, ``[seq]``, ``[!seq]``;
    ``*`` also matches dots). Raises :class:`PatternError` naming what RE2 refuses."""
    regex = pattern[len(_REGEX_PREFIX):] if pattern.startswith(_REGEX_PREFIX) else glob_to_re2(pattern)
    try:
        return re2.compile(regex, _RE2_OPTIONS)
    except re2.error as exc:
        what, detail = re2_refusal(exc, _UNSUPPORTED)
        if what == "backreferences":
            raise PatternError("backreferences are not supported (patterns run on RE2, which matches in "
                               "linear time)") from None
        if what is not None:
            raise PatternError(f"{what} is not supported (patterns run on RE2, which matches in linear "
                               "time: no backreferences, lookaround, atomic groups or possessive "
                               "quantifiers)") from None
        raise PatternError(detail) from None


_MEMO_SIZE = 4096  # names remembered per pattern set (checked on every produce and poll)


class _Patterns:
    def __init__(self, patterns: Sequence[str] | None) -> None:
        self.patterns = None if patterns is None else tuple(patterns)
        self._compiled = None if patterns is None else [compile_pattern(p) for p in patterns]
        self._memo: dict[str, str | None] = {}  # name -> first matching pattern (the patterns never change)

    def matches(self, name: str) -> bool:
        return self._compiled is None or self.first_match(name) is not None

    def first_match(self, name: str) -> str | None:
        """The first pattern matching ``name`` (``None``: none does, or there are no patterns)."""
        memo = self._memo
        try:
            return memo[name]
        except KeyError:
            pass
        found = None
        for pattern, rx in zip(self.patterns or (), self._compiled or (), strict=True):
            if rx.fullmatch(name) is not None:
                found = pattern
                break
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[name] = found
        return found


class TopicDenyList:
    """The operator's deny-list: topics no tenant may produce to, read, subscribe to, assign, commit,
    describe or see listed, whatever its own patterns say (checked first)."""

    def __init__(self, patterns: Iterable[str] = DEFAULT_DENIED_TOPICS) -> None:
        self._patterns = _Patterns(tuple(dict.fromkeys((*GATEWAY_OWN_TOPICS, *patterns))))

    @classmethod
    def from_setting(cls, extra: str | None, *, defaults: bool = True) -> TopicDenyList:
        """The deny-list of ``GATEWAY_DENIED_TOPICS`` (comma-separated patterns, added to the defaults) and
        ``GATEWAY_DENIED_TOPICS_DEFAULTS`` (false: only the setting's patterns, no built-in ones).
        Raises :class:`PatternError` naming the pattern that does not compile."""
        own = [p.strip() for p in (extra or "").split(",") if p.strip()]
        for p in own:
            try:
                compile_pattern(p)
            except PatternError as exc:
                raise PatternError(f"GATEWAY_DENIED_TOPICS: pattern {p!r}: {exc}") from None
        return cls((*(DEFAULT_DENIED_TOPICS if defaults else ()), *own))

    @property
    def patterns(self) -> tuple[str, ...]:
        return self._patterns.patterns or ()

    def rule_for(self, topic: str) -> str | None:
        """The deny pattern matching ``topic``; ``None`` when the topic is not denied."""
        return self._patterns.first_match(topic)

    def denies(self, topic: str) -> bool:
        return self.rule_for(topic) is not None

    def __repr__(self) -> str:
        return f"TopicDenyList({list(self.patterns)!r})"


DEFAULT_DENY_LIST = TopicDenyList()


class TenantPatterns:
    """The topic and group patterns of a tenant and the checks against them; a part of
    :class:`~service.tenants.tenant.Tenant`, which calls :meth:`_init_patterns` and has the ``id``."""

    id: str

    def _init_patterns(self, topics: Sequence[str] | None, groups: Sequence[str] | None,
                       denied_topics: TopicDenyList = DEFAULT_DENY_LIST, *,
                       admin_topics: Sequence[str] | None = None,
                       admin_topic_configs: Sequence[str] | None = None,
                       subjects: Sequence[str] | None = None) -> None:
        self._topics = _Patterns(topics)
        self._groups = _Patterns(groups)
        self.denied_topics = denied_topics
        self._admin = _Patterns(admin_topics)
        #: the topic configs the tenant may set on create (None: the gateway's GATEWAY_TOPIC_CONFIGS_ALLOWED)
        self.admin_topic_configs = None if admin_topic_configs is None else tuple(admin_topic_configs)
        self._subjects = _Patterns(subjects)

    # -- patterns ---------------------------------------------------------------------------------------
    @property
    def topic_patterns(self) -> tuple[str, ...] | None:
        """The configured topic patterns; ``None`` when every topic (but the denied ones) is allowed."""
        return self._topics.patterns

    @property
    def group_patterns(self) -> tuple[str, ...] | None:
        return self._groups.patterns

    def allows_topic(self, topic: str) -> bool:
        """Not denied by the operator, and matching one of the tenant's patterns (if it has any)."""
        return not self.denied_topics.denies(topic) and self._topics.matches(topic)

    def allows_group(self, group: str) -> bool:
        return self._groups.matches(group)

    def require_topic(self, topic: str) -> None:
        """Raise 403/40301 when the operator denies the topic (an internal topic) or it matches none of the
        tenant's topic patterns."""
        rule = self.denied_topics.rule_for(topic)
        if rule is not None:
            raise TenantError(403, FORBIDDEN, f"topic {topic!r} is an internal topic: denied to every tenant by "
                                              f"the gateway's rule {rule!r}")
        if not self._topics.matches(topic):
            raise TenantError(403, FORBIDDEN, f"topic {topic!r} is not allowed for tenant {self.id!r}")

    def require_group(self, group: str) -> None:
        if not self.allows_group(group):
            raise TenantError(403, FORBIDDEN, f"consumer group {group!r} is not allowed for tenant {self.id!r}")

    # -- topic administration -------------------------------------------------------------------------------
    @property
    def admin_topic_patterns(self) -> tuple[str, ...] | None:
        """The ``admin_topics`` patterns; ``None``: no restriction (open mode, no tenants file)."""
        return self._admin.patterns

    def allows_topic_admin(self, topic: str) -> bool:
        """May the tenant create, delete or alter ``topic`` (it may also use it, and an admin pattern matches)."""
        return self.allows_topic(topic) and self._admin.matches(topic)

    def require_topic_admin(self, topic: str) -> None:
        """Raise 403/40301 when the tenant may not use ``topic`` at all, 403/40303 when it may use it but none
        of its ``admin_topics`` patterns matches (a tenant of a tenants file has none unless given)."""
        self.require_topic(topic)
        if not self._admin.matches(topic):
            raise TenantError(403, ADMIN_FORBIDDEN,
                              f"tenant {self.id!r} may not create, delete or alter topic {topic!r}: it matches none "
                              "of the tenant's admin_topics patterns")

    # -- schema subjects ------------------------------------------------------------------------------------
    @property
    def subject_patterns(self) -> tuple[str, ...] | None:
        """The ``subjects`` patterns; ``None``: every subject (open mode, or a tenant with its own registry)."""
        return self._subjects.patterns

    def allows_subject(self, subject: str) -> bool:
        """Whether ``subject`` is the tenant's: no restriction, or it matches one of its ``subjects`` patterns,
        or it is ``<topic>-<suffix>`` for a topic the tenant may use and a suffix without ``-`` (the
        TopicNameStrategy's ``-key``/``-value`` and the TopicRecordNameStrategy's ``-<record name>``: splitting
        at the last ``-`` keeps another tenant's ``<its topic>-value`` from passing as ``<my topic>-...``)."""
        if self._subjects.patterns is None or self._subjects.first_match(subject) is not None:
            return True
        topic, dash, suffix = subject.rpartition("-")
        return bool(dash and topic and suffix) and self.allows_topic(topic)

    def require_subject(self, subject: str) -> None:
        """Raise 403/40304 unless ``subject`` is the tenant's (:meth:`allows_subject`)."""
        if not self.allows_subject(subject):
            raise TenantError(403, SUBJECT_FORBIDDEN,
                              f"schema subject {subject!r} is not allowed for tenant {self.id!r} (it is neither "
                              "<topic>-<suffix> of one of its topics nor matched by its subjects patterns)")
