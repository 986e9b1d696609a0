"""Two schema caches a tenant can grow, bounded by bytes (sans-io): the subjects of each schema id
(:class:`~service.schemas.subjects.IdSubjects`, charged to the registry's schema-cache budget) and the compiled
JSON Schema patterns (:class:`~service.schemas.ecma_regex.PatternCache`, a byte bound of their own). Each held
every entry it was given up to its count bound, whatever its size: 1,000 ids of a few thousand long subjects
each, 256 RE2 programs of up to ~1 MiB each."""

from __future__ import annotations

import pytest
import re2

from service.schemas.ecma_regex import (
    DFA_ALLOWANCE,
    EcmaRegexError,
    PatternCache,
    compile_pattern,
    program_cost,
)
from service.schemas.registry import CacheBudget, LRUCache, SchemaNotFound
from service.schemas.subjects import IdSubjects, subjects_cost

MiB = 1024 * 1024


class ManySubjects:
    """A registry listing ``per_id`` long subjects for every id (none of them the tenant's), and a budget of its
    own as a :class:`~service.schemas.registry.RegistryClient` has."""

    def __init__(self, per_id: int, budget: CacheBudget) -> None:
        self.per_id = per_id
        self.budget = budget
        self.asked: list[int] = []

    async def get_id_versions(self, schema_id: int) -> list[tuple[str, int]]:
        self.asked.append(schema_id)
        if schema_id < 0:
            raise SchemaNotFound(404, 40403, "Schema not found")
        return [(f"other.{schema_id}.{i}.{'s' * 200}", 1) for i in range(self.per_id)]


async def test_id_subjects_are_charged_to_the_registry_budget_and_evicted() -> None:
    budget = CacheBudget(2 * MiB)
    registry = ManySubjects(1000, budget)  # ~0.26 MB of subjects an id
    ids = IdSubjects(registry)  # type: ignore[arg-type]  # the client's budget by default
    mine = lambda s: s.startswith("a.")  # noqa: E731
    one = subjects_cost(tuple(s for s, _ in await registry.get_id_versions(0)))
    assert 200_000 < one < 400_000
    registry.asked.clear()
    for sid in range(40):  # 40 ids: ~10 MB of subjects, 1,000 of them would have been kept (~260 MB)
        assert not await ids.allowed(sid, mine)
        assert budget.used <= budget.max_bytes
    assert 2 <= len(ids) <= budget.max_bytes // one
    assert budget.used > budget.max_bytes - one - 1024  # full, not emptied
    # the most recent ids are cached, the first ones were evicted: asked of the registry again
    assert not await ids.allowed(39, mine)
    assert registry.asked.count(39) == 1
    assert not await ids.allowed(0, mine)
    assert registry.asked.count(0) == 2
    # the budget is shared: another cache of the registry pushes the subjects out, least recently used first
    other: LRUCache[int, bytes] = LRUCache(100, budget)
    for i in range(8):
        other.put(i, b"x", 256 * 1024)
    assert len(ids) == 0 and budget.used <= budget.max_bytes
    # an id whose subjects cost more than the whole budget is not kept (asked again each time)
    huge = IdSubjects(ManySubjects(10_000, budget), budget=budget)  # type: ignore[arg-type]
    assert not await huge.allowed(1, mine) and not await huge.allowed(1, mine)
    assert len(huge) == 0 and huge.client.asked == [1, 1]  # type: ignore[attr-defined]
    # the count bound still holds, and an unknown id is remembered (cheaply) too
    small = IdSubjects(ManySubjects(1, CacheBudget(MiB)), size=3)  # type: ignore[arg-type]
    for sid in (-1, -2, 5, 6, 7):
        if sid < 0:
            with pytest.raises(SchemaNotFound):
                await small.allowed(sid, mine)
        else:
            await small.allowed(sid, mine)
    assert len(small) == 3


def big_pattern(i: int) -> str:
    """An ECMA-262 pattern RE2 compiles into ~60,000 instructions (~0.6 MiB), unique to ``i``."""
    return "\\p{L}{50}x" + "y" * i


def test_pattern_cache_is_bounded_by_bytes_least_recently_used_first() -> None:
    cache = PatternCache(size=256, max_bytes=8 * MiB)
    cost = program_cost(big_pattern(0), cache.compile(big_pattern(0)))
    assert cost > MiB  # both directions' instructions and the DFA allowance
    for i in range(1, 30):  # 30 programs: all 30 were kept (~17 MiB of RSS), under 256
        cache.compile(big_pattern(i))
        assert cache.used <= 8 * MiB
    assert 2 <= len(cache) <= 8 * MiB // cost
    assert cache.compiles == 30
    # the latest stay, the first went (compiled again), and a use moves a program to the back
    cache.compile(big_pattern(29))
    assert cache.compiles == 30
    cache.compile(big_pattern(0))
    assert cache.compiles == 31
    kept = len(cache)
    for i in range(100, 100 + kept - 1):
        cache.compile(big_pattern(i))
        cache.compile(big_pattern(0))  # used every time: never the least recently used
    assert cache.compiles == 31 + kept - 1
    # small patterns: the count bound, each charged at least the DFA allowance
    small = PatternCache(size=4, max_bytes=8 * MiB)
    for i in range(6):
        assert small.compile(f"^a{i}$").search(f"a{i}") is not None
    assert len(small) == 4 and small.used >= 4 * DFA_ALLOWANCE
    # a program costing more than the whole bound works but is not kept; a refusal is never kept
    tiny = PatternCache(size=4, max_bytes=DFA_ALLOWANCE)
    assert tiny.compile(big_pattern(0)).search("é" * 50 + "x") is not None
    assert len(tiny) == 0 and tiny.used == 0
    with pytest.raises(EcmaRegexError):
        tiny.compile("(a)\\1")
    assert len(tiny) == 0


def test_compile_pattern_uses_the_process_cache_only() -> None:
    from service.consumer.subscription import compile_topic_pattern
    from service.schemas.ecma_regex import PATTERNS

    cached = re2._Regexp._make.cache_info().currsize  # google-re2's own cache (128 programs of any size)
    regex = compile_pattern("^unit-cache-[0-9]+$")
    assert compile_pattern("^unit-cache-[0-9]+$") is regex and "^unit-cache-[0-9]+$" in PATTERNS._lru
    assert 0 < PATTERNS.used <= PATTERNS.budget.max_bytes
    PatternCache().compile(big_pattern(1000))
    assert compile_topic_pattern("unit-cache-[a-z]{900}").fullmatch("unit-cache-" + "a" * 900) is not None
    assert re2._Regexp._make.cache_info().currsize == cached  # none of them kept there
