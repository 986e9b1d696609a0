"""Partition choice, as the Java client (and librdkafka's ``murmur2_random``) make it.

- A keyed record goes to ``toPositive(murmur2(key)) % num_partitions`` (Kafka's ``BuiltInPartitioner``;
  ``toPositive`` is ``h & 0x7fffffff``), over *all* partitions of the topic, available or not, so the same
  key always lands on the same partition whichever client wrote it.
- A record without a key goes to a "sticky" partition (KIP-480/794): one randomly chosen available
  partition until about ``sticky_bytes`` were sent to it, then another. Records of concurrent requests
  then fill one batch instead of many small ones.

Pure: no I/O; the random source is injectable for tests.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Collection, Sequence
from itertools import accumulate

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (MurmurHash2, seed 0x9747b28c) as a signed 32-bit int, like Java's."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length & ~3
    if n4:
        for k in memoryview(data)[:n4].cast("I") if _LITTLE else _words(data, n4):
            k = (k * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest:
        if rest == 3:
            h ^= data[n4 + 2] << 16
        if rest >= 2:
            h ^= data[n4 + 1] << 8
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _words(data: bytes, n4: int) -> list[int]:
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, n4, 4)]


_LITTLE = memoryview(b"\x01\x00\x00\x00").cast("I")[0] == 1


def to_positive(h: int) -> int:
    return h & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition the Java client (and librdkafka's murmur2 partitioners) choose for ``key``."""
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """Partitions for records without a key: stick to one available partition for ``sticky_bytes``."""

    def __init__(self, sticky_bytes: int = 16384, rng: random.Random | None = None) -> None:
        self.sticky_bytes = sticky_bytes
        self._rng = rng or random.Random()
        self._current: dict[str, tuple[int, int]] = {}  # topic -> (partition, bytes sent to it)

    def partition(self, topic: str, size: int, num_partitions: int, available: Collection[int] = ()) -> int:
        """``available``: partitions with a leader (a set, for speed; empty: all)."""
        cur = self._current.get(topic)
        if cur is not None:
            p, used = cur
            if p < num_partitions and (not available or p in available) and used < self.sticky_bytes:
                self._current[topic] = (p, used + size)
                return p
        p = self._choose(num_partitions, available, None if cur is None else cur[0])
        self._current[topic] = (p, size)
        return p

    def runs(self, topic: str, sizes: Sequence[int], num_partitions: int,
             available: Collection[int] = ()) -> list[tuple[int, int, int, int]]:
        """What :meth:`partition` would choose for records of ``sizes`` in turn, as runs
        ``(partition, start, end, bytes)`` of consecutive records (same state changes, same random draws)."""
        out: list[tuple[int, int, int, int]] = []
        n = len(sizes)
        cum: list[int] | None = None
        i = 0
        while i < n:
            p = self.partition(topic, sizes[i], num_partitions, available)
            used = self._current[topic][1]
            if cum is None:
                # the common case: the records from i on all stay on p (no running sums needed); record j
                # stays while the bytes before it, used + sizes[i+1..j-1], are below sticky_bytes
                rest = sum(sizes) if i == 0 else sum(sizes[i:])
                if n - i == 1 or used + rest - sizes[i] - sizes[-1] < self.sticky_bytes:
                    self._current[topic] = (p, used + rest - sizes[i])
                    out.append((p, i, n, rest))
                    return out
                cum = list(accumulate(sizes))
            # record j > i stays on p while the bytes before it, used + cum[j-1] - cum[i], are below sticky_bytes
            end = min(bisect_left(cum, self.sticky_bytes - used + cum[i], i) + 1, n)
            run_bytes = cum[end - 1] - (cum[i - 1] if i else 0)
            self._current[topic] = (p, used + cum[end - 1] - cum[i])
            out.append((p, i, end, run_bytes))
            i = end
        return out

    def _choose(self, num_partitions: int, available: Collection[int], previous: int | None) -> int:
        pool = sorted(available) if available else list(range(num_partitions))
        if len(pool) > 1 and previous in pool:
            pool.remove(previous)  # move on, as Java does
        return pool[self._rng.randrange(len(pool))]
