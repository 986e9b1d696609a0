"""Avro payloads <-> the JSON the Confluent REST Proxy v2 speaks. Sans-io: bytes and values only.

A payload here is already unframed (no magic byte, no schema id): :mod:`service.schemas.wire` strips that.
Records are read with the *writer's* schema (the one the id names), by fastavro, and rendered as JSON:

``rendering="confluent"`` (the default) is the Avro JSON encoding of the Avro specification, which is what
Confluent's REST Proxy returns for ``format: avro`` (its AvroConverter writes each record with Avro's
``JsonEncoder`` and the ``GenericDatumWriter`` of the record's own schema; the deserializer runs without
logical-type converters, its default):

* a union value is tagged with its branch, ``{"string": "x"}``, ``{"com.acme.Payload": {...}}``,
  ``{"array": [...]}``, ``{"map": {...}}``; the ``null`` branch is a bare ``null``;
* ``bytes`` and ``fixed`` are strings with one character per byte (code points 0-255, ISO-8859-1);
* an enum is its symbol; records are objects with the fields in schema order;
* logical types are rendered as their underlying type: ``date`` and ``time-millis`` an int,
  ``timestamp-*``/``local-timestamp-*``/``time-micros`` a long, ``decimal`` its two's-complement unscaled
  bytes (as above), ``uuid`` the string, ``duration`` its 12 fixed bytes.

``rendering="karapace"`` matches Karapace's REST proxy where it differs: union values untagged (the bare
branch value) and ``bytes``/``fixed`` base64; everything else as above.

Produce (``encode``) takes the same JSON shapes back: tagged unions (the branch named by its full name, or
its type name for unnamed branches), and -- unless ``strict_unions`` -- an untagged union value, matched
against the branches in order (Karapace accepts both). ``bytes``/``fixed`` are ISO-8859-1 strings in both
renderings, as Avro's JSON decoder reads them. A missing record field takes its schema default; a field
without a default is an error. Everything is validated before a byte is written, and an error names the
path of the offending value (``$.attrs[1].v``).

How unions are told apart: fastavro returns a union's value without its branch, and two branches may look
alike in Python (``int`` and ``long``, ``float`` and ``double``). So the schema fastavro compiles wraps each
non-null union branch in a one-field record (a record of one field has exactly that field's binary
encoding), whose name carries the branch index; fastavro then hands back ``(name, {"v": value})`` and the
renderer knows the branch. Every named type is renamed to a unique synthetic full name in that compiled
schema, so the wrappers can never collide with user names and namespace inheritance cannot change.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import orjson
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from service.schemas import avro_limits
from service.schemas.avro_limits import _K_ARRAY, _K_ENUM, _K_MAP, _K_NULL, _K_RECORD, _K_UNION
from service.schemas.errors import CodecDecodeError, CodecEncodeError, CodecSchemaError

RENDER_CONFLUENT = "confluent"
RENDER_KARAPACE = "karapace"
RENDERINGS = (RENDER_CONFLUENT, RENDER_KARAPACE)

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class AvroSchemaError(CodecSchemaError):
    """The schema text is not a valid Avro schema."""


class AvroEncodeError(CodecEncodeError):
    """A JSON value does not fit the schema; ``path`` names the offending value (``$`` is the root)."""


class AvroDecodeError(CodecDecodeError):
    """A payload could not be read with the writer's schema."""


# ---------------------------------------------------------------------------------------------- schema model
class _Node:
    __slots__ = ("default", "fields", "fullname", "has_default", "items", "kind", "size", "symbols", "synthetic")

    def __init__(self, kind: str) -> None:
        self.kind = kind  # a primitive name, or record/enum/fixed/array/map/union
        self.fullname = ""  # named types: the user's full name
        self.synthetic = ""  # named types: the unique name in the compiled schema
        self.fields: list[tuple[str, _Node, bool, Any]] = []  # record: (name, type, has_default, default)
        self.symbols: list[str] = []
        self.size = 0
        self.items: list[_Node] = []  # array/map: [items]; union: branches


def _needs_wrapping(union: _Node) -> bool:
    """A union whose branch fastavro's value cannot show: more than one non-null branch."""
    return sum(1 for branch in union.items if branch.kind != "null") > 1


def _type_tag(node: _Node) -> str:
    """The key of a union branch in the Avro JSON encoding."""
    return node.fullname if node.kind in ("record", "enum", "fixed") else node.kind


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, _Node] = {}

    def _fullname(self, name: str, namespace: str | None) -> str:
        if "." in name:
            return name
        return f"{namespace}.{name}" if namespace else name

    def parse(self, schema: Any, namespace: str | None) -> _Node:
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _Node(schema)
            for candidate in (self._fullname(schema, namespace), schema):
                if candidate in self.named:
                    return self.named[candidate]
            raise AvroSchemaError(f"unknown type {schema!r}")
        if isinstance(schema, list):
            node = _Node("union")
            node.items = [self.parse(branch, namespace) for branch in schema]
            seen: set[str] = set()
            for branch in node.items:
                if branch.kind == "union":
                    raise AvroSchemaError("a union may not directly contain a union")
                tag = _type_tag(branch)
                if tag in seen:
                    raise AvroSchemaError(f"union has two branches of type {tag!r}")
                seen.add(tag)
            return node
        if not isinstance(schema, dict) or "type" not in schema:
            raise AvroSchemaError(f"not a schema: {schema!r}")
        kind = schema["type"]
        if kind in _PRIMITIVES:  # {"type": "long", "logicalType": ...}: the logical type is rendered raw
            return _Node(kind)
        if kind in ("record", "error", "enum", "fixed"):
            name = schema.get("name")
            if not isinstance(name, str) or not name:
                raise AvroSchemaError(f"a {kind} needs a name")
            ns = schema.get("namespace", namespace) if "." not in name else name.rpartition(".")[0]
            fullname = self._fullname(name, ns or None)
            if fullname in self.named:
                raise AvroSchemaError(f"type {fullname!r} is defined twice")
            node = _Node("record" if kind == "error" else kind)
            node.fullname = fullname
            node.synthetic = f"kcg.t{len(self.named)}"
            self.named[fullname] = node
            if kind == "enum":
                node.symbols = list(schema.get("symbols") or [])
            elif kind == "fixed":
                node.size = int(schema.get("size", -1))
                if node.size < 0:
                    raise AvroSchemaError(f"fixed {fullname!r} needs a size")
            else:
                for field in schema.get("fields") or []:
                    if not isinstance(field, dict) or "name" not in field or "type" not in field:
                        raise AvroSchemaError(f"bad field in {fullname!r}: {field!r}")
                    ftype = self.parse(field["type"], ns or None)
                    node.fields.append((field["name"], ftype, "default" in field, field.get("default")))
            return node
        if kind == "array":
            node = _Node("array")
            node.items = [self.parse(schema.get("items"), namespace)]
            return node
        if kind == "map":
            node = _Node("map")
            node.items = [self.parse(schema.get("values"), namespace)]
            return node
        if isinstance(kind, (dict, list)) or kind in self.named or isinstance(kind, str):
            return self.parse(kind, namespace)  # {"type": {"type": "record", ...}} or {"type": "a.Named"}
        raise AvroSchemaError(f"unknown type {kind!r}")


def _compile_schema(root: _Node, wrap_unions: bool, union_names: dict[int, list[str]] | None = None) -> Any:
    """The schema fastavro compiles: synthetic names, no logical types, wrapped union branches.

    ``union_names`` receives, per union node (by id), the wrapper record name of each branch."""
    emitted: set[int] = set()
    counter = [0]

    def emit(node: _Node) -> Any:
        kind = node.kind
        if kind in _PRIMITIVES:
            return kind
        if kind in ("record", "enum", "fixed"):
            if id(node) in emitted:
                return node.synthetic
            emitted.add(id(node))
            if kind == "enum":
                return {"type": "enum", "name": node.synthetic, "symbols": node.symbols}
            if kind == "fixed":
                return {"type": "fixed", "name": node.synthetic, "size": node.size}
            return {"type": "record", "name": node.synthetic,
                    "fields": [{"name": name, "type": emit(ftype)} for name, ftype, _, _ in node.fields]}
        if kind == "array":
            return {"type": "array", "items": emit(node.items[0])}
        if kind == "map":
            return {"type": "map", "values": emit(node.items[0])}
        # union
        if not wrap_unions or not _needs_wrapping(node):
            return [emit(branch) for branch in node.items]
        counter[0] += 1
        names = [f"kcg.u{counter[0]}_{i}" for i in range(len(node.items))]
        if union_names is not None:
            union_names[id(node)] = names
        return [
            "null" if branch.kind == "null"
            else {"type": "record", "name": names[i], "fields": [{"name": "v", "type": emit(branch)}]}
            for i, branch in enumerate(node.items)
        ]

    return emit(root)


# ---------------------------------------------------------------------------------------------- rendering
Render = Callable[[Any], Any]


def _latin1(value: bytes) -> str:
    return value.decode("latin-1")


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _build_renderers(root: _Node, rendering: str) -> Render | None:
    """A function turning fastavro's value into the JSON shape, or None where fastavro's value is already it.

    Recursive schemas are handled by resolving named types lazily through a slot filled once the type's
    renderer is built. The renderers never refer to the builder's tables (cleared at the end), so a codec
    without recursive types holds no reference cycle: refcounting frees it when it is dropped."""
    tagged = rendering == RENDER_CONFLUENT
    raw_bytes: Render = _latin1 if tagged else _b64
    cache: dict[int, Render | None] = {}
    slots: dict[int, list[Render]] = {}  # recursive records: filled with the finished renderer
    in_progress: set[int] = set()
    needs: dict[int, bool] = {}

    def needs_work(node: _Node, stack: frozenset[int] = frozenset()) -> bool:
        key = id(node)
        if key in needs:
            return needs[key]
        if key in stack:
            return True  # a recursive type: conservatively walk it
        stack = stack | {key}
        kind = node.kind
        if kind in ("bytes", "fixed"):
            result = True
        elif kind == "union":
            result = tagged or any(needs_work(b, stack) for b in node.items)
        elif kind == "record":
            result = any(needs_work(f, stack) for _, f, _, _ in node.fields)
        elif kind in ("array", "map"):
            result = needs_work(node.items[0], stack)
        else:
            result = False
        needs[key] = result
        return result

    def build(node: _Node) -> Render | None:
        key = id(node)
        if key in cache:
            return cache[key]
        if not needs_work(node):
            cache[key] = None
            return None
        kind = node.kind
        if kind in ("bytes", "fixed"):
            fn: Render = raw_bytes
        elif kind == "record":
            if key in in_progress:  # recursive: defer to the finished renderer
                slot = slots.setdefault(key, [])
                return lambda v: slot[0](v)
            in_progress.add(key)
            work = [(name, r) for name, ftype, _, _ in node.fields if (r := build(ftype)) is not None]
            in_progress.discard(key)

            def fn(value: dict, work: list = work) -> dict:
                for name, render in work:
                    value[name] = render(value[name])
                return value
        elif kind == "array":
            inner = build(node.items[0])
            assert inner is not None

            def fn(value: list, inner: Render = inner) -> list:
                return [inner(v) for v in value]
        elif kind == "map":
            inner = build(node.items[0])
            assert inner is not None

            def fn(value: dict, inner: Render = inner) -> dict:
                return {k: inner(v) for k, v in value.items()}
        else:  # union
            if tagged and not _needs_wrapping(node):  # ["null", X]: the value alone shows the branch
                (only,) = [b for b in node.items if b.kind != "null"]
                tag, render = _type_tag(only), build(only)

                def fn(value: Any, tag: str = tag, render: Render | None = render) -> Any:
                    if value is None:
                        return None
                    return {tag: render(value) if render is not None else value}
            elif tagged:
                table = {}
                for i, branch in enumerate(node.items):
                    if branch.kind != "null":
                        table[i] = (_type_tag(branch), build(branch))

                def fn(value: Any, table: dict = table) -> Any:
                    if value is None:
                        return None
                    name, wrapper = value
                    tag, render = table[int(name.rpartition("_")[2])]
                    inner = wrapper["v"]
                    return {tag: render(inner) if render is not None else inner}
            else:
                # untagged: fastavro picks the branch; render by the Python type it returned
                branches = [(b, build(b)) for b in node.items if b.kind != "null"]
                byte_like = any(b.kind in ("bytes", "fixed") for b, _ in branches)
                others = [(b, r) for b, r in branches if r is not None and b.kind not in ("bytes", "fixed")]

                def fn(value: Any, byte_like: bool = byte_like, others: list = others) -> Any:
                    if value is None:
                        return None
                    if isinstance(value, bytes):
                        return raw_bytes(value) if byte_like else value
                    for branch, render in others:
                        if _python_matches(branch, value):
                            return render(value)
                    return value
        cache[key] = fn
        if key in slots:
            slots[key].append(fn)
        return fn

    try:
        return build(root)
    finally:
        cache.clear()
        slots.clear()


def _python_matches(node: _Node, value: Any) -> bool:
    kind = node.kind
    if kind == "record":
        return isinstance(value, dict) and all(name in value for name, _, _, _ in node.fields)
    if kind == "map":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    return False


# ---------------------------------------------------------------------------------------------- encoding
Convert = Callable[[Any, str], Any]


def _build_converters(root: _Node, union_names: dict[int, list[str]], strict_unions: bool) -> Convert:
    """JSON value -> fastavro datum for the compiled schema, validating on the way (errors name the path).

    The converters never refer to the builder (defaults are converted by converters built up front) and its
    table is cleared at the end, so a codec without recursive types holds no reference cycle."""
    cache: dict[int, Convert] = {}

    def build(node: _Node) -> Convert:
        key = id(node)
        if key in cache:
            return cache[key]
        slot: list[Convert] = []
        cache[key] = lambda v, p: slot[0](v, p)  # recursion goes through the finished converter
        fn = _make(node)
        slot.append(fn)
        cache[key] = fn
        return fn

    def _make(node: _Node) -> Convert:
        kind = node.kind
        if kind == "null":
            def conv(v: Any, p: str) -> Any:
                if v is not None:
                    raise AvroEncodeError(p, f"expected null, got {_jtype(v)}")
                return None
        elif kind == "boolean":
            def conv(v: Any, p: str) -> Any:
                if not isinstance(v, bool):
                    raise AvroEncodeError(p, f"expected boolean, got {_jtype(v)}")
                return v
        elif kind in ("int", "long"):
            lo, hi = (_INT_MIN, _INT_MAX) if kind == "int" else (_LONG_MIN, _LONG_MAX)

            def conv(v: Any, p: str, kind: str = kind, lo: int = lo, hi: int = hi) -> Any:  # type: ignore[misc]  # one converter per kind
                if isinstance(v, bool) or not isinstance(v, int):
                    raise AvroEncodeError(p, f"expected {kind}, got {_jtype(v)}")
                if not lo <= v <= hi:
                    raise AvroEncodeError(p, f"{v} is out of range for {kind}")
                return v
        elif kind in ("float", "double"):
            def conv(v: Any, p: str, kind: str = kind) -> Any:  # type: ignore[misc]  # one converter per kind
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    if v in ("NaN", "Infinity", "-Infinity"):
                        return float(v.replace("Infinity", "inf"))
                    raise AvroEncodeError(p, f"expected {kind}, got {_jtype(v)}")
                return float(v)
        elif kind == "string":
            def conv(v: Any, p: str) -> Any:
                if not isinstance(v, str):
                    raise AvroEncodeError(p, f"expected string, got {_jtype(v)}")
                return v
        elif kind in ("bytes", "fixed"):
            size = node.size if kind == "fixed" else -1

            def conv(v: Any, p: str, size: int = size, kind: str = kind) -> Any:  # type: ignore[misc]  # one converter per kind
                if not isinstance(v, str):
                    raise AvroEncodeError(p, f"expected {kind} as a string of code points 0-255, got {_jtype(v)}")
                try:
                    raw = v.encode("latin-1")
                except UnicodeEncodeError:
                    raise AvroEncodeError(p, f"{kind} string has a character above U+00FF") from None
                if size >= 0 and len(raw) != size:
                    raise AvroEncodeError(p, f"fixed {node.fullname} needs {size} bytes, got {len(raw)}")
                return raw
        elif kind == "enum":
            symbols = frozenset(node.symbols)

            def conv(v: Any, p: str, symbols: frozenset = symbols) -> Any:  # type: ignore[misc]  # one converter per kind
                if not isinstance(v, str) or v not in symbols:
                    raise AvroEncodeError(p, f"{v!r} is not a symbol of enum {node.fullname}")
                return v
        elif kind == "array":
            inner = build(node.items[0])

            def conv(v: Any, p: str, inner: Convert = inner) -> Any:  # type: ignore[misc]  # one converter per kind
                if not isinstance(v, list):
                    raise AvroEncodeError(p, f"expected array, got {_jtype(v)}")
                return [inner(item, f"{p}[{i}]") for i, item in enumerate(v)]
        elif kind == "map":
            inner = build(node.items[0])

            def conv(v: Any, p: str, inner: Convert = inner) -> Any:  # type: ignore[misc]  # one converter per kind
                if not isinstance(v, dict):
                    raise AvroEncodeError(p, f"expected map (object), got {_jtype(v)}")
                return {k: inner(item, _child(p, k)) for k, item in v.items()}
        elif kind == "record":
            fields = [(name, build(ftype), has_default, default, _default_of(ftype) if has_default else None)
                      for name, ftype, has_default, default in node.fields]

            def conv(v: Any, p: str, fields: list = fields) -> Any:  # type: ignore[misc]  # one converter per kind
                if not isinstance(v, dict):
                    raise AvroEncodeError(p, f"expected record {node.fullname} (object), got {_jtype(v)}")
                out = {}
                for name, fconv, has_default, default, dconv in fields:
                    fp = _child(p, name)
                    if name in v:
                        out[name] = fconv(v[name], fp)
                    elif has_default:
                        out[name] = dconv(default, fp)
                    else:
                        raise AvroEncodeError(fp, "missing field (it has no default)")
                return out
        else:  # union
            branches = [(b, build(b)) for b in node.items]
            names = union_names.get(id(node), [])
            tags = {_type_tag(b): i for i, b in enumerate(node.items)}

            def pack(i: int, datum: Any) -> Any:
                if node.items[i].kind == "null":
                    return None
                return (names[i], {"v": datum}) if names else datum

            def conv(v: Any, p: str) -> Any:
                if v is None:
                    if "null" in tags:
                        return None
                    raise AvroEncodeError(p, "null is not a branch of this union")
                if isinstance(v, dict) and len(v) == 1:
                    (tag, inner), = v.items()
                    i = tags.get(tag)
                    if i is not None and node.items[i].kind != "null":
                        return pack(i, branches[i][1](inner, _child(p, tag)))
                if strict_unions:
                    raise AvroEncodeError(p, "a union value must be tagged with its branch, one of "
                                          + ", ".join(t for t in tags if t != "null"))
                for i, (branch, bconv) in enumerate(branches):
                    if branch.kind == "null":
                        continue
                    try:
                        return pack(i, bconv(v, p))
                    except AvroEncodeError:
                        continue
                raise AvroEncodeError(p, "matches no branch of the union [" + ", ".join(tags) + "]")
        return conv

    def _default_of(ftype: _Node) -> Convert:
        # a union's default is a value of its first branch, untagged (Avro specification)
        if ftype.kind != "union":
            return build(ftype)
        first = ftype.items[0]
        first_conv = build(first)
        is_null = first.kind == "null"
        names = union_names.get(id(ftype))
        name0 = names[0] if names else None

        def dconv(default: Any, p: str) -> Any:
            datum = first_conv(default, p)
            if is_null:
                return None
            return (name0, {"v": datum}) if name0 is not None else datum
        return dconv

    try:
        return build(root)
    finally:
        cache.clear()


def _plain(name: str) -> bool:
    return name.replace("_", "a").replace(".", "a").isalnum()


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if _plain(name) and "." not in name else f"{path}[{orjson.dumps(name).decode()}]"


def _jtype(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


# ---------------------------------------------------------------------------------------------- the codec
def load_schema(schema: str | dict | list) -> Any:
    """The schema as JSON data: the registry stores text; a bare primitive name is accepted too."""
    if isinstance(schema, (dict, list)):
        return schema
    text = schema.strip()
    if text in _PRIMITIVES:
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise AvroSchemaError(f"schema is not JSON: {exc}") from None


def _parse_references(parser: _Parser, pending: list[Any]) -> None:
    """Parse the schemas a schema references (the registry's ``references``: named types of other subjects)
    so that their names are known, in whatever order they come: one that names a type not parsed yet waits
    for the next pass; a pass without progress raises the first error."""
    while pending:
        waiting: list[Any] = []
        first: AvroSchemaError | None = None
        for ref in pending:
            before = dict(parser.named)
            try:
                parser.parse(ref, None)
            except AvroSchemaError as exc:
                parser.named = before  # nothing half-registered
                waiting.append(ref)
                first = first or exc
        if len(waiting) == len(pending):
            raise AvroSchemaError(f"schema reference: {first}")
        pending = waiting


class AvroCodec:
    """One writer schema compiled once: decode payloads to JSON values, encode JSON values to payloads."""

    format = "avro"

    def __init__(self, schema: str | dict | list, *, rendering: str = RENDER_CONFLUENT,
                 strict_unions: bool = False, references: Sequence[str | dict | list] = ()) -> None:
        if rendering not in RENDERINGS:
            raise ValueError(f"rendering must be one of {RENDERINGS}")
        parser = _Parser()
        try:
            _parse_references(parser, [load_schema(r) for r in references])
            self._root = parser.parse(load_schema(schema), None)
        except (KeyError, TypeError, ValueError) as exc:
            raise AvroSchemaError(str(exc)) from None
        self.rendering = rendering
        wrap = rendering == RENDER_CONFLUENT
        try:
            compiled_read = parse_schema(_compile_schema(self._root, wrap))
            union_names: dict[int, list[str]] = {}
            compiled_write = parse_schema(_compile_schema(self._root, True, union_names))
        except Exception as exc:  # fastavro's SchemaParseException and friends
            raise AvroSchemaError(str(exc)) from None
        self._read_schema = compiled_read
        self._write_schema = compiled_write
        self._wrapped_read = wrap
        self._render = _build_renderers(self._root, rendering)
        self._convert = _build_converters(self._root, union_names, strict_unions)
        self.record_name = self._root.fullname or None  # for RecordNameStrategy subjects
        # the guard run before fastavro reads a payload (service/schemas/avro_limits.py)
        from service.schemas import avro_fast as fast

        self._scan_nodes = fast.scan_nodes(self._root)
        self._scan_program = fast.compile_scan(self._scan_nodes)
        # a scan program is compiled only when the C module is loaded
        self._cscan = fast._cavro.scan if self._scan_program is not None else None  # type: ignore[union-attr]
        self._cscan_many = (fast._cavro.scan_many  # type: ignore[union-attr]
                            if self._scan_program is not None else None)
        self._may_nest = _has_cycle(self._scan_nodes)  # a recursive schema: values of any depth
        # no cycle, array or map: every value's depth, items and fixed JSON bytes have a bound of the schema's
        self._static = None if self._may_nest else _static_bound(self._scan_nodes)

    def refusal(self, payload: bytes | memoryview) -> int:
        """The refusal code of an unframed payload against the gateway's limits
        (:mod:`service.schemas.avro_limits`; 0: within them). Bounded: fastavro may read what passes."""
        if self._always_within():
            return 0
        if self._cscan is not None:
            return self._cscan(self._scan_program, payload, avro_limits.limits_tuple())
        return avro_limits.scan_py(self._scan_nodes, payload)

    def _always_within(self) -> bool:
        """Whether no payload can be over the limits but by not being Avro of the schema (then the decoders
        are safe as they are: nothing loops or nests beyond the schema)."""
        if self._static is None:
            return False
        lim = avro_limits.LIMITS
        depth, items, est = self._static
        return depth <= lim.max_depth and items <= lim.items_base and est <= min(lim.floor, lim.cap)

    def refusals(self, payloads: list[Any]) -> dict[int, int]:
        """:meth:`refusal` of many payloads: index -> code of each refused one (in one C call). A schema whose
        values are bounded by the schema alone (:meth:`_always_within`) skips the scan."""
        if self._always_within():
            return {}
        if self._cscan_many is not None:
            return self._cscan_many(self._scan_program, payloads,
                                    avro_limits.limits_tuple())
        return {i: code for i, p in enumerate(payloads) if (code := self.refusal(p))}

    def refusal_error(self, payload: bytes | memoryview) -> AvroDecodeError | None:
        """:meth:`refusal` as the error of that payload (None: fastavro may read it)."""
        code = self.refusal(payload)
        return AvroDecodeError(avro_limits.refusal_message(code, len(payload))) if code else None

    # -- decode
    def decode(self, payload: bytes) -> Any:
        refused = self.refusal_error(payload)
        if refused is not None:
            raise refused
        try:
            value = schemaless_reader(io.BytesIO(payload), self._read_schema, None, self._wrapped_read, True)
        except Exception as exc:
            raise AvroDecodeError(_reason(exc)) from None
        render = self._render
        return render(value) if render is not None else value

    def decode_many(self, payloads: Iterable[bytes]) -> list[Any]:
        """Decoded values, or an :class:`AvroDecodeError` in the place of a payload that does not decode."""
        out: list[Any] = []
        append = out.append
        read = schemaless_reader
        schema = self._read_schema
        wrapped = self._wrapped_read
        render = self._render
        bytes_io = io.BytesIO
        payloads = payloads if type(payloads) is list else list(payloads)
        refused = self.refusals(payloads)  # never handed to fastavro (it recurses per level, loops per item)
        for i, payload in enumerate(payloads):
            if refused and i in refused:
                append(AvroDecodeError(avro_limits.refusal_message(refused[i], len(payload))))
                continue
            try:
                value = read(bytes_io(payload), schema, None, wrapped, True)
                append(render(value) if render is not None else value)
            except Exception as exc:
                append(AvroDecodeError(_reason(exc)))
        return out

    # -- encode
    def validate(self, value: Any) -> Any:
        """The fastavro datum for ``value``; raises :class:`AvroEncodeError` naming the path. A value of a
        schema that may nest without end (a named type reached twice) is first held to the depth limit, as
        the decoders are (a union's ``{"branch": ...}`` wrapper counts as a level here)."""
        if self._may_nest:
            _check_depth(value, 2 * avro_limits.LIMITS.max_depth + 1)
        try:
            return self._convert(value, "$")
        except RecursionError:
            raise AvroEncodeError("$", "nested too deeply") from None

    def encode(self, value: Any) -> bytes:
        datum = self.validate(value)
        out = io.BytesIO()
        try:
            schemaless_writer(out, self._write_schema, datum)
        except Exception as exc:  # validation above should make this unreachable
            raise AvroEncodeError("$", _reason(exc)) from None
        return out.getvalue()


def _has_cycle(nodes: list[Any]) -> bool:
    """Whether the flat node list (avro_fast.program_nodes) has a cycle: a type that contains itself."""
    state = [0] * len(nodes)  # 0 new, 1 on the path, 2 done
    for start in range(len(nodes)):
        if state[start]:
            continue
        state[start] = 1
        path: list[tuple[int, Iterator[int]]] = [(start, iter(_refs(nodes[start])))]
        while path:
            node, refs = path[-1]
            nxt = next(refs, None)
            if nxt is None:
                state[node] = 2
                path.pop()
            elif state[nxt] == 1:
                return True
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append((nxt, iter(_refs(nodes[nxt]))))
    return False


def _static_bound(nodes: list[Any]) -> tuple[int, int, int] | None:
    """(depth, items, fixed JSON bytes) no value of an acyclic schema without arrays and maps exceeds, as
    service/schemas/avro_limits.py counts them; None for other schemas."""
    memo: dict[int, tuple[int, int, int]] = {}

    def bound(i: int) -> tuple[int, int, int]:
        got = memo.get(i)
        if got is not None:
            return got
        kind, _, _, kids, frags = nodes[i]
        if kind in (_K_ARRAY, _K_MAP):
            raise ValueError("unbounded")
        if kind == _K_RECORD:
            parts = [bound(k) for k in kids]
            got = (1 + max((p[0] for p in parts), default=0), len(kids) + sum(p[1] for p in parts),
                   2 + sum(map(len, frags)) + sum(p[2] for p in parts))
        elif kind == _K_UNION:
            parts = [bound(k) for k in kids]
            got = (max((p[0] for p in parts), default=0), max((p[1] for p in parts), default=0),
                   max((p[2] for p in parts), default=0))
        elif kind == _K_ENUM:
            got = (0, 0, max(map(len, frags), default=0))
        else:
            got = (0, 0, 4 if kind <= 1 or kind == _K_NULL else 2)
        memo[i] = got
        return got

    try:
        depth, items, est = bound(0)
    except (ValueError, RecursionError):
        return None
    return depth, items + 1, est


def _refs(node: Any) -> list[int]:
    _, _, child, kids, _ = node
    return [child, *kids] if child >= 0 else list(kids)


def _check_depth(value: Any, limit: int) -> None:
    """Raise :class:`AvroEncodeError` when JSON ``value`` nests objects / arrays deeper than ``limit``."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Iterable[Any] = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if d > limit:
            raise AvroEncodeError("$", f"nested deeper than {avro_limits.LIMITS.max_depth} levels "
                                  "(GATEWAY_SCHEMA_MAX_DEPTH)")
        stack.extend((c, d + 1) for c in children)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, EOFError) or not text:
        return f"payload ends early or is not Avro for this schema ({type(exc).__name__})"
    return f"not Avro for this schema: {text}"

