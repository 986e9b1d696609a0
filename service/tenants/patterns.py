"""Topic and group patterns: ``re:<regex>`` or shell-style globs, compiled once, and the tenant's
allow/require checks built on them (mixed into :class:`~service.tenants.tenant.Tenant`)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from .errors import FORBIDDEN, TenantError

_REGEX_PREFIX = "re:"


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``re:<regex>`` is a Python regular expression that must match the whole name; anything else is a
    case-sensitive shell-style glob (``*``, ``?``, ``[seq]``, ``[!seq]``; ``*`` also matches dots)."""
    if pattern.startswith(_REGEX_PREFIX):
        return re.compile(pattern[len(_REGEX_PREFIX):])
    return re.compile(fnmatch.translate(pattern))


class _Patterns:
    def __init__(self, patterns: Sequence[str] | None) -> None:
        self.patterns = None if patterns is None else tuple(patterns)
        self._compiled = None if patterns is None else [compile_pattern(p) for p in patterns]

    def matches(self, name: str) -> bool:
        if self._compiled is None:
            return True
        return any(rx.fullmatch(name) for rx in self._compiled)


class TenantPatterns:
    """The topic and group patterns of a tenant and the checks against them; a part of
    :class:`~service.tenants.tenant.Tenant`, which calls :meth:`_init_patterns` and has the ``id``."""

    id: str

    def _init_patterns(self, topics: Sequence[str] | None, groups: Sequence[str] | None) -> None:
        self._topics = _Patterns(topics)
        self._groups = _Patterns(groups)

    # -- patterns ---------------------------------------------------------------------------------------
    @property
    def topic_patterns(self) -> tuple[str, ...] | None:
        """The configured topic patterns; ``None`` when every topic is allowed."""
        return self._topics.patterns

    @property
    def group_patterns(self) -> tuple[str, ...] | None:
        return self._groups.patterns

    def allows_topic(self, topic: str) -> bool:
        return self._topics.matches(topic)

    def allows_group(self, group: str) -> bool:
        return self._groups.matches(group)

    def require_topic(self, topic: str) -> None:
        """Raise 403/40301 unless the topic matches one of the tenant's topic patterns."""
        if not self.allows_topic(topic):
            raise TenantError(403, FORBIDDEN, f"topic {topic!r} is not allowed for tenant {self.id!r}")

    def require_group(self, group: str) -> None:
        if not self.allows_group(group):
            raise TenantError(403, FORBIDDEN, f"consumer group {group!r} is not allowed for tenant {self.id!r}")
