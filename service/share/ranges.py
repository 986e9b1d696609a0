"""Offset ranges with a value, for share-group bookkeeping (pure, no I/O).

A share consumer acquires records in runs of consecutive offsets that share a delivery count and a lock
deadline (the broker's ``AcquiredRecords``), and settles them in runs (acknowledgement batches, offset ranges
of the HTTP API). :class:`RunMap` keeps such runs per partition — disjoint, sorted, adjacent runs with equal
values merged — so acquiring, acknowledging and answering cost per run, not per record.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

V = TypeVar("V")


def _first(run: list[Any]) -> int:
    return run[0]


def runs_of(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct offsets as runs of consecutive ones: ``[(first, last), ...]``."""
    out: list[tuple[int, int]] = []
    start = prev = None
    for o in sorted(set(offsets)):
        if prev is not None and o == prev + 1:
            prev = o
            continue
        if start is not None and prev is not None:
            out.append((start, prev))
        start = prev = o
    if start is not None and prev is not None:
        out.append((start, prev))
    return out


def subtract(first: int, last: int, pieces: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``first..last`` outside ``pieces`` (sorted, disjoint, each inside the range)."""
    out: list[tuple[int, int]] = []
    at = first
    for f, la in pieces:
        if f > at:
            out.append((at, f - 1))
        at = max(at, la + 1)
    if at <= last:
        out.append((at, last))
    return out


class RunMap(Generic[V]):
    """Disjoint runs ``[first, last]`` of offsets, each with a value, sorted by offset."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: list[list[Any]] = []  # [first, last, value]

    def __len__(self) -> int:
        """How many offsets (not runs)."""
        return sum(r[1] - r[0] + 1 for r in self.runs)

    def __bool__(self) -> bool:
        return bool(self.runs)

    def __iter__(self) -> Iterator[tuple[int, int, V]]:
        return ((r[0], r[1], r[2]) for r in self.runs)

    def _start(self, first: int) -> int:
        """The index of the first run that ends at or after ``first``."""
        runs = self.runs
        i = bisect_right(runs, first, key=_first) - 1
        if i < 0:
            return 0
        return i if runs[i][1] >= first else i + 1

    def get(self, offset: int) -> V | None:
        runs = self.runs
        i = bisect_right(runs, offset, key=_first) - 1
        if i >= 0 and runs[i][1] >= offset:
            return runs[i][2]
        return None

    def __contains__(self, offset: int) -> bool:
        runs = self.runs
        i = bisect_right(runs, offset, key=_first) - 1
        return i >= 0 and runs[i][1] >= offset

    def pieces(self, first: int, last: int) -> list[tuple[int, int, V]]:
        """The runs' parts inside ``first..last``, in order."""
        runs = self.runs
        out = []
        j = self._start(first)
        while j < len(runs) and runs[j][0] <= last:
            f, la, v = runs[j]
            out.append((max(f, first), min(la, last), v))
            j += 1
        return out

    def remove(self, first: int, last: int) -> list[tuple[int, int, V]]:
        """Take ``first..last`` out; the parts that were there, in order."""
        runs = self.runs
        i = j = self._start(first)
        out = []
        while j < len(runs) and runs[j][0] <= last:
            f, la, v = runs[j]
            out.append((max(f, first), min(la, last), v))
            j += 1
        if not out:
            return out
        keep = []
        head, tail = runs[i], runs[j - 1]
        if head[0] < first:
            keep.append([head[0], first - 1, head[2]])
        if tail[1] > last:
            keep.append([last + 1, tail[1], tail[2]])
        runs[i:j] = keep
        return out

    def assign(self, first: int, last: int, value: V) -> None:
        """``first..last`` take ``value`` (whatever they had), merged with equal neighbours."""
        self.remove(first, last)
        runs = self.runs
        k = bisect_left(runs, first, key=_first)
        if k > 0 and runs[k - 1][1] == first - 1 and runs[k - 1][2] == value:
            k -= 1
            runs[k][1] = last
        else:
            runs.insert(k, [first, last, value])
        if k + 1 < len(runs) and runs[k + 1][0] == last + 1 and runs[k + 1][2] == value:
            runs[k][1] = runs[k + 1][1]
            del runs[k + 1]

    def remove_if(self, drop: Callable[[V], bool]) -> list[tuple[int, int, V]]:
        """Take out every run whose value ``drop`` says; those runs."""
        gone = [(r[0], r[1], r[2]) for r in self.runs if drop(r[2])]
        if gone:
            self.runs = [r for r in self.runs if not drop(r[2])]
        return gone

    def clear(self) -> None:
        self.runs = []
