"""Bounds of the schema machinery (service/schemas): caches budgeted in bytes, negative entries evicted one at a
time, schema text over the size limit never compiled or kept, what failed never cached, at most N new ids per
poll, at most N registry requests in flight. No sockets: the registry is an httpx MockTransport."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from service.schemas.avro import AvroCodec
from service.schemas.codecs import COST_PER_BYTE, Codecs, DecodeError, SchemaError
from service.schemas.formats import NOT_FOUND_CACHE_SIZE, SchemaResolver
from service.schemas.produce import (
    SCHEMA_INVALID,
    SCHEMA_TOO_LARGE,
    ProduceSchemaError,
    SchemaSpec,
    resolve_encoder,
)
from service.schemas.registry import (
    ENTRY_OVERHEAD,
    CacheBudget,
    LRUCache,
    RegistryClient,
    RegistryConfig,
    Schema,
    SchemaTooLarge,
    TTLCache,
    answer_limit,
)
from service.schemas.wire import frame


def _schema(name: str, fields: int = 1) -> str:
    return json.dumps({"type": "record", "name": name,
                       "fields": [{"name": f"f{i}", "type": "long"} for i in range(fields)]})


# --- caches -------------------------------------------------------------------------------------------------

def test_caches_sharing_a_budget_drop_the_least_recently_used_entry_of_any_of_them() -> None:
    budget = CacheBudget(3 * (100 + ENTRY_OVERHEAD))
    a: LRUCache[str, int] = LRUCache(100, budget)
    b: LRUCache[str, int] = LRUCache(100, budget)
    a.put("a1", 1, 100)
    b.put("b1", 2, 100)
    a.put("a2", 3, 100)
    assert a.get("a1") == 1  # a1 is now more recent than b1
    b.put("b2", 4, 100)  # over budget: b1, the least recently used of all, goes
    assert b.get("b1") is None and a.get("a1") == 1 and a.get("a2") == 3 and b.get("b2") == 4
    assert budget.used == 3 * (100 + ENTRY_OVERHEAD) and len(budget) == 3
    b.put("huge", 5, 10_000)  # more than the whole budget: not kept, nothing else dropped for it
    assert b.get("huge") is None and len(budget) == 3
    a.put("a1", 6, 50)  # replaced: charged its new cost
    assert budget.used == 2 * (100 + ENTRY_OVERHEAD) + 50 + ENTRY_OVERHEAD
    a.clear()
    assert budget.used == 100 + ENTRY_OVERHEAD and b.get("b2") == 4
    c: LRUCache[int, int] = LRUCache(2, budget)  # the count bound still holds, and gives the bytes back
    for i in range(5):
        c.put(i, i, 10)
    assert len(c) == 2 and budget.used == 100 + 2 * 10 + 3 * ENTRY_OVERHEAD


def test_ttl_cache_forgets_one_entry_at_a_time() -> None:
    cache: TTLCache[int, bool] = TTLCache(60, 3)
    for i in range(5):
        cache.put(i, True)
    assert [cache.get(i) for i in range(5)] == [None, None, True, True, True]
    expired: TTLCache[int, bool] = TTLCache(-1, 3)
    expired.put(1, True)
    assert expired.get(1) is None


def test_codecs_keep_no_text_that_failed_and_charge_compiled_ones() -> None:
    budget = CacheBudget(10**9)
    codecs = Codecs(budget=budget)
    for i in range(5):
        with pytest.raises(SchemaError):
            codecs.codec("avro", None, json.dumps({"type": "record", "name": f"X{i}", "fields": [{"name": "a"}]}))
    assert len(budget) == 0
    text = _schema("Ok")
    codecs.codec("avro", None, text)
    assert budget.used >= COST_PER_BYTE * len(text)
    with pytest.raises(SchemaError):  # by id: its small error is kept, so a poison id costs one compile
        codecs.codec("avro", 7, "{nope")
    assert len(budget) == 2


# --- the registry client ------------------------------------------------------------------------------------

class Registry:
    """A MockTransport registry: schemas by id, register answers, a delay, in-flight accounting."""

    def __init__(self, delay: float = 0.0, register: str = "accept") -> None:
        self.schemas: dict[int, str] = {}
        self.delay = delay
        self.register = register
        self.in_flight = self.max_in_flight = self.calls = 0
        self.next_id = 100

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            parts = request.url.path.strip("/").split("/")
            if parts[:2] == ["schemas", "ids"]:
                text = self.schemas.get(int(parts[2]))
                if text is None:
                    return httpx.Response(404, json={"error_code": 40403, "message": "Schema not found"})
                return httpx.Response(200, json={"schema": text})
            if parts[0] == "subjects" and parts[-1] == "versions" and request.method == "POST":
                if self.register == "refuse":
                    return httpx.Response(422, json={"error_code": 42201, "message": "Invalid schema"})
                self.next_id += 1
                self.schemas[self.next_id] = json.loads(request.content)["schema"]
                return httpx.Response(200, json={"id": self.next_id})
            return httpx.Response(404, json={"error_code": 40401, "message": "no route"})
        finally:
            self.in_flight -= 1

    def client(self, **kwargs: Any) -> RegistryClient:
        return RegistryClient(RegistryConfig("http://registry.test"), transport=httpx.MockTransport(self.handler),
                              **kwargs)

    def resolver(self, *, client: dict[str, Any] | None = None, **kwargs: Any) -> SchemaResolver:
        return SchemaResolver(self.client(**(client or {})), **kwargs)


async def test_requests_in_flight_never_exceed_the_cap() -> None:
    reg = Registry(delay=0.01)
    async with reg.client(max_concurrent_requests=3) as client:
        results = await asyncio.gather(*(client.get_schema(i) for i in range(40)), return_exceptions=True)
        assert len(results) == 40 and reg.calls == 40
        assert reg.max_in_flight == 3 == client.max_in_flight and client.in_flight == 0


async def test_a_schema_over_the_limit_is_refused_and_never_kept() -> None:
    reg = Registry()
    big = _schema("Big", 400)
    reg.schemas[1] = big
    async with reg.client(max_schema_bytes=len(big) - 1) as client:
        with pytest.raises(SchemaTooLarge) as info:
            await client.get_schema(1)
        assert info.value.size == len(big) and info.value.error_code == 41302 and "GATEWAY_SCHEMA_MAX_BYTES" in str(
            info.value)
        with pytest.raises(SchemaTooLarge):
            await client.register("t-value", Schema(big))
        assert reg.calls == 1 and len(client.budget) == 0  # registering it never reached the registry
    # an answer longer than the limit is cut off while it is read (a hostile registry cannot fill memory)
    reg.schemas[2] = "x" * (answer_limit(1024) + 1)
    async with reg.client(max_schema_bytes=1024) as client:
        with pytest.raises(SchemaTooLarge):
            await client.get_schema(2)


# --- the resolver -------------------------------------------------------------------------------------------

async def test_a_poll_resolves_at_most_max_ids_and_the_rest_are_per_record_errors() -> None:
    reg = Registry()
    for i in range(1, 11):
        reg.schemas[i] = _schema(f"R{i}")
    resolver = reg.resolver(max_ids_per_poll=4)
    payloads = [frame(i, b"\x02") for i in range(1, 11)] + [frame(99, b"\x02")]
    out = await resolver.decode_all("avro", payloads)
    assert reg.calls == 4 and resolver.deferred == 7
    assert out[:4] == [{"f0": 1}] * 4  # the lowest ids first: a retry of the same records makes progress
    for v in out[4:]:
        assert isinstance(v, DecodeError) and "not resolved yet" in v.message and "retry" in v.message
    out = await resolver.decode_all("avro", payloads)
    out = await resolver.decode_all("avro", payloads)
    assert out[:10] == [{"f0": 1}] * 10
    assert isinstance(out[10], DecodeError) and "schema id 99 not found" in out[10].message
    assert reg.calls == 11


async def test_unknown_ids_are_remembered_one_lru_entry_each() -> None:
    assert NOT_FOUND_CACHE_SIZE == 10_000  # the gateway's; a smaller one here, the same code
    n = 500
    reg = Registry()
    resolver = reg.resolver(max_ids_per_poll=n + 10, not_found_cache_size=n)
    await resolver.prepare(range(n + 10))
    assert reg.calls == n + 10
    await resolver.prepare(range(10, n + 10))  # the newest ones are all still known
    assert reg.calls == n + 10
    await resolver.prepare([0])  # only the oldest was forgotten (no wipe of the whole cache)
    assert reg.calls == n + 11


async def test_a_schema_over_the_limit_is_a_per_record_error_and_its_text_is_not_kept() -> None:
    reg = Registry()
    reg.schemas[1] = _schema("Big", 200)
    reg.schemas[2] = _schema("Small")
    resolver = reg.resolver(client={"max_schema_bytes": 2048})
    out = await resolver.decode_all("avro", [frame(1, b"\x02"), frame(2, b"\x02")])
    assert isinstance(out[0], DecodeError) and "over the gateway's limit of 2048" in out[0].message
    assert out[1] == {"f0": 1}
    assert resolver.budget.used < 64 * 1024  # the small codec and two small entries, not the big text


async def test_resolver_caches_fit_the_budget() -> None:
    reg = Registry()
    for i in range(1, 41):
        reg.schemas[i] = _schema(f"R{i}", 50)
    size = len(reg.schemas[1])
    budget = 10 * 64 * size  # room for about ten compiled codecs
    resolver = reg.resolver(client={"budget": CacheBudget(budget)})
    for i in range(1, 41):
        await resolver.prepare([i], programs=True)
    assert resolver.budget.used <= budget
    assert sum(resolver.cached(i) is not None for i in range(1, 41)) <= 10
    assert resolver.cached(40) is not None  # the most recent are kept


async def test_compiles_run_off_the_event_loop() -> None:
    import threading

    seen: list[str] = []
    reg = Registry()
    reg.schemas[1] = _schema("R")
    resolver = reg.resolver()
    compile_ = resolver.codecs.compile

    def spy(*args: Any) -> Any:
        seen.append(threading.current_thread().name)
        return compile_(*args)

    resolver.codecs.compile = spy  # type: ignore[method-assign]
    await resolver.prepare([1])
    assert seen and all(name.startswith("schema-compile") for name in seen)


# --- produce --------------------------------------------------------------------------------------------------

async def test_produce_schema_text_over_the_limit_is_413_before_anything_else() -> None:
    reg = Registry()
    resolver = reg.resolver(client={"max_schema_bytes": 4096})
    with pytest.raises(ProduceSchemaError) as info:
        await resolve_encoder(resolver, "avro", SchemaSpec("value", schema=_schema("Big", 400)), "t")
    assert (info.value.status, info.value.code) == (413, SCHEMA_TOO_LARGE) and "4096" in info.value.message
    assert reg.calls == 0 and len(resolver.budget) == 0
    reg.schemas[5] = _schema("Big", 400)  # by id: the registry's copy over the limit, 413 too
    with pytest.raises(ProduceSchemaError) as info:
        await resolve_encoder(resolver, "avro", SchemaSpec("value", schema_id=5), "t")
    assert (info.value.status, info.value.code) == (413, SCHEMA_TOO_LARGE)


async def test_produce_schema_text_the_registry_refuses_leaves_nothing_cached() -> None:
    reg = Registry(register="refuse")
    resolver = reg.resolver()
    for i in range(5):
        with pytest.raises(ProduceSchemaError) as info:
            await resolve_encoder(resolver, "avro", SchemaSpec("value", schema=_schema(f"R{i}", 100)), "t")
        assert info.value.code == SCHEMA_INVALID and info.value.status == 422
    assert len(resolver.budget) == 0


async def test_produce_schema_text_compiles_once() -> None:
    reg = Registry()
    resolver = reg.resolver()
    compiles: list[Any] = []
    compile_ = resolver.codecs.compile

    def counting(*args: Any) -> Any:
        compiles.append(args)
        return compile_(*args)

    resolver.codecs.compile = counting  # type: ignore[method-assign]
    spec = SchemaSpec("value", schema=_schema("R"))
    for _ in range(3):
        enc = await resolve_encoder(resolver, "avro", spec, "t")
        assert enc.encode({"f0": 1}) == frame(enc.schema_id, AvroCodec(_schema("R")).encode({"f0": 1}))
    assert len(compiles) == 1  # posted text compiled once, reused for its id; the next produces hit the caches


async def test_a_typed_range_read_resolves_every_id_in_rounds() -> None:
    reg = Registry(delay=0.005)
    for i in range(1, 11):
        reg.schemas[i] = _schema(f"R{i}")
    resolver = reg.resolver(max_ids_per_poll=4, client={"max_concurrent_requests": 2})
    await resolver.prepare(range(1, 11), every=True)
    assert all(resolver.cached(i) is not None for i in range(1, 11)) and resolver.deferred == 0
    assert reg.max_in_flight == 2


async def test_one_tenant_uses_at_most_half_the_registry_slots() -> None:
    reg = Registry(delay=0.02)
    flood_in_flight = [0, 0]  # now, most

    async def counting(request: httpx.Request) -> httpx.Response:
        flood = int(request.url.path.rsplit("/", 1)[1]) < 100
        if flood:
            flood_in_flight[0] += 1
            flood_in_flight[1] = max(flood_in_flight[1], flood_in_flight[0])
        try:
            return await Registry.handler(reg, request)
        finally:
            if flood:
                flood_in_flight[0] -= 1

    client = RegistryClient(RegistryConfig("http://registry.test"), transport=httpx.MockTransport(counting),
                            max_concurrent_requests=4)
    resolver = SchemaResolver(client, max_ids_per_poll=100)
    assert resolver.tenant_share == 2
    flood = asyncio.create_task(resolver.prepare(range(1, 41), tenant="greedy"))
    await asyncio.sleep(0.03)
    await resolver.prepare([100], tenant="other")  # served beside the flood, not after it
    assert not flood.done()
    await flood
    assert flood_in_flight[1] == 2 and reg.max_in_flight == 3


async def test_arrow_readers_are_charged_to_the_registrys_budget() -> None:
    from service.schemas.arrow import ReaderCache

    reg = Registry()
    reg.schemas[1] = _schema("R", 20)
    resolver = reg.resolver()
    resolved = await resolver.resolve(1)
    assert resolved is not None
    cache = ReaderCache(budget=resolver.budget)
    before = resolver.budget.used
    cache.get("avro", resolved)
    assert resolver.budget.used - before >= 64 * resolved.size
    assert not cache.warm("avro", {1})  # a page naming id 1 was never built: the next one is built off the loop
    cache.saw("avro", {1})
    assert cache.warm("avro", {1}) and not cache.warm("avro", {1, 2})


def test_a_dropped_avro_codec_is_freed_without_the_cyclic_gc() -> None:
    """Converters and renderers hold no reference cycle (recursive types aside): a codec dropped from the
    caches is freed at once, even when the GC froze it (the gateway freezes long-lived objects)."""
    import gc
    import weakref

    schema = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": ["null", "string", "bytes"], "default": None},
        {"name": "b", "type": {"type": "array", "items": ["null", {"type": "record", "name": "S", "fields": [
            {"name": "x", "type": "bytes", "default": "ab"}]}]}},
        {"name": "c", "type": ["int", "null"], "default": 3}]})
    enabled = gc.isenabled()
    gc.disable()
    try:
        codec = AvroCodec(schema)
        assert codec.encode({"b": [None, {}]}) == AvroCodec(schema).encode(
            {"a": None, "b": [None, {"S": {"x": "ab"}}], "c": {"int": 3}})  # defaults still converted
        refs = [weakref.ref(codec._convert), weakref.ref(codec._render)]
        del codec
        assert [r() for r in refs] == [None, None]
    finally:
        if enabled:
            gc.enable()
