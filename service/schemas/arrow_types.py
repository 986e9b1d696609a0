"""The schema -> Arrow type mapping of schema'd records (Avro, Protobuf, JSON Schema), sans-io; the
decoding into columns is :mod:`service.schemas.arrow`.


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
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from service.schemas.avro import load_schema

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
AVRO_PRIMITIVE = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
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
            if schema in AVRO_PRIMITIVE:
                return Mapped(AVRO_PRIMITIVE[schema])
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
        if t in AVRO_PRIMITIVE:
            return Mapped(AVRO_PRIMITIVE[t])
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
        if isinstance(b, str) and b not in AVRO_PRIMITIVE:
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
