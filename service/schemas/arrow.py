"""Schema'd records -> typed Arrow columns: the schema -> Arrow mapping, and decoding. Sans-io.

Used by the typed range reads (``GET /topics/{t}/partitions/{p}/records?format=avro`` with Arrow output) and,
through them, by the Spark sink. Values are decoded into Python values (not the REST Proxy's JSON renderings)
and handed to pyarrow, which builds nested arrays in C.

The mapping (the same for keys and values):

============================  ==========================================================================
Avro                          Arrow
============================  ==========================================================================
record                        struct (fields in schema order, all nullable)
array / map                   list / map<string, T>
``[null, T]`` (either order)  T, nullable
other unions                  struct<member0, member1, ...> of the non-null branches, in schema order, only
                              the written branch set (Spark's ``from_avro`` shape; where the value alone cannot
                              tell two branches apart -- int and long, a string and the union's only enum --
                              the first that fits is set)
enum                          string (the symbol)
fixed, bytes                  binary
date                          date32
time-millis / time-micros     time64[us]
timestamp-millis / -micros    timestamp[ms|us, UTC]; local-timestamp-* without a time zone
decimal                       decimal128(precision, scale)
uuid                          string
a recursive reference         string (the value as JSON text)
============================  ==========================================================================

Protobuf (messages by their descriptor, fields by their proto names): message -> struct, repeated -> list,
map fields -> map, enum -> string (the value's name; a number the enum does not know as its decimal text),
int32/sint32/sfixed32 -> int32, int64/sint64/sfixed64 -> int64, uint32/fixed32 -> int64, uint64/fixed64 ->
decimal128(20, 0), float/double, bool, string, bytes -> binary. A message field without a value is null;
proto3 scalars without presence are their default, as protobuf reads them; the fields of a oneof are
separate nullable columns. Well-known types: Timestamp -> timestamp[us, UTC], Duration -> duration[us],
the wrappers (Int32Value, StringValue, ...) -> their nullable scalar, Struct / Value / ListValue / Empty /
FieldMask / Any's payload and recursive messages -> string (their canonical JSON text), Any ->
struct<type_url: string, value: binary>.

JSON Schema: ``object`` with ``properties`` -> struct; ``object`` with only ``additionalProperties`` (a
schema) -> map<string, T>; ``array`` with ``items`` (a schema) -> list; ``string`` (also ``enum`` of
strings) -> string; ``integer`` -> int64; ``number`` -> float64; ``boolean`` -> bool; a ``type`` list of
``null`` and one type, or ``anyOf`` / ``oneOf`` of ``{"type": "null"}`` and one schema -> that type,
nullable; ``$ref`` (local ``#/...`` pointers and the registry's references by name) followed; everything
else (other unions, ``allOf``, objects without properties, recursion, a schema that is just ``true``) ->
string holding the value as JSON text. A value that does not fit its column (``"x"`` where an integer is
expected) makes the row an error row.

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
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from fastavro import parse_schema, schemaless_reader

from service.schemas.avro import AvroCodec, load_schema
from service.schemas.avro_limits import R_MALFORMED, refusal_message
from service.schemas.registry import CacheBudget, LRUCache
from service.schemas.wire import WireFormatError, unframe

Convert = Callable[[Any], Any]

#: the (schema type in the registry) of each format name
SCHEMA_TYPE_OF = {"avro": "AVRO", "protobuf": "PROTOBUF", "jsonschema": "JSON"}
JSON_TEXT = pa.string()  # the Arrow type of values kept as JSON text


class ArrowMappingError(ValueError):
    """A schema cannot be read into Arrow at all (e.g. the reader schema does not compile)."""


@dataclass(frozen=True, slots=True)
class Mapped:
    """A schema node's Arrow type and the function making a decoded Python value fit it (None: as it is)."""

    type: pa.DataType
    convert: Convert | None = None


def _json_default(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("latin-1")
    if isinstance(v, tuple):
        return list(v)
    return str(v)


def json_text(v: Any) -> str | None:
    """A value as compact JSON text (bytes as ISO-8859-1 strings, other unknowns as their str)."""
    if v is None:
        return None
    return orjson.dumps(v, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


_AS_JSON = Mapped(JSON_TEXT, json_text)


def _nest(inner: Convert | None, shape: str) -> Convert | None:
    if inner is None:
        return None
    if shape == "list":
        return lambda v: None if v is None else [inner(x) for x in v]
    return lambda v: None if v is None else [(k, inner(x)) for k, x in v.items()]


def _struct(fields: list[tuple[str, Mapped]]) -> Mapped:
    typ = pa.struct([pa.field(name, m.type) for name, m in fields])
    work = [(name, m.convert) for name, m in fields if m.convert is not None]
    if not work:
        return Mapped(typ)

    def conv(v: Any) -> Any:
        if v is None:
            return None
        out = dict(v)
        for name, c in work:
            if name in out:
                out[name] = c(out[name])
        return out

    return Mapped(typ, conv)


# ---------------------------------------------------------------------------------------------------- Avro
_AVRO_PRIMITIVE = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
                   "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
#: logical types read from their underlying value (fastavro is given schemas without these annotations)
_STRIPPED = frozenset({"date", "time-millis", "time-micros", "timestamp-millis", "timestamp-micros",
                       "local-timestamp-millis", "local-timestamp-micros", "uuid", "timestamp-nanos",
                       "local-timestamp-nanos"})


def _ms_to_us(v: Any) -> Any:
    return None if v is None else v * 1000


def _avro_logical(schema: dict) -> Mapped | None:
    lt, base = schema.get("logicalType"), schema.get("type")
    if lt == "date" and base == "int":
        return Mapped(pa.date32())
    if lt == "time-millis" and base == "int":
        return Mapped(pa.time64("us"), _ms_to_us)
    if lt == "time-micros" and base == "long":
        return Mapped(pa.time64("us"))
    if base == "long" and lt in ("timestamp-millis", "timestamp-micros", "timestamp-nanos", "local-timestamp-millis",
                                 "local-timestamp-micros", "local-timestamp-nanos"):
        unit = {"millis": "ms", "micros": "us", "nanos": "ns"}[lt.rpartition("-")[2]]
        return Mapped(pa.timestamp(unit, None if lt.startswith("local") else "UTC"))
    if lt == "decimal" and base in ("bytes", "fixed"):
        precision, scale = int(schema.get("precision", 0)), int(schema.get("scale", 0))
        if 0 < precision <= 38 and 0 <= scale <= precision:
            return Mapped(pa.decimal128(precision, scale))
        if 0 < precision <= 76 and 0 <= scale <= precision:
            return Mapped(pa.decimal256(precision, scale))
    if lt == "uuid" and base in ("string", "fixed"):
        return Mapped(pa.string(), None if base == "string" else _uuid_text)
    return None


def _uuid_text(v: Any) -> Any:
    return None if v is None else str(uuid.UUID(bytes=bytes(v)))


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


class _AvroMapper:
    def __init__(self) -> None:
        self.named: dict[str, Any] = {}  # full name -> (schema dict, namespace)
        self.active: set[str] = set()

    def collect(self, schema: Any, namespace: str | None) -> None:
        """Record every named type definition (references may precede nothing: Avro defines before use)."""
        if isinstance(schema, list):
            for b in schema:
                self.collect(b, namespace)
        elif isinstance(schema, dict):
            t = schema.get("type")
            if t in ("record", "error", "enum", "fixed") and isinstance(schema.get("name"), str):
                name = schema["name"]
                ns = name.rpartition(".")[0] if "." in name else schema.get("namespace", namespace)
                self.named.setdefault(_fullname(name, ns), (schema, ns))
                for f in schema.get("fields") or []:
                    if isinstance(f, dict):
                        self.collect(f.get("type"), ns)
            elif t == "array":
                self.collect(schema.get("items"), namespace)
            elif t == "map":
                self.collect(schema.get("values"), namespace)
            elif isinstance(t, (dict, list)):
                self.collect(t, namespace)

    def map(self, schema: Any, namespace: str | None) -> Mapped:
        if isinstance(schema, str):
            if schema in _AVRO_PRIMITIVE:
                return Mapped(_AVRO_PRIMITIVE[schema])
            for cand in (_fullname(schema, namespace), schema):
                if cand in self.named:
                    s, ns = self.named[cand]
                    return self._named(s, ns, cand)
            raise ArrowMappingError(f"unknown Avro type {schema!r}")
        if isinstance(schema, list):
            return self._union(schema, namespace)
        if not isinstance(schema, dict):
            raise ArrowMappingError(f"not an Avro schema: {schema!r}")
        t = schema.get("type")
        logical = _avro_logical(schema) if "logicalType" in schema else None
        if logical is not None:
            return logical
        if t in _AVRO_PRIMITIVE:
            return Mapped(_AVRO_PRIMITIVE[t])
        if t in ("record", "error", "enum", "fixed"):
            name = schema["name"]
            ns = name.rpartition(".")[0] if "." in name else schema.get("namespace", namespace)
            return self._named(schema, ns, _fullname(name, ns))
        if t == "array":
            m = self.map(schema.get("items"), namespace)
            return Mapped(pa.list_(m.type), _nest(m.convert, "list"))
        if t == "map":
            m = self.map(schema.get("values"), namespace)
            return Mapped(pa.map_(pa.string(), m.type), _nest(m.convert, "map"))
        return self.map(t, namespace)

    def _named(self, schema: dict, ns: str | None, fullname: str) -> Mapped:
        t = schema.get("type")
        if t == "enum":
            return Mapped(pa.string())
        if t == "fixed":
            logical = _avro_logical(schema) if "logicalType" in schema else None
            return logical or Mapped(pa.binary())
        if fullname in self.active:  # recursive: JSON text from here on
            return _AS_JSON
        self.active.add(fullname)
        try:
            return _struct([(f["name"], self.map(f["type"], ns)) for f in schema.get("fields") or []])
        finally:
            self.active.discard(fullname)

    def _union(self, branches: list, namespace: str | None) -> Mapped:
        others = [b for b in branches if b != "null" and not (isinstance(b, dict) and b.get("type") == "null")]
        if len(others) == 1:
            return self.map(others[0], namespace)
        if not others:
            return Mapped(pa.null())
        mapped = [self.map(b, namespace) for b in others]
        names = [f"member{i}" for i in range(len(others))]
        typ = pa.struct([pa.field(n, m.type) for n, m in zip(names, mapped, strict=True)])
        by_name: dict[str, int] = {}
        tests: list[tuple[int, Callable[[Any], bool]]] = []
        for i, b in enumerate(others):
            full = self._branch_name(b, namespace)
            if full is not None:
                by_name[full] = i
            test = self._python_test(b, namespace)
            if test is not None:
                tests.append((i, test))
        convs = [m.convert for m in mapped]

        def conv(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and v[0] in by_name:
                i, inner = by_name[v[0]], v[1]
            else:
                i, inner = next((j for j, test in tests if test(v)), -1), v
                if i < 0:
                    raise ValueError(f"union value of type {type(v).__name__} matches no branch")
            c = convs[i]
            return {names[i]: c(inner) if c is not None else inner}

        return Mapped(typ, conv)

    def _resolve(self, b: Any, namespace: str | None) -> Any:
        if isinstance(b, str) and b not in _AVRO_PRIMITIVE:
            for cand in (_fullname(b, namespace), b):
                if cand in self.named:
                    return self.named[cand][0]
        return b

    def _branch_name(self, b: Any, namespace: str | None) -> str | None:
        s = self._resolve(b, namespace)
        if isinstance(s, dict) and s.get("type") in ("record", "error", "enum", "fixed"):
            name = s["name"]
            return _fullname(name, name.rpartition(".")[0] if "." in name else s.get("namespace", namespace))
        return None

    def _python_test(self, b: Any, namespace: str | None) -> Callable[[Any], bool] | None:
        s = self._resolve(b, namespace)
        t: Any = s.get("type") if isinstance(s, dict) else s
        if isinstance(s, dict) and s.get("logicalType") == "decimal":
            return lambda v: v.__class__.__name__ == "Decimal"
        return {
            "boolean": lambda v: isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31,
            "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, float), "double": lambda v: isinstance(v, float),
            "string": lambda v: isinstance(v, str), "bytes": lambda v: isinstance(v, bytes),
            "array": lambda v: isinstance(v, list), "map": lambda v: isinstance(v, dict),
            # named types come tagged (fastavro's return_named_type) where a union has several; a union's
            # only named branch comes bare, recognised by its Python type
            "record": lambda v: isinstance(v, dict), "error": lambda v: isinstance(v, dict),
            "enum": lambda v: isinstance(v, str), "fixed": lambda v: isinstance(v, bytes),
        }.get(t)


def strip_logical(schema: Any) -> Any:
    """The Avro schema with the logical types fastavro would turn into Python objects (dates, datetimes, UUIDs)
    taken off: the Arrow arrays are built from their underlying ints and strings, which is faster. Decimals
    stay (fastavro's Decimal is what pyarrow takes)."""
    if isinstance(schema, list):
        return [strip_logical(b) for b in schema]
    if isinstance(schema, dict):
        out = {k: (strip_logical(v) if k in ("type", "items", "values") else v) for k, v in schema.items()
               if not (k == "logicalType" and v in _STRIPPED)}
        if "fields" in out:
            out["fields"] = [{**f, "type": strip_logical(f["type"])} if isinstance(f, dict) and "type" in f else f
                             for f in out["fields"]]
        return out
    return schema


def avro_mapping(schema: str | dict | list) -> Mapped:
    """The Arrow type of an Avro schema (text or JSON data) and the value converter."""
    data = load_schema(schema)
    m = _AvroMapper()
    m.collect(data, None)
    return m.map(data, None)


# ------------------------------------------------------------------------------------------------ Protobuf
def _pb_mapping(descriptor: Any, active: frozenset[str] = frozenset()) -> Mapped:
    """A message descriptor -> struct (see the module docstring)."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    full = descriptor.full_name
    wk = _PB_WELL_KNOWN.get(full)
    if wk is not None:
        return wk()
    if full in active:
        return Mapped(JSON_TEXT, _pb_json)
    active = active | {full}
    fields: list[tuple[str, Mapped]] = []
    getters: list[tuple[str, Callable[[Any], Any]]] = []
    for f in descriptor.fields:
        name = f.name
        is_map = f.type == FD.TYPE_MESSAGE and f.message_type.GetOptions().map_entry
        if is_map:
            kf, vf = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            km, vm = _pb_field(kf, active), _pb_field(vf, active)
            kc, vc = km.convert, vm.convert
            m = Mapped(pa.map_(km.type, vm.type))

            def get(msg: Any, name: str = name, kc: Any = kc, vc: Any = vc) -> Any:
                return [(kc(k) if kc else k, vc(v) if vc else v) for k, v in getattr(msg, name).items()]
        elif _is_repeated(f):
            inner = _pb_field(f, active)
            ic = inner.convert
            m = Mapped(pa.list_(inner.type))

            # one getter per kind of field, each binding its own defaults
            def get(msg: Any, name: str = name, ic: Any = ic) -> Any:  # type: ignore[misc]
                seq = getattr(msg, name)
                return [ic(x) for x in seq] if ic else list(seq)
        else:
            m0 = _pb_field(f, active)
            m = Mapped(m0.type)
            c = m0.convert
            presence = f.type == FD.TYPE_MESSAGE or _has_presence(f)

            def get(msg: Any, name: str = name, c: Any = c, presence: bool = presence) -> Any:  # type: ignore[misc]
                if presence and not msg.HasField(name):
                    return None
                v = getattr(msg, name)
                return c(v) if c else v
        fields.append((name, m))
        getters.append((name, get))
    typ = pa.struct([pa.field(n, m.type) for n, m in fields])

    def conv(msg: Any) -> Any:
        return None if msg is None else {n: g(msg) for n, g in getters}

    return Mapped(typ, conv)


def _is_repeated(f: Any) -> bool:
    rep = getattr(f, "is_repeated", None)
    if rep is not None:
        return bool(rep)
    return f.label == f.LABEL_REPEATED


def _has_presence(f: Any) -> bool:
    hp = getattr(f, "has_presence", None)
    return bool(hp) if hp is not None else False


def _pb_field(f: Any, active: frozenset[str]) -> Mapped:
    from google.protobuf.descriptor import FieldDescriptor as FD

    t = f.type
    if t == FD.TYPE_MESSAGE or t == FD.TYPE_GROUP:
        return _pb_mapping(f.message_type, active)
    if t == FD.TYPE_ENUM:
        values = {v.number: v.name for v in f.enum_type.values}
        return Mapped(pa.string(), lambda v, values=values: values.get(v, str(v)))  # type: ignore[misc]  # bound default
    if t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        return Mapped(pa.int32())
    if t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64, FD.TYPE_UINT32, FD.TYPE_FIXED32):
        return Mapped(pa.int64())
    if t in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return Mapped(pa.decimal128(20, 0), _to_decimal)
    if t == FD.TYPE_FLOAT:
        return Mapped(pa.float32())
    if t == FD.TYPE_DOUBLE:
        return Mapped(pa.float64())
    if t == FD.TYPE_BOOL:
        return Mapped(pa.bool_())
    if t == FD.TYPE_STRING:
        return Mapped(pa.string())
    return Mapped(pa.binary())


def _to_decimal(v: int) -> Any:
    import decimal

    return decimal.Decimal(v)


def _pb_json(msg: Any) -> str | None:
    if msg is None:
        return None
    from google.protobuf import json_format

    return orjson.dumps(json_format.MessageToDict(msg)).decode()


def _wk_timestamp() -> Mapped:
    return Mapped(pa.timestamp("us", "UTC"), lambda m: m.seconds * 1_000_000 + m.nanos // 1000)


def _wk_duration() -> Mapped:
    return Mapped(pa.duration("us"), lambda m: m.seconds * 1_000_000 + int(m.nanos / 1000))


def _wk_wrapper(typ: pa.DataType) -> Callable[[], Mapped]:
    return lambda: Mapped(typ, lambda m: m.value)


def _wk_any() -> Mapped:
    return Mapped(pa.struct([("type_url", pa.string()), ("value", pa.binary())]),
                  lambda m: {"type_url": m.type_url, "value": m.value})


_PB_WELL_KNOWN: dict[str, Callable[[], Mapped]] = {
    "google.protobuf.Timestamp": _wk_timestamp, "google.protobuf.Duration": _wk_duration,
    "google.protobuf.DoubleValue": _wk_wrapper(pa.float64()), "google.protobuf.FloatValue": _wk_wrapper(pa.float32()),
    "google.protobuf.Int64Value": _wk_wrapper(pa.int64()), "google.protobuf.UInt64Value": lambda: Mapped(
        pa.decimal128(20, 0), lambda m: _to_decimal(m.value)),
    "google.protobuf.Int32Value": _wk_wrapper(pa.int32()), "google.protobuf.UInt32Value": _wk_wrapper(pa.int64()),
    "google.protobuf.BoolValue": _wk_wrapper(pa.bool_()), "google.protobuf.StringValue": _wk_wrapper(pa.string()),
    "google.protobuf.BytesValue": _wk_wrapper(pa.binary()), "google.protobuf.Any": _wk_any,
    **{f"google.protobuf.{n}": (lambda: Mapped(JSON_TEXT, _pb_json))
       for n in ("Struct", "Value", "ListValue", "Empty", "FieldMask", "NullValue")},
}


def protobuf_mapping(descriptor: Any) -> Mapped:
    """The Arrow type of a message (its ``Descriptor``); the converter takes a parsed message."""
    return _pb_mapping(descriptor)


# --------------------------------------------------------------------------------------------- JSON Schema
class _JsonMapper:
    def __init__(self, root: Any, references: Mapping[str, Any] | None) -> None:
        self.root = root
        self.refs = {k: (orjson.loads(v) if isinstance(v, (str, bytes)) else v) for k, v in (references or {}).items()}
        self.active: set[int] = set()

    def deref(self, ref: str, base: Any) -> Any:
        doc_name, _, pointer = ref.partition("#")
        doc = self.refs.get(doc_name) if doc_name else base
        if doc is None:
            raise ArrowMappingError(f"$ref {ref!r}: unknown reference")
        for part in [p for p in pointer.split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        return doc

    def map(self, s: Any, base: Any) -> Mapped:
        if not isinstance(s, dict):
            return _AS_JSON
        if "$ref" in s:
            ref = s["$ref"]
            doc_name = ref.partition("#")[0]
            target = self.deref(ref, base)
            key = id(target)
            if key in self.active:
                return _AS_JSON
            self.active.add(key)
            try:
                return self.map(target, self.refs[doc_name] if doc_name else base)
            finally:
                self.active.discard(key)
        for combo in ("anyOf", "oneOf"):
            if combo in s and isinstance(s[combo], list):
                others = [b for b in s[combo] if not (isinstance(b, dict) and b.get("type") == "null")]
                return self.map(others[0], base) if len(others) == 1 else _AS_JSON
        if "allOf" in s or "not" in s or "if" in s:
            return _AS_JSON
        t = s.get("type")
        if t is None and "enum" in s and all(isinstance(x, str) for x in s["enum"]):
            return Mapped(pa.string())
        if t is None and "const" in s:
            t = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(type(s["const"]))
        if t is None and "properties" in s:
            t = "object"
        if isinstance(t, list):
            others = [x for x in t if x != "null"]
            if len(others) != 1:
                return _AS_JSON
            t = others[0]
        if t == "string":
            return Mapped(pa.string())
        if t == "integer":
            return Mapped(pa.int64(), _json_int)
        if t == "number":
            return Mapped(pa.float64(), _json_number)
        if t == "boolean":
            return Mapped(pa.bool_())
        if t == "null":
            return Mapped(pa.null())
        if t == "array" and isinstance(s.get("items"), dict):
            m = self.map(s["items"], base)
            return Mapped(pa.list_(m.type), _nest(m.convert, "list"))
        if t == "object":
            props = s.get("properties")
            if isinstance(props, dict) and props:
                return _struct([(name, self.map(ps, base)) for name, ps in props.items()])
            ap = s.get("additionalProperties")
            if isinstance(ap, dict):
                m = self.map(ap, base)
                return Mapped(pa.map_(pa.string(), m.type), _nest(m.convert, "map") or _items)
        return _AS_JSON


def _items(v: Any) -> Any:
    return None if v is None else list(v.items())


def _json_int(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _json_number(v: Any) -> Any:
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def jsonschema_mapping(schema: str | bytes | Mapping[str, Any] | bool,
                       references: Mapping[str, Any] | None = None) -> Mapped:
    """The Arrow type of a JSON Schema and the value converter."""
    root = orjson.loads(schema) if isinstance(schema, (str, bytes)) else schema
    mapper = _JsonMapper(root, references)
    mapper.active.add(id(root))  # a "$ref": "#" below is recursion
    return mapper.map(root, root)


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
        named = sum(1 for b in schema if (isinstance(b, str) and b not in _AVRO_PRIMITIVE)
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
