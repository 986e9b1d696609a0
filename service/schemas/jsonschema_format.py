"""JSON Schema payloads (issue 23): the payload is JSON text, the schema a JSON Schema. Sans-io.

Decode parses with orjson (and, when asked, validates: Karapace's REST proxy validates on consume, Confluent's
JSON Schema deserializer does not by default); encode validates the value, then serializes it compactly.
Validation errors name the path of the offending value, ``$.items[2].price``, like the Avro codec.

Schemas without ``$schema`` are read as draft-07 (Confluent's default); a ``$schema`` naming another draft
selects it. Schema references (the registry's ``references``: name -> schema) resolve through ``$ref``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from jsonschema import Draft7Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from service.schemas.errors import CodecDecodeError, CodecEncodeError, CodecSchemaError


class JsonSchemaSchemaError(CodecSchemaError):
    """The schema is not a valid JSON Schema (or not JSON)."""


class JsonSchemaEncodeError(CodecEncodeError):
    """A value does not validate; ``path`` names it (``$`` is the root)."""


class JsonSchemaDecodeError(CodecDecodeError):
    """A payload is not JSON, or (when validating) does not validate."""


def _load(schema: str | bytes | Mapping[str, Any] | bool) -> Any:
    if isinstance(schema, (str, bytes)):
        try:
            return orjson.loads(schema)
        except orjson.JSONDecodeError as exc:
            raise JsonSchemaSchemaError(f"schema is not JSON: {exc}") from None
    return schema


def json_path(parts: Iterable[str | int]) -> str:
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "a").isalnum():
            out += f".{part}"
        else:
            out += f"[{orjson.dumps(part).decode()}]"
    return out


class JsonSchemaCodec:
    """One schema compiled once into a validator."""

    format = "jsonschema"

    def __init__(
        self,
        schema: str | bytes | Mapping[str, Any] | bool,
        *,
        references: Mapping[str, str | bytes | Mapping[str, Any]] | None = None,
        validate_on_decode: bool = False,
    ) -> None:
        loaded = _load(schema)
        cls = validators.validator_for(loaded, default=Draft7Validator) if isinstance(loaded, dict) else Draft7Validator
        try:
            cls.check_schema(loaded)
        except SchemaError as exc:
            raise JsonSchemaSchemaError(f"not a valid JSON Schema: {exc.message}") from None
        registry: Registry = Registry()
        for name, ref_schema in (references or {}).items():
            resource = Resource.from_contents(_load(ref_schema), default_specification=DRAFT7)
            registry = registry.with_resource(name, resource)
        self._validator = cls(loaded, registry=registry)
        self.validate_on_decode = validate_on_decode
        self.record_name = loaded.get("title") if isinstance(loaded, dict) else None  # RecordNameStrategy

    def errors(self, value: Any) -> JsonSchemaEncodeError | None:
        error: ValidationError | None = best_match(self._validator.iter_errors(value))
        if error is None:
            return None
        return JsonSchemaEncodeError(json_path(error.absolute_path), error.message)

    def validate(self, value: Any) -> None:
        error = self.errors(value)
        if error is not None:
            raise error

    def encode(self, value: Any) -> bytes:
        self.validate(value)
        try:
            return orjson.dumps(value)
        except TypeError as exc:  # e.g. an integer beyond 64 bits
            raise JsonSchemaEncodeError("$", str(exc)) from None

    def decode(self, payload: bytes | bytearray | memoryview) -> Any:
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise JsonSchemaDecodeError(f"not valid JSON: {exc}") from None
        if self.validate_on_decode:
            error = self.errors(value)
            if error is not None:
                raise JsonSchemaDecodeError(f"does not match the schema: {error}")
        return value

    def decode_many(self, payloads: Iterable[bytes | bytearray | memoryview]) -> list[Any]:
        out: list[Any] = []
        append = out.append
        loads = orjson.loads
        validate = self.validate_on_decode
        for payload in payloads:
            try:
                value = loads(payload)
            except orjson.JSONDecodeError as exc:
                append(JsonSchemaDecodeError(f"not valid JSON: {exc}"))
                continue
            if validate:
                error = self.errors(value)
                if error is not None:
                    append(JsonSchemaDecodeError(f"does not match the schema: {error}"))
                    continue
            append(value)
        return out
