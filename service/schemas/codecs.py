"""One door to the per-format codecs (issue 23): format name -> codec, compiled codecs cached per schema id.

The HTTP layer and the sink call only this module::

    values = decode_many("avro", schema_id, schema_text, payloads)   # list[value | DecodeError], never raises
    payload = encode("avro", schema_text, json_value)                # bytes; raises EncodeError / SchemaError

``payloads`` are already unframed (:mod:`service.schemas.wire` strips the magic byte and schema id). For
Protobuf an item may be ``(message_indexes, payload)``; a bare payload means the file's first message.
A payload that does not decode yields a :class:`DecodeError` in its place (the gateway renders it as
``null`` plus an error field, its policy for undecodable records), so one bad record never fails a batch.

Schemas are immutable per id, so a compiled codec is kept per ``(format, schema_id)`` in a bounded LRU
(and per schema text for :func:`encode` without an id). A schema that does not compile is cached as its
error, so a poison id costs one compile, then each of its records is a :class:`DecodeError`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import orjson

from service.schemas.avro import RENDER_CONFLUENT, AvroCodec
from service.schemas.errors import CodecDecodeError, CodecEncodeError, CodecSchemaError
from service.schemas.jsonschema_format import DEFAULT_MAX_DEPTH, JsonSchemaCodec

FORMATS = ("avro", "protobuf", "jsonschema")


class SchemaError(ValueError):
    """The schema does not compile for its format."""

    def __init__(self, fmt: str, message: str) -> None:
        super().__init__(f"{fmt} schema: {message}")
        self.format = fmt
        self.reason = message


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
    ) -> None:
        self.max_cached = max_cached
        self.max_depth = max_depth
        self.avro_rendering = avro_rendering
        self.avro_strict_unions = avro_strict_unions
        self.validate_json_on_decode = validate_json_on_decode
        self._cache: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

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
        key: Hashable = (fmt, "id", schema_id) if schema_id is not None else (fmt, "text", _text_key(schema))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            try:
                hit = self._compile(fmt, schema, references)
            except SchemaError as exc:
                hit = exc
            with self._lock:
                self._cache[key] = hit
                while len(self._cache) > self.max_cached:
                    self._cache.popitem(last=False)
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
        with self._lock:
            self._cache.clear()


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
