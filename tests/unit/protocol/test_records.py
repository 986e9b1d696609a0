"""Record batches (magic 2): decoding, encoding, both decoder implementations, kafka-python interop."""

from __future__ import annotations

import os
import struct
import types
from collections.abc import Iterator
from typing import Any

import cramjam
import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.protocol import records as R
from service.protocol.errors import CorruptRecordError, UnsupportedMessageFormatError
from service.protocol.records import Compression, ControlType, Record

CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
REQUIRE_CEXT = os.environ.get("KCG_REQUIRE_CEXT") == "1"

# kafka-python (the interop reference) loads its schemas with deprecated importlib calls
pytestmark = pytest.mark.filterwarnings("ignore:(read_text|open_text) is deprecated:DeprecationWarning")


def _select(impl: str) -> None:
    if impl == "c":
        if not R.C_EXTENSION_AVAILABLE:
            msg = f"C record decoder not importable: {R._C_IMPORT_ERROR}"
            if REQUIRE_CEXT:
                pytest.fail(msg + " (KCG_REQUIRE_CEXT=1)")
            pytest.skip(msg)
        R.use_c_extension(True)
    else:
        R.use_c_extension(False)


@pytest.fixture(params=["c", "py"])
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    before = R.using_c_extension()
    _select(request.param)
    try:
        yield request.param
    finally:
        R._decode_section = R._crecords.decode_records if before else R._decode_section_py  # type: ignore[union-attr]


def _recrc(batch: bytes | bytearray) -> bytes:
    b = bytearray(batch)
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


SAMPLE = [
    (b"key-0", b"v" * 100, [("trace", b"abc"), ("empty", b""), ("null", None)], 1_700_000_000_000),
    (None, b"no key", [], 1_700_000_000_005),
    (b"no value", None, [], 1_699_999_999_990),  # earlier than the base: negative delta
    (b"", b"", [("\u00fcnicode-\u2603", b"\x00\xff")], 1_700_000_123_456),
    (None, None, [], 1_700_000_000_001),
    (b"k" * 300, bytes(range(256)) * 40, [("h", b"x" * 200)] * 3, 1_700_000_000_002),
]


def _expected(base_offset: int, rows: list[tuple[Any, ...]]) -> list[Record]:
    return [Record(base_offset + i, ts, k, v, tuple(h)) for i, (k, v, h, ts) in enumerate(rows)]


# -- round trips ----------------------------------------------------------------------------------
@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(impl: str, codec: int) -> None:
    data = R.build_batch(SAMPLE, base_offset=1000, compression=codec, producer_id=42, producer_epoch=3,
                         base_sequence=17, partition_leader_epoch=9)
    rs = R.decode_records(data, topic="t", partition=1)
    assert len(rs.batches) == 1
    assert rs.partial_bytes == 0 and not rs.first_batch_truncated
    b = rs.batches[0]
    assert b.compression == codec
    assert (b.base_offset, b.last_offset, b.next_offset) == (1000, 1005, 1006)
    assert b.records_count == len(SAMPLE)
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (42, 3, 17)
    assert b.partition_leader_epoch == 9 and b.magic == 2
    assert b.base_timestamp == 1_700_000_000_000
    assert b.max_timestamp == 1_700_000_123_456
    assert b.timestamp_type == 0 and not b.is_transactional and not b.is_control
    assert b.size == len(data)
    assert b.records == _expected(1000, SAMPLE)
    assert all(type(r) is Record for r in b.records)
    assert b.records[0].headers == (("trace", b"abc"), ("empty", b""), ("null", None))
    assert b.records[0].headers[2][1] is None and b.records[4].key is None and b.records[4].value is None
    assert rs.next_offset == 1006
    assert list(rs.records()) == b.records


@pytest.mark.parametrize("codec", CODECS)
def test_c_and_python_decoders_agree(codec: int) -> None:
    _select("c")
    try:
        data = R.build_batch(SAMPLE * 20, compression=codec, base_offset=5)
        with_c = R.decode_records(data).batches[0].records
        R.use_c_extension(False)
        with_py = R.decode_records(data).batches[0].records
    finally:
        R.use_c_extension(R.C_EXTENSION_AVAILABLE)
    assert with_c == with_py
    assert len(with_c) == 120 and with_c[-1].offset == 124


def test_many_batches_and_lazy_decoding(impl: str) -> None:
    blob = b"".join(R.build_batch([(b"k", b"v%d" % i)] * 3, base_offset=i * 3, base_timestamp=100 + i)
                    for i in range(50))
    it = R.iter_batches(blob, topic="t", partition=0)
    batches = list(it)
    assert [b.base_offset for b in batches] == list(range(0, 150, 3))
    assert all(b.records is None for b in batches)  # nothing decoded until asked
    recs = batches[7].decode()
    assert recs == [Record(21 + i, 107, b"k", b"v7", ()) for i in range(3)]
    assert batches[7].records is recs
    assert it.partial_bytes == 0 and it.oversized_first_batch is None and not it.first_batch_truncated
    assert sum(len(b.decode()) for b in batches) == 150


def test_offset_gaps_and_empty_batch(impl: str) -> None:
    # compaction leaves holes; the last offset delta can exceed the record count
    recs = [Record(10, 1, b"a", b"1", ()), Record(13, 2, b"b", b"2", ()), Record(19, 3, None, b"3", ())]
    data = R.build_batch(recs, base_offset=10, last_offset_delta=12)
    b = R.decode_records(data).batches[0]
    assert b.records == recs
    assert (b.last_offset, b.next_offset, b.records_count) == (22, 23, 3)
    empty = R.build_batch([], base_offset=50, base_timestamp=7, last_offset_delta=4, producer_id=3,
                          producer_epoch=0)
    eb = R.decode_records(empty).batches[0]
    assert eb.records == [] and eb.next_offset == 55 and eb.producer_id == 3


def test_large_varints(impl: str) -> None:
    # multi-byte varints in every position: big deltas, long lengths, many headers
    rows = [(b"k" * 20000, b"v" * 70000, [(f"h{i}", b"x" * 150) for i in range(200)], 10**12 + 5)]
    rows.append((b"k", b"v", [], 10**12 + 10**9))
    recs = [Record(1 << 40, r[3], r[0], r[1], tuple(r[2])) for r in rows[:1]]
    recs.append(Record((1 << 40) + 100_000, rows[1][3], b"k", b"v", ()))
    data = R.build_batch(recs, base_offset=1 << 40)
    assert R.decode_records(data).batches[0].records == recs


def test_plain_tuple_record_type() -> None:
    _select("c")
    data = R.build_batch([(b"k", b"v", [("a", None)], 5)], base_offset=3)
    rec = R._crecords.decode_records(data, 61, len(data), 1, 3, 5, None, tuple)  # type: ignore[union-attr]
    assert rec == [(3, 5, b"k", b"v", (("a", None),))] and type(rec[0]) is tuple
    with pytest.raises(TypeError):
        R._crecords.decode_records(data, 61, len(data), 1, 3, 5, None, dict)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="bounds"):
        R._crecords.decode_records(data, 61, len(data) + 1, 1, 3, 5, None, tuple)  # type: ignore[union-attr]


# -- special batches ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [ControlType.COMMIT, ControlType.ABORT])
def test_control_batches(impl: str, kind: ControlType) -> None:
    data = R.build_control_batch(kind, base_offset=77, producer_id=1234, producer_epoch=5, timestamp=99,
                                 coordinator_epoch=8)
    b = R.decode_records(data).batches[0]
    assert b.is_control and b.is_transactional
    assert (b.producer_id, b.producer_epoch, b.base_offset, b.last_offset) == (1234, 5, 77, 77)
    assert b.control_type is kind
    rec = b.records[0]
    assert rec.key == struct.pack(">hh", 0, int(kind))
    assert rec.value == struct.pack(">hi", 0, 8)
    # data records of a data batch are not markers
    assert R.decode_records(R.build_batch([(b"k", b"v")])).batches[0].control_type is None
    assert list(R.decode_records(data).records()) == []  # control records are not data


def test_transactional_flag_and_log_append_time(impl: str) -> None:
    rows = [(b"a", b"1", [], 1000), (b"b", b"2", [], 900), (b"c", b"3", [], 1100)]
    data = R.build_batch(rows, transactional=True, producer_id=9, producer_epoch=1, base_sequence=0,
                         log_append_time=True, max_timestamp=55_555)
    b = R.decode_records(data).batches[0]
    assert b.is_transactional and not b.is_control
    assert b.timestamp_type == 1 and b.is_log_append_time
    assert [r.timestamp for r in b.records] == [55_555] * 3
    plain = R.decode_records(R.build_batch(rows)).batches[0]
    assert [r.timestamp for r in plain.records] == [1000, 900, 1100]
    assert plain.max_timestamp == 1100


# -- truncation -----------------------------------------------------------------------------------
def test_truncated_trailing_batch_is_ignored(impl: str) -> None:
    b1 = R.build_batch([(b"a", b"1")], base_offset=0)
    b2 = R.build_batch([(b"b", b"2")], base_offset=1)
    b3 = R.build_batch([(b"c", b"3" * 50)], base_offset=2)
    for cut in (1, 11, 12, 16, 17, 40, 61, len(b3) - 1):
        rs = R.decode_records(b1 + b2 + b3[:cut], topic="t", partition=0)
        assert [b.base_offset for b in rs.batches] == [0, 1]
        assert rs.partial_bytes == cut
        assert not rs.first_batch_truncated and rs.oversized_first_batch is None
    rs = R.decode_records(b1 + b2 + b3)
    assert [r.value for r in rs.records()] == [b"1", b"2", b"3" * 50]


def test_first_batch_larger_than_data_is_flagged(impl: str) -> None:
    big = R.build_batch([(b"k", b"x" * 5000)], base_offset=40)
    it = R.iter_batches(big[:1000])
    assert list(it) == []
    assert it.first_batch_truncated and it.oversized_first_batch == len(big) and it.partial_bytes == 1000
    rs = R.decode_records(big[:13])
    assert rs.batches == [] and rs.first_batch_truncated and rs.oversized_first_batch == len(big)
    tiny = R.decode_records(big[:5])  # too short to even read the size
    assert tiny.first_batch_truncated and tiny.oversized_first_batch is None
    empty = R.decode_records(b"")
    assert empty.batches == [] and not empty.first_batch_truncated and empty.partial_bytes == 0
    assert empty.next_offset is None


# -- errors ---------------------------------------------------------------------------------------
def test_crc_mismatch_names_topic_partition_offset(impl: str) -> None:
    good = R.build_batch([(b"k", b"value")], base_offset=10)
    bad = bytearray(R.build_batch([(b"k", b"value")] * 2, base_offset=11))
    bad[-3] ^= 0x01  # flip a bit inside the last value ("u" -> "t")
    blob = good + bytes(bad)
    with pytest.raises(CorruptRecordError, match="CRC") as ei:
        R.decode_records(blob, topic="orders", partition=3)
    e = ei.value
    assert (e.topic, e.partition, e.offset) == ("orders", 3, 11)
    assert "topic=orders" in str(e) and "partition=3" in str(e) and "offset=11" in str(e)
    # deferred: the good batch before it is still delivered
    rs = R.decode_records(blob, topic="orders", partition=3, defer_errors=True)
    assert [b.base_offset for b in rs.batches] == [10]
    assert isinstance(rs.error, CorruptRecordError) and rs.error.offset == 11
    # the lazy iterator yields the good batch first
    it = R.iter_batches(blob, topic="orders", partition=3)
    assert next(it).base_offset == 10
    with pytest.raises(CorruptRecordError):
        next(it)
    # without CRC checks the flipped bit just reads as data
    rs = R.decode_records(blob, verify_crc=False)
    assert rs.batches[1].records[1].value == b"valte"


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets_are_unsupported(impl: str, magic: int) -> None:
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=1000 if magic else None, key=b"k", value=b"v")
    legacy = bytes(builder.build())
    assert legacy[16] == magic
    for blob in (legacy, legacy[:20]):  # complete, and a cut first message set
        with pytest.raises(UnsupportedMessageFormatError,
                           match=rf"unsupported message format \(magic {magic}\): pre-0.11"):
            R.decode_records(blob, topic="old", partition=0)
    # after good batches: raised when reached; with defer_errors the good ones are kept
    good = R.build_batch([(b"k", b"v")], base_offset=0)
    rs = R.decode_records(good + legacy, defer_errors=True)
    assert len(rs.batches) == 1 and isinstance(rs.error, UnsupportedMessageFormatError)


def _tamper(records_section: bytes, count: int) -> bytes:
    """A batch around an arbitrary records section, with a valid CRC."""
    base = bytearray(R.build_batch([], base_offset=500, base_timestamp=0))
    struct.pack_into(">i", base, 57, count)
    base += records_section
    struct.pack_into(">i", base, 8, len(base) - 12)
    return _recrc(base)


def _one_record(key: bytes = b"k", value: bytes = b"v") -> bytes:
    return R.build_batch([(key, value, [], 0)], base_timestamp=0)[61:]


BAD_SECTIONS = {
    "count too high": (_one_record() * 2, 3),
    "count too low": (_one_record() * 2, 1),
    "varint too long": (b"\xff" * 12, 1),
    "record past batch end": (_one_record()[:-1], 1),
    "record length too small": (b"\x02\x00", 1),
    "key past record": (b"\x0e\x00\x00\x00\x7e\x02v\x00", 1),  # key length 63 inside a 7-byte record
    "bad key length": (b"\x0e\x00\x00\x00\x05\x00\x00\x00" + b"\x00" * 6, 1),  # key length -3
    "negative header count": (b"\x0c\x00\x00\x00\x01\x01\x01", 1),
    "bad utf-8 header key": (b"\x12\x00\x00\x00\x01\x01\x02\x04\xff\xfe\x01", 1),
    "header past record": (b"\x0c\x00\x00\x00\x01\x01\x02", 1),
    "negative count": (_one_record(), -1),
    "trailing garbage": (_one_record() + b"\x00", 1),
}


@pytest.mark.parametrize("name", sorted(BAD_SECTIONS))
def test_structurally_bad_batches(impl: str, name: str) -> None:
    section, count = BAD_SECTIONS[name]
    blob = _tamper(section, count)
    with pytest.raises(CorruptRecordError) as ei:
        R.decode_records(blob, topic="t", partition=7)
    assert (ei.value.topic, ei.value.partition, ei.value.offset) == ("t", 7, 500)


def test_tamper_helper_builds_valid_batches(impl: str) -> None:
    blob = _tamper(_one_record(b"kk", b"vv") * 2, 2)
    assert [r.value for r in R.decode_records(blob).batches[0].records] == [b"vv", b"vv"]


def test_bad_compressed_payload_is_corrupt(impl: str) -> None:
    data = bytearray(R.build_batch([(b"k", b"v" * 1000)], compression=Compression.LZ4, base_offset=8))
    data[70:80] = b"\x00" * 10
    with pytest.raises(CorruptRecordError, match="decompress") as ei:
        R.decode_records(_recrc(data), topic="z", partition=0)
    assert ei.value.offset == 8
    unknown = bytearray(R.build_batch([(b"k", b"v")]))
    struct.pack_into(">h", unknown, 21, 6)
    with pytest.raises(CorruptRecordError):
        R.decode_records(_recrc(unknown))


def test_short_batch_length_is_corrupt() -> None:
    data = bytearray(R.build_batch([(b"k", b"v")], base_offset=4))
    struct.pack_into(">i", data, 8, 20)
    with pytest.raises(CorruptRecordError, match="below the minimum") as ei:
        R.decode_records(bytes(data), topic="t", partition=0)
    assert ei.value.offset == 4


# -- codecs ---------------------------------------------------------------------------------------
def test_snappy_xerial_and_raw_decode() -> None:
    payload = bytes(range(256)) * 600  # > 2 xerial blocks of 32 KiB
    blocks = [payload[i:i + 32768] for i in range(0, len(payload), 32768)]
    xerial = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"".join(
        struct.pack(">i", len(c)) + c for c in (bytes(cramjam.snappy.compress_raw(b)) for b in blocks))
    assert R.decompress(Compression.SNAPPY, xerial) == payload
    assert R.decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(payload))) == payload
    with pytest.raises(ValueError):
        R.decompress(Compression.SNAPPY, xerial[:-5])


def test_lz4_frames_use_independent_blocks() -> None:
    payload = os.urandom(50_000) * 4  # several 64 KiB blocks
    frame = R.compress(Compression.LZ4, payload)
    assert frame[:4] == b"\x04\x22\x4d\x18"
    assert frame[4] & 0x20, "block-independence flag must be set for Kafka's Java reader"
    assert R.decompress(Compression.LZ4, frame) == payload


def test_gzip_multi_member() -> None:
    import gzip

    assert R.decompress(Compression.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"


# -- kafka-python interop -------------------------------------------------------------------------
@pytest.fixture
def kp_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give kafka-python snappy/lz4/zstd backends (it only ships gzip here), backed by cramjam.

    kafka-python's own code still does the record encoding and the xerial snappy framing.
    """
    import kafka.codec as kc
    import kafka.record.default_records as dr

    snappy = types.SimpleNamespace(compress=lambda b: bytes(cramjam.snappy.compress_raw(bytes(b))),
                                   decompress=lambda b: bytes(cramjam.snappy.decompress_raw(bytes(b))))
    monkeypatch.setattr(kc, "snappy", snappy)
    monkeypatch.setattr(kc, "lz4", types.SimpleNamespace())
    monkeypatch.setattr(kc, "zstd", types.SimpleNamespace())
    monkeypatch.setattr(dr, "lz4_encode", lambda b: bytes(cramjam.lz4.compress(bytes(b))))
    monkeypatch.setattr(dr, "lz4_decode", lambda b: bytes(cramjam.lz4.decompress(bytes(b))))
    monkeypatch.setattr(dr, "zstd_encode", lambda b: bytes(cramjam.zstd.compress(bytes(b))))
    monkeypatch.setattr(dr, "zstd_decode", lambda b: bytes(cramjam.zstd.decompress(bytes(b))))


def _kp_build(rows: list[tuple[Any, ...]], codec: int, *, transactional: bool = False,
              producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=transactional,
                                        producer_id=producer[0], producer_epoch=producer[1],
                                        base_sequence=producer[2], batch_size=1 << 24)
    for i, (k, v, h, ts) in enumerate(rows):
        assert builder.append(i, timestamp=ts, key=k, value=v, headers=h) is not None
    return bytes(builder.build())


def _kp_read(blob: bytes) -> list[tuple[Any, list[Any]]]:
    from kafka.record.memory_records import MemoryRecords

    out = []
    mr = MemoryRecords(blob)
    while (batch := mr.next_batch()) is not None:
        assert batch.validate_crc()
        out.append((batch, list(batch)))
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_decode_with_ours(impl: str, kp_codecs: None, codec: int) -> None:
    rows = SAMPLE * 10  # compressible, so kafka-python keeps the compression
    data = _kp_build(rows, codec, transactional=True, producer=(77, 2, 1000))
    assert data[22] & 0x07 == codec  # kafka-python really compressed it
    b = R.decode_records(data, topic="kp", partition=0).batches[0]
    assert b.compression == codec and b.is_transactional
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (77, 2, 1000)
    assert b.last_offset == len(rows) - 1 and b.max_timestamp == max(r[3] for r in rows)
    assert b.records == _expected(0, rows)


def test_kafka_python_xerial_snappy_decodes_with_ours(impl: str, kp_codecs: None) -> None:
    rows = [(b"k%d" % i, bytes(range(256)) * 2, [], 1000 + i) for i in range(300)]  # ~150 KiB: 5 blocks
    data = _kp_build(rows, Compression.SNAPPY)
    assert data[61:69] == b"\x82SNAPPY\x00"
    assert R.decode_records(data).batches[0].records == _expected(0, rows)


@pytest.mark.parametrize("codec", CODECS)
def test_our_batches_decode_with_kafka_python(kp_codecs: None, codec: int) -> None:
    rows = SAMPLE * 10
    blob = (R.build_batch(rows, base_offset=300, compression=codec, producer_id=5, producer_epoch=1,
                          base_sequence=3, transactional=True)
            + R.build_batch(rows[:3], base_offset=360, compression=codec,
                            log_append_time=True, max_timestamp=1_800_000_000_000))
    (b1, recs1), (b2, recs2) = _kp_read(blob)
    assert b1.compression_type == codec and b1.is_transactional
    assert (b1.producer_id, b1.producer_epoch, b1.base_sequence) == (5, 1, 3)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in recs1] == [
        (300 + i, ts, k, v, list(h)) for i, (k, v, h, ts) in enumerate(rows)]
    assert b2.timestamp_type == 1
    assert [(r.offset, r.timestamp) for r in recs2] == [(360 + i, 1_800_000_000_000) for i in range(3)]


def test_our_control_batch_reads_as_control_in_kafka_python() -> None:
    blob = (R.build_control_batch(ControlType.ABORT, base_offset=10, producer_id=1, producer_epoch=0)
            + R.build_control_batch(ControlType.COMMIT, base_offset=11, producer_id=2, producer_epoch=0))
    (b1, r1), (b2, r2) = _kp_read(blob)
    assert b1.is_control_batch and b2.is_control_batch
    assert r1[0].abort and r2[0].commit and r1[0].offset == 10


# -- properties -----------------------------------------------------------------------------------
_headers = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16)), max_size=3)
_rows = st.lists(
    st.tuples(st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=300), _headers,
              st.integers(min_value=0, max_value=2**41)),
    max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_rows, codec=st.sampled_from(CODECS), base_offset=st.integers(0, 2**62),
       ple=st.integers(-1, 2**31 - 1))
def test_property_round_trip(impl: str, rows: list[tuple[Any, ...]], codec: int, base_offset: int,
                             ple: int) -> None:
    data = R.build_batch(rows, base_offset=base_offset, compression=codec, partition_leader_epoch=ple,
                         base_timestamp=rows[0][3] if rows else 0)
    rs = R.decode_records(data + data[: len(data) // 2])  # and a truncated copy after it
    assert len(rs.batches) == 1 and rs.partial_bytes == len(data) // 2
    b = rs.batches[0]
    assert b.records == _expected(base_offset, rows)
    assert b.partition_leader_epoch == ple and b.records_count == len(rows)


@settings(max_examples=200, deadline=None)
@given(section=st.binary(max_size=80), count=st.integers(-2, 12))
def test_property_garbage_never_crashes_and_paths_agree(section: bytes, count: int) -> None:
    """Arbitrary records sections: both decoders either agree or both report corruption."""
    _select("c")
    blob = _tamper(section, count)
    outcomes = []
    try:
        for use_c in (True, False):
            R.use_c_extension(use_c)
            try:
                outcomes.append(R.decode_records(blob).batches[0].records)
            except CorruptRecordError:
                outcomes.append("corrupt")
    finally:
        R.use_c_extension(R.C_EXTENSION_AVAILABLE)
    assert outcomes[0] == outcomes[1]
