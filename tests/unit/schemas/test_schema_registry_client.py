"""service/schemas/registry.py against the protocol-level test registry (tests/fakes/registry/server.py: a real HTTP
server on loopback with fault injection), and its pure answer/error parsing."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trustme

from service.schemas.registry import (
    LRUCache,
    RegistryClient,
    RegistryConfig,
    RegistryRequestError,
    RegistryUnavailable,
    Schema,
    SchemaNotFound,
    SchemaReference,
    error_from_response,
    parse_registered,
    parse_retry_after,
    parse_schema,
    redact_url,
    schema_body,
)
from tests.fakes.registry.server import TestRegistry

AVRO = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})
PROTO = 'syntax = "proto3";\npackage p;\nmessage M { string s = 1; }\n'
JSONS = '{"type": "object", "properties": {"a": {"type": "integer"}}}'


@pytest.fixture
def reg() -> Iterator[TestRegistry]:
    with TestRegistry() as r:
        yield r


@pytest.fixture
async def client(reg: TestRegistry) -> AsyncIterator[RegistryClient]:
    async with RegistryClient(RegistryConfig(reg.url, timeout_s=2)) as c:
        yield c


# --- sans-io ------------------------------------------------------------------------------------------------

def test_parse_schema_and_registered() -> None:
    s = parse_schema(b'{"schema": "\\"long\\""}')
    assert s == Schema('"long"', "AVRO", ())
    body = (b'{"schema": "x", "schemaType": "PROTOBUF", "references": '
            b'[{"name": "dep.proto", "subject": "dep", "version": 2}]}')
    assert parse_schema(body) == Schema("x", "PROTOBUF", (SchemaReference("dep.proto", "dep", 2),))
    reg = parse_registered(b'{"subject": "s", "version": 3, "id": 9, "schema": "x", "schemaType": "JSON"}')
    assert (reg.schema_id, reg.subject, reg.version, reg.schema.schema_type) == (9, "s", 3, "JSON")
    with pytest.raises(RegistryRequestError, match="unexpected schema"):
        parse_schema(b'{"id": 1}')
    with pytest.raises(RegistryRequestError, match="not a JSON"):
        parse_schema(b"<html>")


def test_schema_body() -> None:
    assert json.loads(schema_body(Schema("x"))) == {"schema": "x"}
    doc = json.loads(schema_body(Schema("y", "PROTOBUF", (SchemaReference("d.proto", "d", 1),))))
    assert doc == {"schema": "y", "schemaType": "PROTOBUF",
                   "references": [{"name": "d.proto", "subject": "d", "version": 1}]}


def test_error_mapping() -> None:
    e = error_from_response(404, b'{"error_code": 40403, "message": "Schema 7 not found"}')
    assert isinstance(e, SchemaNotFound) and e.error_code == 40403 and e.message == "Schema 7 not found"
    e = error_from_response(404, b'{"error_code": 40401, "message": "Subject not found"}')
    assert isinstance(e, SchemaNotFound) and e.error_code == 40401
    e = error_from_response(404, b"no such path")  # not the registry's answer: a wrong URL
    assert type(e) is RegistryRequestError and e.error_code == 404
    e = error_from_response(409, b'{"error_code": 409, "message": "incompatible"}')
    assert type(e) is RegistryRequestError and e.status == 409 and e.message == "incompatible"
    e = error_from_response(500, b'{"error_code": 50003, "message": "forwarding"}', "7")
    assert isinstance(e, RegistryUnavailable) and e.retry_after == 7.0 and "50003" in str(e)
    e = error_from_response(502, b"<html>bad gateway</html>")
    assert isinstance(e, RegistryUnavailable) and e.retry_after == 1.0
    assert isinstance(error_from_response(429, b""), RegistryUnavailable)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 1.0
    assert parse_retry_after("-3") == 0.0


def test_config_auth_and_repr() -> None:
    c = RegistryConfig("http://r", basic_auth="u:p@ss")
    assert c.headers()["Authorization"] == "Basic " + base64.b64encode(b"u:p@ss").decode()
    assert "p@ss" not in repr(c)
    assert RegistryConfig("http://r", bearer_token="zq-9").headers()["Authorization"] == "Bearer zq-9"
    assert "zq-9" not in repr(RegistryConfig("http://r", bearer_token="zq-9"))
    with pytest.raises(ValueError, match="user:password"):
        RegistryConfig("http://r", basic_auth="nopassword")
    with pytest.raises(ValueError, match="not both"):
        RegistryConfig("http://r", basic_auth="u:p", bearer_token="t")


def test_lru_cache() -> None:
    c: LRUCache[int, str] = LRUCache(2)
    c.put(1, "a")
    c.put(2, "b")
    assert c.get(1) == "a"  # 1 is now the most recent
    c.put(3, "c")
    assert (c.get(1), c.get(2), c.get(3), len(c)) == ("a", None, "c", 2)


# --- against the test registry ------------------------------------------------------------------------------

async def test_schema_by_id_cached(reg: TestRegistry, client: RegistryClient) -> None:
    sid = reg.add("t-value", PROTO, "PROTOBUF", [{"name": "d.proto", "subject": "d", "version": 1}])
    s = await client.get_schema(sid)
    assert s == Schema(PROTO, "PROTOBUF", (SchemaReference("d.proto", "d", 1),))
    assert await client.get_schema(sid) is s
    assert reg.count("GET", f"/schemas/ids/{sid}") == 1 and client.requests == 1
    assert client.cached_schema(sid) is s


async def test_cache_is_bounded(reg: TestRegistry) -> None:
    ids = [reg.add(f"s{i}", json.dumps({"type": "fixed", "name": f"F{i}", "size": 1})) for i in range(3)]
    async with RegistryClient(RegistryConfig(reg.url, cache_size=2)) as c:
        for i in ids:
            await c.get_schema(i)
        await c.get_schema(ids[0])  # evicted by the third
        assert reg.count("GET", "/schemas/ids/") == 4


async def test_concurrent_lookups_coalesced(reg: TestRegistry, client: RegistryClient) -> None:
    sid = reg.add("t-value", AVRO)
    reg.delay_s = 0.3  # the first request is still being answered while the others ask
    results = await asyncio.gather(*(client.get_schema(sid) for _ in range(20)))
    assert all(r == Schema(AVRO) for r in results)
    assert reg.count("GET", "/schemas/ids/") == 1


async def test_coalesced_waiter_cancelled_others_served(reg: TestRegistry, client: RegistryClient) -> None:
    sid = reg.add("t-value", AVRO)
    reg.delay_s = 0.3
    first = asyncio.create_task(client.get_schema(sid))
    second = asyncio.create_task(client.get_schema(sid))
    await asyncio.to_thread(reg.received.wait, 5)
    first.cancel()
    assert await second == Schema(AVRO)
    assert first.cancelled() and reg.count("GET") == 1


async def test_unknown_id(reg: TestRegistry, client: RegistryClient) -> None:
    with pytest.raises(SchemaNotFound) as ei:
        await client.get_schema(999)
    assert ei.value.error_code == 40403 and ei.value.status == 404
    reg.add("t-value", AVRO)  # not cached: a later request asks again
    with pytest.raises(SchemaNotFound):
        await client.get_schema(999)
    assert reg.count("GET") == 2


async def test_register_and_lookup(reg: TestRegistry, client: RegistryClient) -> None:
    sid = await client.register("t-value", Schema(AVRO))
    assert await client.register("t-value", Schema(AVRO)) == sid  # cached: no second request
    assert reg.count("POST") == 1
    assert await client.get_schema(sid) == Schema(AVRO)  # known from the register: no request
    assert reg.count("GET") == 0
    jid = await client.register("j-value", Schema(JSONS, "JSON"))
    assert jid != sid
    assert json.loads(reg.requests[-1].body) == {"schema": JSONS, "schemaType": "JSON"}
    assert reg.requests[-1].headers["content-type"] == "application/vnd.schemaregistry.v1+json"
    found = await client.lookup("j-value", Schema(JSONS, "JSON"))
    assert (found.schema_id, found.subject, found.version) == (jid, "j-value", 1)
    with pytest.raises(SchemaNotFound) as ei:
        await client.lookup("j-value", Schema(AVRO))
    assert ei.value.error_code == 40403
    with pytest.raises(SchemaNotFound) as ei:
        await client.lookup("nope", Schema(AVRO))
    assert ei.value.error_code == 40401
    with pytest.raises(RegistryRequestError) as er:
        await client.register("x", Schema("s", "XML"))
    assert er.value.status == 422 and er.value.error_code == 42201 and not isinstance(er.value, SchemaNotFound)


async def test_subjects_versions_latest(reg: TestRegistry, client: RegistryClient) -> None:
    v1 = await client.register("a/b value", Schema(AVRO))  # a subject that needs URL quoting
    assert await client.get_versions("a/b value") == [1]
    assert reg.requests[-1].path == "/subjects/a%2Fb%20value/versions"
    latest = await client.get_latest("a/b value")
    assert (latest.schema_id, latest.version) == (v1, 1)
    before = len(reg.requests)
    assert (await client.get_latest("a/b value")).schema_id == v1  # within the TTL: no request
    assert await client.get_versions("a/b value") == [1]
    assert len(reg.requests) == before
    v2 = await client.register("a/b value", Schema('"string"'))  # a register drops the subject's entries
    assert await client.get_versions("a/b value") == [1, 2]
    assert (await client.get_latest("a/b value")).schema_id == v2
    assert (await client.get_version("a/b value", 1)).schema_id == v1
    with pytest.raises(SchemaNotFound) as ei:
        await client.get_version("a/b value", 7)
    assert ei.value.error_code == 40402
    with pytest.raises(SchemaNotFound) as ei:
        await client.get_versions("missing")
    assert ei.value.error_code == 40401


async def test_subject_ttl_expires(reg: TestRegistry) -> None:
    reg.add("s", AVRO)
    async with RegistryClient(RegistryConfig(reg.url, subject_ttl_s=0)) as c:
        await c.get_latest("s")
        await c.get_latest("s")
    assert reg.count("GET", "/subjects/s/versions/latest") == 2


@pytest.mark.parametrize(("conf", "header"), [
    ({"basic_auth": "alice:s3cret"}, "Basic " + base64.b64encode(b"alice:s3cret").decode()),
    ({"bearer_token": "tok-1"}, "Bearer tok-1"),
])
async def test_auth_headers(reg: TestRegistry, conf: dict[str, str], header: str) -> None:
    reg.required_auth = header
    sid = reg.add("s", AVRO)
    async with RegistryClient(RegistryConfig(reg.url, **conf)) as c:  # type: ignore[arg-type]
        assert await c.get_schema(sid) == Schema(AVRO)
    assert reg.requests[-1].headers["authorization"] == header
    async with RegistryClient(RegistryConfig(reg.url)) as c:
        with pytest.raises(RegistryRequestError) as ei:
            await c.get_schema(sid)
    assert ei.value.status == 401


async def test_slow_registry_times_out(reg: TestRegistry) -> None:
    sid = reg.add("s", AVRO)
    reg.delay_s = 30
    async with RegistryClient(RegistryConfig(reg.url, timeout_s=0.3)) as c:
        t0 = time.monotonic()
        with pytest.raises(RegistryUnavailable, match=r"within 0\.3 s|Timeout"):
            await c.get_schema(sid)
        assert time.monotonic() - t0 < 2
        assert not c._inflight  # a later request starts afresh


async def test_down_registry(reg: TestRegistry, client: RegistryClient) -> None:
    sid = reg.add("s", AVRO)
    reg.down()
    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="unreachable") as ei:
        await client.get_schema(sid)
    assert time.monotonic() - t0 < 2 and ei.value.retry_after == 1.0
    reg.up()  # same port: the client recovers
    assert await client.get_schema(sid) == Schema(AVRO)


async def test_unroutable_registry_connect_timeout() -> None:
    # nothing answers SYNs to this TEST-NET-1 address (or the route is refused at once): never a hang
    async with RegistryClient(RegistryConfig("http://192.0.2.1:8081", timeout_s=0.3)) as c:
        t0 = time.monotonic()
        with pytest.raises(RegistryUnavailable):
            await c.get_schema(1)
        assert time.monotonic() - t0 < 2


async def test_5xx(reg: TestRegistry, client: RegistryClient) -> None:
    sid = reg.add("s", AVRO)
    reg.fail_next(503, retry_after="4")
    with pytest.raises(RegistryUnavailable) as ei:
        await client.get_schema(sid)
    assert ei.value.retry_after == 4.0 and "503" in str(ei.value)
    reg.fail_next(500)
    with pytest.raises(RegistryUnavailable) as ei:
        await client.register("s", Schema('"int"'))
    assert ei.value.retry_after == 1.0
    assert await client.get_schema(sid) == Schema(AVRO)  # errors are not cached


def test_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.settings import Settings

    assert Settings().schema_registry_config() is None
    monkeypatch.setenv("GATEWAY_SCHEMA_REGISTRY_URL", "https://sr:8081/")
    monkeypatch.setenv("GATEWAY_SCHEMA_REGISTRY_BASIC_AUTH", "u:pw-77")
    monkeypatch.setenv("GATEWAY_SCHEMA_REGISTRY_TIMEOUT_S", "2.5")
    monkeypatch.setenv("GATEWAY_SCHEMA_REGISTRY_CACHE_SIZE", "10")
    s = Settings()
    assert "pw-77" not in repr(s)
    c = s.schema_registry_config()
    assert c is not None and (c.url, c.basic_auth, c.bearer_token, c.timeout_s, c.cache_size, c.verify) == \
        ("https://sr:8081/", "u:pw-77", None, 2.5, 10, True)
    assert "pw-77" not in repr(c)


async def test_concurrent_registers_coalesced(reg: TestRegistry, client: RegistryClient) -> None:
    reg.delay_s = 0.2
    ids = await asyncio.gather(*(client.register("s", Schema(AVRO)) for _ in range(10)))
    assert len(set(ids)) == 1 and reg.count("POST") == 1


async def test_close_cancels_inflight(reg: TestRegistry) -> None:
    sid = reg.add("s", AVRO)
    reg.delay_s = 30
    c = RegistryClient(RegistryConfig(reg.url, timeout_s=20))
    task = asyncio.create_task(c.get_schema(sid))
    await asyncio.to_thread(reg.received.wait, 5)
    await c.close()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not c._inflight


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, str]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return server_ctx, str(ca_file)


async def test_tls(tmp_path: Path) -> None:
    server_ctx, ca_file = _tls(tmp_path)
    with TestRegistry(ssl_context=server_ctx) as reg:
        sid = reg.add("s", AVRO)
        assert reg.url.startswith("https://")
        async with RegistryClient(RegistryConfig(reg.url, ca_file=ca_file)) as c:
            assert await c.get_schema(sid) == Schema(AVRO)
        async with RegistryClient(RegistryConfig(reg.url, verify=False)) as c:
            assert await c.get_schema(sid) == Schema(AVRO)
        async with RegistryClient(RegistryConfig(reg.url, timeout_s=2)) as c:  # system CAs: not trusted
            with pytest.raises(RegistryUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
                await c.get_schema(sid)


async def test_url_credentials_never_in_messages(reg: TestRegistry) -> None:
    assert redact_url("https://u:pw-5@sr:8081/x") == "https://u:***@sr:8081/x"
    assert redact_url("http://sr:8081") == "http://sr:8081"
    url = reg.url.replace("http://", "http://u:pw-5@")
    assert "pw-5" not in repr(RegistryConfig(url))
    reg.down()
    async with RegistryClient(RegistryConfig(url)) as c:
        with pytest.raises(RegistryUnavailable) as ei:
            await c.get_schema(1)
    assert "pw-5" not in str(ei.value) and "u:***@127.0.0.1" in str(ei.value)
