"""Bounded decompression of record batches: a batch that inflates past the bound is an
InflatedSizeError naming topic, partition and offset, whatever its codec and whatever its frame claims; a batch
just under the bound decodes; decode_records stops at a total budget."""

from __future__ import annotations

from collections.abc import Iterator

import cramjam
import pytest

from service.protocol import compression as Z
from service.protocol import records as R
from service.protocol.errors import CorruptRecordError

MiB = 1024 * 1024
LIMIT = 4 * MiB
CODECS = [R.Compression.GZIP, R.Compression.SNAPPY, R.Compression.LZ4, R.Compression.ZSTD]


@pytest.fixture(params=["c", "python"])
def decoder(request: pytest.FixtureRequest):
    if request.param == "c" and not R.C_EXTENSION_AVAILABLE:
        pytest.fail("the C record decoder is not built")
    before = R.using_c_extension()
    R.use_c_extension(request.param == "c")
    yield request.param
    R.use_c_extension(before)


def _batch(value: bytes, compression: int, base_offset: int = 0, n: int = 1) -> bytes:
    return R.build_batch([(None, value)] * n, base_offset=base_offset, compression=compression)


def _batch_with_payload(payload: bytes, compression: int, monkeypatch: pytest.MonkeyPatch,
                        base_offset: int = 0) -> bytes:
    """A batch whose records section is ``payload`` as given (a hand-made, possibly lying, frame)."""
    with monkeypatch.context() as m:
        m.setattr(R, "compress", lambda _c, _d: payload)
        return R.build_batch([(None, b"x")], base_offset=base_offset, compression=compression)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_bomb_raises_a_typed_error_naming_the_batch(codec: R.Compression, decoder: str) -> None:
    blob = _batch(b"\0" * (6 * LIMIT), codec, base_offset=41, n=3)
    with pytest.raises(R.InflatedSizeError) as ei:
        R.decode_records(blob, topic="bombs", partition=7, max_inflated=LIMIT)
    e = ei.value
    assert isinstance(e, CorruptRecordError)
    assert (e.topic, e.partition, e.offset, e.limit, e.next_offset) == ("bombs", 7, 41, LIMIT, 44)
    assert "topic=bombs" in str(e) and "partition=7" in str(e) and "offset=41" in str(e)
    assert codec.name.lower() in str(e) and str(LIMIT) in str(e)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_batch_just_under_the_bound_decodes(codec: R.Compression, decoder: str) -> None:
    value = (bytes(range(256)) * (LIMIT // 256))[:LIMIT - 64]  # the records section is a few bytes more than this
    blob = _batch(value, codec, base_offset=5)
    rs = R.decode_records(blob, topic="t", partition=0, max_inflated=LIMIT)
    (rec,) = rs.batches[0].records or []
    assert rec.value == value and rec.offset == 5
    assert LIMIT - 64 < rs.inflated_bytes <= LIMIT


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_exactly_at_the_bound_decodes_one_byte_over_does_not(codec: R.Compression) -> None:
    blob = _batch(b"a" * (LIMIT // 2), codec)
    size = R.decode_records(blob).inflated_bytes
    assert len(R.decode_records(blob, max_inflated=size).batches) == 1
    with pytest.raises(R.InflatedSizeError):
        R.decode_records(blob, max_inflated=size - 1)


def test_zstd_frame_without_a_declared_size(decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    body = R.build_batch([(None, b"\0" * (3 * LIMIT))])[R.BATCH_HEADER_SIZE:]  # the plain records section
    c = cramjam.zstd.Compressor()
    c.compress(body)
    frame = bytes(c.finish())
    assert Z._zstd_content_size(memoryview(frame)) is None  # a streaming frame: no content size
    blob = _batch_with_payload(frame, R.Compression.ZSTD, monkeypatch, base_offset=9)
    with pytest.raises(R.InflatedSizeError) as ei:
        R.decode_records(blob, topic="z", partition=1, max_inflated=LIMIT)
    assert ei.value.offset == 9


def test_zstd_frame_that_lies_about_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    body = R.build_batch([(None, b"\0" * (3 * LIMIT))])[R.BATCH_HEADER_SIZE:]
    frame = bytearray(cramjam.zstd.compress(body))
    fhd = frame[4]
    assert fhd >> 6 == 2 and not (fhd >> 5) & 1  # 4-byte content size after a window descriptor
    frame[6:10] = (100).to_bytes(4, "little")  # claims 100 bytes
    assert Z._zstd_content_size(memoryview(bytes(frame))) == 100
    blob = _batch_with_payload(bytes(frame), R.Compression.ZSTD, monkeypatch)
    with pytest.raises(R.InflatedSizeError):
        R.decode_records(blob, max_inflated=LIMIT)
    # a frame claiming more than the bound is refused before decompressing
    frame[6:10] = (LIMIT + 1).to_bytes(4, "little")
    blob = _batch_with_payload(bytes(frame), R.Compression.ZSTD, monkeypatch)
    with pytest.raises(R.InflatedSizeError, match="declares"):
        R.decode_records(blob, max_inflated=LIMIT)


def test_snappy_raw_header_is_checked_before_decompressing(monkeypatch: pytest.MonkeyPatch) -> None:
    # a raw snappy stream that claims a huge size but holds little is refused by its header alone
    lying = bytearray(cramjam.snappy.compress_raw(b"hello"))
    lying[0:1] = b""
    lying = bytearray(b"\xff\xff\xff\xff\x0f") + lying  # varint 2**32-1
    blob = _batch_with_payload(bytes(lying), R.Compression.SNAPPY, monkeypatch)
    with pytest.raises(R.InflatedSizeError, match="declares 4294967295"):
        R.decode_records(blob, max_inflated=LIMIT)


def test_xerial_snappy_chunks_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    body = R.build_batch([(None, b"\0" * (3 * LIMIT))])[R.BATCH_HEADER_SIZE:]
    parts = [Z._XERIAL_MAGIC + b"\0\0\0\1\0\0\0\1"]
    for i in range(0, len(body), MiB):
        chunk = bytes(cramjam.snappy.compress_raw(body[i:i + MiB]))
        parts.append(len(chunk).to_bytes(4, "big") + chunk)
    blob = _batch_with_payload(b"".join(parts), R.Compression.SNAPPY, monkeypatch)
    assert R.decode_records(blob, max_inflated=len(body)).batches[0].records[0].value == b"\0" * (3 * LIMIT)
    with pytest.raises(R.InflatedSizeError):
        R.decode_records(blob, max_inflated=LIMIT)


def test_gzip_and_lz4_fast_path_cannot_pass_the_bound() -> None:
    # worst-case ratios: a batch at most limit / ratio bytes long is decompressed directly
    for codec in (R.Compression.GZIP, R.Compression.LZ4):
        payload = R.compress(codec, b"\0" * (64 * MiB))
        assert len(payload) * Z._MAX_RATIO[codec] > 64 * MiB


def test_process_wide_default_bound() -> None:
    assert R.max_inflated_bytes() == R.DEFAULT_MAX_INFLATED_BYTES == 64 * MiB
    blob = _batch(b"\0" * (2 * MiB), R.Compression.GZIP)
    try:
        R.set_max_inflated_bytes(MiB)
        with pytest.raises(R.InflatedSizeError):
            R.decode_records(blob)
        assert len(R.decode_records(blob, max_inflated=4 * MiB).batches) == 1  # explicit beats default
    finally:
        R.set_max_inflated_bytes(R.DEFAULT_MAX_INFLATED_BYTES)
    with pytest.raises(ValueError):
        R.set_max_inflated_bytes(0)


def test_healthy_batches_before_a_bomb_are_kept_with_defer_errors() -> None:
    blob = _batch(b"ok", R.Compression.GZIP) + _batch(b"\0" * (2 * LIMIT), R.Compression.GZIP, base_offset=1)
    rs = R.decode_records(blob, topic="t", partition=2, max_inflated=LIMIT, defer_errors=True)
    assert [r.value for r in rs.records()] == [b"ok"]
    assert isinstance(rs.error, R.InflatedSizeError) and rs.error.offset == 1


def test_total_budget_stops_after_the_batch_that_reaches_it() -> None:
    blob = b"".join(_batch(b"v" * MiB, R.Compression.LZ4, base_offset=i) for i in range(4))
    rs = R.decode_records(blob, max_total_inflated=1)
    assert len(rs.batches) == 1 and rs.budget_stop and rs.next_offset == 1
    rs = R.decode_records(blob, max_total_inflated=MiB + 100)
    assert len(rs.batches) == 2 and rs.budget_stop
    rs = R.decode_records(blob, max_total_inflated=100 * MiB)
    assert len(rs.batches) == 4 and not rs.budget_stop and rs.inflated_bytes > 4 * MiB


def _section(n: int) -> bytes:
    """A records section of about ``n`` bytes that compresses about 3x."""
    rows = [(None, (b"%08d-" % i) * 8 + bytes(range(i % 200, i % 200 + 40))) for i in range(n // 120)]
    return R.build_batch(rows)[R.BATCH_HEADER_SIZE:]


@pytest.mark.parametrize("size", [100, 70_000, 3 * MiB])
def test_frame_walks_bound_the_output_from_above(size: int) -> None:
    body = _section(size)
    lz4 = R.compress(R.Compression.LZ4, body)
    b = Z._lz4_size_bound(memoryview(lz4), 1 << 40)
    assert b is not None and len(body) <= b < len(body) + 2 * (1 << 22)
    c = cramjam.zstd.Compressor()
    c.compress(body)
    zstd = bytes(c.finish()) + bytes(cramjam.zstd.compress(body))  # two frames, the first without a size
    b = Z._zstd_size_bound(memoryview(zstd), 1 << 40)
    assert b is not None and 2 * len(body) <= b <= 2 * len(body) + 2 * Z._ZSTD_BLOCK_MAX + len(body)
    assert Z._zstd_size_bound(memoryview(zstd[:-3]), 1 << 40) is None  # truncated: no hint
    assert Z._lz4_size_bound(memoryview(b"garbage-not-a-frame"), 1 << 40) is None
    # decoded through the bounded path (each is beyond its codec's fast-path size) and intact
    for codec, payload in ((R.Compression.LZ4, lz4), (R.Compression.ZSTD, zstd)):
        assert bytes(R.decompress_bounded(codec, payload, 8 * MiB)) == (body * (2 if payload is zstd else 1))


@pytest.mark.parametrize("isize", [1, 1 << 20, 2**32 - 1])
def test_gzip_with_a_lying_size_trailer_is_decided_by_the_bound(isize: int) -> None:
    body = _section(2 * MiB)
    gz = bytearray(cramjam.gzip.compress(body))
    assert len(gz) * Z._MAX_RATIO[R.Compression.GZIP] > 4 * MiB  # not the fast path
    gz[-4:] = isize.to_bytes(4, "little")
    try:
        out = R.decompress_bounded(R.Compression.GZIP, bytes(gz), 4 * MiB)
    except Exception as e:  # the codec may check the trailer: then it is corrupt, never unbounded
        assert not isinstance(e, Z.TooLarge)
    else:
        assert bytes(out) == body
    with pytest.raises(Z.TooLarge):
        R.decompress_bounded(R.Compression.GZIP, bytes(gz), MiB)


def test_a_known_bomb_is_refused_again_without_decompressing(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = _batch(b"\0" * (2 * LIMIT), R.Compression.GZIP, base_offset=77)
    with pytest.raises(R.InflatedSizeError):
        R.decode_records(blob, topic="cache", partition=3, max_inflated=LIMIT)

    def boom(*_a: object) -> None:
        raise AssertionError("decompressed again")

    with monkeypatch.context() as m:
        m.setattr(R, "decompress_bounded", boom)
        with pytest.raises(R.InflatedSizeError) as ei:
            R.decode_records(blob, topic="cache", partition=3, max_inflated=LIMIT)
        assert ei.value.offset == 77 and ei.value.limit == LIMIT
        # another place, or a larger bound, is not taken from the cache
        with pytest.raises(CorruptRecordError, match="decompressed again"):
            R.decode_records(blob, topic="cache", partition=4, max_inflated=LIMIT)
        with pytest.raises(CorruptRecordError, match="decompressed again"):
            R.decode_records(blob, topic="cache", partition=3, max_inflated=4 * LIMIT)
    assert len(R.decode_records(blob, topic="cache", partition=3, max_inflated=4 * LIMIT).batches) == 1


# -- the consumer's fetcher: report once, hold the partition back, let the others flow -----------------------
@pytest.fixture
def small_bound() -> Iterator[None]:
    R.set_max_inflated_bytes(LIMIT)
    yield
    R.set_max_inflated_bytes(R.DEFAULT_MAX_INFLATED_BYTES)


def test_fetcher_reports_a_bomb_once_and_parks_only_that_partition(small_bound: None) -> None:
    from types import SimpleNamespace

    from service.consumer.subscription import OffsetResetStrategy, SubscriptionState, TopicPartition
    from service.fetch import fetcher as F

    bomb_tp, ok_tp = TopicPartition("t", 0), TopicPartition("t", 1)
    client = SimpleNamespace(metadata=SimpleNamespace(leader=lambda t, p: 0), invalidate=lambda *a: None)
    subs = SubscriptionState(OffsetResetStrategy.EARLIEST)
    subs.assign([bomb_tp, ok_tp])
    subs.seek(bomb_tp, 5)
    subs.seek(ok_tp, 0)
    fetcher = F.Fetcher(client, subs, F.FetchConfig())  # type: ignore[arg-type]

    def part(blob: bytes) -> SimpleNamespace:
        return SimpleNamespace(error_code=0, high_watermark=100, last_stable_offset=100, log_start_offset=0,
                               records=blob, aborted_transactions=None)

    fetcher._handle_partition(bomb_tp, part(_batch(b"\0" * (2 * LIMIT), R.Compression.ZSTD, base_offset=5)), 5)
    healthy = _batch(b"v" * MiB, R.Compression.GZIP, base_offset=0, n=3)
    fetcher._handle_partition(ok_tp, part(healthy), 0)
    err = fetcher.take_error()
    assert isinstance(err, R.InflatedSizeError) and (err.topic, err.partition, err.offset) == ("t", 0, 5)
    assert fetcher.take_error() is None  # reported once
    # the healthy partition's records are buffered, charged at their decompressed size
    assert fetcher.buffered_records == 3 and fetcher.buffered_bytes >= 3 * MiB > len(healthy)
    fetcher.drain(10)
    # the bomb partition is held back at its offset; the healthy one is fetched on
    assert fetcher._fetchable_by_leader() == {0: [ok_tp]}
    fetcher.parked[bomb_tp] = (5, 0.0)  # the hold expired: fetched (and reported) again
    assert sorted(fetcher._fetchable_by_leader()[0]) == [bomb_tp, ok_tp]
    fetcher._handle_partition(bomb_tp, part(_batch(b"\0" * (2 * LIMIT), R.Compression.ZSTD, base_offset=5)), 5)
    assert isinstance(fetcher.take_error(), R.InflatedSizeError) and bomb_tp in fetcher.parked
    assert fetcher._fetchable_by_leader() == {0: [ok_tp]}
    subs.seek(bomb_tp, 6)  # a seek past it moves it on at once
    assert sorted(fetcher._fetchable_by_leader()[0]) == [bomb_tp, ok_tp] and bomb_tp not in fetcher.parked
