"""Schema'd produce: JSON keys and values -> Confluent-framed Avro / Protobuf / JSON Schema
bytes, for ``POST /topics/{topic}`` with ``application/vnd.kafka.{avro,protobuf,jsonschema}.v2+json``.

The HTTP layer (:mod:`api.v2.produce`) calls, per request:

1. :func:`schema_specs` -- the body's ``key_schema`` / ``key_schema_id`` / ``value_schema`` /
   ``value_schema_id`` as two :class:`SchemaSpec` (or ``None``), and :func:`require_schemas` (a non-null
   key without a key schema is Confluent's 42201, a value without a value schema 42202);
2. ``await`` :func:`resolve_encoder` for each spec -- a schema given as text is registered under the subject
   of the configured :data:`STRATEGIES` entry (the registry answers the existing id when it is already there),
   then, like a schema given by id, resolved through the tenant's
   :class:`~service.schemas.formats.SchemaResolver` (``id -> ResolvedSchema -> codec``), so produce encodes
   with the very codec the consume side decodes with (Protobuf: compiled from the registry's copy of the schema
   and its references, :mod:`service.schemas.proto_text`, never from the posted text as it was sent);
3. :func:`encode_batch` -- every record encoded and framed (magic byte, schema id, for Protobuf the message
   indexes) *before* anything is sent. Any record that does not fit its schema fails the whole batch with a
   :class:`ProduceSchemaError` (42203) naming each bad record, the field and the path in it
   (``records[2].value.$.age: ...``).

Steps 1 and 3 are sans-io; step 2 only awaits the resolver. Decisions (Confluent v2 is the reference):

* a JSON ``null`` key or value is a null key or value (no schema needed, nothing framed), as in Confluent;
* ``*_schema_id`` wins over ``*_schema`` when both are given (Confluent's v2 uses the id); the id is used as
  it is, whatever subject it is registered under (no subject-name check on ids);
* Protobuf records are the file's first message (message indexes ``[0]``, the single byte ``0`` on the wire),
  as Confluent's REST Proxy and serializers pick it for a schema given as text;
* an invalid schema (it does not compile here, the registry answers 422, or a schema id of another type than
  the content type's format) is Confluent's 42205; an incompatible one (the registry's 409) is not mapped
  here: it reaches the client as 42212 with the registry's code and message.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.schemas.codecs import Codecs, SchemaError, TooLargeSchema
from service.schemas.errors import CodecEncodeError
from service.schemas.formats import SCHEMA_TYPE_OF, ResolvedSchema, SchemaResolver
from service.schemas.registry import RegistryRequestError, Schema, SchemaNotFound, SchemaTooLarge, text_size
from service.schemas.wire import frame_header

TOPIC_NAME = "TopicNameStrategy"
RECORD_NAME = "RecordNameStrategy"
TOPIC_RECORD_NAME = "TopicRecordNameStrategy"
#: the subject-name strategies (Confluent's class names; GATEWAY_SCHEMA_SUBJECT_NAME_STRATEGY)
STRATEGIES = (TOPIC_NAME, RECORD_NAME, TOPIC_RECORD_NAME)

#: Confluent's v2 codes (its ``Errors``): key schema missing, value schema missing, a JSON value that does
#: not convert to the schema, an invalid schema
KEY_SCHEMA_MISSING = 42201
VALUE_SCHEMA_MISSING = 42202
RECORD_INVALID = 42203
SCHEMA_INVALID = 42205
#: a schema (posted, or named by id) over GATEWAY_SCHEMA_MAX_BYTES: HTTP 413
SCHEMA_TOO_LARGE = 41302
#: bad records named in one error message at most (the rest are counted)
MAX_REPORTED = 10
#: the message indexes of a Protobuf record: the file's first message
FIRST_MESSAGE = (0,)


class ProduceSchemaError(ValueError):
    """A request the schema'd produce refuses (HTTP ``status``, 422 but for a schema over the size limit:
    413); ``code`` is the REST error code."""

    def __init__(self, code: int, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def too_large(field: str, exc: Exception) -> ProduceSchemaError:
    return ProduceSchemaError(SCHEMA_TOO_LARGE, f"{field} schema: {exc}", 413)


# -- subject names ---------------------------------------------------------------------------------------------
def subject_name(strategy: str, topic: str, is_key: bool, record_name: str | None) -> str:
    """The subject a schema is registered under: ``<topic>-key``/``<topic>-value`` (TopicNameStrategy), the
    record's fully-qualified name (RecordNameStrategy) or ``<topic>-<name>`` (TopicRecordNameStrategy)."""
    if strategy == TOPIC_NAME:
        return f"{topic}-{'key' if is_key else 'value'}"
    if strategy not in (RECORD_NAME, TOPIC_RECORD_NAME):
        raise ValueError(f"unknown subject-name strategy {strategy!r}")
    if not record_name:
        raise ProduceSchemaError(SCHEMA_INVALID, f"the {'key' if is_key else 'value'} schema has no record name, "
                                 f"which the {strategy} (the gateway's subject-name strategy) needs: an Avro "
                                 f"named type, a Protobuf message or a JSON Schema with a title")
    return record_name if strategy == RECORD_NAME else f"{topic}-{record_name}"


# Linear time on any text: a comment or string left open runs to the end (of the text, or of its line) as one
# token instead of failing and being rescanned from every later quote or "/*" (quadratic: 200 KB of `"\` took
# minutes on the event loop).
_PROTO_TOKEN = re.compile(
    r'//[^\n]*|/\*.*?(?:\*/|\Z)|"(?:[^"\\\n]|\\.)*"?|\'(?:[^\'\\\n]|\\.)*\'?|[A-Za-z_][\w.]*|[{};]|\S',
    re.DOTALL)


def proto_record_name(text: str) -> str | None:
    """The fully-qualified name of the first top-level message of ``.proto`` text (``package.Name``), the
    record name of a Protobuf schema for the record-name strategies; ``None`` if it defines no message."""
    package = ""
    depth = 0
    tokens = [t for t in _PROTO_TOKEN.findall(text) if not t.startswith(("//", "/*"))]
    for i, tok in enumerate(tokens):
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth = max(0, depth - 1)
        elif depth == 0 and tok in ("package", "message") and i + 1 < len(tokens):
            following = tokens[i + 1]
            if not (following[:1].isalpha() or following[:1] == "_"):
                continue
            if tok == "package":
                package = following
            else:
                return f"{package}.{following}" if package else following
    return None


# -- the request's schemas -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SchemaSpec:
    """What the body names for keys or values: a registered schema's id, or a schema's text."""

    field: str  # "key" or "value"
    schema_id: int | None = None
    schema: str | None = None

    @property
    def is_key(self) -> bool:
        return self.field == "key"


def _schema_id(v: Any, name: str) -> int | None:
    if v is None:
        return None
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is str and v.strip().isdigit():  # Confluent's Jackson binding takes "5" for an int
        v = int(v)
    if type(v) is not int or not 0 <= v <= 0xFFFFFFFF:
        raise ProduceSchemaError(42206, f"{name} must be a schema id (an integer) or null")
    return v


def _spec(body: dict[str, Any], field: str) -> SchemaSpec | None:
    sid = _schema_id(body.get(f"{field}_schema_id"), f"{field}_schema_id")
    text = body.get(f"{field}_schema")
    if text is not None and type(text) is not str:
        raise ProduceSchemaError(42206, f"{field}_schema must be the schema as a string (e.g. Avro's JSON text "
                                        f"escaped into a string), or null")
    if sid is not None:
        return SchemaSpec(field, schema_id=sid)
    if text is not None:
        if not text.strip():
            raise ProduceSchemaError(SCHEMA_INVALID, f"invalid {field} schema: empty")
        return SchemaSpec(field, schema=text)
    return None


def schema_specs(body: dict[str, Any]) -> tuple[SchemaSpec | None, SchemaSpec | None]:
    """The key and value schemas the body names (``None``: none)."""
    return _spec(body, "key"), _spec(body, "value")


def require_schemas(keys: Sequence[Any], values: Sequence[Any], key: SchemaSpec | None,
                    value: SchemaSpec | None) -> None:
    """A non-null key needs a key schema (42201), a non-null value a value schema (42202)."""
    if key is None and any(k is not None for k in keys):
        raise ProduceSchemaError(KEY_SCHEMA_MISSING, "the request includes keys but neither key_schema nor "
                                                     "key_schema_id")
    if value is None and any(v is not None for v in values):
        raise ProduceSchemaError(VALUE_SCHEMA_MISSING, "the request includes values but neither value_schema "
                                                       "nor value_schema_id")


# -- resolution: spec -> encoder ---------------------------------------------------------------------------------
class SchemaEncoder:
    """One resolved schema: JSON values -> framed payloads (magic byte, schema id, message indexes, data)."""

    __slots__ = ("_codec", "_header", "_protobuf", "format", "schema_id")

    def __init__(self, fmt: str, schema_id: int, codec: Any) -> None:
        self.format = fmt
        self.schema_id = schema_id
        self._codec = codec
        self._protobuf = fmt == "protobuf"
        self._header = frame_header(schema_id, FIRST_MESSAGE if self._protobuf else None)

    @classmethod
    def of(cls, fmt: str, resolved: ResolvedSchema, spec: SchemaSpec) -> SchemaEncoder:
        """The encoder of a resolved schema; 42205 if it is of another type or does not compile."""
        want = SCHEMA_TYPE_OF[fmt]
        what = (f"{spec.field}_schema_id {resolved.schema_id}" if spec.schema_id is not None
                else f"{spec.field}_schema (id {resolved.schema_id})")
        if isinstance(resolved.codec, TooLargeSchema):
            raise too_large(spec.field, resolved.codec)
        if resolved.schema_type != want:
            raise ProduceSchemaError(SCHEMA_INVALID, f"{what} is a {resolved.schema_type} schema, not {want} "
                                                     f"(the content type's format is {fmt})")
        if isinstance(resolved.codec, SchemaError):
            raise ProduceSchemaError(SCHEMA_INVALID, f"{what}: {resolved.codec}")
        return cls(fmt, resolved.schema_id, resolved.codec)

    def encode(self, value: Any) -> bytes:
        """``value`` framed; raises :class:`~service.schemas.errors.CodecEncodeError` naming the path."""
        if self._protobuf:
            return self._header + self._codec.encode(value, FIRST_MESSAGE)
        return self._header + self._codec.encode(value)


def record_name(fmt: str, schema: str, codecs: Codecs) -> str | None:
    """The record name of a schema given as text (Avro: the named type's full name; Protobuf: the first
    message's; JSON Schema: its ``title``). Avro and JSON Schema text is compiled here (cached by text), so an
    invalid one is refused (42205) before the registry sees it."""
    if fmt == "protobuf":
        return proto_record_name(schema)
    try:
        codec = codecs.codec(fmt, None, schema)
    except SchemaError as exc:
        raise ProduceSchemaError(SCHEMA_INVALID, f"invalid schema: {exc}") from None
    name = getattr(codec, "record_name", None)
    return name if isinstance(name, str) and name else None


async def _checked_text(resolver: SchemaResolver, fmt: str, spec: SchemaSpec,
                        strategy: str) -> tuple[str | None, bool]:
    """Schema text posted with a produce: its record name, and whether it was checked now (Avro and JSON
    Schema text the registry did not take before). Refused over the size limit (413/41302) before anything
    else; checked off the event loop and not cached (what the registry then refuses leaves nothing behind)."""
    text = spec.schema
    assert text is not None
    size = text_size(text)
    if size > resolver.max_schema_bytes:
        raise too_large(spec.field, SchemaTooLarge(f"{size} bytes, over the gateway's limit of "
                                                   f"{resolver.max_schema_bytes} (GATEWAY_SCHEMA_MAX_BYTES)", size,
                                                   resolver.max_schema_bytes))
    if fmt == "protobuf":  # only scanned for its first message's name, and only when the subject needs it
        return (proto_record_name(text) if strategy != TOPIC_NAME else None), False
    known = resolver.accepted_name(fmt, text)
    if known is not None:
        return known or None, False
    try:
        return await resolver.check_text(fmt, text), True
    except SchemaError as exc:
        raise ProduceSchemaError(SCHEMA_INVALID, f"invalid schema: {exc}") from None


async def resolve_encoder(resolver: SchemaResolver, fmt: str, spec: SchemaSpec, topic: str,
                          strategy: str = TOPIC_NAME) -> SchemaEncoder:
    """The encoder of ``spec``: a schema id is looked up; schema text is registered under the strategy's
    subject first. Raises ProduceSchemaError, SchemaNotFound (42210), RegistryRequestError (42212) or
    RegistryUnavailable (503)."""
    schema_id = spec.schema_id
    if schema_id is None:
        assert spec.schema is not None
        text = spec.schema
        # Avro and JSON Schema text is compiled here first (refused before the registry sees it)
        name, checked = await _checked_text(resolver, fmt, spec, strategy)
        subject = subject_name(strategy, topic, spec.is_key, name)
        try:
            schema_id = await resolver.client.register(subject, Schema(text, SCHEMA_TYPE_OF[fmt]))
        except SchemaNotFound:
            raise
        except SchemaTooLarge as exc:
            raise too_large(spec.field, exc) from None
        except RegistryRequestError as exc:
            if exc.status == 422:  # the registry's "invalid schema" (42201 there)
                raise ProduceSchemaError(SCHEMA_INVALID, f"invalid {spec.field} schema: the schema registry "
                                                         f"refused it ({exc.error_code}): {exc.message}") from None
            raise
        if checked:
            resolver.accept(fmt, text, name)
    resolved = await resolver.resolve(schema_id)
    if resolved is None:
        raise SchemaNotFound(404, 40403, f"{spec.field}_schema_id {schema_id}: no such schema in the schema "
                                         f"registry")
    return SchemaEncoder.of(fmt, resolved, spec)


# -- encoding a batch ------------------------------------------------------------------------------------------
def encode_batch(keys: Sequence[Any], values: Sequence[Any], key: SchemaEncoder | None,
                 value: SchemaEncoder | None) -> list[tuple[bytes | None, bytes | None]]:
    """Every record's framed key and value (``None`` stays ``None``), or one ProduceSchemaError (42203)
    naming every bad record (up to :data:`MAX_REPORTED`) as ``records[i].value.$.path: reason``."""
    out: list[tuple[bytes | None, bytes | None]] = []
    errors: list[str] = []
    bad = 0  # records
    count = 0  # errors (a record may have two)
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        kb = vb = None
        failed = False
        for field, datum, enc in (("key", k, key), ("value", v, value)):
            if datum is None:
                continue
            if enc is None:  # require_schemas() ran first; kept for direct callers
                raise ProduceSchemaError(KEY_SCHEMA_MISSING if field == "key" else VALUE_SCHEMA_MISSING,
                                         f"records[{i}].{field}: no {field} schema")
            try:
                framed = enc.encode(datum)
            except CodecEncodeError as exc:
                where, reason = exc.path, exc.reason
            except (TypeError, ValueError, OverflowError) as exc:  # a codec's unexpected refusal
                where, reason = "$", str(exc)
            else:
                if field == "key":
                    kb = framed
                else:
                    vb = framed
                continue
            failed = True
            count += 1
            if len(errors) < MAX_REPORTED:
                errors.append(f"records[{i}].{field}.{where}: {reason}")
        if failed:
            bad += 1
        elif not bad:
            out.append((kb, vb))
    if bad:
        more = f" (and {count - len(errors)} more)" if count > len(errors) else ""
        enc = key if key is not None else value
        fmt = enc.format if enc is not None else "schema"
        raise ProduceSchemaError(RECORD_INVALID, f"{bad} record(s) do not match the {fmt} schema, nothing was "
                                                 f"produced: {'; '.join(errors)}{more}")
    return out
