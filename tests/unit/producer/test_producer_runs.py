"""The producer's run-based hot path: the C record encoder against its Python twin, the sticky
partitioner's runs against record-by-record choices, and the accumulator cutting runs into batches and
answering every record of a run exactly once."""

from __future__ import annotations

import json
import os
import random

import pytest

from service.producer import encoding
from service.producer.accumulator import Accumulator, Delivery, ProducerConfig, Run, record_size
from service.producer.errors import ProduceFailure, RecordMetadata
from service.producer.partitioner import StickyPartitioner
from service.protocol.records import decode_records

REQUIRE_CEXT = os.environ.get("KCG_REQUIRE_CEXT") == "1"


@pytest.fixture(params=["c", "python"])
def encoder(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    if request.param == "c":
        if encoding._cproduce is None:
            if REQUIRE_CEXT:
                pytest.fail(f"service.producer._cproduce not importable (KCG_REQUIRE_CEXT=1):"
                            f" {encoding.C_IMPORT_ERROR}")
            pytest.skip("C encoder not built")
        yield encoding._cproduce.encode_runs
    else:
        yield encoding._encode_runs_py


def _random_runs(rng: random.Random) -> list[tuple[list[tuple[object, ...]], int]]:
    runs = []
    for _ in range(rng.randrange(1, 5)):
        recs: list[tuple[object, ...]] = []
        for _ in range(rng.randrange(1, 30)):
            kind = rng.randrange(4)
            key: object = None if kind == 0 else bytes(rng.randrange(256) for _ in range(rng.randrange(0, 20)))
            if kind == 2:
                key = bytearray(key)  # type: ignore[arg-type]
            value: object = None if rng.random() < 0.1 else b"v" * rng.choice([0, 1, 63, 64, 127, 128, 8191, 20_000])
            if kind == 3 and value is not None:
                value = memoryview(value)  # type: ignore[arg-type]
            nh = rng.choice([0, 0, 1, 3])
            headers: object = [(f"h{j}é", None if j == 1 else b"x" * j) for j in range(nh)]
            if nh == 0:
                headers = rng.choice([(), [], None])
            elif rng.random() < 0.5:
                headers = tuple(headers)  # type: ignore[arg-type]
            ts = rng.choice([None, None, 1_700_000_000_000 + rng.randrange(-10**6, 10**6), 0, 2**40])
            recs.append((key, value, headers, None, ts))
        runs.append((recs, 1_700_000_000_000 + rng.randrange(-1000, 1000)))
    return runs


def test_c_encoder_matches_python_and_decodes() -> None:
    if encoding._cproduce is None:
        if REQUIRE_CEXT:
            pytest.fail(f"service.producer._cproduce not importable (KCG_REQUIRE_CEXT=1): {encoding.C_IMPORT_ERROR}")
        pytest.skip("C encoder not built")
    rng = random.Random(24)
    for _ in range(300):
        runs = _random_runs(rng)
        c = encoding._cproduce.encode_runs(runs)
        py = encoding._encode_runs_py(runs)
        assert c == py


def test_run_batch_decodes_to_the_records(encoder) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    runs = _random_runs(rng)
    saved = encoding.encode_runs
    encoding.encode_runs = encoder
    try:
        batch = encoding.encode_run_batch(runs, producer_id=9, producer_epoch=1, base_sequence=5)
    finally:
        encoding.encode_runs = saved
    rs = decode_records(batch)
    (b,) = rs.batches
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (9, 1, 5)
    want = []
    for recs, default_ts in runs:
        for k, v, h, _, ts in recs:
            want.append((None if k is None else bytes(k), None if v is None else bytes(v),  # type: ignore[arg-type]
                         [(hk, hv) for hk, hv in (h or ())], default_ts if ts is None else ts))  # type: ignore[union-attr]
    got = [(r.key, r.value, list(r.headers), r.timestamp) for r in rs.records()]
    assert got == want
    assert [r.offset for r in rs.records()] == list(range(len(want)))


def test_c_encoder_rejects_bad_fields_with_type_errors() -> None:
    if encoding._cproduce is None:
        pytest.skip("C encoder not built")
    enc = encoding._cproduce.encode_runs
    with pytest.raises(TypeError):
        enc([([(None, "text", (), None, None)], 0)])
    with pytest.raises(TypeError):
        enc([([(None, b"v", [("k", b"v", b"extra")], None, None)], 0)])
    with pytest.raises(TypeError):
        enc([([(None, b"v", [(b"bytes-key", b"v")], None, None)], 0)])
    with pytest.raises(TypeError):
        enc([([(None, b"v", ())], 0)])  # too short
    with pytest.raises(TypeError):
        enc([([(None, b"v", (), None, "soon")], 0)])
    assert enc([]) == (b"", 0, 0, 0)


# -- sticky runs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_sticky_runs_are_what_partition_chooses_record_by_record(seed: int) -> None:
    rng = random.Random(seed)
    sticky = rng.choice([1, 100, 1000, 16384, 65536])  # 65536 with small records: mostly one run per call
    a = StickyPartitioner(sticky, rng=random.Random(seed))
    b = StickyPartitioner(sticky, rng=random.Random(seed))
    for _ in range(10):
        num = rng.choice([1, 3, 8])
        available = rng.choice([set(), {0}, set(range(num)), {p for p in range(num) if p % 2 == 0}])
        choices = rng.choice([[1, 24, 124, 5000, 30_000], [124], [24, 124, 300]])
        sizes = [rng.choice(choices) for _ in range(rng.randrange(1, 200))]
        one_by_one = [a.partition("t", s, num, available) for s in sizes]
        runs = b.runs("t", sizes, num, available)
        flat = [p for p, start, end, _ in runs for _ in range(start, end)]
        assert flat == one_by_one
        assert [r[1] for r in runs] == [0] + [r[2] for r in runs[:-1]] and runs[-1][2] == len(sizes)
        assert [r[3] for r in runs] == [sum(sizes[s:e]) for _, s, e, _ in runs]
        assert a._current == b._current


# -- accumulator with runs ----------------------------------------------------------------------------------------
T0 = 1000.0
TP = ("t", 0)


def _run(n: int, value_size: int, delivery: Delivery, start: int = 0, now: float = T0) -> Run:
    recs = [(None, b"%05d" % i + b"x" * (value_size - 5), (), None, None) for i in range(start, start + n)]
    return Run(recs, range(start, start + n), 1, delivery, sum(record_size(None, r[1], ()) for r in recs), now)


def _acc(**kw: object) -> Accumulator:
    acc = Accumulator(ProducerConfig(**kw))  # type: ignore[arg-type]
    acc.set_producer_id(5, 0)
    return acc


def test_a_run_larger_than_a_batch_goes_out_in_order_with_every_offset() -> None:
    acc = _acc(max_batch_bytes=1000)
    d = Delivery(100)
    acc.extend(TP, _run(100, 100, d))  # 12.4 KB: 13 batches of 8 records (124 bytes each)
    offset = 0
    seq = 0
    seen = 0
    while True:
        b = acc.next_batch(TP, T0)
        if b is None:
            break
        assert b.size <= 1000 and b.base_sequence == seq and b.count == sum(len(r.records) for r in b.runs)
        recs = list(decode_records(b.payload).records())  # type: ignore[arg-type]
        assert [r.value[:5] for r in recs] == [b"%05d" % i for i in range(seen, seen + b.count)]  # type: ignore[index]
        acc.on_response(b, 0, 500 + offset, T0)
        offset += b.count
        seq += b.count
        seen += b.count
    assert seen == 100 and d.done and acc.empty
    assert d.results == [RecordMetadata(0, 500 + i) for i in range(100)]


def test_runs_share_a_batch_and_split_caps_cut_runs() -> None:
    acc = _acc()
    d1, d2 = Delivery(3), Delivery(5)
    acc.extend(TP, _run(3, 50, d1))
    acc.extend(TP, _run(5, 50, d2))
    b = acc.next_batch(TP, T0)
    assert b is not None and b.count == 8 and len(b.runs) == 2
    acc.on_response(b, 10, -1, T0)  # MESSAGE_TOO_LARGE: halves
    sizes = []
    while (b := acc.next_batch(TP, T0)) is not None:
        sizes.append(b.count)
        acc.on_response(b, 0, 100 + sum(sizes[:-1]), T0)
    assert sizes == [4, 4]
    assert d1.results == [RecordMetadata(0, 100 + i) for i in range(3)]
    assert d2.results == [RecordMetadata(0, 103 + i) for i in range(5)]


def test_scattered_indices_duplicates_and_failures_resolve_each_record_once() -> None:
    acc = _acc()
    d = Delivery(6)
    recs = [(b"k", b"v%d" % i, (), 0, None) for i in range(3)]
    acc.extend(TP, Run(recs, [0, 2, 4], 1, d, 3 * record_size(b"k", b"v0", ()), T0))
    acc.extend(("t", 1), Run(recs, [1, 3, 5], 1, d, 3 * record_size(b"k", b"v0", ()), T0))
    b0 = acc.next_batch(TP, T0)
    b1 = acc.next_batch(("t", 1), T0)
    assert b0 is not None and b1 is not None
    acc.on_response(b0, 46, -1, T0)  # DUPLICATE_SEQUENCE_NUMBER: written, offset unknown
    assert not d.done
    acc.on_response(b1, 87, -1, T0, "bad")  # INVALID_RECORD: these fail
    assert d.done
    assert [type(r) for r in d.results] == [RecordMetadata, ProduceFailure] * 3
    assert d.results[0] == RecordMetadata(0, -1)


def test_expiry_and_fail_all_count_records_of_runs() -> None:
    acc = _acc(delivery_timeout_ms=1000)
    d = Delivery(10)
    acc.extend(TP, _run(4, 20, d, 0, T0))
    acc.extend(TP, _run(6, 20, d, 4, T0 + 0.5))
    acc.expire(T0 + 1.2)
    assert acc.queued_records == 6 and sum(isinstance(r, ProduceFailure) for r in d.results) == 4
    assert acc.fail_all(ProduceFailure(13, "closed", True)) == 6
    assert d.done and acc.queued_records == 0 and acc.queued_bytes == 0


# -- the HTTP produce route's C helpers (parse_binary, render_offsets) against the Python path ----------------
def _both(fn, *args):  # type: ignore[no-untyped-def]
    """fn(*args) with the C helpers and without: (result or exception text) each."""
    from api.v2 import produce as route

    out = []
    saved = encoding.native
    for native in (saved, None):
        encoding.native = native
        try:
            out.append(("ok", fn(*args)))
        except Exception as exc:  # compared, not swallowed
            out.append(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            encoding.native = saved
    assert route is not None
    return out


def test_parse_binary_in_c_is_the_python_parse() -> None:
    if encoding.native is None:
        if REQUIRE_CEXT:
            pytest.fail("service.producer._cproduce not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C helpers not built")
    import base64

    from api.v2.produce import parse_records

    rng = random.Random(5)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=- \n_é"
    for _ in range(3000):
        recs: list[object] = []
        for _ in range(rng.randrange(1, 4)):
            r: dict[str, object] = {}
            for field in ("key", "value"):
                roll = rng.random()
                if roll < 0.5:
                    r[field] = base64.b64encode(rng.randbytes(rng.randrange(0, 12))).decode()
                elif roll < 0.7:
                    r[field] = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 9)))
                elif roll < 0.8:
                    r[field] = None
                elif roll < 0.85:
                    r[field] = rng.choice([1, ["x"], {"a": 1}])
            if rng.random() < 0.05:
                r["partition"] = 1
            if rng.random() < 0.03:
                r["extra"] = "x"
            recs.append(r if rng.random() > 0.02 else "not an object")
        c, py = _both(parse_records, {"records": recs}, "binary", rng.choice([None, 2]))
        assert c == py, recs


def _python_body_parse(raw: bytes, partition: int | None) -> object:
    """What the route does with a body the C body parser declines: orjson, then parse_records."""
    from api.v2.produce import _parse_body, parse_records

    saved = encoding.native
    encoding.native = None
    try:
        return parse_records(_parse_body(raw, "binary"), "binary", partition)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        encoding.native = saved


def test_parse_body_binary_in_c_is_orjson_and_parse_records() -> None:
    """The whole-body parser (no JSON parser, no dict per record) answers exactly what orjson + parse_records
    answer, or declines (None); it does not decline the plain shapes it exists for."""
    if encoding.native is None:
        if REQUIRE_CEXT:
            pytest.fail("service.producer._cproduce not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C helpers not built")
    import base64

    rng = random.Random(11)
    ws = [" ", "\n", "\t", "\r", "", "", "", "  \n "]
    junk = ["\\/", "\\u0041", "é", "!", "=", "A=AA", "AB", "null", "nul", "1", "[]", "\"", "}", ",", "true"]
    accepted = 0
    for _ in range(4000):
        w = lambda: rng.choice(ws)  # noqa: E731
        members = []
        for field in rng.sample(["key", "value"], rng.randrange(0, 3)):
            roll = rng.random()
            if roll < 0.6:
                v = '"' + base64.b64encode(rng.randbytes(rng.randrange(0, 10))).decode() + '"'
            elif roll < 0.75:
                v = "null"
            else:
                v = '"' + "".join(rng.choice(junk) for _ in range(rng.randrange(1, 3))) + '"' \
                    if rng.random() < 0.7 else rng.choice(junk)
            name = field if rng.random() > 0.03 else rng.choice(["Key", "partition", "valu", "value\\u0000"])
            members.append(f'{w()}"{name}"{w()}:{w()}{v}{w()}')
            if rng.random() < 0.02:
                members.append(members[-1])  # a repeated member
        records = [w() + "{" + ",".join(members) + "}" + w() for _ in range(rng.randrange(0, 4))]
        top = f'{w()}"records"{w()}:{w()}[' + ",".join(records) + f"]{w()}"
        if rng.random() < 0.05:
            top += ',"key_schema":null'
        body = "{" + top + "}" + w()
        if rng.random() < 0.03:
            body = body[: rng.randrange(len(body))]  # truncated
        raw = body.encode()
        partition = rng.choice([None, 2])
        c = encoding.native.parse_body_binary(raw, partition)
        if c is not None:
            accepted += 1
            assert c == _python_body_parse(raw, partition), raw
    assert accepted > 1000  # the plain shapes take the C path
    plain = b'{"records":[' + b",".join(b'{"value":"%s"}' % base64.b64encode(bytes(100)) for _ in range(100)) + b"]}"
    c = encoding.native.parse_body_binary(plain, None)
    assert c is not None and c == _python_body_parse(plain, None) and len(c[0]) == 100


def test_render_offsets_in_c_is_the_python_render() -> None:
    if encoding.native is None:
        pytest.skip("C helpers not built")
    from api.v2.produce import render

    cases = [
        ([RecordMetadata(0, 0)], None, None),
        ([RecordMetadata(3, 2**40 + i) for i in range(50)], 7, None),
        ([RecordMetadata(1, -1), RecordMetadata(2, 5)], None, 2**31 - 1),
        ([RecordMetadata(1, 4), ProduceFailure(6, "NOT_LEADER", True, 1)], 1, 2),
        ([RecordMetadata(2**31 - 1, 2**63 - 1), RecordMetadata(0, -(2**63)), RecordMetadata(9, 10),
          RecordMetadata(10, 99), RecordMetadata(100, 1000)], 0, 10),
        ([], None, None),
    ]
    for results, ksid, vsid in cases:
        c, py = _both(render, results, ksid, vsid)
        assert c[0] == py[0] == "ok"
        body_c, status_c, failed_c, oks_c = c[1]
        body_py, status_py, failed_py, oks_py = py[1]
        assert (body_c, status_c, failed_c) == (body_py, status_py, failed_py)
        assert oks_c == oks_py or (oks_c is None and all(oks_py))  # None: every record succeeded


def test_plain_sizes_in_c_is_the_python_check() -> None:
    if encoding._cproduce is None:
        pytest.skip("C helpers not built")
    rows = [
        [(None, b"abc", (), None, None), (None, None, [], None, 5)],
        [(None, bytearray(b"ab"), None, None, None)],
        [(b"k", b"v", (), None, None)],
        [(None, b"v", (), 1, None)],
        [(None, b"v", [("h", b"x")], None, None)],
        [(None, b"v", ())],
        [[None, b"v", (), None, None]],
        [],
    ]
    for recs in rows:
        assert encoding._cproduce.plain_sizes(recs, 24) == encoding._plain_sizes_py(recs, 24), recs


def test_metas_in_c_are_record_metadata_counting_up() -> None:
    if encoding._cproduce is None:
        pytest.skip("C helpers not built")
    for p, base, n in ((0, 0, 0), (3, 2**40, 5), (1, -1, 1), (7, 2**62, 3)):
        c = encoding._cproduce.metas(RecordMetadata, p, base, n)
        py = encoding._metas_py(RecordMetadata, p, base, n)
        assert c == py and all(type(m) is RecordMetadata for m in c)
        assert [m.offset for m in c] == list(range(base, base + n)) and all(m.partition == p for m in c)
    with pytest.raises(TypeError):
        encoding._cproduce.metas(dict, 0, 0, 1)
    with pytest.raises(ValueError):
        encoding._cproduce.metas(RecordMetadata, 0, 0, -1)


def test_a_delivery_counts_its_failures() -> None:
    acc = _acc()
    d = Delivery(4)
    acc.extend(TP, _run(2, 20, d, 0))
    acc.extend(("t", 1), _run(2, 20, d, 2))
    b0, b1 = acc.next_batch(TP, T0), acc.next_batch(("t", 1), T0)
    assert b0 is not None and b1 is not None
    acc.on_response(b0, 0, 10, T0)
    acc.on_response(b1, 87, -1, T0, "bad")
    assert d.done and d.failed == 2 == sum(isinstance(r, ProduceFailure) for r in d.results)


@pytest.mark.parametrize("n,max_batch", [(20_000, 16_384), (1000, 300), (50, 1_000_000)])
def test_a_long_run_is_cut_once_and_every_record_goes_out_once_in_order(n: int, max_batch: int) -> None:
    acc = _acc(max_batch_bytes=max_batch)
    recs = [(None, b"%06d" % i, (), None, None) for i in range(n)]
    d = Delivery(n)
    acc.extend(TP, Run(recs, range(n), 1, d, sum(record_size(None, r[1], ()) for r in recs), T0))
    sent = 0
    batches = 0
    while (b := acc.next_batch(TP, T0, max_bytes=max_batch * 3 // 4 if batches % 3 == 1 else None)) is not None:
        assert b.size <= max_batch or b.count == 1
        assert b.base_sequence == sent
        assert [r.value for r in decode_records(b.payload).records()] == [  # type: ignore[arg-type]
            b"%06d" % i for i in range(sent, sent + b.count)]
        acc.on_response(b, 0, sent, T0)
        sent += b.count
        batches += 1
    assert sent == n and d.done and d.results == [RecordMetadata(0, i) for i in range(n)]
    assert acc.queued_records == 0 and acc.queued_bytes == 0 and acc.empty


def test_parse_body_binary_declines_every_corrupted_base64_value() -> None:
    """A value with one character replaced by anything outside the alphabet (or '=' before the padding), in any
    position of any quad, is declined (the full path then names the error); intact values decode as binascii."""
    if encoding.native is None:
        if REQUIRE_CEXT:
            pytest.fail("service.producer._cproduce not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C helpers not built")
    import base64
    import binascii

    rng = random.Random(5)
    bad_chars = ["=", "-", "_", " ", "\x7f", "\\u0041", "é", "*", ".", "\x01"]
    for _ in range(300):
        raw = rng.randbytes(rng.randrange(1, 40))
        text = base64.b64encode(raw).decode()
        body = b'{"records":[{"value":"%s"}]}' % text.encode()
        got = encoding.native.parse_body_binary(body, None)
        assert got is not None and got[0][0][1] == binascii.a2b_base64(text, strict_mode=True) == raw
        unpadded = len(text.rstrip("="))
        for pos in range(len(text)):
            for ch in rng.sample(bad_chars, 3):
                if ch == "=" and pos >= unpadded:
                    continue  # already padding
                corrupted = text[:pos] + ch + text[pos + 1:]
                body = ('{"records":[{"value":"' + corrupted + '"}]}').encode()
                got = encoding.native.parse_body_binary(body, None)
                try:  # "...PE=" with "E" made "=" is still valid base64 (two pads): then the same bytes
                    expected = binascii.a2b_base64(corrupted, strict_mode=True) if "\\" not in corrupted else None
                except (binascii.Error, ValueError):
                    expected = None
                if expected is None:
                    assert got is None, corrupted
                else:
                    assert got is None or got[0][0][1] == expected, corrupted


def test_render_offset_runs_is_render_offsets_of_the_same_records() -> None:
    """The answer rendered from acknowledged runs (Delivery.offsets) is byte for byte the one rendered from a
    RecordMetadata per record; runs that do not cover 0..n-1 in order are declined (None)."""
    if encoding.native is None:
        if REQUIRE_CEXT:
            pytest.fail("service.producer._cproduce not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C helpers not built")
    rng = random.Random(3)
    for _ in range(300):
        runs, metas, first = [], [], 0
        for _ in range(rng.randrange(0, 5)):
            count = rng.randrange(0, 40)
            p, off = rng.randrange(0, 2**31 - 1), rng.choice([0, rng.randrange(0, 2**62)])
            runs.append((first, p, off, count))
            metas += [RecordMetadata(p, off + i) for i in range(count)]
            first += count
        got = encoding.native.render_offset_runs(runs, first)
        assert got == encoding.native.render_offsets(metas, RecordMetadata, None, None)
        assert json.loads(got)["offsets"] == [{"partition": m.partition, "offset": m.offset, "error_code": None,
                                               "error": None} for m in metas]
    for runs, n in (([(0, 1, 1, 2)], 3), ([(0, 1, 1, 2)], 1), ([(1, 1, 1, 2)], 3), ([(0, 1, 1, 1), (0, 1, 1, 1)], 2),
                    ([(0, -1, 1, 1)], 1), ([(0, 1, -1, 1)], 1), ([(0, 1, 1)], 1), ([[0, 1, 1, 1]], 1), ([], 1)):
        assert encoding.native.render_offset_runs(runs, n) is None, runs
