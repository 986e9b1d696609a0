"""Every index, count and offset argument of the C entry points of ``_crecords`` and ``_cproduce`` is checked:
a negative or too large one is a Python exception (as in the Python twin), never a read outside the
records (ASan saw ``take_budget(recs, -3, ...)`` read before the array)."""

from __future__ import annotations

from typing import Any

import pytest

from service.fetch.fetcher import _payload_from, _take_budget_py
from service.producer import encoding
from service.producer.accumulator import RecordMetadata
from service.protocol import records as R
from service.protocol.records import Record, build_batch
from tests.conftest import require_cext

C = getattr(R, "_crecords", None)
P = encoding._cproduce
need_c = pytest.mark.skipif((C is None or P is None) and not require_cext(), reason="C accelerators not built")

RECS = [Record(i, 1_700_000_000_000, b"k%d" % i, b"v" * (i + 1), ()) for i in range(5)]
BIG = 2**62


def _run() -> Any:
    blob = build_batch(RECS, base_offset=0)
    run = C.RecordRun(blob, Record)  # type: ignore[union-attr]
    for b in R.iter_batches(blob):
        run.add(b._start, b._end, b.records_count, b.base_offset, b.base_timestamp, None)
    return run


BAD_RANGES = [(-3, 5), (-1, 0), (6, 7), (BIG, BIG + 1), (-BIG, 2), (3, 2), (0, -1)]


@pytest.mark.parametrize(("i", "j"), BAD_RANGES)
def test_take_budget_python_twin_refuses_bad_ranges(i: int, j: int) -> None:
    with pytest.raises(IndexError):
        _take_budget_py(RECS, i, j, 100, False)


@need_c
@pytest.mark.parametrize(("i", "j"), BAD_RANGES)
@pytest.mark.parametrize("container", ["list", "run"])
def test_take_budget_c_refuses_bad_ranges(i: int, j: int, container: str) -> None:
    recs = RECS if container == "list" else _run()
    with pytest.raises(IndexError):
        C.take_budget(recs, i, j, 100, False)  # type: ignore[union-attr]


@need_c
@pytest.mark.parametrize("container", ["list", "run"])
def test_take_budget_valid_edges_agree(container: str) -> None:
    recs = RECS if container == "list" else _run()
    for i, j in [(0, 0), (5, 5), (5, BIG), (0, BIG), (2, 4), (4, 5)]:
        for budget in (0, 1, 7, 1000):
            assert C.take_budget(recs, i, j, budget, False) == _take_budget_py(RECS, i, j, budget, False)  # type: ignore[union-attr]
    with pytest.raises(OverflowError):
        C.take_budget(recs, 2**64, 2**65, 10, False)  # type: ignore[union-attr]


@need_c
def test_run_indexes() -> None:
    run = _run()
    assert run.payload(0) == _payload_from(RECS, 0) and run.payload(5) == 0 == _payload_from(RECS, 5)
    for i in (-1, -3, 6, BIG):
        with pytest.raises(IndexError):
            run.payload(i)
        with pytest.raises(IndexError):
            _payload_from(RECS, i)
    for i in (5, -6, BIG, -BIG):
        with pytest.raises(IndexError):
            run.offset(i)
        with pytest.raises(IndexError):
            run[i]
    assert run.offset(-1) == 4 and run[-1] == RECS[-1]  # Python's negative indexing, as a list's
    with pytest.raises((IndexError, OverflowError)):
        run.offset(2**64)
    assert list(run[-BIG:BIG]) == RECS and list(run[BIG:]) == [] and run[3:1].payload(0) == 0
    view = run[1:3]
    with pytest.raises(IndexError):
        view.payload(3)
    with pytest.raises(IndexError):
        C.take_budget(view, 3, 4, 10, False)  # type: ignore[union-attr]


@need_c
def test_decode_records_and_add_bounds() -> None:
    blob = build_batch(RECS, base_offset=0)
    b = next(R.iter_batches(blob))
    for start, end in [(-1, b._end), (b._start, len(blob) + 1), (b._end, b._start), (BIG, BIG)]:
        with pytest.raises(ValueError):
            C.decode_records(blob, start, end, 5, 0, 0, None, Record)  # type: ignore[union-attr]
        with pytest.raises(ValueError):
            C.RecordRun(blob, Record).add(start, end, 5, 0, 0, None)  # type: ignore[union-attr]
    for count in (-1, BIG):
        with pytest.raises(ValueError):
            C.decode_records(blob, b._start, b._end, count, 0, 0, None, Record)  # type: ignore[union-attr]
        with pytest.raises(ValueError):
            C.RecordRun(blob, Record).add(b._start, b._end, count, 0, 0, None)  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        C.frame_buffer(-1)  # type: ignore[union-attr]


def test_produce_twins_refuse_bad_counts() -> None:
    for metas in [encoding._metas_py] + ([P.metas] if P is not None else []):
        with pytest.raises(ValueError):
            metas(RecordMetadata, 0, 0, -1)
        with pytest.raises(OverflowError):
            metas(RecordMetadata, 0, 2**63 - 1, 2)
        assert metas(RecordMetadata, 0, 2**63 - 2, 2) == [(0, 2**63 - 2), (0, 2**63 - 1)]
    plain = [(None, b"abc", (), None, None)]
    for sizes in [encoding._plain_sizes_py] + ([P.plain_sizes] if P is not None else []):
        assert sizes(plain, 70) == [73]
        for overhead in (-1, 2**31, BIG):
            with pytest.raises(ValueError):
                sizes(plain, overhead)


@need_c
def test_render_offsets_arguments() -> None:
    assert P.render_offset_runs([(0, 1, 5, 2)], 2) is not None
    for n in (-1, -BIG):
        with pytest.raises(ValueError):
            P.render_offset_runs([], n)
    with pytest.raises(ValueError):
        P.render_offset_runs([], 2**62)
    assert P.render_offset_runs([(0, 1, 5, 3)], 2) is None  # a run past n: the Python renderer's case
    assert P.render_offset_runs([(-1, 1, 5, 1)], 1) is None
    with pytest.raises(TypeError):  # not a tuple class: PyTuple_GET_SIZE on an int would read garbage
        P.render_offsets([5], int, None, None)
    assert P.render_offsets([RecordMetadata(0, 7)], RecordMetadata, None, 3).startswith(b'{"offsets":[')
