"""Records to response bytes, without a model object per record.

Both formats render one partition chunk at a time into a single ``bytes`` whose records are joined by a
caller-chosen separator, so a JSON array, an ndjson stream and an SSE stream are all a join away:

- binary: ``{"topic","partition","offset","timestamp","key","value","headers"}`` with base64 key, value and
  header values.
- json: key and value are embedded JSON. A value that is valid JSON (RFC 8259) is spliced in as it arrived,
  never re-serialised (the C path drops the whitespace outside strings; the Python path only compacts a
  value containing a line break), so ndjson/SSE stay one record per line; one that is not JSON is still
  delivered (never lose a record): ``null`` plus ``<field>_error`` and ``<field>_base64``.

Both are written by the C accelerator (``service.protocol._crecords.render``) when it is available, else
by the pure-Python fallbacks below; tests run both against the same records.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from service.consumer.subscription import TopicPartition
from service.protocol import records as _records
from service.protocol.records import Record
from service.schemas.codecs import DecodeError
from service.schemas.jsonschema_format import value_depth

Chunks = list[tuple[TopicPartition, list[Record]]]

_b64 = binascii.b2a_base64


class Rendered(NamedTuple):
    parts: list[bytes]  # one per non-empty chunk: its records joined by the separator
    count: int  # type: ignore[assignment]  # records (shadows tuple.count, on purpose)
    payload: int  # key + value bytes (the bytes-delivered metric)

    # Each framing copies the (possibly multi-megabyte) parts exactly once.
    def array(self) -> bytes:
        return self._framed(b"[", b",", b"]")

    def ndjson(self) -> bytes:
        return self._framed(b"", b"\n", b"\n")

    def sse(self) -> bytes:
        return self._framed(b"data: ", b"\n\ndata: ", b"\n\n")

    def _framed(self, lead: bytes, sep: bytes, trail: bytes) -> bytes:
        pieces = [lead]
        for i, part in enumerate(self.parts):
            if i:
                pieces.append(sep)
            pieces.append(part)
        pieces.append(trail)
        return b"".join(pieces)


# The separator a framing needs between two records inside one part.
ARRAY_SEP = b","
NDJSON_SEP = b"\n"
SSE_SEP = b"\n\ndata: "


def _head(tp: TopicPartition) -> bytes:
    return b'{"topic":%s,"partition":%d,"offset":' % (orjson.dumps(tp.topic), tp.partition)


def _b64json(v: bytes | None) -> bytes:
    return b'"' + _b64(v, newline=False) + b'"' if v is not None else b"null"


def _headers_binary(headers: tuple[tuple[str, bytes | None], ...]) -> bytes:
    if not headers:
        return b"[]"
    return b"[" + b",".join(b'{"key":%s,"value":%s}' % (orjson.dumps(k), _b64json(v)) for k, v in headers) + b"]"


def _payload(recs: list[Record]) -> int:
    return sum((len(r.key) if r.key is not None else 0) + (len(r.value) if r.value is not None else 0) for r in recs)


def render_binary_chunk_py(recs: list[Record], head: bytes, sep: bytes) -> tuple[bytes, int]:
    out = [b'%s%d,"timestamp":%d,"key":%s,"value":%s,"headers":%s}' % (
        head, r.offset, r.timestamp, _b64json(r.key), _b64json(r.value), _headers_binary(r.headers)) for r in recs]
    return sep.join(out), _payload(recs)


_crecords = getattr(_records, "_crecords", None)
if _crecords is not None and not hasattr(_crecords, "render"):  # a module built from an older source
    _crecords = None
Renderer = Callable[[list[Record], bytes, bytes], tuple[bytes, int]]


def _c_binary(recs: list[Record], head: bytes, sep: bytes) -> tuple[bytes, int]:
    return _crecords.render(recs, head, sep, False)  # type: ignore[union-attr]


def _c_json(recs: list[Record], head: bytes, sep: bytes) -> tuple[bytes, int]:
    return _crecords.render(recs, head, sep, True)  # type: ignore[union-attr]


render_binary_chunk: Renderer = render_binary_chunk_py
render_json_chunk: Renderer = render_binary_chunk_py  # replaced below


def use_c_renderer(enabled: bool) -> None:
    """Switch between the C and the pure-Python renderers (tests)."""
    global render_binary_chunk, render_json_chunk
    if enabled and _crecords is None:
        raise ImportError("service.protocol._crecords is not available")
    render_binary_chunk = _c_binary if enabled else render_binary_chunk_py
    render_json_chunk = _c_json if enabled else render_json_chunk_py


def _render(chunks: Chunks, sep: bytes, chunk_renderer: Renderer) -> Rendered:
    parts: list[bytes] = []
    count = payload = 0
    for tp, recs in chunks:
        if recs:
            body, n = chunk_renderer(recs, _head(tp), sep)
            parts.append(body)
            count += len(recs)
            payload += n
    return Rendered(parts, count, payload)


def render_binary(chunks: Chunks, sep: bytes = ARRAY_SEP) -> Rendered:
    return _render(chunks, sep, render_binary_chunk)


_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError


#: the deepest nesting the json format embeds (the C validator's JSON_MAX_DEPTH; orjson alone reads 1024)
JSON_MAX_DEPTH = 512


def _embedded(v: bytes | None, field: bytes) -> bytes:
    if v is None:
        return b'"%s":null' % field
    try:
        parsed = _loads(v)
        if len(v) > 2 * JSON_MAX_DEPTH and value_depth(parsed, JSON_MAX_DEPTH):  # 513 levels take 1026 bytes
            raise _JSONDecodeError("too deep", "", 0)
    except _JSONDecodeError:
        return b'"%s":null,"%s_error":"not valid JSON","%s_base64":"%s"' % (
            field, field, field, _b64(v, newline=False))
    if b"\n" in v or b"\r" in v:  # one record per line in ndjson / SSE
        try:
            v = _dumps(parsed)
        except TypeError:  # deeper than orjson writes (254): the standard library's compact text
            v = json.dumps(parsed, separators=(",", ":"), ensure_ascii=False).encode()
    return b'"%s":%s' % (field, v)


def render_json_chunk_py(recs: list[Record], head: bytes, sep: bytes) -> tuple[bytes, int]:
    out = [b'%s%d,"timestamp":%d,%s,%s,"headers":%s}' % (
        head, r.offset, r.timestamp, _embedded(r.key, b"key"), _embedded(r.value, b"value"),
        _headers_binary(r.headers)) for r in recs]  # header values are base64 in both formats
    return sep.join(out), _payload(recs)


def render_json(chunks: Chunks, sep: bytes = ARRAY_SEP) -> Rendered:
    return _render(chunks, sep, render_json_chunk)


def render_array_py(chunks: Chunks, json: bool) -> tuple[bytes, int, int]:
    out = render_json(chunks) if json else render_binary(chunks)
    return out.array(), out.count, out.payload


def _c_array(chunks: Chunks, json: bool) -> tuple[bytes, int, int]:
    # the whole JSON array in one C buffer (no per-chunk bytes, no join copy)
    return _crecords.render_framed(  # type: ignore[union-attr]
        [(recs, _head(tp)) for tp, recs in chunks if recs], ARRAY_SEP, json, b"[", b"]")


def render_ndjson_py(chunks: Chunks, json: bool, resume: bytes | None) -> tuple[bytes, int, int]:
    out = render_json(chunks, NDJSON_SEP) if json else render_binary(chunks, NDJSON_SEP)
    if resume is None or not out.count:
        return out.ndjson(), out.count, out.payload
    pieces: list[bytes | memoryview] = []
    for i, part in enumerate(out.parts):
        if i:
            pieces.append(NDJSON_SEP)
        pieces.append(part)
    pieces[-1] = memoryview(pieces[-1])[:-1]  # the last record's closing brace
    pieces += (b',"resume":"', resume, b'"}\n')
    return b"".join(pieces), out.count, out.payload


def render_ndjson(chunks: Chunks, json: bool, resume: bytes | None) -> tuple[bytes, int, int]:
    """A stream write of binary or json-format records, one per line; with ``resume``, the last record carries
    ``"resume":"<resume>"`` (the stream's resume token after it). (body, records, key + value bytes), in one
    buffer with the C renderer (no per-chunk bytes, no join copy)."""
    if render_binary_chunk is _c_binary and _crecords is not None and hasattr(_crecords, "render_framed"):
        items = [(recs, _head(tp)) for tp, recs in chunks if recs]
        if not items:
            resume = None  # no record to carry it
        trail = b"\n" if resume is None else b',"resume":"' + resume + b'"}\n'
        return _crecords.render_framed(
            items, NDJSON_SEP, json, b"", trail, resume is not None)
    return render_ndjson_py(chunks, json, resume)


def render_array(chunks: Chunks, json: bool) -> tuple[bytes, int, int]:
    """A poll's binary (``json`` false) or json-format records as one JSON array: (body, records, key + value
    bytes); the same bytes as ``render_binary(chunks).array()`` / ``render_json(chunks).array()``."""
    if render_binary_chunk is _c_binary and _crecords is not None and hasattr(_crecords, "render_framed"):
        return _c_array(chunks, json)
    return render_array_py(chunks, json)


use_c_renderer(_crecords is not None)


# -- schema'd formats (avro, protobuf, jsonschema) ----------------------------------------------------------------
# Keys and values were decoded by service.schemas (SchemaResolver.decode): each is its JSON value, None, or a
# DecodeError, rendered as the json format renders a value that is not JSON: null plus "<field>_error" (why)
# and "<field>_base64" (the record's bytes), so an undecodable record is still delivered, never lost.
Decoded = list[tuple[list[Any], list[Any]]]  # per chunk: (keys, values)


def _error_field(field: bytes, message: str, raw: bytes | None) -> bytes:
    return b'"%s":null,"%s_error":%s,"%s_base64":%s' % (field, field, _dumps(message), field, _b64json(raw))


def _decoded_field(v: Any, raw: bytes | None, field: bytes, bound: list[int] | None = None) -> bytes:
    """The field of a decoded value; ``bound`` (Avro): a value over the byte bound of its payload is an error,
    counted in ``bound[0]``."""
    if v is None:
        return b'"%s":null' % field
    if isinstance(v, DecodeError):
        return _error_field(field, v.message, raw)
    try:
        text = _dumps(v, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:  # a decoded value JSON cannot hold (should not happen: the codecs render JSON)
        return _error_field(field, f"not renderable as JSON: {exc}", raw)
    if bound is not None and raw is not None and len(text) > _avro_limits.LIMITS.max_out(len(raw) - 5):
        # the C renderer's byte bound (service/schemas/avro_limits.py), checked on what the Python path wrote
        bound[0] += 1
        return _error_field(field, _avro_limits.refusal_message(_avro_limits.R_BYTES, len(raw) - 5), raw)
    return b'"%s":%s' % (field, text)


def render_decoded_chunk(recs: list[Record], keys: list[Any], values: list[Any], head: bytes,
                         sep: bytes, bound: list[int] | None = None) -> tuple[bytes, int]:
    out = [b'%s%d,"timestamp":%d,%s,%s,"headers":%s}' % (
        head, r.offset, r.timestamp, _decoded_field(k, r.key, b"key", bound),
        _decoded_field(v, r.value, b"value", bound),
        _headers_binary(r.headers)) for r, k, v in zip(recs, keys, values, strict=True)]
    return sep.join(out), _payload(recs)


def render_decoded(chunks: Chunks, decoded: Decoded, sep: bytes = ARRAY_SEP,
                   bound: list[int] | None = None) -> Rendered:
    """Chunks whose keys and values ``decoded`` holds (one ``(keys, values)`` per chunk, in order); ``bound``
    (Avro): a value rendering to more than its byte bound is its per-record error (as the C renderer does),
    counted in ``bound[0]``."""
    parts: list[bytes] = []
    count = payload = 0
    for (tp, recs), (keys, values) in zip(chunks, decoded, strict=True):
        if recs:
            body, n = render_decoded_chunk(recs, keys, values, _head(tp), sep, bound)
            parts.append(body)
            count += len(recs)
            payload += n
    return Rendered(parts, count, payload)


# -- avro through the C renderer (service.schemas._cavro) ----------------------------------------------------
# The avro hot path: every key and value a compiled program covers is rendered in C straight from its bytes
# to the JSON that render_decoded_chunk writes for it; each other one (not framed, unknown id, a payload the C
# code does not decode, ...) is rendered by ``fallback(field, raw)``, the Python path for that one field. A
# value over the decode limits (service/schemas/avro_limits.py) is ``refuse(field, raw, code)``: its per-record
# error, the text the Python path gives it.
from service.schemas import avro_fast as _avro_fast  # noqa: E402
from service.schemas import avro_limits as _avro_limits  # noqa: E402

_cavro = _avro_fast._cavro
AvroFallback = Callable[[bytes, bytes], bytes]
AvroRefuse = Callable[[bytes, bytes, int], bytes]


def use_c_avro(enabled: bool) -> None:
    """Switch render_schema_chunks between the C avro renderer and the Python path (tests, benches)."""
    global _cavro
    if enabled and _avro_fast._cavro is None:
        raise ImportError(f"service.schemas._cavro is not available: {_avro_fast.C_IMPORT_ERROR}")
    _cavro = _avro_fast._cavro if enabled else None


def _as_list(recs: Any) -> list[Record]:
    """The C avro renderer takes lists; a poll's chunk may be a RecordRun (service/fetch/fetcher.py)."""
    return recs if type(recs) is list else list(recs)


def chunk_schema_ids(chunks: Chunks) -> set[int]:
    """The schema ids of the framed keys and values of the chunks (what ``resolver.prepare`` needs)."""
    ids: set[int] = set()
    if _avro_fast._cavro is not None:
        for _, recs in chunks:
            if recs:
                ids |= _avro_fast._cavro.schema_ids(_as_list(recs))
        return ids
    for _, recs in chunks:
        for r in recs:
            for p in (r.key, r.value):
                if p is not None and len(p) >= 5 and p[0] == 0:
                    ids.add(int.from_bytes(p[1:5], "big"))
    return ids


def render_avro(chunks: Chunks, sep: bytes, programs: dict[int, Any], fallback: AvroFallback,
                refuse: AvroRefuse | None = None) -> Rendered:
    """Avro chunks rendered by the C renderer: ``programs`` maps schema ids to compiled programs; a value over
    the limits of :mod:`service.schemas.avro_limits` is ``refuse(field, raw, code)`` (default: its per-record
    error), never the fallback."""
    assert _cavro is not None
    refuse = refuse if refuse is not None else _refuse([0])
    limits = _avro_limits.limits_tuple()
    parts: list[bytes] = []
    count = payload = 0
    for tp, recs in chunks:
        if recs:
            body, n = _cavro.render_chunk(_as_list(recs), _head(tp), sep, programs, fallback, refuse, limits)
            parts.append(body)
            count += len(recs)
            payload += n
    return Rendered(parts, count, payload)


def _field_fallback(resolver: Any, fmt: str, rendering: str | None, errors: list[int]) -> AvroFallback:
    def fallback(field: bytes, raw: bytes) -> bytes:
        (v,) = resolver.decode(fmt, [raw], rendering=rendering)  # AvroCodec scans before fastavro reads
        if isinstance(v, DecodeError):
            errors[0] += 1
        return _decoded_field(v, raw, field, errors if fmt == "avro" else None)
    return fallback


def _refuse(errors: list[int]) -> AvroRefuse:
    """The per-record error of a value the C renderer refused (the text the Python path gives it)."""
    def refuse(field: bytes, raw: bytes, code: int) -> bytes:
        errors[0] += 1
        sid = int.from_bytes(raw[1:5], "big")
        return _decoded_field(DecodeError("avro", sid, _avro_limits.refusal_message(code, len(raw) - 5)), raw,
                              field)
    return refuse


def _avro_programs(resolver: Any, rendering: str | None, ids: set[int]) -> dict[int, Any] | None:
    """Schema id -> program for every resolved Avro id; None if one of them has a codec but no program."""
    programs: dict[int, Any] = {}
    for sid in ids:
        resolved = resolver.cached(sid)
        if resolved is None or resolved.schema_type != "AVRO" or isinstance(resolved.codec, Exception):
            continue  # its records become per-record errors: the fallback renders them
        try:
            program = resolver.avro_program(sid, rendering)
        except Exception:  # a rendering that does not compile: the Python path reports it per record
            return None
        if program is None:
            return None
        programs[sid] = program
    return programs


def render_schema_chunks(resolver: Any, fmt: str, rendering: str | None, chunks: Chunks,
                         sep: bytes = ARRAY_SEP, on_errors: Callable[[int], None] | None = None) -> Rendered:
    """Chunks of a schema'd format rendered after ``await resolver.prepare(chunk_schema_ids(chunks))``: avro
    by the C renderer when it is available and covers every schema id, else (and for protobuf, jsonschema)
    by ``resolver.decode`` + :func:`render_decoded`. The same bytes either way. ``on_errors(n)`` is called
    with the number of keys and values that did not decode (per-record errors), when there are any."""
    if fmt == "avro" and _cavro is not None:
        programs = _avro_programs(resolver, rendering, chunk_schema_ids(chunks))
        if programs is not None:
            errors = [0]
            out = render_avro(chunks, sep, programs, _field_fallback(resolver, fmt, rendering, errors),
                              _refuse(errors))
            if errors[0] and on_errors is not None:
                on_errors(errors[0])
            return out
    keys = [r.key for _, recs in chunks for r in recs]
    values = [r.value for _, recs in chunks for r in recs]
    dk = resolver.decode(fmt, keys, rendering=rendering)
    dv = resolver.decode(fmt, values, rendering=rendering)
    decoded: Decoded = []
    i = 0
    for _, recs in chunks:
        n = len(recs)
        decoded.append((dk[i:i + n], dv[i:i + n]))
        i += n
    bound = [0] if fmt == "avro" else None
    out = render_decoded(chunks, decoded, sep, bound)
    if on_errors is not None:
        n = sum(1 for v in dk if isinstance(v, DecodeError)) + sum(1 for v in dv if isinstance(v, DecodeError))
        n += bound[0] if bound is not None else 0  # values over the byte bound, found while rendering
        if n:
            on_errors(n)
    return out
