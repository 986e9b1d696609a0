"""Protobuf payloads <-> the JSON the Confluent REST Proxy v2 speaks. Sans-io.

The schema is a ``FileDescriptorProto``, not ``.proto`` text: the Schema Registry hands one out for any
Protobuf schema with ``GET /schemas/ids/{id}?format=serialized`` (base64 of the serialized descriptor;
Confluent's registry and Karapace both answer it), and so does each referenced schema (its import).
That needs no ``.proto`` parser at all; the ``protobuf`` package builds the message classes from the
descriptors (dynamic messages, no generated code). Imports of ``google/protobuf/*.proto`` (the well-known
types) come from the ``protobuf`` package itself; any other import must be given in ``dependencies``
(import name -> descriptor), as the registry's ``references`` list names them.

A record's message type is picked by its message indexes (from the wire frame): ``[1, 0]`` is the first
nested message of the file's second message; ``[0]`` (or none) the file's first message.

Rendering is protobuf's canonical JSON mapping, as Confluent's ProtobufConverter prints it
(``JsonFormat.printer().includingDefaultValueFields()``): lowerCamelCase json names, fields at their
default value included, 64-bit integers as strings, enums by name, bytes base64, well-known types in their
JSON forms (Timestamp as RFC 3339 text, ...). Encode parses the same JSON (unknown fields rejected, as
JsonFormat's parser does), so an error names the field chain it failed in.

Depth: a value (the JSON given to encode, or a decoded message's JSON) nests at most ``max_depth`` levels of
objects and arrays (GATEWAY_SCHEMA_MAX_DEPTH); protobuf's own parser stops at 100 nested messages. A payload
past either, or one whose JSON rendering fails (a ``google.protobuf.Value`` holding NaN, an ``Any`` of an
unknown type), is that record's decode error, never an exception out of :meth:`ProtobufCodec.decode_many`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError as _PbDecodeError
from google.protobuf.message import EncodeError as _PbEncodeError

from service.schemas.errors import CodecDecodeError, CodecEncodeError, CodecSchemaError
from service.schemas.jsonschema_format import DEFAULT_MAX_DEPTH, value_depth

F = descriptor_pb2.FieldDescriptorProto
SchemaInput = bytes | bytearray | memoryview | str | descriptor_pb2.FileDescriptorProto


class ProtobufSchemaError(CodecSchemaError):
    """The descriptor (or one of its dependencies) is missing, malformed or inconsistent."""


class ProtobufEncodeError(CodecEncodeError):
    """A JSON value does not fit the message; ``path`` names the field chain (``$`` is the root)."""


class ProtobufDecodeError(CodecDecodeError):
    """A payload is not a valid message of its type, or its message indexes name no message."""


def load_descriptor(schema: SchemaInput) -> descriptor_pb2.FileDescriptorProto:
    """A ``FileDescriptorProto`` from serialized bytes, the registry's base64 text, or itself."""
    if isinstance(schema, descriptor_pb2.FileDescriptorProto):
        copy = descriptor_pb2.FileDescriptorProto()
        copy.CopyFrom(schema)  # normalize() edits it
        return copy
    if isinstance(schema, str):
        if re.search(r"\b(syntax|message|package)\b", schema) and not re.fullmatch(r"[A-Za-z0-9+/=\s]*", schema):
            raise ProtobufSchemaError(
                "got .proto text; fetch the schema as a descriptor (GET /schemas/ids/{id}?format=serialized)")
        try:
            raw = base64.b64decode(schema, validate=False)
        except (binascii.Error, ValueError) as exc:
            raise ProtobufSchemaError(f"not a base64 descriptor: {exc}") from None
    else:
        raw = bytes(schema)
    fdp = descriptor_pb2.FileDescriptorProto()
    try:
        fdp.ParseFromString(raw)
    except _PbDecodeError as exc:
        raise ProtobufSchemaError(f"not a serialized FileDescriptorProto: {exc}") from None
    return fdp


_SCALARS = {
    "double": F.TYPE_DOUBLE, "float": F.TYPE_FLOAT, "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64,
    "int32": F.TYPE_INT32, "fixed64": F.TYPE_FIXED64, "fixed32": F.TYPE_FIXED32, "bool": F.TYPE_BOOL,
    "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES, "uint32": F.TYPE_UINT32, "sfixed32": F.TYPE_SFIXED32,
    "sfixed64": F.TYPE_SFIXED64, "sint32": F.TYPE_SINT32, "sint64": F.TYPE_SINT64,
}
_MAP = re.compile(r"map\s*<\s*([\w.]+)\s*,\s*([\w.]+)\s*>")


def _symbols(fdp: descriptor_pb2.FileDescriptorProto, out: dict[str, str]) -> None:
    """Fully-qualified message and enum names of a file (``.pkg.Outer.Inner`` -> "message" / "enum")."""

    def walk(scope: str, messages: Iterable[Any], enums: Iterable[Any]) -> None:
        for enum in enums:
            out[f"{scope}.{enum.name}"] = "enum"
        for msg in messages:
            name = f"{scope}.{msg.name}"
            out[name] = "message"
            walk(name, msg.nested_type, msg.enum_type)

    walk(f".{fdp.package}" if fdp.package else "", fdp.message_type, fdp.enum_type)


def _resolve(name: str, scope: str, symbols: Mapping[str, str]) -> str | None:
    """Protobuf's scoping: a relative name is looked up from the innermost scope outwards."""
    if name.startswith("."):
        return name if name in symbols else None
    while True:
        candidate = f"{scope}.{name}"
        if candidate in symbols:
            return candidate
        if not scope:
            return None
        scope = scope.rpartition(".")[0]


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def normalize(fdp: descriptor_pb2.FileDescriptorProto, symbols: dict[str, str]) -> None:
    """Make a descriptor as the registry may store it into one the protobuf runtime builds, in place.

    Karapace serializes a schema's parsed ``.proto`` without compiling it: type names as written
    (relative), no message/enum type on such fields, ``map<K, V>`` left as a type name, ``optional``
    proto3 fields without their synthetic oneof, no file name. protoc-made descriptors (Confluent's)
    pass through unchanged. ``symbols`` holds the names of this file and its imports (see ``_symbols``)."""

    def fix(msg: Any, scope: str) -> None:
        name = f"{scope}.{msg.name}"
        for nested in msg.nested_type:
            fix(nested, name)
        synthetic: list[Any] = []
        for field in msg.field:
            if field.type_name:
                mapped = _MAP.fullmatch(field.type_name)
                if mapped:
                    entry = msg.nested_type.add(name=f"{_camel(field.name)}Entry")
                    entry.options.map_entry = True
                    for number, (fname, ftype) in enumerate((("key", mapped[1]), ("value", mapped[2])), 1):
                        sub = entry.field.add(name=fname, number=number, label=F.LABEL_OPTIONAL)
                        if ftype in _SCALARS:
                            sub.type = _SCALARS[ftype]
                        else:
                            sub.type_name = ftype
                            _fix_named(sub, name)
                    field.ClearField("type")
                    field.type_name = f"{name}.{entry.name}"
                    field.type = F.TYPE_MESSAGE
                    field.label = F.LABEL_REPEATED
                    symbols[field.type_name] = "message"
                else:
                    _fix_named(field, name)
            if field.proto3_optional and not field.HasField("oneof_index"):
                synthetic.append(field)
        for field in synthetic:  # synthetic oneofs come after the real ones
            field.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{field.name}")

    def _fix_named(field: Any, scope: str) -> None:
        resolved = _resolve(field.type_name, scope, symbols)
        if resolved is None:
            raise ProtobufSchemaError(f"field {field.name}: unknown type {field.type_name}")
        field.type_name = resolved
        if not field.HasField("type") or field.type not in (F.TYPE_MESSAGE, F.TYPE_ENUM, F.TYPE_GROUP):
            field.type = F.TYPE_ENUM if symbols[resolved] == "enum" else F.TYPE_MESSAGE

    package = f".{fdp.package}" if fdp.package else ""
    for msg in fdp.message_type:
        fix(msg, package)


def _message_path(fdp: descriptor_pb2.FileDescriptorProto, indexes: Sequence[int]) -> str:
    """The full name of the message the indexes point at."""
    if not indexes:
        indexes = (0,)
    messages = fdp.message_type
    names = [fdp.package] if fdp.package else []
    for index in indexes:
        if not 0 <= index < len(messages):
            raise ProtobufDecodeError(f"message indexes {list(indexes)} name no message of the schema")
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join(names)


class ProtobufCodec:
    """One schema (a file descriptor and its imports) compiled once into dynamic message classes."""

    format = "protobuf"

    def __init__(self, schema: SchemaInput, *, dependencies: Mapping[str, SchemaInput] | None = None,
                 max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self._deep: dict[str, bool] = {}
        self._fdp = load_descriptor(schema)
        if not self._fdp.name:
            self._fdp.name = "schema.proto"
        if not self._fdp.message_type:
            raise ProtobufSchemaError("the schema defines no message")
        deps = {name: load_descriptor(dep) for name, dep in (dependencies or {}).items()}
        self._pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()

        def add(fdp: descriptor_pb2.FileDescriptorProto, chain: tuple[str, ...]) -> None:
            if fdp.name in added:
                return
            if fdp.name in chain:
                raise ProtobufSchemaError(f"import cycle through {fdp.name}")
            for imported in fdp.dependency:
                add(self._dependency(imported, deps), (*chain, fdp.name))
            try:
                self._pool.Add(fdp)
            except (TypeError, ValueError) as exc:
                raise ProtobufSchemaError(f"{fdp.name}: {exc}") from None
            added.add(fdp.name)

        symbols: dict[str, str] = {}
        files = [self._fdp, *deps.values()]
        for fdp in files:
            _symbols(fdp, symbols)
        for imported in sorted({name for fdp in files for name in fdp.dependency if name not in deps}):
            _symbols(self._dependency(imported, deps), symbols)  # a well-known type, or an error
        for fdp in files:
            normalize(fdp, symbols)
        add(self._fdp, ())
        self._classes: dict[tuple[int, ...], Any] = {}
        try:
            self.message_class(())  # the first message must build, or the schema is bad
        except ProtobufDecodeError as exc:
            raise ProtobufSchemaError(str(exc)) from None
        self.record_name = _message_path(self._fdp, (0,))  # for RecordNameStrategy subjects

    @staticmethod
    def _dependency(name: str, deps: Mapping[str, descriptor_pb2.FileDescriptorProto]
                    ) -> descriptor_pb2.FileDescriptorProto:
        if name in deps:
            fdp = deps[name]
            if fdp.name != name:
                fdp = descriptor_pb2.FileDescriptorProto.FromString(fdp.SerializeToString())
                fdp.name = name
            return fdp
        if name.startswith("google/protobuf/"):
            try:
                builtin = descriptor_pool.Default().FindFileByName(name)
            except KeyError:
                builtin = None
            if builtin is None:  # pragma: no cover - the well-known files are registered on first import
                from google.protobuf import any_pb2, duration_pb2, struct_pb2, timestamp_pb2, wrappers_pb2  # noqa: F401

                builtin = descriptor_pool.Default().FindFileByName(name)
            fdp = descriptor_pb2.FileDescriptorProto()
            builtin.CopyToProto(fdp)
            return fdp
        raise ProtobufSchemaError(f"import {name!r} is not among the schema's references")

    def message_class(self, indexes: Sequence[int] | None) -> Any:
        key = tuple(indexes or (0,))
        cls = self._classes.get(key)
        if cls is None:
            full_name = _message_path(self._fdp, key)
            try:
                cls = message_factory.GetMessageClass(self._pool.FindMessageTypeByName(full_name))
            except KeyError as exc:  # pragma: no cover - the pool holds every message of the file
                raise ProtobufDecodeError(f"message {full_name} not found: {exc}") from None
            self._classes[key] = cls
        return cls

    # -- decode
    def decode(self, payload: bytes | memoryview, message_indexes: Sequence[int] | None = None) -> Any:
        cls = self.message_class(message_indexes)
        try:
            msg = cls.FromString(bytes(payload))
        except (_PbDecodeError, RuntimeError) as exc:
            raise ProtobufDecodeError(f"not a valid {cls.DESCRIPTOR.full_name}: {exc}") from None
        try:
            out = json_format.MessageToDict(msg, always_print_fields_with_no_presence=True)
        except RecursionError:
            raise ProtobufDecodeError(f"a {cls.DESCRIPTOR.full_name} nested too deeply") from None
        except Exception as exc:  # e.g. Value(NaN), an Any of an unknown type: this record's error
            raise ProtobufDecodeError(f"a {cls.DESCRIPTOR.full_name} that has no JSON form: {exc}") from None
        if self._may_nest_past_limit(cls.DESCRIPTOR) and value_depth(out, self.max_depth):
            raise ProtobufDecodeError(f"a {cls.DESCRIPTOR.full_name} whose JSON nests objects and arrays deeper "
                                      f"than {self.max_depth} levels (GATEWAY_SCHEMA_MAX_DEPTH)")
        return out

    def _may_nest_past_limit(self, descriptor: Any) -> bool:
        """Whether a message's JSON can nest deeper than ``max_depth`` (a recursive type, Struct/Value, Any, or
        simply deep); when not, decoded values need no depth walk. Cached per message type."""
        hit = self._deep.get(descriptor.full_name)
        if hit is None:
            hit = self._deep[descriptor.full_name] = _static_depth(descriptor, {}, set()) > self.max_depth
        return hit

    def decode_many(self, items: Iterable[Any]) -> list[Any]:
        """Each item is a payload (the first message) or ``(message_indexes, payload)``."""
        out: list[Any] = []
        for item in items:
            if isinstance(item, tuple):
                indexes, payload = item
            else:
                indexes, payload = None, item
            try:
                out.append(self.decode(payload, indexes))
            except ProtobufDecodeError as exc:
                out.append(exc)
        return out

    # -- encode
    def encode(self, value: Any, message_indexes: Sequence[int] | None = None) -> bytes:
        try:
            cls = self.message_class(message_indexes)
        except ProtobufDecodeError as exc:
            raise ProtobufEncodeError("$", str(exc)) from None
        if not isinstance(value, dict):
            raise ProtobufEncodeError("$", f"expected an object for {cls.DESCRIPTOR.full_name}")
        if value_depth(value, self.max_depth):
            raise ProtobufEncodeError("$", f"objects and arrays nested deeper than {self.max_depth} levels "
                                           f"(GATEWAY_SCHEMA_MAX_DEPTH)")
        try:
            msg = json_format.ParseDict(value, cls())
            return msg.SerializeToString()
        except RecursionError:
            raise ProtobufEncodeError("$", "nested too deeply") from None
        except json_format.ParseError as exc:
            path, reason = _parse_error_path(str(exc))
            raise ProtobufEncodeError(path, reason) from None
        except _PbEncodeError as exc:  # e.g. a required proto2 field left unset
            raise ProtobufEncodeError("$", str(exc)) from None


_UNBOUNDED = 1 << 30
_OPAQUE = frozenset({"google.protobuf.Any", "google.protobuf.Struct", "google.protobuf.Value",
                     "google.protobuf.ListValue"})  # their JSON nests as deep as the data does


def _repeated(field: Any) -> bool:
    rep = getattr(field, "is_repeated", None)  # protobuf 6+; older ones have only the label
    return bool(rep) if rep is not None else field.label == field.LABEL_REPEATED


def _static_depth(descriptor: Any, memo: dict[str, int], stack: set[str]) -> int:
    """An upper bound of the levels of objects and arrays of a message's JSON (``_UNBOUNDED`` for a recursive
    type or one whose JSON nests with its data). Recursion here follows the schema, not the data: a schema
    nests a few levels, and a deep one is bounded (cut at ``_UNBOUNDED``) by the cycle check."""
    name = descriptor.full_name
    if name in _OPAQUE or name in stack or len(stack) > 200:
        return _UNBOUNDED
    if name in memo:
        return memo[name]
    stack.add(name)
    deepest = 0
    for field in descriptor.fields:
        if field.message_type is not None:
            sub = _static_depth(field.message_type, memo, stack)
            deepest = max(deepest, sub + (1 if _repeated(field) else 0))
        elif _repeated(field):
            deepest = max(deepest, 1)
        if deepest >= _UNBOUNDED:
            break
    stack.discard(name)
    memo[name] = depth = min(_UNBOUNDED, 1 + deepest)
    return depth


_FIELD_FAILURE = re.compile(r"Failed to parse (\w+) field: ")


def _parse_error_path(text: str) -> tuple[str, str]:
    """json_format's nested 'Failed to parse a field: Failed to parse b field: ...' as ``$.a.b`` + reason."""
    path = "$"
    pos = 0
    while match := _FIELD_FAILURE.match(text, pos):
        path += "." + match.group(1)
        pos = match.end()
    reason = text[pos:]
    unknown = re.match(r'Message type "[\w.]+" has no field named "(\w+)"', reason)
    if unknown:
        path += "." + unknown.group(1)
    return path, reason
