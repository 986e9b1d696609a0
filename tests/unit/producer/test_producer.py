"""The producer's pure parts: murmur2 partitioning, sticky partitions, batch encoding, and the accumulator
(batching, sequences, answers, retries, producer-id resets, splits, expiry) without sockets."""

from __future__ import annotations

import random

import pytest

from service.producer.accumulator import (
    Accumulator,
    Delivery,
    ProducerConfig,
    increment_sequence,
    parse_compression,
    record_size,
)
from service.producer.encoding import encode_batch
from service.producer.errors import ProduceFailure, RecordMetadata
from service.producer.partitioner import StickyPartitioner, murmur2, partition_for_key, to_positive
from service.protocol.records import Compression, build_batch, decode_records

# Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


# -- partitioner ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,expected", list(JAVA_MURMUR2.items()))
def test_murmur2_matches_java(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_murmur2_lengths_and_partition() -> None:
    # every tail length (0-3 bytes after the 4-byte words) and the empty key stay 32-bit signed
    for n in range(0, 40):
        h = murmur2(bytes(range(n)))
        assert -(2**31) <= h < 2**31
    assert murmur2(b"") == murmur2(bytearray())  # bytes-like accepted
    for key in JAVA_MURMUR2:
        assert partition_for_key(key, 7) == to_positive(JAVA_MURMUR2[key]) % 7
    assert partition_for_key(b"foobar", 1) == 0


def test_sticky_partitioner_sticks_then_moves_on() -> None:
    sp = StickyPartitioner(sticky_bytes=100, rng=random.Random(1))
    first = sp.partition("t", 40, 4)
    assert sp.partition("t", 40, 4) == first
    assert sp.partition("t", 40, 4) == first  # 80 < 100 before this one
    nxt = sp.partition("t", 40, 4)
    assert nxt != first  # switched after 120 bytes, never to the same partition
    # only available partitions are chosen
    sp2 = StickyPartitioner(sticky_bytes=1, rng=random.Random(2))
    assert {sp2.partition("t", 10, 6, available={3, 5}) for _ in range(50)} == {3, 5}
    # a sticky partition that became unavailable is left at once
    sp3 = StickyPartitioner(sticky_bytes=10**9, rng=random.Random(3))
    p = sp3.partition("t", 10, 3, available={0})
    assert p == 0 and sp3.partition("t", 10, 3, available={1, 2}) in (1, 2)


# -- encoding -------------------------------------------------------------------------------------------------
def _recs(n: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]:
    out = []
    for i in range(n):
        key = None if i % 4 == 0 else b"key-%d" % i
        value = None if i % 7 == 3 else bytes(range(256)) * (i % 50 + 1)  # up to 12.8 KB: 2-byte varints
        headers = [(f"h{j}", None if j == 1 else b"v" * j) for j in range(i % 3)]
        out.append((key, value, headers, 1_700_000_000_000 + i * 1000))
    return out


@pytest.mark.parametrize("codec", list(Compression))
def test_encode_batch_is_build_batch_and_decodes(codec: Compression) -> None:
    recs = _recs(40)
    ours = encode_batch(recs, producer_id=7, producer_epoch=2, base_sequence=11, compression=codec)
    if codec == Compression.NONE:
        assert ours == build_batch(recs, producer_id=7, producer_epoch=2, base_sequence=11)
    rs = decode_records(ours)
    (batch,) = rs.batches
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 2, 11)
    assert batch.compression == codec
    got = list(rs.records())
    assert [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in got] == [
        (i, k, v, h, ts) for i, (k, v, h, ts) in enumerate(recs)]


def test_encode_batch_large_deltas_and_timestamps_before_the_first() -> None:
    recs = [(b"k", b"v", (), 5_000), (None, b"x" * 20_000, (), 1_000), (b"z", None, (), 10**12)]
    assert encode_batch(recs) == build_batch(recs)


def test_parse_compression() -> None:
    assert parse_compression("LZ4") == Compression.LZ4
    assert parse_compression("none") == 0
    assert parse_compression(4) == Compression.ZSTD
    with pytest.raises(ValueError):
        parse_compression("brotli")


# -- accumulator ----------------------------------------------------------------------------------------------
T0 = 1000.0


def cfg(**kw: object) -> ProducerConfig:
    base: dict[str, object] = {"delivery_timeout_ms": 10_000, "retry_backoff_ms": 100, "retry_backoff_max_ms": 1000}
    base.update(kw)
    return ProducerConfig(**base)  # type: ignore[arg-type]


def acc_with_id(**kw: object) -> Accumulator:
    acc = Accumulator(cfg(**kw))
    assert acc.ready(T0) == ([], None)  # nothing moves before the producer id
    acc.set_producer_id(42, 0)
    return acc


def put(acc: Accumulator, tp: tuple[str, int], n: int, now: float = T0, size: int = 10, tag: bytes = b"v"
        ) -> Delivery:
    d = Delivery(n)
    for i in range(n):
        acc.append(tp, None, tag + b"%d" % i + b"x" * size, (), 1, d, i, now)
    return d


TP0 = ("t", 0)
TP1 = ("t", 1)


def test_batches_take_what_queued_and_one_in_flight_per_partition() -> None:
    acc = acc_with_id()
    d = put(acc, TP0, 3)
    ready, _ = acc.ready(T0)
    assert ready == [TP0]
    b = acc.next_batch(TP0, T0)
    assert b is not None and b.count == 3 and b.base_sequence == 0 and b.producer_id == 42
    # records arriving while the batch is in flight wait for it, then go together
    d2 = put(acc, TP0, 5)
    assert acc.ready(T0)[0] == []
    assert acc.next_batch(TP0, T0) is None
    acc.on_response(b, 0, 100, T0)
    assert d.done and d.results == [RecordMetadata(0, 100), RecordMetadata(0, 101), RecordMetadata(0, 102)]
    b2 = acc.next_batch(TP0, T0)
    assert b2 is not None and b2.count == 5 and b2.base_sequence == 3
    acc.on_response(b2, 0, 103, T0)
    assert [r.offset for r in d2.results] == [103, 104, 105, 106, 107]  # type: ignore[union-attr]
    assert acc.empty


def test_batch_size_cap_and_request_cap() -> None:
    one = record_size(None, b"v0" + b"x" * 10, ())
    acc = acc_with_id(max_batch_bytes=one * 3)
    put(acc, TP0, 7)
    b = acc.next_batch(TP0, T0)
    assert b is not None and b.count == 3
    acc.on_response(b, 0, 0, T0)
    b = acc.next_batch(TP0, T0, max_bytes=one * 2)
    assert b is not None and b.count == 2 and b.base_sequence == 3
    acc.on_response(b, 0, 3, T0)
    b = acc.next_batch(TP0, T0, max_bytes=1)  # at least one record, whatever the cap
    assert b is not None and b.count == 1 and b.base_sequence == 5


def test_payload_is_the_encoded_batch() -> None:
    acc = acc_with_id(compression=Compression.ZSTD)
    put(acc, TP0, 4)
    b = acc.next_batch(TP0, T0)
    assert b is not None and b.payload is not None
    (batch,) = decode_records(b.payload).batches
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 0, 0)
    assert batch.compression == Compression.ZSTD
    assert [r.value for r in batch.decode()] == [b"v%d" % i + b"x" * 10 for i in range(4)]


def test_retriable_error_resends_the_same_bytes_after_backoff() -> None:
    acc = acc_with_id()
    d = put(acc, TP0, 2)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    payload = b.payload
    out = acc.on_response(b, 6, -1, T0)  # NOT_LEADER_OR_FOLLOWER
    assert out.refresh_metadata and not out.reset_producer_id and not d.done
    put(acc, TP0, 1, tag=b"later")  # queues behind the retry
    assert acc.ready(T0) == ([], T0 + 0.1)
    assert acc.ready(T0 + 0.1)[0] == [TP0]
    b2 = acc.next_batch(TP0, T0 + 0.1)
    assert b2 is b and b2.payload is payload and b2.base_sequence == 0 and b2.count == 2
    out = acc.on_response(b2, 7, -1, T0 + 0.1)  # REQUEST_TIMED_OUT: retriable, no metadata refresh
    assert not out.refresh_metadata
    assert acc.ready(T0 + 0.2)[1] == pytest.approx(T0 + 0.3)  # backoff doubles
    b3 = acc.next_batch(TP0, T0 + 0.3)
    assert b3 is b
    acc.on_response(b3, 0, 50, T0 + 0.3)
    assert d.results == [RecordMetadata(0, 50), RecordMetadata(0, 51)]
    b4 = acc.next_batch(TP0, T0 + 0.3)
    assert b4 is not None and b4.base_sequence == 2 and b4.runs[0].records[0][1].startswith(b"later")  # type: ignore[union-attr]


def test_duplicate_sequence_is_success_with_unknown_offset() -> None:
    acc = acc_with_id()
    d = put(acc, TP0, 2)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    acc.on_request_error(b, T0, "connection lost")  # maybe written
    b = acc.next_batch(TP0, T0 + 1)
    assert b is not None and b.ambiguous
    acc.on_response(b, 46, -1, T0 + 1)
    assert d.results == [RecordMetadata(0, -1), RecordMetadata(0, -1)]
    assert not acc.needs_producer_id


def test_non_retriable_error_fails_the_batch_and_gives_its_sequences_back() -> None:
    acc = acc_with_id()
    d = put(acc, TP0, 3)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    out = acc.on_response(b, 87, -1, T0, "bad record")  # INVALID_RECORD
    assert out == (False, False)
    for r in d.results:
        assert isinstance(r, ProduceFailure) and r.code == 87 and not r.retriable and "bad record" in r.message
    d2 = put(acc, TP0, 1)
    b2 = acc.next_batch(TP0, T0)
    assert b2 is not None and b2.base_sequence == 0  # the failed batch was not written: no gap
    acc.on_response(b2, 0, 0, T0)
    assert d2.results == [RecordMetadata(0, 0)]


def test_failure_after_an_ambiguous_attempt_resets_the_producer_id() -> None:
    acc = acc_with_id()
    d = put(acc, TP0, 2)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    acc.on_request_error(b, T0, "timed out")
    b = acc.next_batch(TP0, T0 + 1)
    assert b is not None
    out = acc.on_response(b, 87, -1, T0 + 1)
    assert out.reset_producer_id and acc.needs_producer_id
    assert all(isinstance(r, ProduceFailure) for r in d.results)
    put(acc, TP0, 1)
    assert acc.ready(T0 + 2) == ([], None)  # nothing goes out before the new id
    acc.set_producer_id(43, 0)
    b = acc.next_batch(TP0, T0 + 2)
    assert b is not None and (b.producer_id, b.base_sequence) == (43, 0)


@pytest.mark.parametrize("code", [45, 59, 47, 90])
def test_producer_state_errors_resend_under_a_new_producer_id(code: int) -> None:
    acc = acc_with_id()
    d_other = put(acc, TP1, 1)
    b_other = acc.next_batch(TP1, T0)
    d = put(acc, TP0, 2)
    b = acc.next_batch(TP0, T0)
    assert b is not None and b_other is not None
    out = acc.on_response(b, code, -1, T0)
    assert out.reset_producer_id and acc.needs_producer_id and not d.done
    # the other partition's batch still in flight finishes under the old id; the reset waits for it
    assert acc.in_flight == 1
    acc.on_response(b_other, 0, 9, T0)
    assert d_other.results == [RecordMetadata(1, 9)]
    assert acc.ready(T0) == ([], None)
    acc.set_producer_id(77, 0)
    assert acc.producer_id_resets == 1
    b2 = acc.next_batch(TP0, T0)
    assert b2 is b and (b2.producer_id, b2.base_sequence) == (77, 0)
    (batch,) = decode_records(b2.payload).batches  # type: ignore[arg-type]
    assert batch.producer_id == 77
    acc.on_response(b2, 0, 5, T0)
    assert d.results == [RecordMetadata(0, 5), RecordMetadata(0, 6)]
    b3 = acc.next_batch(TP1, T0)
    assert b3 is None  # nothing queued there
    put(acc, TP1, 1)
    b3 = acc.next_batch(TP1, T0)
    assert b3 is not None and (b3.producer_id, b3.base_sequence) == (77, 0)


def test_producer_state_errors_give_up_after_max_resets() -> None:
    acc = acc_with_id(max_producer_id_resets=2)
    d = put(acc, TP0, 1)
    for i in range(2):
        b = acc.next_batch(TP0, T0)
        assert b is not None
        acc.on_response(b, 59, -1, T0)
        acc.set_producer_id(50 + i, 0)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    acc.on_response(b, 59, -1, T0)
    (r,) = d.results
    assert isinstance(r, ProduceFailure) and r.code == 59 and not r.retriable


def test_reset_fails_waiting_retries_that_may_have_been_written() -> None:
    acc = acc_with_id()
    d_amb = put(acc, TP1, 2)
    b_amb = acc.next_batch(TP1, T0)
    d_safe = put(acc, ("u", 0), 1)
    b_safe = acc.next_batch(("u", 0), T0)
    d = put(acc, TP0, 1)
    b = acc.next_batch(TP0, T0)
    assert b_amb is not None and b_safe is not None and b is not None
    acc.on_request_error(b_amb, T0, "connection lost")  # waits for a retry, maybe written
    acc.on_response(b_safe, 6, -1, T0)  # waits for a retry, definitely not written
    acc.on_response(b, 59, -1, T0)  # triggers the reset
    acc.set_producer_id(9, 1)
    for r in d_amb.results:
        assert isinstance(r, ProduceFailure) and r.retriable and "may have been written" in r.message
    assert not d_safe.done and not d.done
    ready, _ = acc.ready(T0 + 1)
    assert sorted(ready) == [TP0, ("u", 0)]
    for tp in ready:
        nb = acc.next_batch(tp, T0 + 1)
        assert nb is not None and (nb.producer_id, nb.producer_epoch, nb.base_sequence) == (9, 1, 0)
        acc.on_response(nb, 0, 0, T0 + 1)
    assert d_safe.done and d.done and acc.empty


def test_message_too_large_splits_in_halves_in_order() -> None:
    acc = acc_with_id()
    d = put(acc, TP0, 8)
    put(acc, TP0, 2, tag=b"after")
    b = acc.next_batch(TP0, T0)
    assert b is not None and b.count == 10
    acc.on_response(b, 10, -1, T0)  # MESSAGE_TOO_LARGE
    sizes = []
    offset = 0
    while not acc.empty:
        nb = acc.next_batch(TP0, T0)
        assert nb is not None
        assert nb.base_sequence == offset  # the failed batch's sequences were given back
        sizes.append(nb.count)
        acc.on_response(nb, 0, offset, T0)
        offset += nb.count
    assert sizes == [5, 5]
    assert [r.offset for r in d.results] == list(range(8))  # type: ignore[union-attr]
    # a single record that is too large fails
    d1 = put(acc, TP0, 1)
    nb = acc.next_batch(TP0, T0)
    assert nb is not None
    acc.on_response(nb, 10, -1, T0)
    assert isinstance(d1.results[0], ProduceFailure) and d1.results[0].code == 10


def test_queued_records_expire_with_a_retriable_timeout() -> None:
    acc = acc_with_id(delivery_timeout_ms=1000)
    d_old = put(acc, TP0, 2, now=T0)
    d_new = put(acc, TP0, 1, now=T0 + 0.5)
    assert acc.expire(T0 + 0.9) == (False, T0 + 1.0)
    reset, nxt = acc.expire(T0 + 1.0)
    assert not reset and nxt == T0 + 1.5
    for r in d_old.results:
        assert (isinstance(r, ProduceFailure) and r.code == 7 and r.retriable
                and "Expiring 2 record(s) for t-0" in r.message)
    assert not d_new.done and acc.queued_records == 1
    b = acc.next_batch(TP0, T0 + 1.0)
    assert b is not None and b.count == 1 and b.base_sequence == 0


def test_retries_expire_and_keep_the_last_error() -> None:
    acc = acc_with_id(delivery_timeout_ms=1000)
    d = put(acc, TP0, 1)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    acc.on_response(b, 6, -1, T0)  # waits for a retry
    reset, _ = acc.expire(T0 + 1.0)
    assert not reset
    (r,) = d.results
    assert isinstance(r, ProduceFailure) and r.retriable and "NOT_LEADER_OR_FOLLOWER" in r.message
    d2 = put(acc, TP0, 1)
    b2 = acc.next_batch(TP0, T0 + 1)
    assert b2 is not None and b2.base_sequence == 0  # not written: sequence given back
    acc.on_response(b2, 0, 0, T0 + 1)
    assert d2.done
    # an answer after the delivery timeout fails at once instead of retrying
    d3 = put(acc, TP0, 1, now=T0 + 1)
    b3 = acc.next_batch(TP0, T0 + 1)
    assert b3 is not None
    acc.on_request_error(b3, T0 + 2.5, "timed out")
    (r,) = d3.results
    assert isinstance(r, ProduceFailure) and r.retriable and "may have been written" in r.message
    assert acc.needs_producer_id  # its outcome is unknown: the sequences are unknown too


def test_expired_ambiguous_retry_requests_a_reset() -> None:
    acc = acc_with_id(delivery_timeout_ms=1000)
    put(acc, TP0, 1)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    acc.on_request_error(b, T0, "lost")
    reset, _ = acc.expire(T0 + 1.0)
    assert reset and acc.needs_producer_id


def test_request_never_sent_is_not_ambiguous() -> None:
    acc = acc_with_id(delivery_timeout_ms=1000)
    d = put(acc, TP0, 1)
    b = acc.next_batch(TP0, T0)
    assert b is not None
    acc.on_request_error(b, T0, "no connection", ambiguous=False)
    assert not b.ambiguous
    acc.expire(T0 + 1.0)
    assert d.done and not acc.needs_producer_id


def test_linger_waits_for_more_records_unless_the_batch_is_full() -> None:
    acc = acc_with_id(linger_ms=50)
    put(acc, TP0, 1)
    assert acc.ready(T0) == ([], T0 + 0.05)
    assert acc.ready(T0 + 0.05)[0] == [TP0]
    acc2 = acc_with_id(linger_ms=50, max_batch_bytes=record_size(None, b"v0" + b"x" * 10, ()))
    put(acc2, TP0, 1)
    assert acc2.ready(T0)[0] == [TP0]


def test_fail_all_and_late_answers() -> None:
    acc = acc_with_id()
    d_flight = put(acc, TP0, 1)
    b = acc.next_batch(TP0, T0)
    d_queued = put(acc, TP0, 2)
    assert b is not None
    n = acc.fail_all(ProduceFailure(13, "closing", True), in_flight=True)
    assert n == 3 and d_flight.done and d_queued.done and acc.empty
    assert acc.on_response(b, 0, 0, T0) == (False, False)  # an answer after shutdown is ignored
    assert isinstance(d_flight.results[0], ProduceFailure)


def test_non_idempotent_has_no_producer_id_nor_sequences() -> None:
    acc = Accumulator(cfg(idempotent=False))
    d = put(acc, TP0, 2)
    assert acc.ready(T0)[0] == [TP0]
    b = acc.next_batch(TP0, T0)
    assert b is not None and (b.producer_id, b.base_sequence) == (-1, -1)
    (batch,) = decode_records(b.payload).batches  # type: ignore[arg-type]
    assert (batch.producer_id, batch.base_sequence) == (-1, -1)
    out = acc.on_response(b, 59, -1, T0)  # no reset without idempotence: a plain non-retriable failure
    assert not out.reset_producer_id and isinstance(d.results[0], ProduceFailure)


def test_sequences_wrap_like_kafka() -> None:
    assert increment_sequence(2**31 - 1, 1) == 0
    assert increment_sequence(2**31 - 2, 5) == 3
    assert increment_sequence(5, 3) == 8


def test_delivery_resolves_once_and_calls_back() -> None:
    calls = []
    d = Delivery(2, lambda: calls.append(1))
    d.resolve(0, RecordMetadata(0, 1))
    d.resolve(0, RecordMetadata(0, 2))  # ignored
    assert calls == [] and not d.done
    d.resolve(1, RecordMetadata(0, 3))
    assert calls == [1] and d.results == [RecordMetadata(0, 1), RecordMetadata(0, 3)]


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ProducerConfig(max_batch_bytes=0)
    with pytest.raises(ValueError):
        ProducerConfig(max_in_flight_per_broker=0)
    with pytest.raises(ValueError):
        ProducerConfig(compression=9)

