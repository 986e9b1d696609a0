"""Schema'd formats for the gateway: which registry a tenant uses, and framed payloads -> JSON.

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
outage: it is remembered for :data:`NOT_FOUND_TTL_S` (at most :data:`NOT_FOUND_CACHE_SIZE` such ids, the least
recently used forgotten first) and its records become per-record errors.

Bounds (hostile topics and schemas): one ``prepare`` resolves at most ``max_ids_per_poll`` new ids; the
records of the others become per-record errors ("not resolved yet") that a later poll resolves (the raw bytes
are delivered with them: nothing is lost). A schema whose text (references included) is over
``max_schema_bytes`` is never compiled: its records are per-record errors. Every cache here and in the
registry client is charged to one byte budget per registry (a compiled codec by :data:`COMPILED_COST_PER_BYTE`
times its schema's length, measured); of what failed, only an id's error is kept (so its records cost one
compile, not one per poll). Schemas are compiled on one worker thread (:func:`compile_off_loop`), never on
the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from service.schemas import proto_text
from service.schemas.avro import RENDER_CONFLUENT, AvroCodec
from service.schemas.codecs import Codecs, DecodeError, SchemaError, TooLargeSchema
from service.schemas.errors import CodecDecodeError, CodecSchemaError
from service.schemas.jsonschema_format import DEFAULT_MAX_DEPTH
from service.schemas.registry import (
    DEFAULT_CACHE_MAX_BYTES,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_SCHEMA_BYTES,
    CacheBudget,
    LRUCache,
    RegistryClient,
    RegistryConfig,
    RegistryUnavailable,
    Schema,
    SchemaNotFound,
    SchemaReference,
    SchemaTooLarge,
    TTLCache,
    text_size,
)
from service.schemas.wire import WireFormatError, unframe

#: the gateway's format names <-> the registry's schema types
SCHEMA_TYPE_OF = {"avro": "AVRO", "protobuf": "PROTOBUF", "jsonschema": "JSON"}
FORMAT_OF = {v: k for k, v in SCHEMA_TYPE_OF.items()}
SCHEMA_FORMATS = tuple(SCHEMA_TYPE_OF)
#: how long an id the registry answered 404 for is remembered as unknown (it may be registered later, in
#: another registry that a misconfigured gateway should have used, ...)
NOT_FOUND_TTL_S = 30.0
#: ids remembered as unknown at most (the least recently used is forgotten first, one at a time)
NOT_FOUND_CACHE_SIZE = 10_000
#: the default bound of new schema ids one poll resolves (GATEWAY_SCHEMA_REGISTRY_MAX_IDS_PER_POLL)
DEFAULT_MAX_IDS_PER_POLL = 100
#: what a compiled codec holds per byte of its schema's text (tracemalloc: Avro 54-69x, JSON Schema 7-57x),
#: and the C renderer's program (13-15x); what the caches are charged
COMPILED_COST_PER_BYTE = 64
PROGRAM_COST_PER_BYTE = 16
#: references followed at most (a cycle or a pathological chain is an error, not a hang)
MAX_REFERENCES = 256
#: the hint every "no registry" answer carries
CONFIGURE_HINT = ("set GATEWAY_SCHEMA_REGISTRY_URL, or schema_registry in the tenant's entry of the tenants file "
                  "(make run starts an embedded registry unless GATEWAY_EMBEDDED_REGISTRY=false)")


T = TypeVar("T")
_compiler: ThreadPoolExecutor | None = None
_compiler_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _compiler
    with _compiler_lock:
        if _compiler is None:
            _compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="schema-compile")
        return _compiler


async def compile_off_loop(fn: Callable[..., T], *args: Any, keep: bool = False) -> T:
    """``fn(*args)`` on the gateway's one schema-compiling thread. One thread: compiles queue rather than run
    side by side, so their peak memory is one compile's and the event loop competes with one thread for the
    GIL, which it gets back every switch interval (the longest single C step of a compile at the size limit,
    fastavro's parse, holds it ~20 ms).

    ``keep``: the result is long-lived (a codec for the caches). Then the cyclic GC is paused while it is
    built; when it succeeded, the young generation (what the build left) is collected once and the rest
    frozen (``gc.freeze``): a codec is hundreds of thousands of container objects, and automatic collections
    walking them again and again -- in whichever thread allocates -- held the GIL for long (a gen-1 pass
    over four ~200 KB codecs being built: 0.45 s). The gateway's GC policy (:mod:`api.server.gcpolicy`)
    freezes every survivor periodically anyway; this does it at once. A codec holds no reference cycle
    (but for recursive types), so one dropped from the caches later is freed by refcounting, frozen or not."""
    call = functools.partial(_kept, fn, args) if keep else functools.partial(fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_executor(), call)


def _kept(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        result = fn(*args)
    except BaseException:
        if paused:
            gc.enable()  # what a failed compile left is collected as usual, never frozen
        raise
    if paused:
        gc.collect(0)  # the build's own cyclic debris (tens of ms: only what is new since the pause)
        gc.freeze()
        gc.enable()
    return result


def _texts_size(schema: Schema, references: dict[str, str]) -> int:
    return text_size(schema.schema) + sum(text_size(t) for t in references.values())


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
    size: int = 0  # the schema's and its references' text, bytes

    @property
    def format(self) -> str:
        return FORMAT_OF.get(self.schema_type, self.schema_type.lower())


class SchemaResolver:
    """Schema ids -> compiled codecs for one registry. Decoding is sync, after an async ``prepare``."""

    def __init__(self, client: RegistryClient, codecs: Codecs | None = None, *, cache_size: int = 1000,
                 avro_rendering: str = RENDER_CONFLUENT, max_ids_per_poll: int = DEFAULT_MAX_IDS_PER_POLL,
                 not_found_cache_size: int = NOT_FOUND_CACHE_SIZE,
                 max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.client = client
        self.budget: CacheBudget = client.budget
        self.max_schema_bytes = client.max_schema_bytes
        self.codecs = codecs if codecs is not None else Codecs(max_cached=cache_size, avro_rendering=avro_rendering,
                                                               budget=self.budget, max_depth=max_depth)
        self.avro_rendering = self.codecs.avro_rendering
        self.max_ids_per_poll = max(1, max_ids_per_poll)
        self._resolved: LRUCache[int, ResolvedSchema] = LRUCache(cache_size, self.budget)
        self._other_renderings: LRUCache[tuple[int, str], Any] = LRUCache(cache_size, self.budget)
        self._programs: LRUCache[tuple[int, str], Any] = LRUCache(cache_size, self.budget)  # avro_program (C renderer)
        #: (format, schema text) -> its record name, for schema text a produce posted and the registry took
        self._accepted: LRUCache[tuple[str, str], str] = LRUCache(cache_size, self.budget)
        self._unknown: TTLCache[int, bool] = TTLCache(NOT_FOUND_TTL_S, not_found_cache_size)
        self._resolving: dict[int, asyncio.Future[ResolvedSchema | None]] = {}
        #: resolutions one tenant's polls wait for at once: half the registry's request slots, so tenants
        #: sharing a registry always leave the other half to the others
        self.tenant_share = max(1, client.max_concurrent_requests // 2)
        self._tenant_slots: dict[str, asyncio.Semaphore] = {}
        #: ids a poll left unresolved because of max_ids_per_poll (tests and metrics)
        self.deferred = 0

    async def close(self) -> None:
        await self.client.close()

    # -- resolution (async, cached) -----------------------------------------------------------------------
    def cached(self, schema_id: int) -> ResolvedSchema | None:
        return self._resolved.get(schema_id)

    def _known_unknown(self, schema_id: int) -> bool:
        return self._unknown.get(schema_id) is not None

    def _put(self, resolved: ResolvedSchema) -> None:
        # a schema that does not compile is kept as its error (and its text, within the size limit): its
        # records are per-record errors without a compile per poll
        compiled = 0 if isinstance(resolved.codec, SchemaError) else COMPILED_COST_PER_BYTE * resolved.size
        self._resolved.put(resolved.schema_id, resolved, compiled + resolved.size)

    async def resolve(self, schema_id: int) -> ResolvedSchema | None:
        """The id's schema and codec; ``None`` if the registry has no such id. Raises RegistryUnavailable.
        Concurrent calls for one id share one resolution."""
        hit = self._resolved.get(schema_id)
        if hit is not None:
            return hit
        if self._known_unknown(schema_id):
            return None
        fut = self._resolving.get(schema_id)
        if fut is None:
            fut = asyncio.ensure_future(self._resolve(schema_id))
            self._resolving[schema_id] = fut
            fut.add_done_callback(functools.partial(self._resolved_one, schema_id))
        return await asyncio.shield(fut)

    def _resolved_one(self, schema_id: int, fut: asyncio.Future[Any]) -> None:
        if self._resolving.get(schema_id) is fut:
            del self._resolving[schema_id]
        if not fut.cancelled():
            fut.exception()  # retrieved: every waiter may have been cancelled

    async def _resolve(self, schema_id: int) -> ResolvedSchema | None:
        try:
            schema = await self.client.get_schema(schema_id)
            serialized = schema.schema_type == "PROTOBUF" and not proto_text.available()
            if serialized:  # no protoc here: ask the registry for descriptors (Confluent's can; Karapace not
                schema = await self.client.get_schema(schema_id, fmt="serialized")  # with references)
            references = await self._references(schema.references, serialized)
        except SchemaNotFound:
            self._unknown.put(schema_id, True)
            return None
        except SchemaTooLarge as exc:  # kept as its error (no text, type unknown): per-record errors
            resolved = ResolvedSchema(schema_id, "", Schema("", ""), {}, TooLargeSchema("", exc.message), size=exc.size)
            self._resolved.put(schema_id, resolved)
            return resolved
        size = _texts_size(schema, references)
        fmt = FORMAT_OF.get(schema.schema_type, "")
        codec: Any
        source: Any = schema.schema  # Protobuf text: replaced by its compiled descriptor below
        deps: Any = references or None
        if size > self.max_schema_bytes:
            codec = TooLargeSchema(fmt, f"schema id {schema_id} with its references is {size} bytes, over the "
                                        f"gateway's limit of {self.max_schema_bytes} (GATEWAY_SCHEMA_MAX_BYTES)")
            resolved = ResolvedSchema(schema_id, schema.schema_type, Schema("", schema.schema_type), {}, codec,
                                      size=size)
            self._resolved.put(schema_id, resolved)
            return resolved
        try:
            if schema.schema_type == "PROTOBUF" and proto_text.looks_like_text(schema.schema):
                try:  # .proto text: compiled with protoc, off the event loop (a subprocess, once per id)
                    main, deps_ = await asyncio.to_thread(
                        proto_text.compile_proto, f"kcg_schema_{schema_id}.proto", schema.schema, references)
                except CodecSchemaError as exc:
                    raise SchemaError(fmt, str(exc)) from None
                source, deps = main, deps_
                codec = await compile_off_loop(self.codecs.compile, fmt, main, deps_, keep=True)
            else:
                codec = await compile_off_loop(self.codecs.compile, fmt, source, deps, keep=True)
        except SchemaError as exc:
            codec = exc
        resolved = ResolvedSchema(schema_id, schema.schema_type, schema, references, codec, source, deps, size)
        self._put(resolved)
        return resolved

    async def check_text(self, fmt: str, text: str) -> str | None:
        """Schema text a produce posted: checked off the loop (:meth:`Codecs.check`), nothing kept (its
        registration may still fail); its record name. Raises SchemaTooLarge or SchemaError."""
        size = text_size(text)
        if size > self.max_schema_bytes:
            raise SchemaTooLarge(f"the schema is {size} bytes, over the gateway's limit of {self.max_schema_bytes} "
                                 f"(GATEWAY_SCHEMA_MAX_BYTES)", size, self.max_schema_bytes)
        return await compile_off_loop(self.codecs.check, fmt, text)

    def accepted_name(self, fmt: str, text: str) -> str | None:
        """The record name of schema text the registry took before (``""``: it has none), or None."""
        return self._accepted.get((fmt, text))

    def accept(self, fmt: str, text: str, name: str | None) -> None:
        """Remember that the registry took ``text`` (so the next produce posting it skips the compile)."""
        self._accepted.put((fmt, text), name or "", len(text))

    async def _references(self, refs: Sequence[SchemaReference], serialized: bool = False) -> dict[str, str]:
        """Every schema ``refs`` import, transitively: import name -> schema text (``serialized``: Protobuf
        descriptors, base64). Raises SchemaTooLarge once they add up to more than the size limit."""
        out: dict[str, str] = {}
        todo = list(refs)
        seen: set[tuple[str, int]] = set()
        fmt = "serialized" if serialized else None
        total = 0
        while todo:
            ref = todo.pop()
            if (ref.subject, ref.version) in seen:
                continue
            seen.add((ref.subject, ref.version))
            if len(seen) > MAX_REFERENCES:
                raise SchemaNotFound(422, 42201, f"more than {MAX_REFERENCES} schema references")
            reg = await self.client.get_version(ref.subject, ref.version, fmt=fmt)
            total += text_size(reg.schema.schema)
            if total > self.max_schema_bytes:
                raise SchemaTooLarge(f"the schema's references add up to more than the gateway's limit of "
                                     f"{self.max_schema_bytes} bytes (GATEWAY_SCHEMA_MAX_BYTES)", total,
                                     self.max_schema_bytes)
            out[ref.name] = reg.schema.schema
            todo.extend(reg.schema.references)
        return out

    async def _resolve_for(self, schema_id: int, tenant: str | None) -> ResolvedSchema | None:
        if tenant is None:
            return await self.resolve(schema_id)
        slots = self._tenant_slots.get(tenant)
        if slots is None:
            slots = self._tenant_slots[tenant] = asyncio.Semaphore(self.tenant_share)
        async with slots:
            return await self.resolve(schema_id)

    async def prepare(self, schema_ids: Iterable[int], rendering: str | None = None, *,
                      programs: bool = False, every: bool = False, tenant: str | None = None) -> None:
        """Resolve the ids not cached yet, concurrently, at most ``max_ids_per_poll`` of them (the records of
        the others decode as "not resolved yet" errors; a later call resolves them; ``every``: all of them,
        that many at a time), and with ``programs`` compile the C renderer's programs of ``rendering`` for
        the Avro ones, off the loop. With ``tenant``, at most :attr:`tenant_share` of that tenant's
        resolutions run at once. Raises RegistryUnavailable (nothing else)."""
        missing: list[int] = []
        avro: list[int] = []
        for i in schema_ids:
            hit = self._resolved.get(i)
            if hit is None:
                if not self._known_unknown(i):
                    missing.append(i)
            elif hit.schema_type == "AVRO" and not isinstance(hit.codec, SchemaError):
                avro.append(i)
        missing.sort()  # the same ids first on every retry of the same records: a retry makes progress
        if len(missing) > self.max_ids_per_poll and not every:
            self.deferred += len(missing) - self.max_ids_per_poll
            del missing[self.max_ids_per_poll:]
        for start in range(0, len(missing), self.max_ids_per_poll):
            batch = missing[start:start + self.max_ids_per_poll]
            results = await asyncio.gather(*(self._resolve_for(i, tenant) for i in batch), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
                if r is not None and r.schema_type == "AVRO" and not isinstance(r.codec, SchemaError):
                    avro.append(r.schema_id)
        if not programs:
            return
        key = rendering or self.avro_rendering
        for sid in avro:
            if self._programs.get((sid, key)) is None:
                await self._compile_program(sid, key)

    async def _compile_program(self, schema_id: int, rendering: str) -> None:
        resolved = self._resolved.get(schema_id)
        if resolved is None or resolved.schema_type != "AVRO" or isinstance(resolved.codec, SchemaError):
            return
        try:
            codec = self._codec(resolved, rendering, compile_now=False)
            if codec is None:
                codec = await compile_off_loop(self._rendering_codec, resolved, rendering, keep=True)
                self._other_renderings.put((schema_id, rendering), codec, COMPILED_COST_PER_BYTE * resolved.size)
        except Exception:  # a rendering that does not compile: avro_program reports it
            return
        from service.schemas.avro_fast import compile_program
        program = await compile_off_loop(compile_program, codec, keep=True) or False  # False: "no program"
        self._programs.put((schema_id, rendering), program, PROGRAM_COST_PER_BYTE * resolved.size)

    # -- decoding (sync, never raises) --------------------------------------------------------------------
    @staticmethod
    def schema_ids(payloads: Iterable[bytes | memoryview | None]) -> set[int]:
        """The schema ids of the framed payloads among ``payloads`` (the rest are skipped)."""
        ids: set[int] = set()
        for p in payloads:
            if p is not None and len(p) >= 5 and p[0] == 0:
                ids.add(int.from_bytes(p[1:5], "big"))
        return ids

    def _rendering_codec(self, resolved: ResolvedSchema, rendering: str) -> AvroCodec:
        return AvroCodec(resolved.source, rendering=rendering, strict_unions=self.codecs.avro_strict_unions,
                         references=list((resolved.deps or {}).values()))

    def _codec(self, resolved: ResolvedSchema, rendering: str | None, *, compile_now: bool = True) -> Any:
        """The id's codec in a rendering (Avro only has several); a SchemaError when it does not compile.
        Another rendering than the default is compiled here only when ``prepare`` has not (its cache entry
        was dropped since); ``compile_now=False``: None then."""
        if rendering is None or rendering == self.avro_rendering or resolved.schema_type != "AVRO" \
                or isinstance(resolved.codec, SchemaError):
            return resolved.codec
        key = (resolved.schema_id, rendering)
        codec = self._other_renderings.get(key)
        if codec is None and compile_now:
            codec = self._rendering_codec(resolved, rendering)
            self._other_renderings.put(key, codec, COMPILED_COST_PER_BYTE * resolved.size)
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
            self._programs.put(key, program, PROGRAM_COST_PER_BYTE * resolved.size)
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
                    out[i] = DecodeError(fmt, sid, f"schema id {sid} not found in the schema registry"
                                         if self._known_unknown(sid) else self._not_resolved(sid))
                    continue
                if isinstance(resolved.codec, TooLargeSchema):
                    out[i] = DecodeError(fmt, sid, str(resolved.codec))
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

    def _not_resolved(self, sid: int) -> str:
        return (f"schema id {sid} not resolved yet (a poll resolves at most {self.max_ids_per_poll} new schema "
                f"ids, GATEWAY_SCHEMA_REGISTRY_MAX_IDS_PER_POLL): retry, e.g. seek back to this record's offset")

    async def decode_all(self, fmt: str, payloads: Sequence[bytes | memoryview | None], *,
                         rendering: str | None = None) -> list[Any]:
        """:meth:`prepare` then :meth:`decode` (raises RegistryUnavailable only)."""
        await self.prepare(self.schema_ids(payloads))
        return self.decode(fmt, payloads, rendering=rendering)


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """The bounds every registry's client and resolver get (the GATEWAY_SCHEMA_* settings)."""

    max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    max_ids_per_poll: int = DEFAULT_MAX_IDS_PER_POLL


class SchemaService:
    """The gateway's registries: the default one and the tenants' own, one resolver per distinct config."""

    def __init__(self, default: RegistryConfig | None = None, *, avro_rendering: str = RENDER_CONFLUENT,
                 limits: SchemaLimits | None = None, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.default = default
        self.avro_rendering = avro_rendering
        self.limits = limits if limits is not None else SchemaLimits()
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
            lim = self.limits
            client = RegistryClient(config, budget=CacheBudget(lim.cache_max_bytes),
                                    max_schema_bytes=lim.max_schema_bytes,
                                    max_concurrent_requests=lim.max_concurrent_requests)
            resolver = self._resolvers[config] = SchemaResolver(
                client, cache_size=config.cache_size, avro_rendering=self.avro_rendering,
                max_ids_per_poll=lim.max_ids_per_poll, max_depth=self.max_depth)
        return resolver

    def cache_bytes(self) -> int:
        """Bytes charged now to the schema-cache budgets of every registry (GATEWAY_SCHEMA_CACHE_MAX_BYTES each)."""
        return sum(r.budget.used for r in list(self._resolvers.values()))

    async def close(self) -> None:
        resolvers, self._resolvers = list(self._resolvers.values()), {}
        for r in resolvers:
            await r.close()
