"""A large partition of a Fetch response is decoded in pieces of whole batches with the event loop let
go in between (service/fetch/fetcher.py split_records / Fetcher._handle_pieces): the pieces cover the records
exactly, in order; the buffered records are the same as decoded in one go; a seek between two pieces drops the
rest; what cannot be split safely (compressed batches, aborted transactions, small partitions) is not."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from service.consumer.subscription import OffsetResetStrategy, SubscriptionState, TopicPartition
from service.fetch import fetcher as F
from service.protocol import records as R

TP = TopicPartition("t", 0)


def _blob(batches: int, per_batch: int, *, base: int = 0, compression: int = 0, tail: int = 0) -> bytes:
    out = b"".join(R.build_batch([(b"k%d" % i, b"v" * 100) for i in range(per_batch)],
                                 base_offset=base + b * per_batch, compression=compression)
                   for b in range(batches))
    if tail:  # a batch cut short by the response size
        out += R.build_batch([(b"x", b"y" * 500)] * 5, base_offset=base + batches * per_batch)[:tail]
    return out


def _part(blob: bytes, aborted: Any = None) -> SimpleNamespace:
    return SimpleNamespace(error_code=0, high_watermark=10**6, last_stable_offset=10**6, log_start_offset=0,
                           records=blob, aborted_transactions=aborted)


def _fetcher() -> tuple[F.Fetcher, SubscriptionState]:
    client = SimpleNamespace(metadata=SimpleNamespace(leader=lambda t, p: 0), invalidate=lambda *a: None)
    subs = SubscriptionState(OffsetResetStrategy.EARLIEST)
    subs.assign([TP])
    subs.seek(TP, 0)
    return F.Fetcher(client, subs, F.FetchConfig()), subs  # type: ignore[arg-type]


def test_pieces_cover_the_batches_in_order() -> None:
    blob = _blob(40, 100, tail=300)
    pieces = F.split_records(_part(blob), max_piece=20_000)
    assert pieces is not None and len(pieces) > 2
    assert b"".join(bytes(p.records) for p in pieces) == blob
    for p in pieces[:-1]:  # whole batches only, each piece at least the piece size
        rs = R.decode_records(p.records)
        assert rs.partial_bytes == 0 and len(bytes(p.records)) >= 20_000
    whole = [r for b in R.decode_records(blob).batches for r in b.decode()]
    pieced = [r for p in pieces for b in R.decode_records(p.records).batches for r in b.decode()]
    assert pieced == whole


def test_what_is_not_split() -> None:
    blob = _blob(40, 100)
    assert F.split_records(_part(blob), max_piece=len(blob)) is None  # small enough
    assert F.split_records(_part(blob, aborted=[(7, 0)]), max_piece=20_000) is None
    assert F.split_records(_part(_blob(40, 100, compression=R.Compression.GZIP)), max_piece=200) is None
    assert F.split_records(SimpleNamespace(**{**vars(_part(blob)), "error_code": 1}), max_piece=200) is None
    assert F.split_records(_part(None), max_piece=200) is None  # type: ignore[arg-type]
    one = R.build_batch([(b"k", b"v" * 50_000)])  # one batch larger than a piece, then only a cut-short tail
    assert F.split_records(_part(one + one[:100]), max_piece=1000) is None


async def test_pieces_buffer_the_same_records_as_one_go() -> None:
    blob = _blob(60, 100, tail=200)
    one, subs1 = _fetcher()
    one._handle_partition(TP, _part(blob), 0)
    pieced, subs2 = _fetcher()
    pieces = F.split_records(_part(blob), max_piece=30_000)
    assert pieces is not None and len(pieces) > 3
    await pieced._handle_pieces(TP, pieces, 0)
    assert pieced.buffered_records == one.buffered_records == 6000
    assert pieced.fetch_offset(TP) == one.fetch_offset(TP) == 6000
    a = one.drain(10**6)
    b = pieced.drain(10**6)
    assert [r for _, recs in a for r in recs] == [r for _, recs in b for r in recs]
    assert subs1.position(TP) == subs2.position(TP) == 6000


async def test_a_seek_between_pieces_drops_the_rest() -> None:
    blob = _blob(60, 100)
    fetcher, subs = _fetcher()
    pieces = F.split_records(_part(blob), max_piece=30_000)
    assert pieces is not None and len(pieces) > 3
    task = asyncio.ensure_future(fetcher._handle_pieces(TP, pieces, 0))
    await asyncio.sleep(0)  # the first piece is buffered, the task waits before the second
    first = fetcher.buffered_records
    assert 0 < first < 6000
    fetcher.purge([TP])
    subs.seek(TP, 10)  # back: the pieces in flight must not be buffered as if fetched from 10
    await task
    assert fetcher.buffered_records == 0 and fetcher.fetch_offset(TP) == 10
