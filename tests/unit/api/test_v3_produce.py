"""v3 produce without sockets: splitting a body into JSON objects, parsing one record, rendering results, and
the pipeline's ordering (one batch with the producer at a time, results in record order, errors in place)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable

import orjson
import pytest

from api.v3.produce import (
    SEPARATOR,
    JsonObjectSplitter,
    ProducePipeline,
    RecordError,
    SplitError,
    V3Record,
    error_result,
    format_timestamp,
    parse_record,
    parse_timestamp,
    result_prefix,
    success_result,
)
from service.producer import RecordMetadata
from tests.v3_shapes import check

OBJECTS = [b'{"value":{"type":"STRING","data":"a}b{c"}}', b'{"key":{"type":"JSON","data":{"x":[1,{"y":"\\"}"}]}}}',
           b'{"value":{"type":"BINARY","data":"AAE="},"headers":[{"name":"h","value":null}]}', b"{}"]


def split_all(chunks: list[bytes], max_bytes: int = 1 << 20) -> list[bytes]:
    s = JsonObjectSplitter(max_bytes)
    out: list[bytes] = []
    for c in chunks:
        out += s.feed(c)
    s.finish()  # raises the error, if any
    return out


@pytest.mark.parametrize("sep", [b"", b"\n", b"\r\n", b"  \t\n "])
def test_concatenated_objects_split_whole_and_byte_by_byte(sep: bytes) -> None:
    body = sep + sep.join(OBJECTS) + sep
    assert split_all([body]) == OBJECTS
    assert split_all([body[i:i + 1] for i in range(len(body))]) == OBJECTS  # every chunk boundary, escapes too


def test_lines_and_other_layouts_mix() -> None:
    """One object per line takes the fast path; several per line, pretty-printed objects and broken ones the
    scanner; both give the same objects."""
    pretty = b'{\n  "value": {\n    "type": "STRING",\n    "data": "}\\n{"\n  }\n}'
    body = b'{"a":1}\n{"b":2} {"c":3}\n' + pretty + b'\r\n{"d": tru}\n{"e":"\\""}\n'
    want = [b'{"a":1}', b'{"b":2}', b'{"c":3}', pretty, b'{"d": tru}', b'{"e":"\\""}']
    assert split_all([body]) == want
    assert split_all([body[i:i + 7] for i in range(0, len(body), 7)]) == want
    s = JsonObjectSplitter(10)
    assert s.feed(b'{"a":1}\n{"long":"xxxxxxxx"}\n') == [b'{"a":1}']
    assert s.error is not None and s.error.code == 41301


def test_one_array_of_records() -> None:
    body = b"[" + b" ,\n".join(OBJECTS) + b"]\n"
    assert split_all([body]) == OBJECTS
    assert split_all([body[i:i + 1] for i in range(len(body))]) == OBJECTS
    assert split_all([b" [ ] "]) == []


@pytest.mark.parametrize("body", [b'{"a":1} x', b"42", b'"text"', b'{"a":1}[', b"[{}{}]", b"[{}],", b"[{}] {}",
                                  b"[,{}]", b"[{},]x"])
def test_text_between_objects_ends_the_stream(body: bytes) -> None:
    with pytest.raises(SplitError) as e:
        split_all([body])
    assert e.value.code == 40001


def test_objects_before_an_error_are_kept_nothing_after() -> None:
    s = JsonObjectSplitter(1000)
    assert s.feed(b'{"a":1}\n{"b":2} xyz {"c":3}') == [b'{"a":1}', b'{"b":2}']
    assert s.error is not None and s.error.code == 40001
    assert s.feed(b'{"d":4}') == []


@pytest.mark.parametrize("body", [b'{"a":1', b'{"a":"}', b"[{}", b"[{},"])
def test_a_body_ending_inside_a_record_is_an_error(body: bytes) -> None:
    s = JsonObjectSplitter(1000)
    s.feed(body)
    with pytest.raises(SplitError) as e:
        s.finish()
    assert e.value.code == 40001


def test_broken_json_inside_braces_is_still_one_object() -> None:
    assert split_all([b'{"a": tru} {"b":1}']) == [b'{"a": tru}', b'{"b":1}']


def test_record_size_limit_and_bounded_buffer() -> None:
    s = JsonObjectSplitter(100)
    small = b'{"value":{"type":"STRING","data":"%s"}}' % (b"x" * 50)
    for _ in range(1000):
        assert s.feed(small + b"\n") == [small]
    assert len(s._buf) <= 1  # consumed objects are dropped
    s.feed(b'{"value":{"type":"STRING","data":"' + b"y" * 60)
    assert s.error is None
    assert s.feed(b"y" * 60) == []
    with pytest.raises(SplitError) as e:
        s.finish()
    assert e.value.code == 41301
    whole = JsonObjectSplitter(100)  # an object that arrives complete in one chunk is checked too
    assert whole.feed(small + b'{"v":"' + b"y" * 100 + b'"}' + small) == [small]
    assert whole.error is not None and whole.error.code == 41301


# -- one record -------------------------------------------------------------------------------------------
def test_parse_every_type() -> None:
    r = parse_record(orjson.dumps({
        "partition_id": 2, "headers": [{"name": "a", "value": base64.b64encode(b"\x00\xff").decode()},
                                       {"name": "n", "value": None}, {"name": "m"}],
        "key": {"type": "binary", "data": base64.b64encode(b"k\x00").decode()},
        "value": {"type": "JSON", "data": {"z": [1, 2.5, None], "s": "é"}},
        "timestamp": "2021-02-05T19:14:42.65Z"}), now_ms=5)
    assert r == V3Record(b"k\x00", '{"z":[1,2.5,null],"s":"é"}'.encode(), (("a", b"\x00\xff"), ("n", None),
                         ("m", None)), 2, 1612552482650, "BINARY", "JSON")
    r = parse_record(b'{"value":{"type":"STRING","data":"h\\u00e9"},"key":null}', now_ms=7)
    assert (r.key, r.value, r.key_type, r.value_type, r.timestamp, r.partition) == (None, "hé".encode(), None,
                                                                                     "STRING", 7, None)
    r = parse_record(b'{"value":{"type":"JSON","data":123456789012345678901234567890}}', now_ms=0)
    assert r.value == b"123456789012345678901234567890"  # exact
    r = parse_record(b'{"key":{"type":"BINARY","data":null},"value":{"type":"JSON"},"partition_id":1.0}', 0)
    assert (r.key, r.key_type, r.value, r.value_type, r.partition) == (None, "BINARY", None, "JSON", 1)
    r = parse_record(b'{"value":{"type":"BINARY","data":"","subject":"s","schema_id":null}}', 0)
    assert r.value == b""


@pytest.mark.parametrize(("body", "code"), [
    (b'{"value":{"type":"BINARY","data":"not base64!"}}', 42206),
    (b'{"value":{"type":"BINARY","data":"QQ"}}', 42206),  # padding required (RFC 4648, as Guava's decoder)
    (b'{"value":{"type":"BINARY","data":5}}', 42206),
    (b'{"value":{"type":"STRING","data":{"a":1}}}', 42206),
    (b'{"value":{"type":"XML","data":"x"}}', 42206),
    (b'{"value":{"type":"AVRO","data":"x","schema":"\\"string\\""}}', 42208),
    (b'{"value":{"type":"PROTOBUF","data":{}}}', 42208),
    (b'{"key":{"type":"JSONSCHEMA","data":{}}}', 42208),
    (b'{"value":{"schema_id":1,"data":"x"}}', 42208),
    (b'{"value":{"data":"x"}}', 42208),
    (b'{"value":"x"}', 42206),
    (b'{"records":[]}', 42206),
    (b'{"value":{"type":"JSON","data":1,"extra":1}}', 42206),
    (b'{"headers":[{"key":"a","value":null}]}', 42206),
    (b'{"headers":[{"name":"a","value":"%%"}]}', 42206),
    (b'{"headers":{"a":"b"}}', 42206),
    (b'{"partition_id":-1}', 40402),
    (b'{"partition_id":"0"}', 42207),
    (b'{"partition_id":2147483648}', 42207),
    (b'{"timestamp":1612552482}', 42207),
    (b'{"timestamp":"2021-02-05T19:14:42"}', 42207),  # no offset
    (b'{"timestamp":"yesterday"}', 42207),
    (b'{"timestamp":"1960-01-01T00:00:00Z"}', 42207),
    (b'{"a": tru}', 40001),
    (b"[1]", 42206),
])
def test_invalid_records(body: bytes, code: int) -> None:
    with pytest.raises(RecordError) as e:
        parse_record(body, 0)
    assert e.value.code == code, e.value.message
    assert e.value.message


def test_timestamps() -> None:
    assert parse_timestamp("2021-02-05T19:14:42Z") == 1612552482000
    assert parse_timestamp("2021-02-05T20:14:42.001+01:00") == 1612552482001
    assert format_timestamp(0) == "1970-01-01T00:00:00Z"
    assert format_timestamp(1612552482650) == "2021-02-05T19:14:42.650Z"
    assert format_timestamp(1612552482001) == "2021-02-05T19:14:42.001Z"


def test_success_result_shape() -> None:
    rec = V3Record(None, b"abc", (), None, 1612552482000, "BINARY", "STRING")
    out = success_result(result_prefix("c-1", "t\u00e9"), rec, RecordMetadata(3, 17))
    assert out.endswith(SEPARATOR)
    assert list(orjson.loads(out).items()) == [
        ("error_code", 200), ("cluster_id", "c-1"), ("topic_name", "t\u00e9"), ("partition_id", 3), ("offset", 17),
        ("timestamp", "2021-02-05T19:14:42Z"), ("key", {"type": "BINARY", "size": -1}),
        ("value", {"type": "STRING", "size": 3})]
    check(orjson.loads(out), "ProduceResponse")
    plain = V3Record(None, None, (), None, 0, None, None)
    bare = orjson.loads(success_result(result_prefix("c", "t"), plain, RecordMetadata(0, 0)))
    assert set(bare) == {"error_code", "cluster_id", "topic_name", "partition_id", "offset", "timestamp"}
    check(bare, "ProduceResponse")
    check(orjson.loads(error_result(40403, "Topic not found.")), "Error")


# -- the pipeline ---------------------------------------------------------------------------------------------
class FakeProducer:
    """Answers each batch when the test releases it; records how batches overlapped."""

    def __init__(self) -> None:
        self.batches: list[list[V3Record]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release: asyncio.Queue[None] = asyncio.Queue()
        self.called = asyncio.Event()

    async def __call__(self, records: list[V3Record]) -> bytes:
        self.batches.append(records)
        self.called.set()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await self.release.get()
        self.in_flight -= 1
        return b"".join(b'{"error_code":200,"v":%s}\r\n' % (r.value or b"null") for r in records)


async def chunks_from(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    """The queued chunks (``queue.join()`` returns once the reader took them all and waits for more)."""
    while (c := await queue.get()) is not None:
        queue.task_done()
        yield c


def rec(i: int) -> bytes:
    return b'{"value":{"type":"JSON","data":%d}}' % i


async def test_pipeline_orders_results_and_keeps_one_batch_in_flight() -> None:
    fake = FakeProducer()
    body: asyncio.Queue[bytes | None] = asyncio.Queue()
    p = ProducePipeline(chunks_from(body), fake, 1 << 20)
    p.start()
    results = p.results()
    body.put_nowait(rec(0))
    assert await p.first()
    await fake.called.wait()
    # while batch [0] is with the producer, 1..3 and a bad record arrive: they wait, in order
    body.put_nowait(rec(1) + rec(2))
    body.put_nowait(b'{"value":{"type":"AVRO"}}' + rec(3) + b"\n")
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(fake.batches) == 1 and fake.in_flight == 1
    fake.release.put_nowait(None)
    first = orjson.loads(await anext(results))
    assert first["v"] == 0
    got = [first]
    fake.release.put_nowait(None)  # batch [1, 2]
    fake.release.put_nowait(None)  # batch [3]
    body.put_nowait(b"{oops")  # cannot be delimited at the end: the last result
    body.put_nowait(None)
    async for chunk in results:
        got += [orjson.loads(line) for line in chunk.split(b"\r\n") if line]
    assert [g.get("v", g["error_code"]) for g in got] == [0, 1, 2, 42208, 3, 40001]
    assert [[r.value for r in b] for b in fake.batches] == [[b"0"], [b"1", b"2"], [b"3"]]
    assert fake.max_in_flight == 1
    await p.close()


async def test_pipeline_empty_body_and_garbage_first() -> None:
    body: asyncio.Queue[bytes | None] = asyncio.Queue()
    p = ProducePipeline(chunks_from(body), FakeProducer(), 1 << 20)
    p.start()
    body.put_nowait(b"  \n")
    body.put_nowait(None)
    assert await p.first() is False
    await p.close()
    body2: asyncio.Queue[bytes | None] = asyncio.Queue()
    p = ProducePipeline(chunks_from(body2), FakeProducer(), 1 << 20)
    p.start()
    body2.put_nowait(b"hello")
    assert await p.first() is True
    out = [orjson.loads(c) async for c in p.results()]
    assert [o["error_code"] for o in out] == [40001]
    await p.close()


async def test_pipeline_drain_stops_reading_answers_what_was_read_and_ends_with_50301() -> None:
    fake = FakeProducer()
    listeners: list[Callable[[], None]] = []

    def on_drain(listener: Callable[[], None]) -> Callable[[], None]:
        listeners.append(listener)
        return lambda: listeners.remove(listener)

    body: asyncio.Queue[bytes | None] = asyncio.Queue()
    p = ProducePipeline(chunks_from(body), fake, 1 << 20, on_drain)
    p.start()
    body.put_nowait(rec(0))
    assert await p.first()
    await fake.called.wait()
    body.put_nowait(rec(1))  # read while batch [0] is with the producer: still produced after the drain
    await body.join()
    listeners[0]()  # SIGTERM; the reader waits for the next chunk
    body.put_nowait(rec(2))  # not read any more
    fake.release.put_nowait(None)
    fake.release.put_nowait(None)
    out = [orjson.loads(line) async for chunk in p.results() for line in chunk.split(b"\r\n") if line]
    assert [o.get("v", o["error_code"]) for o in out] == [0, 1, 50301]
    await p.close()
    assert listeners == []


async def test_pipeline_started_while_draining_reads_nothing() -> None:
    body: asyncio.Queue[bytes | None] = asyncio.Queue()
    body.put_nowait(rec(0))

    def draining(listener: Callable[[], None]) -> Callable[[], None]:
        listener()
        return lambda: None

    fake = FakeProducer()
    p = ProducePipeline(chunks_from(body), fake, 1 << 20, draining)
    p.start()
    assert await p.first()
    assert [orjson.loads(c)["error_code"] async for c in p.results()] == [50301]
    assert fake.batches == []
    await p.close()


async def test_records_of_one_chunk_go_to_the_producer_together() -> None:
    fake = FakeProducer()
    body: asyncio.Queue[bytes | None] = asyncio.Queue()
    p = ProducePipeline(chunks_from(body), fake, 1 << 20)
    p.start()
    body.put_nowait(rec(0) + b"\n" + rec(1) + rec(2))
    body.put_nowait(None)
    fake.release.put_nowait(None)
    out = [orjson.loads(line) async for chunk in p.results() for line in chunk.split(b"\r\n") if line]
    assert [o["v"] for o in out] == [0, 1, 2]
    assert [[r.value for r in b] for b in fake.batches] == [[b"0", b"1", b"2"]]
    await p.close()
