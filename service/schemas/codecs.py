"""One door to the per-format codecs: format name -> codec, compiled codecs cached per schema id.

The HTTP layer and the sink call only this module::

    values = decode_many("avro", schema_id, schema_text, payloads)   # list[value | DecodeError], never raises
    payload = encode("avro", schema_text, json_value)                # bytes; raises EncodeError / SchemaError

``payloads`` are already unframed (:mod:`service.schemas.wire` strips the magic byte and schema id). For
Protobuf an item may be ``(message_indexes, payload)``; a bare payload means the file's first message.
A payload that does not decode yields a :class:`DecodeError` in its place (the gateway renders it as
``null`` plus an error field, its policy for undecodable records), so one bad record never fails a batch.

Schemas are immutable per id, so a compiled codec is kept per ``(format, schema_id)`` in a bounded LRU
(and per schema text for :func:`encode` without an id), bounded by count and, with a
:class:`~service.schemas.registry.CacheBudget`, by bytes (a codec is charged :data:`COST_PER_BYTE` times its
schema's length). A schema id that does not compile is cached as its (small) error, so a poison id costs one
compile, then each of its records is a :class:`DecodeError`; schema *text* that does not compile is not
cached at all (it would keep the text).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import orjson

from service.schemas import avro as _avro
from service.schemas.avro import RENDER_CONFLUENT, AvroCodec
from service.schemas.errors import CodecDecodeError, CodecEncodeError, CodecSchemaError
from service.schemas.jsonschema_format import DEFAULT_MAX_DEPTH, JsonSchemaCodec
from service.schemas.registry import CacheBudget, LRUCache

#: what a compiled codec holds per byte of its schema's text (measured with tracemalloc: Avro 54-69x,
#: JSON Schema 7-57x): what the cache is charged for it
COST_PER_BYTE = 64

FORMATS = ("avro", "protobuf", "jsonschema")


class SchemaError(ValueError):
    """The schema does not compile for its format."""

    def __init__(self, fmt: str, message: str) -> None:
        super().__init__(f"{fmt} schema: {message}")
        self.format = fmt
        self.reason = message


class TooLargeSchema(SchemaError):
    """The schema (with its references) is over the gateway's size limit: never compiled. Its text is the
    message alone."""

    def __init__(self, fmt: str, message: str) -> None:
        super().__init__(fmt, message)
        self.args = (message,)


class EncodeError(ValueError):
    """A JSON value does not fit its schema; ``path`` names the offending value (``$`` is the root)."""

    def __init__(self, fmt: str, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.format = fmt
        self.path = path
        self.reason = message


class DecodeError:
    """In the place of a record that does not decode. A value, never raised."""

    __slots__ = ("format", "message", "schema_id")

    def __init__(self, fmt: str, schema_id: int | None, message: str) -> None:
        self.format = fmt
        self.schema_id = schema_id
        self.message = message

    def __repr__(self) -> str:
        return f"DecodeError({self.format!r}, {self.schema_id!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DecodeError) and (self.format, self.schema_id, self.message) == (
            other.format, other.schema_id, other.message)

    __hash__ = None  # type: ignore[assignment]


def _protobuf() -> Any:
    from service.schemas import protobuf  # imported on first use: google.protobuf is only needed for it

    return protobuf


class Codecs:
    """Compiled codecs per schema id, bounded; thread-safe (the sink decodes off the event loop)."""

    def __init__(
        self,
        *,
        max_cached: int = 1024,
        avro_rendering: str = RENDER_CONFLUENT,
        avro_strict_unions: bool = False,
        validate_json_on_decode: bool = False,
        max_depth: int = DEFAULT_MAX_DEPTH,
        budget: CacheBudget | None = None,
    ) -> None:
        self.max_cached = max_cached
        self.max_depth = max_depth
        self.avro_rendering = avro_rendering
        self.avro_strict_unions = avro_strict_unions
        self.validate_json_on_decode = validate_json_on_decode
        self._cache: LRUCache[Hashable, Any] = LRUCache(max_cached, budget)

    def compile(self, fmt: str, schema: Any, references: Mapping[str, Any] | None = None) -> Any:
        """A codec compiled now, not cached (the resolver keeps its own); raises :class:`SchemaError`."""
        return self._compile(fmt, schema, references)

    def check(self, fmt: str, schema: Any) -> str | None:
        """Whether ``schema`` compiles (raises :class:`SchemaError`), and its record name: what a produce
        needs of posted schema text before the registry sees it. Avro is only parsed and checked by fastavro
        -- a full codec's converters and renderers form reference cycles that only a (stop-the-world) cyclic
        GC pass frees, which is what text the registry then refuses would leave behind."""
        if fmt != "avro":
            codec = self._compile(fmt, schema, None)
            name = getattr(codec, "record_name", None)
            return name if isinstance(name, str) and name else None
        try:
            return _avro_check(schema)
        except CodecSchemaError as exc:
            raise SchemaError(fmt, str(exc)) from None
        except RecursionError:
            raise SchemaError(fmt, "the schema is nested too deeply") from None

    # -- compile
    def _compile(self, fmt: str, schema: Any, references: Mapping[str, Any] | None) -> Any:
        try:
            if fmt == "avro":
                return AvroCodec(schema, rendering=self.avro_rendering, strict_unions=self.avro_strict_unions,
                                 references=list((references or {}).values()))
            if fmt == "jsonschema":
                return JsonSchemaCodec(schema, references=references,
                                       validate_on_decode=self.validate_json_on_decode, max_depth=self.max_depth)
            if fmt == "protobuf":
                return _protobuf().ProtobufCodec(schema, dependencies=references, max_depth=self.max_depth)
        except CodecSchemaError as exc:
            raise SchemaError(fmt, str(exc)) from None
        except RecursionError:  # a backstop: every compile checks depth itself
            raise SchemaError(fmt, "the schema is nested too deeply") from None
        raise SchemaError(fmt, f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")

    def codec(self, fmt: str, schema_id: int | None, schema: Any,
              references: Mapping[str, Any] | None = None) -> Any:
        """The compiled codec (cached by id, else by schema text); raises :class:`SchemaError`."""
        by_text = schema_id is None
        key: Hashable = (fmt, "id", schema_id) if not by_text else (fmt, "text", _text_key(schema))
        hit = self._cache.get(key)
        if hit is None:
            size = _size(schema) + sum(_size(r) for r in (references or {}).values())
            try:
                hit = self._compile(fmt, schema, references)
            except SchemaError as exc:
                if by_text:  # nothing that failed is kept with its text
                    raise
                self._cache.put(key, exc)
                raise
            self._cache.put(key, hit, COST_PER_BYTE * size + (size if by_text else 0))
        if isinstance(hit, SchemaError):
            raise hit
        return hit

    # -- the two calls
    def decode_many(self, fmt: str, schema_id: int | None, schema: Any, payloads: Iterable[Any],
                    references: Mapping[str, Any] | None = None) -> list[Any]:
        items = list(payloads)
        try:
            codec = self.codec(fmt, schema_id, schema, references)
        except SchemaError as exc:
            error = DecodeError(fmt, schema_id, str(exc))
            return [error] * len(items)
        decoded = codec.decode_many(items)
        for i, value in enumerate(decoded):
            if isinstance(value, CodecDecodeError):
                decoded[i] = DecodeError(fmt, schema_id, str(value))
        return decoded

    def encode(self, fmt: str, schema: Any, value: Any, *, schema_id: int | None = None,
               references: Mapping[str, Any] | None = None, message_indexes: Iterable[int] | None = None) -> bytes:
        codec = self.codec(fmt, schema_id, schema, references)
        try:
            if fmt == "protobuf":
                return codec.encode(value, message_indexes)
            return codec.encode(value)
        except CodecEncodeError as exc:
            raise EncodeError(fmt, exc.path, exc.reason) from None

    def clear(self) -> None:
        self._cache.clear()


def _avro_check(schema: Any) -> str | None:
    """:class:`AvroCodec`'s schema checks without its codec (the same errors)."""
    parser = _avro._Parser()
    try:
        root = parser.parse(_avro.load_schema(schema), None)
    except (KeyError, TypeError, ValueError) as exc:
        raise _avro.AvroSchemaError(str(exc)) from None
    try:
        _avro.parse_schema(_avro._compile_schema(root, True))
    except Exception as exc:  # fastavro's SchemaParseException and friends
        raise _avro.AvroSchemaError(str(exc)) from None
    return root.fullname or None


def _size(schema: Any) -> int:
    if isinstance(schema, (str, bytes)):
        return len(schema)
    try:
        return len(orjson.dumps(schema))
    except TypeError:
        return 0


def _text_key(schema: Any) -> Hashable:
    if isinstance(schema, (str, bytes)):
        return schema
    try:
        return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return id(schema)


DEFAULT = Codecs()

decode_many: Callable[..., list[Any]] = DEFAULT.decode_many
encode: Callable[..., bytes] = DEFAULT.encode
