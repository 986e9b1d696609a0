"""Typed offset-range reads: a range page of schema'd records as typed Arrow columns.

``GET /topics/{t}/partitions/{p}/records?format=avro`` (or ``protobuf`` / ``jsonschema``) with ``Accept:
application/vnd.apache.arrow.stream`` answers the page of :mod:`service.fetch.ranges` with the value decoded:

==================  =======================================================================================
column              type
==================  =======================================================================================
topic               dictionary<int32, string>
partition           int32
offset              int64
timestamp           timestamp[ms]
key                 binary, or typed as the value is when ``key_format`` is given
value               the reader schema's Arrow type (:mod:`service.schemas.arrow`): a struct for a record /
                    message / object schema, as Spark's ``from_avro`` / ``from_protobuf`` give it; null for a
                    tombstone and for a row that did not decode
headers             list<struct<key: string, value: binary>>
key_schema_id       int32 (only with ``key_format``): the writer schema id of the key
value_schema_id     int32: the writer schema id of the value (null: no value, or not framed)
error               string: why the key or value of this row is null although the record had one (no magic
                    byte, an unknown schema id, a schema of another format, a payload that does not decode,
                    a writer schema the reader schema cannot resolve); null for good rows
value_raw           binary: the record's value bytes, only in error rows (null otherwise), so that nothing of
                    the topic is lost in a typed copy
key_raw             binary (only with ``key_format``): the same for keys
==================  =======================================================================================

The reader schema (one per column, so one Arrow type per page): ``value_schema_id=N`` pins it, ``latest``
takes the latest version of the subject ``{topic}-value`` (``{topic}-key`` for keys: TopicNameStrategy);
by default it is the writer schema of the page's last record with a known schema. A reader paging through
a range that wants one type across pages (the Spark sink does) pins the id: the schema metadata of every
typed page names it (``value_schema_id``, ``key_schema_id``; also the ``X-Value-Schema-Id`` header).
Records of other writer schemas are resolved into the reader's (see :mod:`service.schemas.arrow`);
records that cannot be are error rows, not a failed request. A pinned id the registry does not know is
422 / 42210; one of another format, or a schema that does not map to Arrow, 422 / 42206; a registry that is
down 503 / 50307 (retryable). An empty page with no pinned schema has a value column of type null.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from service.errors import GatewayError
from service.fetch.ranges import RangePage, _headers_array
from service.protocol.records import Record
from service.schemas.arrow import ReaderCache, TypedColumn, decode_column, framed_ids
from service.schemas.arrow_types import ArrowMappingError
from service.schemas.registry import SchemaNotFound

TYPED_FORMATS = ("avro", "protobuf", "jsonschema")
#: pages with more records than this are decoded off the event loop
THREAD_ROWS = 5_000

_READERS: weakref.WeakKeyDictionary[Any, ReaderCache] = weakref.WeakKeyDictionary()


def reader_cache(resolver: Any) -> ReaderCache:
    """The compiled Arrow readers of one registry (schema ids are per registry)."""
    got = _READERS.get(resolver)
    if got is None:
        got = _READERS[resolver] = ReaderCache(budget=getattr(resolver, "budget", None))
    return got


async def pinned_id(resolver: Any, spec: str | None, subject: str) -> int | None:
    """``None`` (pick per page), an id, or ``latest`` -> the subject's latest schema id (raises SchemaNotFound)."""
    if spec is None:
        return None
    if spec == "latest":
        reg = await resolver.client.get_latest(subject)
        return int(reg.schema_id)
    return int(spec)


async def prepare(resolver: Any, payloads: Sequence[bytes | None], pinned: int | None) -> set[int]:
    """Fetch every schema the payloads name (and the pinned one, first) into the resolver's cache: a typed
    copy of a range is not a poll that a later one completes, so every id is resolved, in rounds of the
    resolver's per-poll bound (the registry client bounds the requests in flight). Returns the ids."""
    ids = {i for i in framed_ids(payloads) if i is not None}
    if pinned is not None:
        await resolver.resolve(pinned)
    await resolver.prepare(ids, every=True)
    if pinned is not None and resolver.cached(pinned) is None:
        raise SchemaNotFound(404, 40403, f"schema id {pinned} not found in the schema registry")
    if pinned is not None:
        ids.add(pinned)
    return ids


def _column(fmt: str, payloads: Sequence[bytes | None], resolver: Any, pinned: int | None) -> TypedColumn:
    try:
        return decode_column(fmt, payloads, resolver.cached, pinned, reader_cache(resolver))
    except ArrowMappingError as exc:
        raise GatewayError(f"{fmt}: {exc}", status=422, error_code=42206) from None


def _ids_array(ids: list[int | None]) -> pa.Array:
    return pa.array(ids, pa.int32())


def typed_table(page: RangePage, resolver_value: Any, value_format: str, value_pin: int | None,
                resolver_key: Any = None, key_format: str | None = None, key_pin: int | None = None) -> pa.Table:
    """The page as one typed record batch (see the module docstring); everything already prepared."""
    records: list[Record] = page.records
    n = len(records)
    value = _column(value_format, [r.value for r in records], resolver_value, value_pin)
    key = _column(key_format, [r.key for r in records], resolver_key, key_pin) if key_format else None
    meta = page.metadata()
    meta["value_format"] = value_format
    meta["value_schema_id"] = "" if value.reader_id is None else str(value.reader_id)
    if key is not None:
        meta["key_format"] = key_format or ""
        meta["key_schema_id"] = "" if key.reader_id is None else str(key.reader_id)
    zeros = pa.repeat(pa.scalar(0, pa.int32()), n)
    cols: list[tuple[pa.Field, pa.Array]] = [
        (pa.field("topic", pa.dictionary(pa.int32(), pa.string()), nullable=False),
         pa.DictionaryArray.from_arrays(zeros, pa.array([page.topic], pa.string()))),
        (pa.field("partition", pa.int32(), nullable=False), pa.repeat(pa.scalar(page.partition, pa.int32()), n)),
        (pa.field("offset", pa.int64(), nullable=False), pa.array([r[0] for r in records], pa.int64())),
        (pa.field("timestamp", pa.timestamp("ms"), nullable=False),
         pa.array([r[1] for r in records], pa.int64()).view(pa.timestamp("ms"))),
        (pa.field("key", key.array.type if key else pa.binary()),
         key.array if key else pa.array([r.key for r in records], pa.binary())),
        (pa.field("value", value.array.type), value.array),
    ]
    htype = pa.list_(pa.field("item", pa.struct([pa.field("key", pa.string(), nullable=False),
                                                 pa.field("value", pa.binary())]), nullable=False))
    hs = [r[4] for r in records]
    if any(hs):
        headers = _headers_array(pa, htype, hs)
    else:
        headers = pa.ListArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), n + 1),
                                           pa.array([], htype.value_type), type=htype)
    cols.append((pa.field("headers", htype, nullable=False), headers))
    if key is not None:
        cols.append((pa.field("key_schema_id", pa.int32()), _ids_array(key.schema_ids)))
    cols.append((pa.field("value_schema_id", pa.int32()), _ids_array(value.schema_ids)))
    errors: list[str | None] = value.errors
    if key is not None and any(key.errors):
        errors = [_join(k, v) for k, v in zip(key.errors, value.errors, strict=True)]
    cols.append((pa.field("error", pa.string()), pa.array(errors, pa.string())))
    # the bytes of the rows whose value did not decode, so that a typed copy of a topic loses nothing
    cols.append((pa.field("value_raw", pa.binary()),
                 pa.array([r[3] if e is not None else None for r, e in zip(records, value.errors, strict=True)],
                          pa.binary())))
    if key is not None:
        cols.append((pa.field("key_raw", pa.binary()),
                     pa.array([r[2] if e is not None else None for r, e in zip(records, key.errors, strict=True)],
                              pa.binary())))
    schema = pa.schema([f for f, _ in cols], metadata=meta)
    batch = pa.RecordBatch.from_arrays([a for _, a in cols], schema=schema)
    return pa.Table.from_batches([batch], schema=schema)


def _join(k: str | None, v: str | None) -> str | None:
    if k is None:
        return None if v is None else f"value: {v}"
    return f"key: {k}" if v is None else f"key: {k}; value: {v}"


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        if table.num_rows:
            writer.write_table(table)
    return sink.getvalue().to_pybytes()


async def typed_ipc(page: RangePage, schemas: Any, registry_config: Any, value_format: str,
                    value_schema: str | None = None, key_format: str | None = None,
                    key_schema: str | None = None) -> tuple[bytes, dict[str, str]]:
    """The page as a typed Arrow IPC stream and the extra response headers. ``schemas`` is the gateway's
    ``SchemaService``; ``value_schema`` / ``key_schema``: ``None``, an id, or ``latest``. Raises the
    registry's errors (RegistryNotConfigured, RegistryUnavailable, SchemaNotFound) for the caller's mapping."""
    vres = schemas.resolver(registry_config, value_format)
    vpin = await pinned_id(vres, value_schema, f"{page.topic}-value")
    used = [(reader_cache(vres), value_format, await prepare(vres, [r.value for r in page.records], vpin))]
    kres, kpin = None, None
    if key_format:
        kres = schemas.resolver(registry_config, key_format)
        kpin = await pinned_id(kres, key_schema, f"{page.topic}-key")
        used.append((reader_cache(kres), key_format, await prepare(kres, [r.key for r in page.records], kpin)))
    args = (page, vres, value_format, vpin, kres, key_format, kpin)
    if len(page.records) > THREAD_ROWS or not all(cache.warm(fmt, ids) for cache, fmt, ids in used):
        # a large page, or one naming schemas not read into Arrow before: compiling readers is schema-sized
        # work, never done on the event loop
        body, table_meta = await asyncio.to_thread(_build, *args)
        for cache, fmt, ids in used:
            cache.saw(fmt, ids)
    else:
        body, table_meta = _build(*args)
    headers = {"X-Value-Schema-Id": table_meta.get(b"value_schema_id", b"").decode()}
    if key_format:
        headers["X-Key-Schema-Id"] = table_meta.get(b"key_schema_id", b"").decode()
    return body, headers


def _build(*args: Any) -> tuple[bytes, dict[bytes, bytes]]:
    table = typed_table(*args)
    return to_ipc(table), dict(table.schema.metadata or {})
