"""Fetcher.drain's byte budget: the C take_budget (service/protocol/_crecords.c) against the Python one,
on random records and budgets, and the rules themselves (a poll never stalls on a large record)."""

from __future__ import annotations

import random

import pytest

from service.fetch.fetcher import _take_budget_py
from service.protocol import records
from service.protocol.records import Record
from tests.conftest import require_cext

_c = getattr(records, "_crecords", None)


def _recs(rng: random.Random, n: int) -> list[Record]:
    def field() -> bytes | None:
        return None if rng.random() < 0.2 else bytes(rng.randrange(0, 300))
    return [Record(i, 0, field(), field(), ()) for i in range(n)]


def test_rules() -> None:
    recs = [Record(i, 0, None, b"x" * size, ()) for i, size in enumerate((10, 50, 10, 10))]
    assert _take_budget_py(recs, 0, 4, 25, False) == (1, 0)  # the 50-byte record does not fit: the take ends
    assert _take_budget_py(recs, 1, 4, 25, False) == (2, 0)  # first taken at all: whole, budget spent
    assert _take_budget_py(recs, 1, 4, 25, True) == (1, 0)  # something taken before: nothing more
    assert _take_budget_py(recs, 0, 4, 60, False) == (2, 0)  # exactly spent: stop
    assert _take_budget_py(recs, 0, 3, 1000, False) == (3, 930)  # j bounds the take


@pytest.mark.skipif(_c is None and not require_cext(), reason="the C accelerator is not built")
def test_c_matches_python_on_random_records() -> None:
    assert _c is not None, "KCG_REQUIRE_CEXT=1: the C accelerator must be built"
    rng = random.Random(7)
    for _ in range(3000):
        recs = _recs(rng, rng.randrange(0, 30))
        i = rng.randrange(0, len(recs) + 1)
        j = rng.randrange(i, len(recs) + 2)
        budget = rng.randrange(1, 2000)
        started = rng.random() < 0.5
        assert _c.take_budget(recs, i, j, budget, started) == _take_budget_py(recs, i, min(j, len(recs)), budget,
                                                                                 started)
    with pytest.raises(TypeError):
        _c.take_budget([("not", "a", "record")], 0, 1, 10, False)
