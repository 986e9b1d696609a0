"""Schema'd records -> typed Arrow columns: decoding, with one reader schema per column. Sans-io.

Used by the typed range reads (``GET /topics/{t}/partitions/{p}/records?format=avro`` with Arrow output) and,
through them, by the Spark sink. Values are decoded into Python values (not the REST Proxy's JSON renderings)
and handed to pyarrow, which builds nested arrays in C; the types come from :mod:`service.schemas.arrow_types`.

Speed: Avro records are read column-wise (:mod:`service.schemas.avro_columns`, numpy), those of another
writer schema too where their resolution into the reader's is plain on columns; the rest (decimals,
recursive types, aliases, ...) goes through fastavro (all records of one writer in one call, as the Avro
encoding of an array of them), then pyarrow.

Schema evolution: a set of records written with several writer schemas is read with ONE reader schema, so
it has one Arrow type: the caller picks it (by default the latest writer schema id seen; see
:func:`decode_column`). Avro records are resolved into the reader schema by Avro's schema resolution
(fastavro with writer and reader schema: a field the reader added takes its default, a field it dropped is
skipped, promotions such as int -> long apply). Protobuf payloads are parsed with the reader schema's
message class (fields are matched by number, unknown ones skipped); a record of another message type
(by full name) than the reader's is an error row. JSON Schema values are taken as they are and fitted to
the reader's columns (properties the reader does not know are dropped, missing ones are null). A record
that cannot be read so (an incompatible Avro writer schema, a type mismatch, no magic byte, an unknown
schema id, a schema of another format) is not fatal: its value is null and the row's error text says
why (see :class:`TypedColumn`); the range read answers it with the other rows.
"""

from __future__ import annotations

import io
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from fastavro import parse_schema, schemaless_reader

from service.schemas.arrow_types import (
    AVRO_PRIMITIVE,
    SCHEMA_TYPE_OF,
    ArrowMappingError,
    avro_mapping,
    jsonschema_mapping,
    protobuf_mapping,
    strip_logical,
)
from service.schemas.avro import AvroCodec, load_schema
from service.schemas.avro_limits import R_MALFORMED, refusal_message
from service.schemas.registry import CacheBudget, LRUCache
from service.schemas.wire import WireFormatError, unframe


# ------------------------------------------------------------------------------------- decoding to columns
@dataclass(slots=True)
class TypedColumn:
    """A column of decoded keys or values: ``array`` (the reader schema's Arrow type; null where there was no
    payload or it did not decode), the schema id of each framed payload (None for null payloads and
    unframed ones), the error text of each row (None when fine), and the reader schema id (None: no schema
    known, the array is of type null)."""

    array: pa.Array
    schema_ids: list[int | None]
    errors: list[str | None]
    reader_id: int | None


class Reader:
    """One reader schema, compiled for Arrow, with the writer schemas it has resolved (thread-safe)."""

    def __init__(self, fmt: str, resolved: Any, message_indexes: Sequence[int] | None = None) -> None:
        self.format = fmt
        self.schema_id: int = resolved.schema_id
        self._lock = threading.Lock()
        self._writers: dict[int, Any] = {}
        self.columns: Any = None
        self._writer_columns: dict[int, Any] = {}  # writer id -> (its columnar reader or None, its schema data)
        self._schema_data: Any = None
        self._array_schemas: dict[int, Any] = {}  # id(parsed writer) -> array-of-writer, array-of-reader
        if fmt == "avro":
            data = load_schema(resolved.schema.schema)
            self.mapped = avro_mapping(data)
            from service.schemas.avro_columns import compile_schema

            self.columns = compile_schema(data, self.mapped.type)  # vectorised reader of its own records
            self._schema_data = data
            self._reader_data = strip_logical(data)
            self._tags = _needs_tags(data)  # unions of several named types: fastavro names the branch read
            try:
                self._fast_reader = parse_schema(self._reader_data, {})
            except Exception as exc:  # fastavro's SchemaParseException and friends
                raise ArrowMappingError(f"avro schema {resolved.schema_id}: {exc}") from None
        elif fmt == "protobuf":
            codec = resolved.codec
            if isinstance(codec, Exception):
                raise ArrowMappingError(str(codec))
            self._codec = codec
            self._class = codec.message_class(tuple(message_indexes or (0,)))
            self.message_name: str = self._class.DESCRIPTOR.full_name
            self.mapped = protobuf_mapping(self._class.DESCRIPTOR)
        elif fmt == "jsonschema":
            if isinstance(resolved.codec, Exception):  # e.g. a $ref that does not resolve, nested too deeply
                raise ArrowMappingError(str(resolved.codec))
            try:
                self.mapped = jsonschema_mapping(resolved.schema.schema, resolved.references or None)
            except (LookupError, TypeError, ValueError, RecursionError) as exc:  # a pointer into nothing
                raise ArrowMappingError(f"jsonschema schema {resolved.schema_id}: {exc!r}") from None
        else:
            raise ArrowMappingError(f"unknown format {fmt!r}")

    @property
    def type(self) -> pa.DataType:
        return self.mapped.type

    def read_columns(self, payloads: list[Any], resolved: Any) -> pa.Array | None:
        """Avro payloads of one writer schema read column-wise (:mod:`service.schemas.avro_columns`) into
        :attr:`type`, resolved from the writer's schema on the columns where that is plain; None when the
        schema or a payload needs the record-by-record path."""
        if self.format != "avro" or len(payloads) < _ARRAY_MIN:
            return None
        from service.schemas.avro_columns import CannotResolve, compile_schema, resolve

        sid = resolved.schema_id
        if sid == self.schema_id:
            return self.columns.read(payloads) if self.columns is not None else None
        with self._lock:
            hit = self._writer_columns.get(sid)
        if hit is None:
            try:
                data = load_schema(resolved.schema.schema)
                hit = (compile_schema(data, avro_mapping(data).type), data)
            except Exception:  # a writer schema that does not even map: the fallback names the problem
                hit = (None, None)
            with self._lock:
                self._writer_columns[sid] = hit
        columns, data = hit
        if columns is None:
            return None
        arr = columns.read(payloads)
        if arr is None:
            return None
        try:
            return resolve(data, self._schema_data, arr, self.type)
        except CannotResolve:
            return None

    def _avro_writer(self, resolved: Any) -> Any:
        """The parsed writer schema of ``resolved`` (None: the reader's own id)."""
        sid = resolved.schema_id
        if sid == self.schema_id:
            return None
        with self._lock:
            hit = self._writers.get(sid)
        if hit is None:
            try:
                data = strip_logical(load_schema(resolved.schema.schema))
                hit = (parse_schema(data, {}), data)
            except Exception as exc:
                hit = ArrowMappingError(f"avro schema {sid}: {exc}")
            with self._lock:
                self._writers[sid] = hit
        return hit

    def decode(self, payloads: list[Any], indexes: list[Any] | None, resolved: Any) -> list[Any]:
        """Unframed payloads of one writer schema (and, for Protobuf, their message indexes) -> Python values
        fitting :attr:`type`, or an error text (a str subclass: :class:`RowError`) in the place of one that
        cannot be read."""
        fmt = self.format
        out: list[Any] = []
        append = out.append
        if fmt == "avro":
            got = self._avro_writer(resolved)
            if isinstance(got, Exception):
                return [RowError(str(got))] * len(payloads)
            if got is None:
                writer, reader, wdata, rdata = self._fast_reader, None, self._reader_data, None
            else:
                (writer, wdata), reader, rdata = got, self._fast_reader, self._reader_data
            conv = self.mapped.convert
            tags = self._tags
            batch = _read_avro_batch(payloads, resolved.schema_id, wdata, rdata, self._array_schemas, tags)
            if batch is not None:
                return [conv(v) for v in batch] if conv is not None else batch
            read, bio = schemaless_reader, io.BytesIO
            for payload in payloads:
                try:
                    v = (read(bio(payload), writer, reader, False, False, "strict", True, True) if tags
                         else read(bio(payload), writer, reader))
                    append(conv(v) if conv is not None else v)
                except Exception as exc:  # a payload that is not Avro of its schema, an unresolvable schema
                    append(RowError(_avro_reason(exc, resolved.schema_id, self.schema_id)))
            return out
        if fmt == "protobuf":
            wcodec = resolved.codec
            conv = self.mapped.convert
            assert conv is not None
            for payload, message_indexes in zip(payloads, indexes or [None] * len(payloads), strict=True):
                try:
                    if resolved.schema_id != self.schema_id:
                        if isinstance(wcodec, Exception):
                            raise ValueError(str(wcodec))
                        name = wcodec.message_class(tuple(message_indexes or (0,))).DESCRIPTOR.full_name
                    else:
                        name = self._codec.message_class(tuple(message_indexes or (0,))).DESCRIPTOR.full_name
                    if name != self.message_name:
                        raise ValueError(f"a {name} message (schema id {resolved.schema_id}); this range is "
                                         f"read as {self.message_name} (schema id {self.schema_id})")
                    append(conv(self._class.FromString(bytes(payload))))
                except Exception as exc:
                    append(RowError(f"protobuf: {exc}"))
            return out
        conv = self.mapped.convert
        for payload in payloads:
            try:
                v = orjson.loads(payload)
                append(conv(v) if conv is not None else v)
            except Exception as exc:
                append(RowError(f"jsonschema: not valid JSON: {exc}"))
        return out


_ARRAY_MIN = 8  # groups this small are read record by record


def _varint(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _needs_tags(schema: Any) -> bool:
    """Whether a union of the schema has two or more named branches (a record, enum or fixed, defined there
    or by name): only then must fastavro tag values with their type name (slower)."""
    if isinstance(schema, list):
        named = sum(1 for b in schema if (isinstance(b, str) and b not in AVRO_PRIMITIVE)
                    or (isinstance(b, dict) and b.get("type") in ("record", "error", "enum", "fixed")))
        return named >= 2 or any(_needs_tags(b) for b in schema)
    if isinstance(schema, dict):
        if any(_needs_tags(schema.get(k)) for k in ("type", "items", "values")):
            return True
        return any(_needs_tags(f.get("type")) for f in schema.get("fields") or [] if isinstance(f, dict))
    return False


def _read_avro_batch(payloads: list[Any], writer_id: int, writer: Any, reader: Any,
                     array_schemas: dict[int, Any], tags: bool = True) -> list[Any] | None:
    """All payloads of one writer schema read in ONE fastavro call: Avro records are self-delimiting, so the
    payloads concatenated behind an item count (and a 0 after them) are the Avro encoding of an array of
    them, which fastavro's compiled reader walks without a Python call per record. The read must consume
    exactly the bytes given and yield exactly one value per payload; anything else (a payload that does not
    decode, one with trailing bytes) returns None and the caller reads record by record, so that each
    record gets its own value or error. ``writer`` / ``reader``: the schemas as data (reader None: the
    writer's own)."""
    if len(payloads) < _ARRAY_MIN:
        return None
    schemas = array_schemas.get(writer_id)
    if schemas is None:
        w = parse_schema({"type": "array", "items": writer}, {})
        r = None if reader is None else parse_schema({"type": "array", "items": reader}, {})
        schemas = array_schemas[writer_id] = (w, r)
    buf = b"".join((_varint(len(payloads)), *payloads, b"\x00"))
    bio = io.BytesIO(buf)
    try:
        values = (schemaless_reader(bio, schemas[0], schemas[1], False, False, "strict", True, True) if tags
                  else schemaless_reader(bio, schemas[0], schemas[1]))
    except Exception:
        return None
    if not isinstance(values, list) or len(values) != len(payloads) or bio.tell() != len(buf):
        return None
    return values


class RowError(str):
    """The error text of a row (a str, so that it is told apart from decoded values by its class)."""


def _avro_reason(exc: BaseException, writer: int, reader: int) -> str:
    name = type(exc).__name__
    if "Resolution" in name:
        return f"avro: schema id {writer} cannot be read as schema id {reader}: {exc}"
    text = str(exc) or name
    return f"avro: payload is not Avro of schema id {writer}: {text}"


class ReaderCache:
    """Compiled readers per (format, reader id, message indexes), bounded LRU; thread-safe. With a
    ``budget`` (the registry's schema cache budget), a reader is charged 64 bytes per byte of its schema."""

    def __init__(self, size: int = 256, budget: CacheBudget | None = None) -> None:
        self.size = size
        self._data: LRUCache[tuple[Any, ...], Reader | Exception] = LRUCache(size, budget)
        self._seen: LRUCache[tuple[str, int], bool] = LRUCache(4 * size)  # ids of pages built before

    def warm(self, fmt: str, ids: Iterable[int]) -> bool:
        """Whether pages naming these ids were built before (their readers are likely compiled)."""
        return all(self._seen.get((fmt, i)) for i in ids)

    def saw(self, fmt: str, ids: Iterable[int]) -> None:
        for i in ids:
            self._seen.put((fmt, i), True)

    def get(self, fmt: str, resolved: Any, message_indexes: Sequence[int] | None = None) -> Reader:
        key = (fmt, resolved.schema_id, tuple(message_indexes or (0,)) if fmt == "protobuf" else None)
        hit = self._data.get(key)
        if hit is None:
            try:
                hit = Reader(fmt, resolved, message_indexes)
                cost = 64 * (getattr(resolved, "size", 0) or len(getattr(resolved.schema, "schema", "")))
            except Exception as exc:  # a schema that does not map: an error for every request naming it
                hit = ArrowMappingError(str(exc)) if not isinstance(exc, ArrowMappingError) else exc
                cost = 0
            self._data.put(key, hit, cost)
        if isinstance(hit, Exception):
            raise hit
        return hit


def framed_ids(payloads: Sequence[bytes | memoryview | None]) -> list[int | None]:
    """The schema id of each framed payload (None for null and unframed payloads)."""
    from_bytes = int.from_bytes
    return [from_bytes(p[1:5], "big") if p is not None and len(p) >= 5 and p[0] == 0 else None for p in payloads]


def pick_reader_id(schema_ids: Sequence[int | None], lookup: Callable[[int], Any], fmt: str) -> int | None:
    """The default reader schema: the id of the last record (by offset) written with a known schema of the
    format (the latest writer schema in the range; ids grow as schemas are registered, but a subject may be
    rolled back to an older version, so the record order, not the id, says what is latest)."""
    want = SCHEMA_TYPE_OF[fmt]
    for sid in reversed(schema_ids):
        if sid is None:
            continue
        r = lookup(sid)
        if r is not None and r.schema_type == want and not isinstance(getattr(r, "codec", None), Exception):
            return sid
    return None


def decode_column(fmt: str, payloads: Sequence[bytes | memoryview | None], lookup: Callable[[int], Any],
                  reader_id: int | None = None, cache: ReaderCache | None = None,
                  message_indexes: Sequence[int] | None = None) -> TypedColumn:
    """Decode framed payloads of one format into one Arrow array of the reader schema's type.

    ``lookup(id)`` gives the registry's schema for an id (a ``ResolvedSchema``: schema_id, schema_type,
    schema, references, codec) or None (unknown); everything must be resolved beforehand (this is sync).
    ``reader_id``: the reader schema (None: :func:`pick_reader_id`). Raises :class:`ArrowMappingError` only
    when the reader schema itself is unusable; every per-record problem is an error row."""
    cache = cache if cache is not None else ReaderCache()
    n = len(payloads)
    ids = framed_ids(payloads)
    if reader_id is None:
        reader_id = pick_reader_id(ids, lookup, fmt)
    errors: list[str | None] = [None] * n
    if reader_id is None:  # nothing decodable: a column of nulls
        for i, p in enumerate(payloads):
            if p is not None:
                errors[i] = _frame_error(fmt, p, ids[i], lookup)
        return TypedColumn(pa.nulls(n), ids, errors, None)
    reader_resolved = lookup(reader_id)
    if reader_resolved is None:
        raise ArrowMappingError(f"reader schema id {reader_id} is not in the schema registry")
    if reader_resolved.schema_type != SCHEMA_TYPE_OF[fmt]:
        raise ArrowMappingError(f"reader schema id {reader_id} is a {reader_resolved.schema_type} schema, not "
                                f"{SCHEMA_TYPE_OF[fmt]} (format {fmt})")
    protobuf = fmt == "protobuf"
    if protobuf and message_indexes is None:  # the reader's message: that of the last record of the reader id
        for p, sid in zip(reversed(payloads), reversed(ids), strict=True):
            if sid == reader_id and p is not None:
                try:
                    message_indexes = unframe(p, protobuf=True).message_indexes
                    break
                except WireFormatError:
                    continue
    reader = cache.get(fmt, reader_resolved, message_indexes)
    pieces: list[tuple[Sequence[int], pa.Array]] = []
    want = SCHEMA_TYPE_OF[fmt]
    usable = {sid for sid in set(ids) if sid is not None and (r := lookup(sid)) is not None
              and r.schema_type == want}
    groups: dict[int, list[int] | None] = {}  # writer id -> its rows (None: every row, the common case)
    if not protobuf and len(usable) == 1 and ids.count(next(iter(usable))) == n:
        groups[next(iter(usable))] = None
    else:
        for i, (p, sid) in enumerate(zip(payloads, ids, strict=True)):
            if p is None:
                continue
            if sid not in usable:
                errors[i] = _frame_error(fmt, p, sid, lookup)
                continue
            rows = groups.get(sid)
            if rows is None:
                rows = groups[sid] = []
            rows.append(i)
    for sid, rows in groups.items():
        picked = payloads if rows is None else [payloads[i] for i in rows]
        indexes: list[Any] | None = None
        if not protobuf:  # framed_ids checked the magic byte and the length: the payload follows the id
            bodies: list[Any] = list(map(_AFTER_HEADER, picked))  # type: ignore[arg-type]  # framed: no None
        else:
            bodies, indexes, kept = [], [], []
            for i, p in zip(rows or range(n), picked, strict=True):
                try:
                    fr = unframe(p, protobuf=True)  # type: ignore[arg-type]
                except WireFormatError as exc:
                    errors[i] = f"{fmt}: {exc}"
                    continue
                bodies.append(fr.payload)
                indexes.append(fr.message_indexes)
                kept.append(i)
            rows = kept
        if fmt == "avro":  # the limits of service/schemas/avro_limits.py, before any reader sees a payload
            refused = _avro_refusals(bodies, lookup(sid))
            if refused:
                kept = []
                for k, i in enumerate(rows or range(n)):
                    if k in refused:
                        errors[i] = refused[k]
                    else:
                        kept.append(i)
                bodies = [b for k, b in enumerate(bodies) if k not in refused]
                rows = kept
        where: Sequence[int] = range(n) if rows is None else rows
        arr = reader.read_columns(bodies, lookup(sid)) if not protobuf else None
        if arr is None:
            decoded = reader.decode(bodies, indexes, lookup(sid))
            group_errors: list[str | None] = [None] * len(decoded)
            if any(type(v) is RowError for v in decoded):
                for k, v in enumerate(decoded):
                    if type(v) is RowError:
                        group_errors[k] = str(v)
                        decoded[k] = None
            arr = _to_array(decoded, reader.type, group_errors)
            for i, e in zip(where, group_errors, strict=True):
                if e is not None:
                    errors[i] = e
        if rows is None:  # one writer schema, every row: the array is the column
            return TypedColumn(arr, ids, errors, reader_id)
        pieces.append((where, arr))
    return TypedColumn(_assemble(pieces, n, reader.type), ids, errors, reader_id)


def _avro_refusals(bodies: list[Any], resolved: Any) -> dict[int, str]:
    """Index -> error text of the payloads over the decode limits (a deep, item- or byte-amplifying value is
    an error row; the readers behind, fastavro's above all, never see it). A writer schema the gateway's Avro
    codec does not take makes every row an error."""
    codec, sid = resolved.codec, resolved.schema_id
    if not isinstance(codec, (AvroCodec, Exception)):  # not compiled by a resolver (tests): compile it here
        try:
            codec = AvroCodec(resolved.schema.schema, references=list((resolved.references or {}).values()))
        except Exception as exc:
            codec = exc
    if not isinstance(codec, AvroCodec):
        return dict.fromkeys(range(len(bodies)), f"avro: schema id {sid}: {codec}")
    out: dict[int, str] = {}
    for k, code in codec.refusals(bodies).items():
        text = refusal_message(code, len(bodies[k]))
        out[k] = (f"avro: payload is not Avro of schema id {sid}: {text}" if code == R_MALFORMED
                  else f"avro: schema id {sid}: {text}")
    return out


def _assemble(pieces: list[tuple[Sequence[int], pa.Array]], n: int, typ: pa.DataType) -> pa.Array:
    """The groups' arrays put back in row order (rows in no group are null)."""
    perm = np.full(n, -1, np.int64)
    offset = 0
    for where, arr in pieces:
        perm[np.asarray(where, np.int64)] = np.arange(offset, offset + len(arr))
        offset += len(arr)
    perm[perm < 0] = offset
    return pa.concat_arrays([a for _, a in pieces] + [pa.nulls(1, typ)]).take(pa.array(perm, pa.int64()))


_AFTER_HEADER = operator.itemgetter(slice(5, None))


def _frame_error(fmt: str, p: bytes | memoryview, sid: int | None, lookup: Callable[[int], Any]) -> str:
    if sid is None:
        try:
            unframe(p)
        except WireFormatError as exc:
            return f"{fmt}: {exc}"
        return f"{fmt}: not a framed payload"
    r = lookup(sid)
    if r is None:
        return f"{fmt}: schema id {sid} not found in the schema registry"
    if not r.schema_type:  # not even parsed (a schema over GATEWAY_SCHEMA_MAX_BYTES)
        return f"{fmt}: schema id {sid}: {r.codec}"
    if r.schema_type != SCHEMA_TYPE_OF[fmt]:
        return f"{fmt}: schema id {sid} is a {r.schema_type} schema, not {SCHEMA_TYPE_OF[fmt]}"
    return f"{fmt}: schema id {sid}: {r.codec}"


def _to_array(values: list[Any], typ: pa.DataType, errors: list[str | None]) -> pa.Array:
    """One array of ``typ``; a value that does not fit it (JSON Schema data against its schema, mostly) makes
    its row an error row instead of failing the column. A struct is built column by column (each field's
    values gathered in C by ``map(itemgetter)``), much faster than pyarrow's per-row dict conversion."""
    try:
        if pa.types.is_struct(typ) and typ.num_fields and all(v is None or type(v) is dict for v in values):
            return _struct_array(values, typ)
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError, KeyError):
        pass
    fixed: list[Any] = []
    for i, v in enumerate(values):
        if v is not None:
            try:
                pa.array([v], typ)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                errors[i] = f"value does not fit the reader schema's column type {typ}: {exc}"
                v = None
        fixed.append(v)
    return pa.array(fixed, typ)


def _struct_array(values: list[Any], typ: pa.StructType) -> pa.Array:
    fields = list(typ)
    names = [f.name for f in fields]
    mask = None
    if None in values:
        empty = dict.fromkeys(names)
        mask = pa.array([v is None for v in values], pa.bool_())
        values = [empty if v is None else v for v in values]
    children = []
    for f in fields:
        get = operator.itemgetter(f.name)
        try:
            column = list(map(get, values))
        except KeyError:  # JSON data without some property: missing is null
            column = [v.get(f.name) for v in values]
        children.append(_to_array_strict(column, f.type))
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _to_array_strict(values: list[Any], typ: pa.DataType) -> pa.Array:
    if pa.types.is_struct(typ) and typ.num_fields and all(v is None or type(v) is dict for v in values):
        return _struct_array(values, typ)
    return pa.array(values, typ)
