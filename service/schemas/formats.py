"""Schema'd formats for the gateway (issue 23): which registry a tenant uses, and framed payloads -> JSON.

The HTTP layer and the sink call only this module (and :mod:`service.schemas.codecs` through it):

* :class:`SchemaService` (one per gateway) picks the registry of a tenant -- its own from the tenants file,
  else the gateway-wide ``GATEWAY_SCHEMA_REGISTRY_URL``, else the embedded one ``make run`` starts -- and
  keeps one :class:`SchemaResolver` per distinct registry, so tenants sharing a registry share its caches.
* :class:`SchemaResolver` turns schema ids into compiled codecs: ``await prepare(ids)`` fetches what is not
  cached (Protobuf as descriptors, ``?format=serialized``, with every reference, transitively), then
  :meth:`SchemaResolver.decode` is synchronous and never raises: each payload becomes its JSON value, ``None``
  (a null key/value) or a :class:`~service.schemas.codecs.DecodeError` (no magic byte, unknown id, a schema
  of another format, a payload that does not decode) that the caller renders as ``null`` plus an error field.

A registry that is down raises :class:`~service.schemas.registry.RegistryUnavailable` from ``prepare`` (the
caller gives the records back: nothing is delivered half-decoded). An id the registry does not know is not an
outage: it is remembered for :data:`NOT_FOUND_TTL_S` and its records become per-record errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from service.schemas import proto_text
from service.schemas.avro import RENDER_CONFLUENT, AvroCodec
from service.schemas.codecs import Codecs, DecodeError, SchemaError
from service.schemas.errors import CodecDecodeError, CodecSchemaError
from service.schemas.jsonschema_format import DEFAULT_MAX_DEPTH
from service.schemas.registry import (
    LRUCache,
    RegistryClient,
    RegistryConfig,
    RegistryUnavailable,
    Schema,
    SchemaNotFound,
    SchemaReference,
)
from service.schemas.wire import WireFormatError, unframe

#: the gateway's format names <-> the registry's schema types
SCHEMA_TYPE_OF = {"avro": "AVRO", "protobuf": "PROTOBUF", "jsonschema": "JSON"}
FORMAT_OF = {v: k for k, v in SCHEMA_TYPE_OF.items()}
SCHEMA_FORMATS = tuple(SCHEMA_TYPE_OF)
#: how long an id the registry answered 404 for is remembered as unknown (it may be registered later, in
#: another registry that a misconfigured gateway should have used, ...)
NOT_FOUND_TTL_S = 30.0
#: references followed at most (a cycle or a pathological chain is an error, not a hang)
MAX_REFERENCES = 256
#: the hint every "no registry" answer carries
CONFIGURE_HINT = ("set GATEWAY_SCHEMA_REGISTRY_URL, or schema_registry in the tenant's entry of the tenants file "
                  "(make run starts an embedded registry unless GATEWAY_EMBEDDED_REGISTRY=false)")


class RegistryNotConfigured(Exception):
    """A schema'd format was asked for and no registry is configured for the tenant."""

    def __init__(self, fmt: str) -> None:
        super().__init__(f"format {fmt!r} needs a schema registry and none is configured: {CONFIGURE_HINT}")
        self.format = fmt


@dataclass(frozen=True, slots=True)
class ResolvedSchema:
    """A schema id's schema, its references (name -> schema text or descriptor), and its codec."""

    schema_id: int
    schema_type: str
    schema: Schema
    references: dict[str, str]
    codec: Any  # the compiled codec (the resolver's default rendering), or a SchemaError
    source: Any = None  # what the codec was compiled from (Protobuf: the compiled descriptor)
    deps: Any = None  # and its imports (name -> schema or descriptor)

    @property
    def format(self) -> str:
        return FORMAT_OF.get(self.schema_type, self.schema_type.lower())


class SchemaResolver:
    """Schema ids -> compiled codecs for one registry. Decoding is sync, after an async ``prepare``."""

    def __init__(self, client: RegistryClient, codecs: Codecs | None = None, *, cache_size: int = 1000,
                 avro_rendering: str = RENDER_CONFLUENT, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.client = client
        self.codecs = codecs if codecs is not None else Codecs(max_cached=cache_size, avro_rendering=avro_rendering,
                                                               max_depth=max_depth)
        self.avro_rendering = self.codecs.avro_rendering
        self._resolved: LRUCache[int, ResolvedSchema] = LRUCache(cache_size)
        self._other_renderings: LRUCache[tuple[int, str], Any] = LRUCache(cache_size)
        self._programs: LRUCache[tuple[int, str], Any] = LRUCache(cache_size)  # avro_program (C renderer)
        self._unknown: dict[int, float] = {}  # id -> monotonic deadline of the negative entry

    async def close(self) -> None:
        await self.client.close()

    # -- resolution (async, cached) -----------------------------------------------------------------------
    def cached(self, schema_id: int) -> ResolvedSchema | None:
        return self._resolved.get(schema_id)

    def _known_unknown(self, schema_id: int) -> bool:
        deadline = self._unknown.get(schema_id)
        if deadline is None:
            return False
        if time.monotonic() < deadline:
            return True
        del self._unknown[schema_id]
        return False

    async def resolve(self, schema_id: int) -> ResolvedSchema | None:
        """The id's schema and codec; ``None`` if the registry has no such id. Raises RegistryUnavailable."""
        hit = self._resolved.get(schema_id)
        if hit is not None:
            return hit
        if self._known_unknown(schema_id):
            return None
        try:
            schema = await self.client.get_schema(schema_id)
            serialized = schema.schema_type == "PROTOBUF" and not proto_text.available()
            if serialized:  # no protoc here: ask the registry for descriptors (Confluent's can; Karapace not
                schema = await self.client.get_schema(schema_id, fmt="serialized")  # with references)
            references = await self._references(schema.references, serialized)
        except SchemaNotFound:
            if len(self._unknown) > 10_000:
                self._unknown.clear()
            self._unknown[schema_id] = time.monotonic() + NOT_FOUND_TTL_S
            return None
        fmt = FORMAT_OF.get(schema.schema_type, "")
        codec: Any
        source, deps = schema.schema, references or None
        try:
            if schema.schema_type == "PROTOBUF" and proto_text.looks_like_text(schema.schema):
                try:  # .proto text: compiled with protoc, off the event loop (a subprocess, once per id)
                    main, deps_ = await asyncio.to_thread(
                        proto_text.compile_proto, f"kcg_schema_{schema_id}.proto", schema.schema, references)
                except CodecSchemaError as exc:
                    raise SchemaError(fmt, str(exc)) from None
                source, deps = main, deps_
                codec = self.codecs.codec(fmt, schema_id, main, deps_)
            else:
                codec = self.codecs.codec(fmt, schema_id, source, deps)
        except SchemaError as exc:
            codec = exc
        resolved = ResolvedSchema(schema_id, schema.schema_type, schema, references, codec, source, deps)
        self._resolved.put(schema_id, resolved)
        return resolved

    async def _references(self, refs: Sequence[SchemaReference], serialized: bool = False) -> dict[str, str]:
        """Every schema ``refs`` import, transitively: import name -> schema text (``serialized``: Protobuf
        descriptors, base64)."""
        out: dict[str, str] = {}
        todo = list(refs)
        seen: set[tuple[str, int]] = set()
        fmt = "serialized" if serialized else None
        while todo:
            ref = todo.pop()
            if (ref.subject, ref.version) in seen:
                continue
            seen.add((ref.subject, ref.version))
            if len(seen) > MAX_REFERENCES:
                raise SchemaNotFound(422, 42201, f"more than {MAX_REFERENCES} schema references")
            reg = await self.client.get_version(ref.subject, ref.version, fmt=fmt)
            out[ref.name] = reg.schema.schema
            todo.extend(reg.schema.references)
        return out

    async def prepare(self, schema_ids: Iterable[int]) -> None:
        """Resolve every id not cached yet, concurrently; raises RegistryUnavailable (nothing else)."""
        missing = {i for i in schema_ids if self._resolved.get(i) is None and not self._known_unknown(i)}
        if not missing:
            return
        results = await asyncio.gather(*(self.resolve(i) for i in missing), return_exceptions=True)
        for r in results:
            if isinstance(r, RegistryUnavailable):
                raise r
            if isinstance(r, BaseException):
                raise r

    # -- decoding (sync, never raises) --------------------------------------------------------------------
    @staticmethod
    def schema_ids(payloads: Iterable[bytes | memoryview | None]) -> set[int]:
        """The schema ids of the framed payloads among ``payloads`` (the rest are skipped)."""
        ids: set[int] = set()
        for p in payloads:
            if p is not None and len(p) >= 5 and p[0] == 0:
                ids.add(int.from_bytes(p[1:5], "big"))
        return ids

    def _codec(self, resolved: ResolvedSchema, rendering: str | None) -> Any:
        """The id's codec in a rendering (Avro only has several); a SchemaError when it does not compile."""
        if rendering is None or rendering == self.avro_rendering or resolved.schema_type != "AVRO" \
                or isinstance(resolved.codec, SchemaError):
            return resolved.codec
        key = (resolved.schema_id, rendering)
        codec = self._other_renderings.get(key)
        if codec is None:
            codec = AvroCodec(resolved.source, rendering=rendering, strict_unions=self.codecs.avro_strict_unions,
                              references=list((resolved.deps or {}).values()))
            self._other_renderings.put(key, codec)
        return codec

    def avro_program(self, schema_id: int, rendering: str | None = None) -> Any:
        """The C renderer's program (:mod:`service.schemas.avro_fast`) of a resolved Avro schema id in a
        rendering (the resolver's default when None), or None: not resolved, not Avro, does not compile, or
        a schema the C renderer leaves to the Python path. Cached per (id, rendering)."""
        resolved = self._resolved.get(schema_id)
        if resolved is None or resolved.schema_type != "AVRO" or isinstance(resolved.codec, SchemaError):
            return None
        key = (schema_id, rendering or self.avro_rendering)
        program = self._programs.get(key)
        if program is None:
            from service.schemas.avro_fast import compile_program
            program = compile_program(self._codec(resolved, key[1])) or False  # False: cached "no program"
            self._programs.put(key, program)
        return program or None

    def decode(self, fmt: str, payloads: Sequence[bytes | memoryview | None], *,
               rendering: str | None = None) -> list[Any]:
        """Each payload as its JSON value, ``None`` for ``None``, or a DecodeError in its place. ``rendering``:
        the Avro JSON rendering (``confluent`` or ``karapace``; the resolver's default when None)."""
        out: list[Any] = [None] * len(payloads)
        protobuf = fmt == "protobuf"
        groups: dict[int, tuple[ResolvedSchema, list[int], list[Any]]] = {}
        want_type = SCHEMA_TYPE_OF[fmt]
        for i, p in enumerate(payloads):
            if p is None:
                continue
            try:
                fr = unframe(p, protobuf=protobuf)
            except WireFormatError as exc:
                out[i] = DecodeError(fmt, None, str(exc))
                continue
            sid = fr.schema_id
            group = groups.get(sid)
            if group is None:
                resolved = self._resolved.get(sid)
                if resolved is None:
                    out[i] = DecodeError(fmt, sid, f"schema id {sid} not found in the schema registry")
                    continue
                if resolved.schema_type != want_type:
                    out[i] = DecodeError(fmt, sid, f"schema id {sid} is a {resolved.schema_type} schema, "
                                                   f"not {want_type} (this consumer's format is {fmt})")
                    continue
                if isinstance(resolved.codec, SchemaError):
                    out[i] = DecodeError(fmt, sid, str(resolved.codec))
                    continue
                group = groups[sid] = (resolved, [], [])
            group[1].append(i)
            group[2].append((fr.message_indexes, fr.payload) if protobuf else fr.payload)
        for sid, (resolved, where, items) in groups.items():
            values = self._codec(resolved, rendering).decode_many(items)
            for i, v in zip(where, values, strict=True):
                out[i] = DecodeError(fmt, sid, str(v)) if isinstance(v, CodecDecodeError) else v
        return out

    async def decode_all(self, fmt: str, payloads: Sequence[bytes | memoryview | None], *,
                         rendering: str | None = None) -> list[Any]:
        """:meth:`prepare` then :meth:`decode` (raises RegistryUnavailable only)."""
        await self.prepare(self.schema_ids(payloads))
        return self.decode(fmt, payloads, rendering=rendering)


class SchemaService:
    """The gateway's registries: the default one and the tenants' own, one resolver per distinct config."""

    def __init__(self, default: RegistryConfig | None = None, *, avro_rendering: str = RENDER_CONFLUENT,
                 max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.default = default
        self.avro_rendering = avro_rendering
        self.max_depth = max_depth
        #: set while an embedded registry is starting (schema'd requests answer 503 + Retry-After meanwhile)
        self.pending: str | None = None
        self._resolvers: dict[RegistryConfig, SchemaResolver] = {}

    def set_default(self, config: RegistryConfig | None, *, pending: str | None = None) -> None:
        """Install the gateway-wide registry (the embedded one calls this once it takes writes)."""
        self.default = config
        self.pending = pending

    def config_for(self, tenant_config: RegistryConfig | None) -> RegistryConfig | None:
        return tenant_config if tenant_config is not None else self.default

    def available(self, tenant_config: RegistryConfig | None) -> bool:
        """Whether schema'd formats can work for a tenant (a registry is configured, or one is starting)."""
        return self.config_for(tenant_config) is not None or (tenant_config is None and self.pending is not None)

    def resolver(self, tenant_config: RegistryConfig | None, fmt: str = "avro") -> SchemaResolver:
        """The resolver of a tenant's registry. Raises RegistryNotConfigured, or RegistryUnavailable while
        the embedded registry is still starting."""
        config = self.config_for(tenant_config)
        if config is None:
            if tenant_config is None and self.pending is not None:
                raise RegistryUnavailable(self.pending, retry_after=2.0)
            raise RegistryNotConfigured(fmt)
        resolver = self._resolvers.get(config)
        if resolver is None:
            # codecs are cached per schema id, and ids are per registry: a codec cache of its own each
            resolver = self._resolvers[config] = SchemaResolver(
                RegistryClient(config), cache_size=config.cache_size, avro_rendering=self.avro_rendering,
                max_depth=self.max_depth)
        return resolver

    async def close(self) -> None:
        resolvers, self._resolvers = list(self._resolvers.values()), {}
        for r in resolvers:
            await r.close()
