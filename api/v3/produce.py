"""Confluent REST Proxy v3 produce: ``POST /v3/clusters/{cluster_id}/topics/{topic_name}/records``.

The body is a stream of ``ProduceRequest`` JSON objects, concatenated (whitespace or nothing between
them; one JSON array of them works too, as Jackson's ``MappingIterator`` reads one); the answer is
``200`` with a stream of one JSON result per record, in the order of the records, each followed by
``\\r\\n`` (Confluent's chunk separator). One object in, one result out is the "single" case; a chunked
request that keeps sending records is the "streaming" case: the same code, as in Confluent, whose
``ProduceAction`` always reads a ``JsonStream<ProduceRequest>``. Results are written as the broker
acknowledges records (acks=all, through the tenant's idempotent producer, as v2 produce), while the
request body is still being read.

A record: ``{"partition_id": int?, "headers": [{"name", "value": base64 | null}]?, "key": data?,
"value": data?, "timestamp": RFC 3339?}``; data is ``{"type": "BINARY" | "JSON" | "STRING", "data": ...}``
(BINARY: base64; JSON: any JSON value, stored as compact JSON text; STRING: text, stored as UTF-8; a null
or absent ``data`` is a null key/value). A result: ``{"error_code": 200, "cluster_id", "topic_name",
"partition_id", "offset", "timestamp", "key": {"type", "size"}, "value": {"type", "size"}}`` (``key`` /
``value`` only when the record had one; ``size`` is -1 for null data, as Java's ``RecordMetadata``), or
``{"error_code": <code>, "message": "..."}`` for a record that failed; the stream continues with the next.

Per-record error codes (the gateway's table, :data:`api.errors.ERROR_CODES`; Confluent mixes its v3
mapper's HTTP statuses such as 400 with five-digit codes, the only contract is "200 is success"):
40001 the object is not valid JSON; 42206 invalid field (unknown field, bad base64, STRING data that is
not a string, unknown type); 42207 bad ``partition_id`` or ``timestamp`` value; 42208 a schema type
(AVRO, PROTOBUF, JSONSCHEMA, or no type, which means "schema from the registry" in Confluent) — the
gateway has no schema registry (Confluent without one: the same 42208 "Schema Registry must be
configured"); 40401 topic not found (Confluent: 40401 after its producer's metadata wait); 40402 partition
not found; 40301/40101/50002/50003 as v2 produce for records the broker did not acknowledge.

Whole-request errors (an HTTP status, before any result): 401/403 as every route (a topic outside the
tenant's patterns is 403/40301), 404/404 an unknown cluster id (as the other v3 routes), 415/41501 a
non-JSON content type, 422/42208 an empty body (Confluent: "Request body is empty"), 503/50301 while the
gateway shuts down. Text that cannot be split into JSON objects (garbage between objects, an unterminated
object at the end, a record larger than the body limit) ends the stream with one error result (40001,
41301); so does a shutdown (SIGTERM): the records read so far are produced and answered, then 50301 —
a record without a result was not produced.

Order: at most one batch of a stream is with the producer at a time (the next collects what arrives
meanwhile), so the records of a stream are stored in stream order per partition, and a result is written
only once the broker acknowledged its record. A missing topic is created as in v2 when
``GATEWAY_AUTO_CREATE_TOPICS`` is on (:func:`api.produce_common.partitions_or_create`).

Body limit: ``GATEWAY_MAX_BODY_BYTES`` applies **per record** here (not to the whole stream), so a
long-lived stream works; a single record beyond it ends the stream with 41301. A request with a
``Content-Length`` above the limit is refused at once (413) by the middleware, as everywhere. A client
must read its results while it sends (as Confluent's): one that does not stops being read once about
``MAX_UNITS`` results wait (TCP backpressure).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import orjson
from fastapi import APIRouter, Depends, Request, Response
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from api.auth import current_tenant
from api.deps import acceptable_content_type
from api.errors import kafka_error_response
from api.kafka_texts import failure_text, failure_texts
from api.produce_common import (
    LONG_DIGITS,
    JsonTooDeep,
    failure_code,
    json_bytes,
    loads_exact,
    missing_topic,
    partitions_or_create,
)
from api.v2.produce import producer_for
from api.v2.topics import catalog
from api.v3.common import require_cluster
from service.client.errors import KafkaError
from service.cluster.topics import is_legal_topic_name
from service.errors import GatewayError
from service.instances.registry import ShuttingDown
from service.producer import Producer, RecordMetadata, UnknownTopicError
from service.tenants import Tenant

log = logging.getLogger(__name__)

router = APIRouter(tags=["v3"])

V3_JSON = "application/json"
SEPARATOR = b"\r\n"  # after every result, as Confluent's ChunkedOutput
INT32_MAX = 2**31 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EMBEDDED_TYPES = frozenset({"BINARY", "JSON", "STRING"})
SCHEMA_TYPES = frozenset({"AVRO", "PROTOBUF", "JSONSCHEMA"})
_RECORD_KEYS = frozenset({"partition_id", "headers", "key", "value", "timestamp"})
_DATA_KEYS = frozenset({"type", "data", "subject", "subject_name_strategy", "schema_id", "schema_version",
                        "schema"})
_HEADER_KEYS = frozenset({"name", "value"})
# A pipeline holds at most this many result units (an error, or one batch of records) not yet written, and
# starts a new batch beyond these sizes: the memory of one stream stays bounded when its client reads slowly.
MAX_UNITS = 32
MAX_BATCH_RECORDS = 5000
MAX_BATCH_BYTES = 1024 * 1024


class RecordError(Exception):
    """One record cannot be produced: its result is ``{"error_code": code, "message": message}``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SplitError(Exception):
    """The body cannot be split into JSON objects any further: the stream ends with this error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- framing: concatenated JSON objects (pure) ---------------------------------------------------------------
_WS = re.compile(rb"[ \t\r\n]*")
_IN_STRING = re.compile(rb'["\\]')
_IN_OBJECT = re.compile(rb'[{}"]')


def _is_object(text: bytes) -> bool:
    try:
        return type(orjson.loads(text)) is dict
    except orjson.JSONDecodeError:
        return False


class JsonObjectSplitter:
    """Cuts a byte stream of concatenated JSON objects (or one JSON array of objects) into the bytes of
    each object, without parsing them: only braces outside strings are counted, so a broken object is
    still delimited and fails alone when parsed. ``feed`` returns the objects completed by a chunk;
    ``finish`` checks the end of the body. Text between objects that is not whitespace (or an array's
    commas), or an object longer than ``max_object_bytes``, sets :attr:`error` (a :class:`SplitError`):
    ``feed`` still returns the objects before it, and nothing after."""

    def __init__(self, max_object_bytes: int) -> None:
        self.max_object_bytes = max_object_bytes
        self._buf = bytearray()
        self._pos = 0  # next byte to look at
        self._start = -1  # start of the object being read; -1 between objects
        self._depth = 0
        self._in_string = False
        self._array: bool | None = None  # None: not known yet; True: inside "[...]"; False: concatenated
        self._expect_object = True  # in an array: after "[" or ","
        self._closed = False  # the array ended: only whitespace may follow
        self.objects = 0
        self.error: SplitError | None = None

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        if self.error is None:
            try:
                self._feed(data, out)
            except SplitError as exc:
                self.error = exc
        return out

    def _feed(self, data: bytes, out: list[bytes]) -> None:
        buf = self._buf
        buf += data
        n = len(buf)
        pos = self._pos
        while pos < n:
            if self._start < 0:
                pos = _WS.match(buf, pos).end()  # type: ignore[union-attr]  # always matches
                if pos >= n:
                    break
                c = buf[pos]
                if self._closed:
                    raise SplitError(40001, f"malformed JSON: text after the closing ']' at byte {pos}")
                if c == 0x7B and not self._array:
                    # Fast path: a line that is one whole JSON object (a raw newline is never inside a JSON
                    # string, so a line that parses as an object is exactly one record)
                    nl = buf.find(b"\n", pos)
                    if nl > 0:
                        line = bytes(buf[pos:nl]).rstrip()
                        if line[-1:] == b"}" and _is_object(line):
                            if len(line) > self.max_object_bytes:
                                raise self._too_large()
                            self._array = False
                            out.append(line)
                            self.objects += 1
                            pos = nl + 1
                            continue
                if c == 0x7B:  # {
                    if self._array is None:
                        self._array = False
                    elif self._array and not self._expect_object:
                        raise SplitError(40001, "malformed JSON: expected ',' or ']' between records")
                    self._start = pos
                    self._depth = 1
                    pos += 1
                elif c == 0x5B and self._array is None:  # [ : one array of records
                    self._array = True
                    self._expect_object = True
                    pos += 1
                elif self._array and c == 0x2C and not self._expect_object:  # ,
                    self._expect_object = True
                    pos += 1
                elif self._array and c == 0x5D and (not self._expect_object or self.objects == 0):  # ]
                    self._closed = True
                    pos += 1
                else:
                    raise SplitError(40001, f"malformed JSON: expected a JSON object (a record), found "
                                            f"{bytes(buf[pos:pos + 20])!r}")
                continue
            if self._in_string:
                m = _IN_STRING.search(buf, pos)
                if m is None:
                    pos = n
                elif buf[m.start()] == 0x5C:  # a backslash: skip the escaped byte (it may be in the next chunk)
                    pos = m.start() + 2
                else:
                    self._in_string = False
                    pos = m.start() + 1
                continue
            m = _IN_OBJECT.search(buf, pos)
            if m is None:
                pos = n
                continue
            i = m.start()
            c = buf[i]
            pos = i + 1
            if c == 0x22:  # "
                self._in_string = True
            elif c == 0x7B:
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    if pos - self._start > self.max_object_bytes:
                        raise self._too_large()
                    out.append(bytes(buf[self._start:pos]))
                    self._start = -1
                    self.objects += 1
                    self._expect_object = False
        if self._start >= 0 and n - self._start > self.max_object_bytes:
            raise self._too_large()
        # keep only what is still needed
        keep = self._start if self._start >= 0 else min(pos, n)
        if keep:
            del buf[:keep]
            pos -= keep
            if self._start >= 0:
                self._start = 0
        self._pos = pos

    def _too_large(self) -> SplitError:
        return SplitError(41301, f"a record is larger than {self.max_object_bytes} bytes (the gateway's body limit "
                                 "applies to each record of a stream)")

    def finish(self) -> None:
        """The body ended: raise if it ended inside an object or an unclosed array (or :attr:`error`)."""
        if self.error is not None:
            raise self.error
        if self._start >= 0:
            raise SplitError(40001, "malformed JSON: the body ended inside a record")
        if self._array and not self._closed:
            raise SplitError(40001, "malformed JSON: the body ended before the closing ']'")


# -- one record (pure) ---------------------------------------------------------------------------------------
class V3Record(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    partition: int | None
    timestamp: int  # ms since the epoch
    key_type: str | None  # None: the record had no key object (left out of the result)
    value_type: str | None

    @property
    def size(self) -> int:
        return (len(self.key) if self.key is not None else 0) + (len(self.value) if self.value is not None else 0)


def parse_timestamp(v: Any) -> int:
    """An RFC 3339 date-time (with a time zone offset) as ms since the epoch."""
    if type(v) is not str:
        raise RecordError(42207, "timestamp must be an RFC 3339 date-time string, e.g. 2021-02-05T19:14:42.5Z")
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        raise RecordError(42207, f"timestamp {v!r} is not an RFC 3339 date-time") from None
    if dt.tzinfo is None:
        raise RecordError(42207, f"timestamp {v!r} has no time zone offset (RFC 3339: e.g. 'Z' or '+01:00')")
    ms = (dt - EPOCH) // timedelta(milliseconds=1)
    if ms < 0:
        raise RecordError(42207, f"timestamp {v!r} is before 1970 (Kafka timestamps are not negative)")
    return ms


def format_timestamp(ms: int) -> str:
    """ms since the epoch as Java's ``Instant.toString()`` (what Confluent answers): seconds, then the
    milliseconds only when not zero, then ``Z``."""
    dt = EPOCH + timedelta(milliseconds=ms)
    frac = ms % 1000
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac:03d}" if frac else "") + "Z"


_TS_CACHE: dict[int, bytes] = {}  # records of one chunk share their timestamp


def _timestamp_bytes(ms: int) -> bytes:
    text = _TS_CACHE.get(ms)
    if text is None:
        if len(_TS_CACHE) >= 4096:
            _TS_CACHE.clear()
        text = _TS_CACHE[ms] = format_timestamp(ms).encode()
    return text


def _has_float(v: Any) -> bool:
    """Whether a float is anywhere in ``v`` (iterative: data nests up to orjson's 1024 levels)."""
    stack = [v]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is float:
            return True
        if t is dict:
            stack.extend(x.values())
        elif t is list:
            stack.extend(x)
    return False


def _data(v: Any, field: str, raw: bytes) -> tuple[bytes | None, str | None]:
    """A key or value object: (the bytes to store, its type), (None, None) when absent. ``raw`` is the
    record's JSON text (JSON data with an integer beyond 64 bits, which orjson reads as a float, is taken
    from it exactly)."""
    if v is None:
        return None, None
    if type(v) is not dict:
        raise RecordError(42206, f"{field} must be an object {{\"type\", \"data\"}} or null")
    if not v.keys() <= _DATA_KEYS:
        unknown = [k for k in v if k not in _DATA_KEYS]
        raise RecordError(42206, f"{field}: unknown field(s) {', '.join(repr(k) for k in unknown)}")
    t = v.get("type")
    if t is None:
        raise RecordError(42208, f"{field} has no type: a record without one is serialized with a schema from a "
                                 "schema registry, which this gateway does not provide; set type to BINARY, JSON "
                                 "or STRING")
    if type(t) is not str or t.upper() not in EMBEDDED_TYPES | SCHEMA_TYPES:
        raise RecordError(42206, f"{field}.type must be BINARY, JSON or STRING")
    t = t.upper()
    if t in SCHEMA_TYPES:
        raise RecordError(42208, f"unsupported: {field}.type {t} needs a schema registry, which this gateway does "
                                 "not provide; use BINARY, JSON or STRING")
    data = v.get("data")
    if data is None:
        return None, t
    if t == "JSON":
        try:
            if _has_float(data) and LONG_DIGITS.search(raw):
                data = loads_exact(raw)[field]["data"]
            return json_bytes(data), t
        except JsonTooDeep as exc:
            raise RecordError(42206, f"{field}.data: {exc}") from None
    if type(data) is not str:
        what = "a base64 string" if t == "BINARY" else "a string"
        raise RecordError(42206, f"{field}.data must be {what} for type {t}")
    if t == "BINARY":
        try:
            return binascii.a2b_base64(data, strict_mode=True), t
        except ValueError:
            raise RecordError(42206, f"{field}.data is not valid base64 (RFC 4648, with padding)") from None
    try:
        return data.encode(), t
    except UnicodeEncodeError:  # a lone surrogate escape (\ud800) is not text
        raise RecordError(42206, f"{field}.data is not valid Unicode text") from None


def _headers(v: Any) -> tuple[tuple[str, bytes | None], ...]:
    if v is None:
        return ()
    if type(v) is not list:
        raise RecordError(42206, 'headers must be an array of {"name", "value"} objects')
    out = []
    for j, h in enumerate(v):
        if type(h) is not dict or type(h.get("name")) is not str or not h.keys() <= _HEADER_KEYS:
            raise RecordError(42206, f'headers[{j}] must be {{"name": <string>, "value": <base64> | null}}')
        value = h.get("value")
        if value is not None:
            if type(value) is not str:
                raise RecordError(42206, f"headers[{j}].value must be a base64 string or null")
            try:
                value = binascii.a2b_base64(value, strict_mode=True)
            except ValueError:
                raise RecordError(42206, f"headers[{j}].value is not valid base64 (RFC 4648, with padding)") from None
        out.append((h["name"], value))
    return tuple(out)


def parse_record(raw: bytes, now_ms: int) -> V3Record:
    """One ``ProduceRequest`` object (its JSON text) as a record, or a :class:`RecordError`."""
    try:
        r = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RecordError(40001, f"malformed JSON: {exc}") from None
    if type(r) is not dict:
        raise RecordError(42206, "a record must be a JSON object")
    if not r.keys() <= _RECORD_KEYS:
        unknown = [k for k in r if k not in _RECORD_KEYS]
        raise RecordError(42206, f"unknown field(s) {', '.join(repr(k) for k in unknown)}; a record has "
                                 "partition_id, headers, key, value and timestamp")
    partition = r.get("partition_id")
    if partition is not None:
        if type(partition) is float and partition.is_integer():  # 1.0 is an integer for JSON Schema (and Jackson)
            partition = int(partition)
        if type(partition) is not int or partition > INT32_MAX:
            raise RecordError(42207, "partition_id must be an integer (or null)")
        if partition < 0:
            raise RecordError(40402, f"partition {partition} not found")
    key, key_type = _data(r.get("key"), "key", raw)
    value, value_type = _data(r.get("value"), "value", raw)
    ts = r.get("timestamp")
    return V3Record(key, value, _headers(r.get("headers")), partition,
                    now_ms if ts is None else parse_timestamp(ts), key_type, value_type)


def error_result(code: int, message: str) -> bytes:
    return orjson.dumps({"error_code": code, "message": message}) + SEPARATOR


def _data_result(name: bytes, t: str | None, data: bytes | None) -> bytes:
    if t is None:
        return b""
    return b',"%s":{"type":"%s","size":%d}' % (name, t.encode(), -1 if data is None else len(data))


def success_result(prefix: bytes, rec: V3Record, md: RecordMetadata) -> bytes:
    """``prefix`` is ``{"error_code":200,"cluster_id":...,"topic_name":...`` (see :func:`result_prefix`)."""
    return (prefix + b',"partition_id":%d,"offset":%d,"timestamp":"%s"' % (
        md.partition, md.offset, _timestamp_bytes(rec.timestamp))
        + _data_result(b"key", rec.key_type, rec.key) + _data_result(b"value", rec.value_type, rec.value)
        + b"}" + SEPARATOR)


def result_prefix(cluster: str, topic: str) -> bytes:
    return b'{"error_code":200,"cluster_id":' + orjson.dumps(cluster) + b',"topic_name":' + orjson.dumps(topic)


def _exception_result(exc: KafkaError) -> tuple[int, str]:
    """The code and message of a request-level Kafka error, from the one HTTP mapping of api/errors.py."""
    body = orjson.loads(kafka_error_response(exc).body)
    return body["error_code"], body["message"]


# -- the pipeline: read records, produce them in order, write results in order ------------------------------
class _Unit:
    """Results for a run of consecutive records: one error, or a batch sent with one ``send_many``."""

    __slots__ = ("future", "nbytes", "records")

    def __init__(self, future: asyncio.Future[bytes], records: list[V3Record] | None = None) -> None:
        self.future = future
        self.records = records
        self.nbytes = 0


_END = None


class ProducePipeline:
    """Reads the body, splits and parses records, produces them and yields the results in order.

    At most one batch is with the producer at a time: the next one collects what arrives meanwhile, so
    records reach the producer in the order of the stream (per partition they are stored in that order)
    and batches grow with the load. ``MAX_UNITS`` bounds the results waiting to be written: a client that
    does not read its results stops being read (TCP backpressure) instead of growing the gateway's memory.
    """

    def __init__(self, receive: AsyncIterator[bytes], produce: Callable[[list[V3Record]], Awaitable[bytes]],
                 max_record_bytes: int,
                 on_drain: Callable[[Callable[[], None]], Callable[[], None]] | None = None) -> None:
        self._chunks = receive
        self._produce = produce
        self._splitter = JsonObjectSplitter(max_record_bytes)
        self._units: asyncio.Queue[_Unit | None] = asyncio.Queue(MAX_UNITS)
        self._open: _Unit | None = None  # the batch records are added to (not started yet)
        self._waiting: deque[_Unit] = deque()  # batches not started, in order
        self._inflight: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._first: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._on_drain = on_drain  # Gateway.on_drain: at SIGTERM the stream stops reading records
        self._unregister: Callable[[], None] | None = None
        self._reading = False
        self._drained = False

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="v3-produce-reader")
        if self._on_drain is not None:
            self._unregister = self._on_drain(self._drain)

    def _drain(self) -> None:
        """The gateway shuts down: stop reading records; those read are still produced and answered, then
        the stream ends with a 50301 result."""
        self._drained = True
        if self._reading and self._reader is not None and not self._reader.done():
            self._reader.cancel(msg="gateway draining")

    async def first(self) -> bool:
        """Wait until the first result unit exists (True) or the body ended without any (False)."""
        return await asyncio.shield(self._first)

    async def results(self) -> AsyncIterator[bytes]:
        while True:
            unit = await self._units.get()
            if unit is _END:
                return
            yield await unit.future

    async def close(self) -> None:
        if self._unregister is not None:
            self._unregister()
        for task in (self._reader, self._inflight):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # -- reading -----------------------------------------------------------------------------------------------
    async def _put(self, unit: _Unit | None) -> None:
        self._pump()  # never wait for the writer while a batch could be started
        await self._units.put(unit)
        if not self._first.done():
            self._first.set_result(unit is not _END)

    async def _error(self, code: int, message: str) -> None:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        fut.set_result(error_result(code, message))
        self._open = None  # later records go after this error
        await self._put(_Unit(fut))

    async def _record(self, rec: V3Record) -> None:
        unit = self._open
        if unit is None or len(unit.records or ()) >= MAX_BATCH_RECORDS or unit.nbytes >= MAX_BATCH_BYTES:
            unit = self._open = _Unit(asyncio.get_running_loop().create_future(), [rec])
            unit.nbytes = rec.size
            await self._put(unit)  # may wait for the writer; the unit cannot start before it is in _waiting
            self._waiting.append(unit)
        else:
            assert unit.records is not None
            unit.records.append(rec)
            unit.nbytes += rec.size

    def _pump(self) -> None:
        if self._inflight is not None or not self._waiting:
            return
        unit = self._waiting.popleft()
        if unit is self._open:
            self._open = None
        self._inflight = asyncio.get_running_loop().create_task(self._send(unit))

    async def _send(self, unit: _Unit) -> None:
        try:
            assert unit.records is not None
            unit.future.set_result(await self._produce(unit.records))
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: answer these records, keep the stream going
            log.exception("v3 produce batch failed")
            unit.future.set_result(b"".join(error_result(50001, "internal error; the gateway logged the details")
                                             for _ in unit.records or ()))
        finally:
            self._inflight = None
            self._pump()

    async def _read(self) -> None:
        failed = cut = False
        self._reading = True
        try:
            if self._drained:
                cut = True
            else:
                await self._read_records()
        except ClientDisconnect:
            pass
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._drained or task is None or task.cancelling() != 1:
                raise  # close(): nobody reads the results any more
            task.uncancel()  # only the drain's wake-up
            cut = True
        except Exception:
            log.exception("reading a v3 produce stream failed")
            failed = True
        finally:
            self._reading = False
        if failed:
            await self._error(50001, "internal error; the gateway logged the details")
        if cut:
            await self._error(50301, "the gateway is shutting down: records after the last result were not read "
                                     "(nor produced); send them again (to another replica)")
        await self._put(_END)

    async def _read_records(self) -> None:
        splitter = self._splitter
        async for chunk in self._chunks:
            if not chunk:
                continue
            now_ms = time.time_ns() // 1_000_000
            for raw in splitter.feed(chunk):
                try:
                    rec = parse_record(raw, now_ms)
                except RecordError as exc:
                    await self._error(exc.code, exc.message)
                else:
                    await self._record(rec)
            self._pump()  # after the whole chunk: its records go to the producer together
            if splitter.error is not None:
                break
        try:
            splitter.finish()
        except SplitError as exc:
            await self._error(exc.code, exc.message)


class ResultStream(StreamingResponse):
    """The ``200`` answer: results in order as they become available. Unlike Starlette's streaming
    response it never calls ``receive`` to watch for a disconnect: the route's pipeline is still reading
    the request body from it (a lost client shows as a failed ``send`` or a ``ClientDisconnect``)."""

    media_type = V3_JSON

    def __init__(self, pipeline: ProducePipeline) -> None:
        super().__init__(pipeline.results(), status_code=200, media_type=V3_JSON)
        self.pipeline = pipeline

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away
        finally:
            await self.pipeline.close()


class _Producing:
    """Produces one batch of a stream and renders its results (with the tenant's producer and metrics)."""

    def __init__(self, request: Request, tenant: Tenant, producer: Producer, cluster: str, topic: str) -> None:
        self.request = request
        self.tenant = tenant
        self.producer = producer
        self.topic = topic
        self.prefix = result_prefix(cluster, topic)
        self.metrics = request.app.state.metrics

    async def __call__(self, records: list[V3Record]) -> bytes:
        topic = self.topic
        try:
            if not is_legal_topic_name(topic):
                raise UnknownTopicError(topic)
            partitions = await partitions_or_create(self.request.app.state.settings, self.producer, topic,
                                                    catalog(self.request, self.tenant), self.tenant)
        except UnknownTopicError:
            return error_result(40401, missing_topic(self.request.app.state.settings, topic, self.tenant)) \
                * len(records)
        except KafkaError as exc:
            return error_result(*_exception_result(exc)) * len(records)
        out: list[bytes | None] = [None] * len(records)
        send: list[tuple[Any, ...]] = []
        where: list[int] = []
        for i, r in enumerate(records):
            if r.partition is not None and r.partition not in partitions:
                out[i] = error_result(40402, f"partition {r.partition} of topic {topic!r} not found")
            else:
                send.append((r.key, r.value, r.headers, r.partition, r.timestamp))
                where.append(i)
        acked = acked_bytes = failed = 0
        failures: list[Any] = []
        if send:
            try:
                results = await self.producer.send_many(topic, send)
            except KafkaError as exc:
                failed = len(send)
                err = error_result(*_exception_result(exc))
                for i in where:
                    out[i] = err
            else:
                for i, res in zip(where, results, strict=True):
                    rec = records[i]
                    if type(res) is RecordMetadata:
                        out[i] = success_result(self.prefix, rec, res)
                        acked += 1
                        acked_bytes += rec.size
                    else:
                        # type(res) is ...: no narrowing of the else branch
                        out[i] = error_result(failure_code(res), failure_text(res))  # type: ignore[arg-type]  # broker text: logged
                        failures.append(res)
                        failed += 1
        if failures:
            failure_texts(failures)
        tid = self.tenant.id
        if acked:
            self.metrics.produced_records.add(tid, acked)
            self.metrics.produced_bytes.add(tid, acked_bytes)
        if failed:
            self.metrics.produce_failures.add(tid, failed)
        return b"".join(out)  # type: ignore[arg-type]  # every slot is set


# -- the route -----------------------------------------------------------------------------------------------
def _schema_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_DATA_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "description": "A key or value: `type` BINARY (data: base64), JSON (data: any JSON value, stored as its compact "
                   "JSON text) or STRING (data: text, stored as UTF-8); null or absent data is a null key/value. "
                   "AVRO, PROTOBUF, JSONSCHEMA or no type need a schema registry: that record fails with 42208. "
                   "The schema fields are accepted and ignored with the embedded types.",
    "properties": {
        "type": {"type": "string", "enum": ["BINARY", "JSON", "STRING", "AVRO", "PROTOBUF", "JSONSCHEMA"]},
        "data": {"description": "the data, as the type says"},
        "subject": {"type": ["string", "null"]},
        "subject_name_strategy": {"type": ["string", "null"]},
        "schema_id": {"type": ["integer", "null"]},
        "schema_version": {"type": ["integer", "null"]},
        "schema": {"type": ["string", "null"]},
    },
    "additionalProperties": False,
}

REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "V3ProduceRequest",
    "description": "One record. To produce several, send several of these objects one after the other in the body "
                   "(concatenated JSON; whitespace between them is fine): each gets its result, in order.",
    "properties": {
        "partition_id": {"type": ["integer", "null"], "minimum": 0, "maximum": INT32_MAX,
                         "description": "default: by key (murmur2, as the Java client), else a sticky partition"},
        "headers": {"type": "array", "items": {
            "type": "object", "title": "V3ProduceRequestHeader", "required": ["name"], "additionalProperties": False,
            "properties": {"name": {"type": "string"},
                           "value": {"type": ["string", "null"], "format": "byte", "description": "base64"}}}},
        "key": _DATA_SCHEMA,
        "value": _DATA_SCHEMA,
        "timestamp": {"type": ["string", "null"], "format": "date-time",
                      "description": "RFC 3339 (with a time zone offset); default: the time the gateway read the "
                                     "record"},
    },
    "additionalProperties": False,
}

_RESULT_DATA: dict[str, Any] = {
    "type": "object", "title": "V3ProduceResponseData", "required": ["type", "size"],
    "properties": {"type": {"type": "string", "enum": ["BINARY", "JSON", "STRING"]},
                   "size": {"type": "integer", "description": "bytes stored; -1 for null data"}},
}

RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "V3ProduceResponse",
    "description": "One result per record, in order, each followed by CRLF. `error_code` 200: the broker acknowledged "
                   "the record (cluster_id, topic_name, partition_id, offset, timestamp; key/value when the record "
                   "had one). Any other `error_code`: the record failed, `message` says why (the other fields are "
                   "absent); the stream goes on with the next record.",
    "required": ["error_code"],
    "properties": {
        "error_code": {"type": "integer"},
        "message": {"type": "string"},
        "cluster_id": {"type": "string"},
        "topic_name": {"type": "string"},
        "partition_id": {"type": "integer"},
        "offset": {"type": "integer", "format": "int64"},
        "timestamp": {"type": "string", "format": "date-time"},
        "key": _RESULT_DATA,
        "value": _RESULT_DATA,
    },
}

_OPENAPI: dict[str, Any] = {
    "requestBody": {"required": True, "content": {V3_JSON: {"schema": REQUEST_SCHEMA}}},
}

_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "A stream of results, one per record, in order (also for a single record, and also when "
                         "records failed: check each error_code)",
          "content": {V3_JSON: {"schema": RESPONSE_SCHEMA}}},
    401: {}, 403: {}, 404: {}, 413: {}, 415: {}, 422: {}, 429: {},
}


@router.post("/v3/clusters/{cluster_id}/topics/{topic_name}/records", operation_id="produceRecord",
             status_code=200, response_class=ResultStream, responses=_RESPONSES, openapi_extra=_OPENAPI,
             summary="Produce records (one, or a stream of concatenated records) to a topic (Confluent v3)")
async def v3_produce_record(request: Request, cluster_id: str, topic_name: str,
                            tenant: Tenant = Depends(current_tenant)) -> Response:
    ct = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ct and not acceptable_content_type(ct):
        raise GatewayError(f"unsupported content type {ct!r}; send the records as {V3_JSON}", status=415,
                           error_code=41501)
    tenant.require_topic(topic_name)
    cluster = await require_cluster(request, tenant, cluster_id)
    gateway = request.app.state.gateway
    if gateway.draining:
        raise ShuttingDown("the gateway is shutting down; send the records to another replica",
                           headers={"Retry-After": "1"})
    # The body limit applies per record here (ObserveMiddleware stops counting the whole body)
    request.state.body_limit_per_record = True
    producing = _Producing(request, tenant, producer_for(request, tenant), cluster, topic_name)
    pipeline = ProducePipeline(request.stream(), producing, request.app.state.settings.max_body_bytes,
                               gateway.on_drain)
    pipeline.start()
    try:
        started = await pipeline.first()
    except BaseException:
        await pipeline.close()
        raise
    if not started:
        await pipeline.close()
        raise GatewayError("the request body is empty; send one or more JSON records", status=422,
                           error_code=42208)
    return ResultStream(pipeline)

