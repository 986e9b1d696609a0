"""The declarative message DSL and the compiler that derives codecs from it.

A :class:`MessageSchema` lists fields with Kafka's version ranges (``"3+"``, ``"0-4"``), nullable
versions, tags and defaults. :func:`compile_schema` turns it into a family of ``__slots__`` classes
(one per struct) and, lazily, one generated encoder and decoder per version. Generated code packs
runs of fixed-width fields with a single ``struct`` call, so no per-version codec is written by hand.
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from service.protocol import primitives as P
from service.protocol.errors import ProtocolDecodeError, UnsupportedVersionError

VersionRange = tuple[int, int]
_OPEN = 1 << 15


@functools.cache  # a few dozen distinct specs; asked on every request's header
def parse_versions(spec: str | None) -> VersionRange | None:
    """``"3+"`` → (3, open); ``"0-4"`` → (0, 4); ``"2"`` → (2, 2); ``None``/``"none"`` → None."""
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return (int(spec[:-1]), _OPEN)
    if "-" in spec:
        lo, hi = spec.split("-", 1)
        return (int(lo), int(hi))
    return (int(spec), int(spec))


def in_range(r: VersionRange | None, v: int) -> bool:
    return r is not None and r[0] <= v <= r[1]


_FIXED = {
    "int8": ("b", 1),
    "int16": ("h", 2),
    "int32": ("i", 4),
    "int64": ("q", 8),
    "uint16": ("H", 2),
    "uint32": ("I", 4),
    "float64": ("d", 8),
    "bool": ("?", 1),
}
PRIMITIVES = frozenset({*_FIXED, "string", "bytes", "records", "uuid"})


@dataclass(frozen=True)
class F:
    """One field. ``type`` uses Kafka's spelling: ``int32``, ``string``, ``[]int32``, ``[]Struct``, ``Struct``."""

    name: str
    type: str
    versions: str
    nullable: str | None = None
    tag: int | None = None
    tagged: str | None = None
    default: Any = None
    ignorable: bool = False
    fields: tuple[F, ...] = ()

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element_type(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        return self.element_type not in PRIMITIVES

    def present(self, v: int) -> bool:
        return in_range(parse_versions(self.versions), v)

    def nullable_in(self, v: int) -> bool:
        return in_range(parse_versions(self.nullable), v)

    def tagged_in(self, v: int) -> bool:
        return self.tag is not None and in_range(parse_versions(self.tagged), v)


@dataclass(frozen=True)
class MessageSchema:
    name: str
    api_key: int | None
    kind: str  # "request" | "response" | "data"
    versions: VersionRange
    flexible: str
    fields: tuple[F, ...] = field(default_factory=tuple)

    def is_flexible(self, v: int) -> bool:
        return in_range(parse_versions(self.flexible), v)


class Struct:
    """Base of generated message classes: slots, keyword/positional init, equality, repr."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    if TYPE_CHECKING:
        # each generated class has its own __init__ (its fields, by keyword or position)
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict[str, Any]:
        def conv(x: Any) -> Any:
            if isinstance(x, Struct):
                return x.to_dict()
            if isinstance(x, list):
                return [conv(i) for i in x]
            return x

        return {n: conv(getattr(self, n)) for n in self._fields}


_MISSING = object()


def _default_value(f: F) -> Any:
    """The value a field takes when absent: Kafka's ``default`` or the type's zero value."""
    d = f.default
    if f.is_array:
        return None if d == "null" else []
    if f.is_struct:
        return None  # replaced by a fresh default struct in __init__
    t = f.type
    if d == "null":
        return None
    if t in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        if d is None or d == "":
            return 0
        return int(d, 0) if isinstance(d, str) else int(d)
    if t == "float64":
        return float(d) if d not in (None, "") else 0.0
    if t == "bool":
        return d in ("true", True)
    if t == "string":
        return "" if d is None else str(d)
    if t in ("bytes", "records"):
        return b"" if t == "bytes" else None
    if t == "uuid":
        return P.ZERO_UUID
    raise ValueError(f"unknown type {t!r} for {f.name}")


class CompiledMessage:
    """Everything derived from one :class:`MessageSchema`: classes and per-version codecs."""

    def __init__(self, schema: MessageSchema) -> None:
        self.schema = schema
        self.classes: dict[str, type[Struct]] = {}
        self.struct_fields: dict[str, tuple[F, ...]] = {}
        self.cls = self._make_class(schema.name, schema.fields)
        self._encoders: dict[int, Callable[[Any, bytearray], None]] = {}
        self._decoders: dict[int, Callable[[Any, int], tuple[Any, int]]] = {}

    # -- classes -----------------------------------------------------------------------------
    def _make_class(self, name: str, fields: tuple[F, ...]) -> type[Struct]:
        self.struct_fields[name] = fields
        for f in fields:
            if f.is_struct and f.fields:
                self._make_class(f.element_type, f.fields)
            elif f.is_struct and f.element_type not in self.classes:  # pragma: no cover - schema bug
                raise ValueError(f"{self.schema.name}: struct {f.element_type} used before it is defined")
        names = tuple(f.name for f in fields)
        params, body = [], []
        ns: dict[str, Any] = {"_MISSING": _MISSING}
        for f in fields:
            dflt = _default_value(f)
            if f.is_struct and not f.is_array and f.default == "null":  # a nullable struct: None by default
                params.append(f"{f.name}=None")
                body.append(f"    self.{f.name} = None if {f.name} is _MISSING else {f.name}")
            elif f.is_struct and not f.is_array:
                ns[f"_c_{f.name}"] = self.classes[f.element_type]
                params.append(f"{f.name}=_MISSING")
                body.append(f"    self.{f.name} = _c_{f.name}() if {f.name} is _MISSING else {f.name}")
            elif isinstance(dflt, list):
                params.append(f"{f.name}=_MISSING")
                body.append(f"    self.{f.name} = [] if {f.name} is _MISSING else {f.name}")
            else:
                ns[f"_d_{f.name}"] = dflt
                params.append(f"{f.name}=_d_{f.name}")
                body.append(f"    self.{f.name} = {f.name}")
        src = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass") + "\n"
        if not params:
            src = "def __init__(self):\n    pass\n"
        exec(compile(src, f"<kafka-class {name}>", "exec"), ns)
        cls = type(name, (Struct,), {"__slots__": names, "_fields": names, "__init__": ns["__init__"]})
        cls.__qualname__ = f"{self.schema.name}.{name}" if name != self.schema.name else name
        self.classes[name] = cls
        return cls

    # -- codecs --------------------------------------------------------------------------------
    def encoder(self, version: int) -> Callable[[Any, bytearray], None]:
        enc = self._encoders.get(version)
        if enc is None:
            self._check_version(version)
            enc = self._encoders[version] = _Generator(self, version).encoder()
        return enc

    def decoder(self, version: int) -> Callable[[Any, int], tuple[Any, int]]:
        dec = self._decoders.get(version)
        if dec is None:
            self._check_version(version)
            dec = self._decoders[version] = _Generator(self, version).decoder()
        return dec

    def _check_version(self, version: int) -> None:
        lo, hi = self.schema.versions
        if not lo <= version <= hi:
            raise UnsupportedVersionError(f"{self.schema.name} v{version} is outside v{lo}-v{hi}")

    def encode(self, obj: Any, version: int) -> bytes:
        out = bytearray()
        self.encoder(version)(obj, out)
        return bytes(out)

    def decode(self, buf: bytes | memoryview, version: int, pos: int = 0) -> Any:
        try:
            obj, end = self.decoder(version)(buf, pos)
        except ProtocolDecodeError:
            raise
        except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
            raise ProtocolDecodeError(f"malformed {self.schema.name} v{version}: {exc}") from exc
        if end > len(buf):
            raise ProtocolDecodeError(f"malformed {self.schema.name} v{version}: truncated")
        return obj


class _Generator:
    """Writes Python source for one (message, version) and execs it."""

    def __init__(self, cm: CompiledMessage, version: int) -> None:
        self.cm = cm
        self.v = version
        self.flex = cm.schema.is_flexible(version)
        self.ns: dict[str, Any] = {
            "P": P,
            "ProtocolDecodeError": ProtocolDecodeError,
            "UUID": uuid.UUID,
            "_MISSING": _MISSING,
        }
        self.funcs: list[str] = []
        self.done: set[str] = set()
        self.nstruct = 0

    def _struct_const(self, fmt: str) -> str:
        name = "_S_" + fmt.replace("?", "B_")
        if name not in self.ns:
            self.ns[name] = struct.Struct(">" + fmt)
        return name

    # ---------------- encoder ----------------
    def encoder(self) -> Callable[[Any, bytearray], None]:
        top = self._enc_struct(self.cm.schema.name, self.cm.schema.fields)
        src = "\n".join(self.funcs)
        exec(compile(src, f"<kafka-encode {self.cm.schema.name} v{self.v}>", "exec"), self.ns)
        # generated source: the checker cannot see the function exec just defined
        return cast("Callable[[Any, bytearray], None]", self.ns[top])

    def _enc_struct(self, name: str, fields: tuple[F, ...]) -> str:
        fname = f"e_{name}"
        if fname in self.done:
            return fname
        self.done.add(fname)
        lines = [f"def {fname}(o, out):"]
        run: list[F] = []

        def flush() -> None:
            if not run:
                return
            fmt = "".join(_FIXED[f.type][0] for f in run)
            sc = self._struct_const(fmt)
            args = ", ".join(f"o.{f.name}" for f in run)
            lines.append(f"    out += {sc}.pack({args})")
            run.clear()

        tagged: list[F] = []
        for f in fields:
            if f.tagged_in(self.v):
                tagged.append(f)
                continue
            if not f.present(self.v):
                continue
            if f.type in _FIXED:
                run.append(f)
                continue
            flush()
            lines.extend("    " + ln for ln in self._enc_value(f, f"o.{f.name}", "out"))
        flush()
        if self.flex:
            if not tagged:
                lines.append("    out.append(0)")
            else:
                lines.append("    tags = []")
                for f in sorted(tagged, key=lambda x: x.tag or 0):
                    dflt = _default_value(f)
                    dname = f"_tdef_{name}_{f.name}"
                    self.ns[dname] = dflt
                    cond = f"o.{f.name} is not None" if f.is_struct and not f.is_array else f"o.{f.name} != {dname}"
                    if f.is_struct and not f.is_array:
                        self.ns[dname] = self.cm.classes[f.element_type]()
                        cond = f"o.{f.name} is not None and o.{f.name} != {dname}"
                    lines.append(f"    if {cond}:")
                    lines.append("        tb = bytearray()")
                    lines.extend("        " + ln for ln in self._enc_value(f, f"o.{f.name}", "tb"))
                    lines.append(f"        tags.append(({f.tag}, tb))")
                lines.append("    P.write_uvarint(out, len(tags))")
                lines.append("    for t, tb in tags:")
                lines.append("        P.write_uvarint(out, t)")
                lines.append("        P.write_uvarint(out, len(tb))")
                lines.append("        out += tb")
        if len(lines) == 1:
            lines.append("    pass")
        self.funcs.append("\n".join(lines) + "\n")
        return fname

    def _enc_value(self, f: F, expr: str, out: str) -> list[str]:
        nullable = f.nullable_in(self.v)
        flex = self.flex
        if f.is_array:
            et = f.element_type
            lines = []
            if nullable:
                lines.append(f"if {expr} is None:")
                lines.append(f"    {out} += {'P.NULL_COMPACT' if flex else 'P.NULL_ARRAY32'}")
                lines.append("else:")
                ind = "    "
            else:
                ind = ""
            lines.append(f"{ind}_a = {expr}")
            if flex:
                lines.append(f"{ind}P.write_uvarint({out}, len(_a) + 1)")
            else:
                lines.append(f"{ind}{out} += P.INT32.pack(len(_a))")
            if f.is_struct:
                sub = self._enc_struct(et, self.cm.struct_fields[et])
                lines.append(f"{ind}for _e in _a:")
                lines.append(f"{ind}    {sub}(_e, {out})")
            else:
                lines.append(f"{ind}for _e in _a:")
                elem = F("_e", et, "0+")
                lines.extend(f"{ind}    " + ln for ln in self._enc_value(elem, "_e", out))
            return lines
        if f.is_struct:
            sub = self._enc_struct(f.element_type, self.cm.struct_fields[f.element_type])
            if nullable:  # a nullable struct: an int8 marker, -1 for null, 1 before the struct
                return [f"if {expr} is None:", f"    {out} += b'\\xff'", "else:", f"    {out} += b'\\x01'",
                        f"    {sub}({expr}, {out})"]
            return [f"{sub}({expr}, {out})"]
        t = f.type
        if t in _FIXED:
            return [f"{out} += {self._struct_const(_FIXED[t][0])}.pack({expr})"]
        if t == "string":
            fn = ("P.write_compact_nullable_string" if nullable else "P.write_compact_string") if flex else (
                "P.write_nullable_string" if nullable else "P.write_string")
            return [f"{fn}({out}, {expr})"]
        if t in ("bytes", "records"):
            fn = (("P.write_compact_nullable_bytes" if nullable or t == "records" else "P.write_compact_bytes")
                  if flex else ("P.write_nullable_bytes" if nullable or t == "records" else "P.write_bytes"))
            return [f"{fn}({out}, {expr})"]
        if t == "uuid":
            return [f"{out} += P.uuid_bytes({expr})"]
        raise ValueError(f"cannot encode type {t!r}")

    # ---------------- decoder ----------------
    def decoder(self) -> Callable[[Any, int], tuple[Any, int]]:
        top = self._dec_struct(self.cm.schema.name, self.cm.schema.fields)
        src = "\n".join(self.funcs)
        exec(compile(src, f"<kafka-decode {self.cm.schema.name} v{self.v}>", "exec"), self.ns)
        return cast("Callable[[Any, int], tuple[Any, int]]", self.ns[top])

    def _dec_struct(self, name: str, fields: tuple[F, ...]) -> str:
        fname = f"d_{name}"
        if fname in self.done:
            return fname
        self.done.add(fname)
        cls = self.cm.classes[name]
        cname = f"_C_{name}"
        self.ns[cname] = cls
        lines = [f"def {fname}(b, pos):"]
        run: list[F] = []
        values: dict[str, str] = {}

        def flush() -> None:
            if not run:
                return
            fmt = "".join(_FIXED[f.type][0] for f in run)
            sc = self._struct_const(fmt)
            size = struct.calcsize(">" + fmt)
            names = [f"v_{f.name}" for f in run]
            lhs = ", ".join(names) + ("," if len(names) == 1 else "")
            lines.append(f"    {lhs} = {sc}.unpack_from(b, pos)")
            lines.append(f"    pos += {size}")
            run.clear()

        tagged: list[F] = []
        for f in fields:
            if f.tagged_in(self.v):
                tagged.append(f)
            if not f.present(self.v) or f.tagged_in(self.v):
                d = _default_value(f)
                if (f.is_struct and not f.is_array and f.default != "null") or isinstance(d, list):
                    dexpr = "_MISSING"
                else:
                    dexpr = f"_dd_{name}_{f.name}"
                    self.ns[dexpr] = d
                if f.tagged_in(self.v):
                    lines.append(f"    v_{f.name} = {dexpr}")
                    values[f.name] = f"v_{f.name}"
                else:
                    values[f.name] = dexpr
                continue
            values[f.name] = f"v_{f.name}"
            if f.type in _FIXED:
                run.append(f)
                continue
            flush()
            lines.extend("    " + ln for ln in self._dec_value(f, f"v_{f.name}"))
        flush()
        if self.flex:
            lines.append("    ntag, pos = P.read_uvarint(b, pos)")
            lines.append("    for _ in range(ntag):")
            lines.append("        tag, pos = P.read_uvarint(b, pos)")
            lines.append("        tsize, pos = P.read_uvarint(b, pos)")
            lines.append("        tend = pos + tsize")
            first = True
            for f in tagged:
                kw = "if" if first else "elif"
                first = False
                lines.append(f"        {kw} tag == {f.tag}:")
                lines.extend("            " + ln for ln in self._dec_value(f, f"v_{f.name}"))
                lines.append("            if pos != tend:")
                lines.append(f"                raise ProtocolDecodeError('tagged field {f.name}: size mismatch')")
            lines.append("        pos = tend")
        args = ", ".join(values[f.name] for f in fields)
        lines.append(f"    return {cname}({args}), pos")
        self.funcs.append("\n".join(lines) + "\n")
        return fname

    def _dec_value(self, f: F, target: str) -> list[str]:
        nullable = f.nullable_in(self.v)
        flex = self.flex
        if f.is_array:
            lines = []
            if flex:
                lines.append("n, pos = P.read_uvarint(b, pos)")
                lines.append("n -= 1")
            else:
                lines.append("n, = P.INT32.unpack_from(b, pos)")
                lines.append("pos += 4")
            lines.append("if n < 0:")
            if nullable:
                lines.append(f"    {target} = None")
            else:
                lines.append(f"    raise ProtocolDecodeError('null array for non-nullable field {f.name}')")
            lines.append("else:")
            if f.is_struct:
                sub = self._dec_struct(f.element_type, self.cm.struct_fields[f.element_type])
                lines.append(f"    {target} = _l = []")
                lines.append("    for _ in range(n):")
                lines.append(f"        _e, pos = {sub}(b, pos)")
                lines.append("        _l.append(_e)")
            else:
                et = f.element_type
                if et in _FIXED:
                    ch, size = _FIXED[et]
                    lines.append(f"    {target} = list(struct_unpack_from('>%d{ch}' % n, b, pos))")
                    lines.append(f"    pos += {size} * n")
                    self.ns["struct_unpack_from"] = struct.unpack_from
                else:
                    lines.append(f"    {target} = _l = []")
                    lines.append("    for _ in range(n):")
                    elem = F("_e", et, "0+")
                    lines.extend("        " + ln for ln in self._dec_value(elem, "_e"))
                    lines.append("        _l.append(_e)")
            return lines
        if f.is_struct:
            sub = self._dec_struct(f.element_type, self.cm.struct_fields[f.element_type])
            if nullable:  # the int8 marker: negative for null
                return ["if b[pos] >= 128:", "    pos += 1", f"    {target} = None", "else:", "    pos += 1",
                        f"    {target}, pos = {sub}(b, pos)"]
            return [f"{target}, pos = {sub}(b, pos)"]
        t = f.type
        if t in _FIXED:
            ch, size = _FIXED[t]
            sc = self._struct_const(ch)
            return [f"{target}, = {sc}.unpack_from(b, pos)", f"pos += {size}"]
        if t == "string":
            fn = ("P.read_compact_nullable_string" if nullable else "P.read_compact_string") if flex else (
                "P.read_nullable_string" if nullable else "P.read_string")
            return [f"{target}, pos = {fn}(b, pos)"]
        if t == "records":  # zero-copy: a view of the frame
            fn = "P.read_compact_nullable_records" if flex else "P.read_nullable_records"
            return [f"{target}, pos = {fn}(b, pos)"]
        if t == "bytes":
            fn = "P.read_compact_nullable_bytes" if flex else "P.read_nullable_bytes"
            if not (nullable or t == "records"):
                fn = "P.read_compact_bytes" if flex else "P.read_bytes"
            return [f"{target}, pos = {fn}(b, pos)"]
        if t == "uuid":
            return [f"{target} = UUID(bytes=bytes(b[pos:pos + 16]))", "pos += 16"]
        raise ValueError(f"cannot decode type {t!r}")


def compile_schema(schema: MessageSchema) -> CompiledMessage:
    return CompiledMessage(schema)
