"""Avro records straight into Arrow columns, vectorised with numpy (for typed range reads).

fastavro decodes a record at a time into Python dicts that pyarrow then converts back: some microseconds a
record. Here all records of one writer schema are decoded together, field after field: a numpy array
holds every record's read position, and each field is read for all records at once (a varint for every
row in a handful of array operations; strings and bytes gathered into one Arrow data buffer), building the
Arrow arrays directly. Avro's binary encoding is a plain sequence of its fields, so reading field k of every
record needs only the positions left by field k-1.

:func:`compile_schema` returns ``None`` for what this reader does not do (the caller then uses fastavro):
decimals, recursive types, arrays of nulls, fixed with a logical type. Every other shape is read: records,
arrays and maps (blocked ones too), unions (nullable ones and several-branch ones), enums, fixed, the
date / time / timestamp / uuid logical types. It reads with the writer's schema; :func:`resolve` then
resolves the columns into a reader schema where that is plain (fields by name, defaults, promotions).

Any sign that a payload is not what its schema says -- a read past its end, bytes left over, a bad union
branch or enum index, a length out of range, invalid UTF-8 -- makes :meth:`ColumnReader.read` return
``None`` for the whole set, and the caller reads it record by record with fastavro, which names each bad
record. Output types are those of :mod:`service.schemas.arrow`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

_PAD = 16  # zero bytes after the data: a varint read near the end never indexes past the buffer
_GATHER = 1 << 20  # string bytes gathered per step (the int32 index of a step is 4x that)


class _Bad(Exception):
    """A payload is not what the schema says (the whole set goes to the fallback)."""


class _Unsupported(Exception):
    pass


class _State:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: np.ndarray, pos: np.ndarray, end: np.ndarray) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def long(self, rows: np.ndarray) -> np.ndarray:
        """A zigzag varint at the position of each row in ``rows``; positions advance. Byte k is read only
        for the rows whose varint is still going (most are one or two bytes long)."""
        p = self.pos[rows]
        if len(p) == 0:
            return np.zeros(0, np.int64)
        buf = self.buf
        b = buf[p]
        v = (b & 0x7F).astype(np.uint64)
        length = np.ones(len(p), np.int64)
        going = np.flatnonzero(b & 0x80)
        shift = np.uint64(7)
        while len(going):
            if shift > 63:
                raise _Bad("varint longer than 10 bytes")
            b = buf[p[going] + length[going]]
            v[going] |= (b & 0x7F).astype(np.uint64) << shift
            length[going] += 1
            going = going[(b & 0x80) != 0]
            shift += np.uint64(7)
        value = (v >> np.uint64(1)).astype(np.int64) ^ -(v & np.uint64(1)).astype(np.int64)
        newp = p + length
        if (newp > self.end[rows]).any():
            raise _Bad("read past the end of a payload")
        self.pos[rows] = newp
        return value

    def fixed(self, rows: np.ndarray, size: int) -> np.ndarray:
        """``size`` bytes of each row, as an (m, size) uint8 array."""
        p = self.pos[rows]
        newp = p + size
        if (newp > self.end[rows]).any():
            raise _Bad("read past the end of a payload")
        self.pos[rows] = newp
        return self.buf[p[:, None] + np.arange(size)]

    def blobs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Length-prefixed bytes of each row: (int32 Arrow offsets, data bytes)."""
        n = self.long(rows)
        p = self.pos[rows]
        if (n < 0).any() or (p + n > self.end[rows]).any():
            raise _Bad("a string or bytes length out of range")
        self.pos[rows] = p + n
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(n, out=offsets[1:])
        total = int(offsets[-1])
        if total >= 2**31:
            raise _Bad("more than 2 GiB of strings in one column")
        data = np.empty(total, np.uint8)
        # gathered through an index per byte, in chunks of about _GATHER bytes so the index stays small
        shift = (p - offsets[:-1]).astype(np.int32)
        lo = 0
        while lo < len(n):
            hi = max(lo + 1, int(np.searchsorted(offsets, offsets[lo] + _GATHER, side="right")) - 1)
            a, b = int(offsets[lo]), int(offsets[hi])
            if b > a:
                data[a:b] = self.buf[np.repeat(shift[lo:hi], n[lo:hi]) + np.arange(a, b, dtype=np.int32)]
            lo = hi
        return offsets.astype(np.int32), data


Read = Callable[[_State, np.ndarray], pa.Array]


def _varlen(kind: pa.DataType) -> Read:
    def read(st: _State, rows: np.ndarray) -> pa.Array:
        offsets, data = st.blobs(rows)
        arr = pa.Array.from_buffers(kind, len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        if kind == pa.string():
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise _Bad(str(exc)) from None
        return arr
    return read


def _long_as(typ: pa.DataType, check32: bool = False, scale: int = 1) -> Read:
    def read(st: _State, rows: np.ndarray) -> pa.Array:
        v = st.long(rows)
        if check32:
            if len(v) and (v.min() < -(2**31) or v.max() >= 2**31):
                raise _Bad("an int out of range")
            if typ == pa.int32() or typ == pa.date32():
                return pa.array(v.astype(np.int32), pa.int32()).view(typ)
        if scale != 1:
            v = v * scale
        if pa.types.is_time(typ) and len(v) and (v.min() < 0 or v.max() >= 86_400_000_000):
            raise _Bad("a time of day out of range")
        return pa.array(v, pa.int64()).view(typ) if typ != pa.int64() else pa.array(v, pa.int64())
    return read


def _float(size: int) -> Read:
    dtype, typ = (np.dtype("<f4"), pa.float32()) if size == 4 else (np.dtype("<f8"), pa.float64())

    def read(st: _State, rows: np.ndarray) -> pa.Array:
        raw = np.ascontiguousarray(st.fixed(rows, size))
        return pa.array(raw.view(dtype).reshape(-1), typ)
    return read


def _boolean(st: _State, rows: np.ndarray) -> pa.Array:
    b = st.fixed(rows, 1).reshape(-1)
    if (b > 1).any():
        raise _Bad("a boolean byte other than 0 or 1")
    return pa.array(b.astype(bool), pa.bool_())


def _null(st: _State, rows: np.ndarray) -> pa.Array:
    return pa.nulls(len(rows))


def _fixed(size: int) -> Read:
    def read(st: _State, rows: np.ndarray) -> pa.Array:
        raw = np.ascontiguousarray(st.fixed(rows, size)).reshape(-1)
        offsets = (np.arange(len(rows) + 1, dtype=np.int64) * size).astype(np.int32)
        return pa.Array.from_buffers(pa.binary(), len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(raw)])
    return read


def _enum(symbols: list[str]) -> Read:
    table = pa.array(symbols, pa.string())

    def read(st: _State, rows: np.ndarray) -> pa.Array:
        i = st.long(rows)
        if len(i) and (i.min() < 0 or i.max() >= len(symbols)):
            raise _Bad("an enum index out of range")
        return table.take(pa.array(i, pa.int64()))
    return read


def _scatter(child: pa.Array, where: np.ndarray, n: int) -> pa.Array:
    """``child`` (values of the rows ``where``) spread over ``n`` rows, null elsewhere."""
    idx = np.full(n, -1, np.int64)
    idx[where] = np.arange(len(where))
    return child.take(pa.array(idx, pa.int64(), mask=idx < 0))


def _union(branches: list[tuple[bool, Read | None]], typ: pa.DataType) -> Read:
    """``branches``: (is null, reader) per branch in schema order; ``typ``: the mapped Arrow type."""
    nonnull = [i for i, (isnull, _) in enumerate(branches) if not isnull]

    def read(st: _State, rows: np.ndarray) -> pa.Array:
        b = st.long(rows)
        if len(b) and (b.min() < 0 or b.max() >= len(branches)):
            raise _Bad("a union branch index out of range")
        n = len(rows)
        if len(nonnull) == 1:
            k = nonnull[0]
            where = np.flatnonzero(b == k)
            child = branches[k][1](st, rows[where])  # type: ignore[misc]
            return child if len(where) == n else _scatter(child, where, n)
        members = []
        for k in nonnull:
            where = np.flatnonzero(b == k)
            members.append(_scatter(branches[k][1](st, rows[where]), where, n))  # type: ignore[misc]
        isnull = np.isin(b, [i for i, (x, _) in enumerate(branches) if x])
        return pa.StructArray.from_arrays(members, fields=list(typ), mask=pa.array(isnull, pa.bool_()))
    return read


def _record(fields: list[tuple[str, Read]], typ: pa.DataType) -> Read:
    def read(st: _State, rows: np.ndarray) -> pa.Array:
        children = [r(st, rows) for _, r in fields]
        return pa.StructArray.from_arrays(children, fields=list(typ))
    return read


def _blocks(st: _State, rows: np.ndarray, item: Callable[[np.ndarray], list[pa.Array]]) -> tuple[np.ndarray,
                                                                                                 list[pa.Array]]:
    """Avro's blocked arrays / maps: per row a sequence of (count, items) blocks ending with count 0 (a
    negative count is followed by the block's byte size). Items are read block by block, item j of every
    row that has one at once; returns the Arrow list offsets and the item arrays in row order."""
    n = len(rows)
    counts = np.zeros(n, np.int64)
    parts: list[list[pa.Array]] = []
    dest: list[np.ndarray] = []  # per step: the row-local index (into rows) of each item read
    active = np.arange(n)
    while len(active):
        c = st.long(rows[active])
        neg = c < 0
        if neg.any():
            c = np.abs(c)
            st.long(rows[active[neg]])  # the block's size in bytes: not needed
        room = st.end[rows[active]] - st.pos[rows[active]]
        if (c > room).any():
            raise _Bad("an array or map count larger than its payload")
        more = c > 0
        active, c = active[more], c[more]
        for j in range(int(c.max()) if len(c) else 0):
            step = active[c > j]
            parts.append(item(rows[step]))
            dest.append(step)
        counts[active] += c
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    if not dest:
        return offsets, []
    # items came out step by step (item j of each row); put them in row order
    owner = np.concatenate(dest)
    order = np.argsort(owner, kind="stable")
    columns = [pa.concat_arrays([p[k] for p in parts]).take(pa.array(order, pa.int64())) for k in range(len(parts[0]))]
    return offsets, columns


def _array(inner: Read, item_type: pa.DataType) -> Read:
    def read(st: _State, rows: np.ndarray) -> pa.Array:
        offsets, cols = _blocks(st, rows, lambda r: [inner(st, r)])
        values = cols[0] if cols else pa.array([], item_type)
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), values,
                                        type=pa.list_(item_type))
    return read


def _map(inner: Read, value_type: pa.DataType) -> Read:
    key = _varlen(pa.string())

    def read(st: _State, rows: np.ndarray) -> pa.Array:
        offsets, cols = _blocks(st, rows, lambda r: [key(st, r), inner(st, r)])
        keys = cols[0] if cols else pa.array([], pa.string())
        values = cols[1] if cols else pa.array([], value_type)
        return pa.MapArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), keys, values,
                                       type=pa.map_(pa.string(), value_type))
    return read


_TS_UNITS = {"millis": "ms", "micros": "us", "nanos": "ns"}


class _Compiler:
    def __init__(self) -> None:
        self.named: dict[str, tuple[dict, str | None]] = {}
        self.active: set[str] = set()

    def full(self, name: str, ns: str | None) -> str:
        return name if "." in name or not ns else f"{ns}.{name}"

    def compile(self, s: Any, ns: str | None) -> tuple[Read, pa.DataType]:
        if isinstance(s, str):
            prim = _PRIMITIVES.get(s)
            if prim is not None:
                return prim
            for cand in (self.full(s, ns), s):
                if cand in self.named:
                    d, dns = self.named[cand]
                    return self.named_type(d, dns)
            raise _Unsupported(f"unknown type {s}")
        if isinstance(s, list):
            branches: list[tuple[bool, Read | None]] = []
            types = []
            for b in s:
                if b == "null" or (isinstance(b, dict) and b.get("type") == "null"):
                    branches.append((True, None))
                else:
                    r, t = self.compile(b, ns)
                    branches.append((False, r))
                    types.append(t)
            if not types:
                return _null, pa.null()
            if len(types) == 1:
                typ = types[0]
            else:
                typ = pa.struct([pa.field(f"member{i}", t) for i, t in enumerate(types)])
            return _union(branches, typ), typ
        if not isinstance(s, dict):
            raise _Unsupported("not a schema")
        t = s.get("type")
        lt = s.get("logicalType")
        if lt is not None:
            got = self.logical(s, t, lt)
            if got is not None:
                return got
        if t in _PRIMITIVES:
            return _PRIMITIVES[t]
        if t in ("record", "error", "enum", "fixed"):
            name = s["name"]
            nns = name.rpartition(".")[0] if "." in name else s.get("namespace", ns)
            full = self.full(name, nns)
            self.named[full] = (s, nns)
            return self.named_type(s, nns)
        if t == "array":
            r, it = self.compile(s.get("items"), ns)
            if it == pa.null():
                raise _Unsupported("an array of nulls")
            return _array(r, it), pa.list_(it)
        if t == "map":
            r, vt = self.compile(s.get("values"), ns)
            return _map(r, vt), pa.map_(pa.string(), vt)
        return self.compile(t, ns)

    def named_type(self, s: dict, ns: str | None) -> tuple[Read, pa.DataType]:
        t = s.get("type")
        if t == "enum":
            return _enum(list(s.get("symbols") or [])), pa.string()
        if t == "fixed":
            if s.get("logicalType") in ("decimal", "uuid", "duration"):
                raise _Unsupported(f"fixed with logical type {s.get('logicalType')}")
            return _fixed(int(s["size"])), pa.binary()
        full = self.full(s["name"], ns)
        if full in self.active:
            raise _Unsupported("a recursive type")
        self.active.add(full)
        try:
            fields = []
            for f in s.get("fields") or []:
                r, ft = self.compile(f["type"], ns)
                fields.append((f["name"], r, ft))
        finally:
            self.active.discard(full)
        typ = pa.struct([pa.field(name, ft) for name, _, ft in fields])
        return _record([(name, r) for name, r, _ in fields], typ), typ

    def logical(self, s: dict, base: Any, lt: str) -> tuple[Read, pa.DataType] | None:
        if lt == "date" and base == "int":
            return _long_as(pa.date32(), check32=True), pa.date32()
        if lt == "time-millis" and base == "int":
            return _long_as(pa.time64("us"), scale=1000), pa.time64("us")
        if lt == "time-micros" and base == "long":
            return _long_as(pa.time64("us")), pa.time64("us")
        if base == "long" and lt.rpartition("-")[0] in ("timestamp", "local-timestamp") and \
                lt.rpartition("-")[2] in _TS_UNITS:
            typ = pa.timestamp(_TS_UNITS[lt.rpartition("-")[2]], None if lt.startswith("local") else "UTC")
            return _long_as(typ), typ
        if lt == "uuid" and base == "string":
            return _varlen(pa.string()), pa.string()
        if lt == "decimal":
            raise _Unsupported("decimal")
        return None


_PRIMITIVES: dict[str, tuple[Read, pa.DataType]] = {
    "null": (_null, pa.null()), "boolean": (_boolean, pa.bool_()), "int": (_long_as(pa.int32(), True), pa.int32()),
    "long": (_long_as(pa.int64()), pa.int64()), "float": (_float(4), pa.float32()), "double": (_float(8), pa.float64()),
    "bytes": (_varlen(pa.binary()), pa.binary()), "string": (_varlen(pa.string()), pa.string()),
}


class ColumnReader:
    """One writer schema compiled for columnar reading."""

    def __init__(self, read: Read, typ: pa.DataType) -> None:
        self._read = read
        self.type = typ

    def read(self, payloads: list[Any]) -> pa.Array | None:
        """The payloads (unframed, one writer schema) as one Arrow array, or None: read them one by one."""
        n = len(payloads)
        if n == 0:
            return None
        lengths = np.fromiter(map(len, payloads), np.int64, n)
        end = np.cumsum(lengths)
        start = end - lengths
        data = b"".join(payloads) + bytes(_PAD)
        st = _State(np.frombuffer(data, np.uint8), start.copy(), end)
        try:
            with np.errstate(over="ignore"):
                arr = self._read(st, np.arange(n))
        except (_Bad, pa.ArrowInvalid, IndexError, ValueError, OverflowError):
            return None
        if not np.array_equal(st.pos, end):  # bytes left over in some payload
            return None
        return arr


def compile_schema(schema: Any, expected: pa.DataType | None = None) -> ColumnReader | None:
    """A columnar reader of an Avro schema (JSON data), or None when it has what this reader does not do.
    ``expected``: the Arrow type the caller maps the schema to (the readers must agree, else None)."""
    c = _Compiler()
    try:
        read, typ = c.compile(schema, None)
    except (_Unsupported, KeyError, TypeError, ValueError):
        return None
    if expected is not None and typ != expected:
        return None
    return ColumnReader(read, typ)


# ------------------------------------------------------------------------------- schema resolution on columns
class CannotResolve(Exception):
    """The writer -> reader resolution has a case :func:`resolve` does not do (fastavro then does it)."""


_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
               ("float", "double")}


def _branches(node: Any) -> list[Any]:
    return [b for b in node.items if b.kind != "null"] if node.kind == "union" else [node]


def _resolve(w: Any, r: Any, arr: pa.Array, rtype: pa.DataType) -> pa.Array:
    if w.kind == "union" or r.kind == "union":
        wb, rb = _branches(w), _branches(r)
        if len(wb) != 1 or len(rb) != 1:
            if arr.type == rtype and _same(w, r):
                return arr
            raise CannotResolve("a union of several types changed")
        if r.kind != "union" and arr.null_count:
            raise CannotResolve("nulls where the reader has no null branch")
        return _resolve(wb[0], rb[0], arr, rtype)
    if w.kind != r.kind:
        if (w.kind, r.kind) in _PROMOTIONS and arr.type in (pa.int32(), pa.int64(), pa.float32()):
            return arr.cast(rtype)
        raise CannotResolve(f"{w.kind} read as {r.kind}")
    kind = w.kind
    if kind == "record":
        if w.fullname.rpartition(".")[2] != r.fullname.rpartition(".")[2]:
            raise CannotResolve("record names differ")
        wfields = {name: node for name, node, _, _ in w.fields}
        children = []
        for i, (name, node, has_default, default) in enumerate(r.fields):
            ftype = rtype.field(i).type
            if name in wfields:
                children.append(_resolve(wfields[name], node, arr.field(name), ftype))
            elif has_default and (default is None or isinstance(default, (bool, int, float, str))) and \
                    not pa.types.is_binary(ftype):
                try:
                    children.append(pa.array([default] * len(arr), ftype))
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
                    raise CannotResolve(f"default of {name}: {exc}") from None
            else:
                raise CannotResolve(f"field {name}: no such writer field and no simple default")
        return pa.StructArray.from_arrays(children, fields=list(rtype), mask=arr.is_null())
    if kind == "array":
        values = _resolve(w.items[0], r.items[0], arr.values, rtype.value_type)
        return pa.ListArray.from_arrays(arr.offsets, values, type=rtype, mask=arr.is_null())
    if kind == "map":
        items = _resolve(w.items[0], r.items[0], arr.items, rtype.item_type)
        return pa.MapArray.from_arrays(arr.offsets, arr.keys, items, type=rtype)
    if kind == "enum":
        if not set(w.symbols) <= set(r.symbols):
            raise CannotResolve("writer enum symbols the reader does not have")
        return arr
    if kind == "fixed" and w.size != r.size:
        raise CannotResolve("fixed sizes differ")
    if arr.type != rtype:
        raise CannotResolve(f"{arr.type} read as {rtype}")
    return arr


def _same(w: Any, r: Any) -> bool:
    """Two schema nodes of the same shape (names, fields, branches), as far as the values go."""
    if w.kind != r.kind:
        return False
    if w.kind in ("record",):
        return [n for n, _, _, _ in w.fields] == [n for n, _, _, _ in r.fields] and all(
            _same(a, b) for (_, a, _, _), (_, b, _, _) in zip(w.fields, r.fields, strict=True))
    if w.kind == "enum":
        return w.symbols == r.symbols
    if w.kind == "fixed":
        return w.size == r.size
    if w.kind in ("array", "map", "union"):
        return len(w.items) == len(r.items) and all(_same(a, b) for a, b in zip(w.items, r.items, strict=True))
    return True


def resolve(writer: Any, reader: Any, arr: pa.Array, reader_type: pa.DataType) -> pa.Array:
    """``arr`` (records read with the writer schema, as Arrow) resolved into the reader schema's Arrow type
    by Avro's rules where they are plain on columns: fields by name (a reader field the writer lacks takes
    its default when that is null or a scalar), dropped writer fields, numeric promotions, enum symbols the
    reader has, nullable wrappers. Raises :class:`CannotResolve` for anything else (aliases, unions whose
    branches changed, string <-> bytes, complex defaults): the caller reads with fastavro, which also names
    the records that cannot be resolved at all. ``writer`` / ``reader``: schema data (JSON)."""
    from service.schemas.avro import _Parser

    try:
        w = _Parser().parse(writer, None)
        r = _Parser().parse(reader, None)
    except Exception as exc:  # any schema the Avro codec's parser refuses
        raise CannotResolve(str(exc)) from None
    if _has_aliases(writer) or _has_aliases(reader):
        raise CannotResolve("aliases")
    try:
        return _resolve(w, r, arr, reader_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, IndexError) as exc:
        raise CannotResolve(str(exc)) from None


def _has_aliases(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_has_aliases(b) for b in schema)
    if isinstance(schema, dict):
        if "aliases" in schema:
            return True
        return any(_has_aliases(schema.get(k)) for k in ("type", "items", "values")) or any(
            isinstance(f, dict) and ("aliases" in f or _has_aliases(f.get("type"))) for f in schema.get("fields") or [])
    return False
