"""Confluent REST Proxy v2 compatibility, checked from a client's side.

Black-box: a real gateway process over Tansu, driven with httpx exactly the way Confluent's v2 documentation
and its typical clients do (media types, bodies, URLs built from the instance name the client chose, loops
on GET records). Each test names the section of Confluent's documentation it is based on:
"API reference" is the v2 part of kafka-rest's docs/api.rst (docs.confluent.io "REST Proxy API
reference"), "quick start" is kafka-rest's docs/quickstart.rst. Where the docs leave a behaviour open, the
test follows Confluent's v2 implementation (io.confluent.kafkarest.v2.KafkaConsumerManager and
KafkaConsumerState, resources.v2.PartitionsResource) and says so.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
JSN = "application/vnd.kafka.json.v2+json"
H = {"Content-Type": V2}
# The Accept header of the API reference's metadata examples (weighted alternatives).
ACCEPT_METADATA = "application/vnd.kafka.v2+json, application/vnd.kafka+json, application/json"


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, log_file=tmp_path_factory.mktemp("gw-compat") / "gateway.log") as g:
        yield g



# -- helpers ----------------------------------------------------------------------------------------------
def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def ck_produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, int]]) -> None:
    """Produce (key, value, partition) records with a native client (for tests about the consumer side)."""
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for key, value, partition in records:
        p.produce(topic, key=key, value=value, partition=partition)
    assert p.flush(30) == 0


def body_of(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        raise AssertionError(f"not JSON: HTTP {r.status_code} {r.headers.get('content-type')} {r.text[:300]!r}"
                             ) from None


def err(r: httpx.Response, status: int, code: int) -> None:
    """API reference, "Errors": every error is a JSON object with an integer error_code and a message."""
    body = body_of(r)
    assert (r.status_code, body.get("error_code") if isinstance(body, dict) else None) == (status, code), r.text
    assert set(body) == {"error_code", "message"}, body
    assert isinstance(body["error_code"], int) and isinstance(body["message"], str) and body["message"]
    assert r.headers["content-type"].startswith(V2), r.headers.get("content-type")


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, f"HTTP {r.status_code}: {r.text[:500]}"
    if status == 204:
        assert r.content == b""
        return None
    return body_of(r)


async def create(http: httpx.AsyncClient, group: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(f"/consumers/{group}", json=body, headers=H)
    out = ok(r)
    assert r.headers["content-type"].startswith(V2)
    assert set(out) == {"instance_id", "base_uri"}, out
    return out  # type: ignore[no-any-return]


async def poll(http: httpx.AsyncClient, url: str, n: int, accept: str = BIN, deadline_s: float = 30.0,
               params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Loop on GET records, as Confluent clients do, until n records arrived (or the deadline passed)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < n and time.monotonic() < deadline:
        r = await http.get(url, params=params, headers={"Accept": accept})
        batch = ok(r)
        assert isinstance(batch, list), batch
        if batch:
            assert r.headers["content-type"].startswith(accept), r.headers.get("content-type")
        got += batch
    assert len(got) >= n, f"only {len(got)} of {n} records within {deadline_s} s: {got}"
    return got


def tp(topic: str, partition: int) -> dict[str, Any]:
    return {"topic": topic, "partition": partition}


# -- consumer instances: names, ids, formats --------------------------------------------------------------
async def test_named_instance_every_url_built_from_the_name(broker: AnyBroker, bclient: KafkaClient,
                                                            gw: GatewayProcess, http: httpx.AsyncClient,
                                                            topic_name: str) -> None:
    """API reference "POST /consumers/(string:group_name)": the instance id is the requested name and
    base_uri is http://host:port/consumers/<group>/instances/<name>; the quick start then builds every
    URL from that name. Subscription, records, positions (+ beginning, end), assignments, offsets, DELETE."""
    t = topic_name
    await bclient.create_topics({t: 1})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(b"k%d" % i, b"v%d" % i, 0) for i in range(3)])
    group = f"g-{t}"
    out = await create(http, group, {"name": "my_consumer_instance", "format": "binary",
                                     "auto.offset.reset": "earliest"})
    assert out == {"instance_id": "my_consumer_instance",
                   "base_uri": f"{gw.url}/consumers/{group}/instances/my_consumer_instance"}
    inst = f"/consumers/{group}/instances/my_consumer_instance"  # from the name, not from base_uri

    ok(await http.post(f"{inst}/subscription", json={"topics": [t]}, headers=H), 204)
    assert ok(await http.get(f"{inst}/subscription", headers={"Accept": V2})) == {"topics": [t]}
    recs = await poll(http, f"{inst}/records", 3)
    assert [(r["topic"], r["partition"], r["offset"], r["key"], r["value"]) for r in recs[:3]] == [
        (t, 0, i, b64(b"k%d" % i), b64(b"v%d" % i)) for i in range(3)]
    assert ok(await http.get(f"{inst}/assignments", headers={"Accept": V2})) == {"partitions": [tp(t, 0)]}

    # API reference "POST .../positions": the next records start at the given offset
    ok(await http.post(f"{inst}/positions", json={"offsets": [{**tp(t, 0), "offset": 1}]}, headers=H), 204)
    recs = await poll(http, f"{inst}/records", 2)
    assert [r["offset"] for r in recs[:2]] == [1, 2]
    # "POST .../positions/beginning"
    ok(await http.post(f"{inst}/positions/beginning", json={"partitions": [tp(t, 0)]}, headers=H), 204)
    recs = await poll(http, f"{inst}/records", 1)
    assert recs[0]["offset"] == 0
    # "POST .../positions/end": nothing old comes back; a record produced afterwards does
    ok(await http.post(f"{inst}/positions", json={"offsets": [{**tp(t, 0), "offset": 0}]}, headers=H), 204)
    ok(await http.post(f"{inst}/positions/end", json={"partitions": [tp(t, 0)]}, headers=H), 204)
    r = await http.get(f"{inst}/records", params={"timeout": 1500}, headers={"Accept": BIN})
    assert ok(r) == []
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, b"after-end", 0)])
    recs = await poll(http, f"{inst}/records", 1)
    assert [(r["offset"], r["key"], r["value"]) for r in recs] == [(3, None, b64(b"after-end"))]

    # "POST .../offsets" stores offset + 1, "GET .../offsets" answers it
    assert ok(await http.post(f"{inst}/offsets", json={"offsets": [{**tp(t, 0), "offset": 3}]}, headers=H)) == []
    got = ok(await http.request("GET", f"{inst}/offsets", json={"partitions": [tp(t, 0)]}, headers=H))
    assert got == {"offsets": [{**tp(t, 0), "offset": 4, "metadata": ""}]}
    ok(await http.delete(inst, headers=H), 204)
    err(await http.get(f"{inst}/subscription"), 404, 40403)


async def test_legacy_id_is_the_name_and_overrides_name(http: httpx.AsyncClient, gw: GatewayProcess,
                                                        topic_name: str) -> None:
    """Confluent's KafkaConsumerManager.createConsumer: an explicit legacy 'id' always overrides 'name'."""
    group = f"g-{topic_name}"
    out = await create(http, group, {"id": "legacy_id", "name": "ignored_name", "format": "binary"})
    assert out == {"instance_id": "legacy_id", "base_uri": f"{gw.url}/consumers/{group}/instances/legacy_id"}
    assert ok(await http.get(f"/consumers/{group}/instances/legacy_id/subscription")) == {"topics": []}
    err(await http.get(f"/consumers/{group}/instances/ignored_name/subscription"), 404, 40403)
    # 'id' alone works as the name too
    out = await create(http, group, {"id": "only_id"})
    assert out["instance_id"] == "only_id"
    for name in ("legacy_id", "only_id"):
        ok(await http.delete(f"/consumers/{group}/instances/{name}", headers=H), 204)


async def test_without_a_name_an_id_is_generated_and_base_uri_works(broker: AnyBroker, bclient: KafkaClient,
                                                                    gw: GatewayProcess, http: httpx.AsyncClient,
                                                                    topic_name: str) -> None:
    """API reference "POST /consumers/...": without 'name' the proxy generates the id; base_uri is the
    consumer's URL (the Confluent node client and most others use base_uri as given)."""
    t = topic_name
    await bclient.create_topics({t: 1})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, b"generated", 0)])
    group = f"g-{t}"
    a = await create(http, group, {"format": "binary", "auto.offset.reset": "earliest"})
    b = await create(http, group, {})
    assert a["instance_id"] and a["instance_id"] != b["instance_id"]
    for out in (a, b):
        assert out["base_uri"] == f"{gw.url}/consumers/{group}/instances/{out['instance_id']}"
    uri = a["base_uri"]  # absolute URL, used as is
    ok(await http.post(f"{uri}/subscription", json={"topics": [t]}, headers=H), 204)
    recs = await poll(http, f"{uri}/records", 1)
    assert base64.b64decode(recs[0]["value"]) == b"generated"
    ok(await http.delete(uri, headers=H), 204)
    ok(await http.delete(b["base_uri"], headers=H), 204)
    err(await http.get(f"{uri}/records", headers={"Accept": BIN}), 404, 40403)


@pytest.mark.parametrize("fmt", ["BINARY", "Binary", "binary", "JSON", "Json", "json"])
async def test_format_is_case_insensitive(broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient,
                                          topic_name: str, fmt: str) -> None:
    """Confluent's CreateConsumerInstanceRequest upper-cases 'format' before matching it; the Accept of
    GET records must match the format (API reference "GET .../records": otherwise 406 / 40601)."""
    t = topic_name
    await bclient.create_topics({t: 1})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(b'"somekey"', b'{"foo":"bar"}', 0)])
    group = f"g-{t}"
    out = await create(http, group, {"name": "fmt", "format": fmt, "auto.offset.reset": "earliest"})
    inst = f"/consumers/{group}/instances/{out['instance_id']}"
    ok(await http.post(f"{inst}/assignments", json={"partitions": [tp(t, 0)]}, headers=H), 204)
    binary = fmt.lower() == "binary"
    right, wrong = (BIN, JSN) if binary else (JSN, BIN)
    err(await http.get(f"{inst}/records", headers={"Accept": wrong}), 406, 40601)
    recs = await poll(http, f"{inst}/records", 1, accept=right)
    if binary:
        assert (recs[0]["key"], recs[0]["value"]) == (b64(b'"somekey"'), b64(b'{"foo":"bar"}'))
    else:
        assert (recs[0]["key"], recs[0]["value"]) == ("somekey", {"foo": "bar"})
    ok(await http.delete(inst, headers=H), 204)


async def test_same_name_in_the_same_group_is_409_40902(http: httpx.AsyncClient, topic_name: str) -> None:
    """API reference "POST /consumers/...": 409 / 40902 when the name exists (Confluent keys instances by
    group and name, so another group may use it; once deleted the name is free again)."""
    group, other = f"g-{topic_name}", f"g2-{topic_name}"
    await create(http, group, {"name": "twice", "format": "binary"})
    err(await http.post(f"/consumers/{group}", json={"name": "twice", "format": "binary"}, headers=H), 409, 40902)
    err(await http.post(f"/consumers/{group}", json={"id": "twice"}, headers=H), 409, 40902)
    assert (await create(http, other, {"name": "twice"}))["instance_id"] == "twice"
    ok(await http.delete(f"/consumers/{group}/instances/twice", headers=H), 204)
    assert (await create(http, group, {"name": "twice"}))["instance_id"] == "twice"
    for g in (group, other):
        ok(await http.delete(f"/consumers/{g}/instances/twice", headers=H), 204)


# -- trailing slashes --------------------------------------------------------------------------------------
async def test_trailing_slash_variants_answer_directly(broker: AnyBroker, bclient: KafkaClient,
                                                       http: httpx.AsyncClient, topic_name: str) -> None:
    """The API reference's own create example posts to /consumers/testgroup/ (trailing slash); Jersey
    matches such paths directly. No 307: clients do not follow redirects on POST/DELETE."""
    t = topic_name
    await bclient.create_topics({t: 1})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, b"slash", 0)])
    group = f"g-{t}"

    async def call(method: str, path: str, status: int, body: Any = None, accept: str | None = None) -> Any:
        headers = dict(H) if body is not None or method != "GET" else {}
        if accept:
            headers["Accept"] = accept
        r = await http.request(method, path, json=body, headers=headers, follow_redirects=False)
        assert r.status_code == status, f"{method} {path}: HTTP {r.status_code} {r.headers.get('location')} {r.text}"
        return ok(r, status)

    out = await call("POST", f"/consumers/{group}/", 200, {"name": "slash", "format": "binary",
                                                          "auto.offset.reset": "earliest"})
    assert out["instance_id"] == "slash"
    inst = f"/consumers/{group}/instances/slash"
    await call("POST", f"{inst}/subscription/", 204, {"topics": [t]})
    assert await call("GET", f"{inst}/subscription/", 200) == {"topics": [t]}
    recs = await poll(http, f"{inst}/records/", 1)
    assert base64.b64decode(recs[0]["value"]) == b"slash"
    assert await call("GET", f"{inst}/assignments/", 200) == {"partitions": [tp(t, 0)]}
    await call("POST", f"{inst}/positions/", 204, {"offsets": [{**tp(t, 0), "offset": 0}]})
    await call("POST", f"{inst}/positions/beginning/", 204, {"partitions": [tp(t, 0)]})
    await call("POST", f"{inst}/positions/end/", 204, {"partitions": [tp(t, 0)]})
    assert await call("POST", f"{inst}/offsets/", 200, {"offsets": [{**tp(t, 0), "offset": 0}]}) == []
    got = await call("GET", f"{inst}/offsets/", 200, {"partitions": [tp(t, 0)]})
    assert [o["offset"] for o in got["offsets"]] == [1]
    await call("DELETE", f"{inst}/subscription/", 204)
    await call("POST", f"{inst}/assignments/", 204, {"partitions": [tp(t, 0)]})
    await call("DELETE", f"{inst}/", 204)
    assert t in await call("GET", "/topics/", 200)
    assert (await call("GET", f"/topics/{t}/", 200))["name"] == t
    assert len(await call("GET", f"/topics/{t}/partitions/", 200)) == 1
    assert (await call("GET", f"/topics/{t}/partitions/0/", 200))["partition"] == 0
    assert (await call("GET", f"/topics/{t}/partitions/0/offsets/", 200))["end_offset"] == 1


async def test_produce_paths_with_a_trailing_slash(bclient: KafkaClient, http: httpx.AsyncClient,
                                                   topic_name: str) -> None:
    """Produce (API reference "POST /topics/..." and ".../partitions/(int)") with a trailing slash: no 307."""
    t = topic_name
    await bclient.create_topics({t: 1})
    body = {"records": [{"value": b64(b"slash")}]}
    for path in (f"/topics/{t}/", f"/topics/{t}/partitions/0/"):
        r = await http.post(path, json=body, headers={"Content-Type": BIN, "Accept": V2}, follow_redirects=False)
        out = ok(r)
        assert [o["partition"] for o in out["offsets"]] == [0], out


# -- subscriptions ------------------------------------------------------------------------------------------
async def test_topics_win_over_a_pattern_in_one_request(bclient: KafkaClient, http: httpx.AsyncClient,
                                                        topic_name: str) -> None:
    """API reference "POST .../subscription" calls topics and topic_pattern mutually exclusive; Confluent's
    KafkaConsumerState.subscribe uses the topics list when both are given."""
    t = topic_name
    await bclient.create_topics({t: 1, f"{t}-other": 1})
    group = f"g-{t}"
    inst = f"/consumers/{group}/instances/{(await create(http, group, {'name': 'both'}))['instance_id']}"
    ok(await http.post(f"{inst}/subscription", json={"topics": [t], "topic_pattern": f"{t}-.*"}, headers=H), 204)
    assert ok(await http.get(f"{inst}/subscription")) == {"topics": [t]}
    ok(await http.delete(inst, headers=H), 204)


async def test_switching_subscription_kinds_needs_an_unsubscribe(bclient: KafkaClient, http: httpx.AsyncClient,
                                                                 topic_name: str) -> None:
    """API reference "POST .../subscription" and ".../assignments": 409 / 40903, subscription to topics,
    partitions and a pattern are mutually exclusive. A new topics list replaces the previous one."""
    t, t2 = topic_name, f"{topic_name}-b"
    await bclient.create_topics({t: 1, t2: 1})
    group = f"g-{t}"
    inst = f"/consumers/{group}/instances/{(await create(http, group, {'name': 'switch'}))['instance_id']}"
    pattern = {"topic_pattern": f"{t}.*"}

    ok(await http.post(f"{inst}/subscription", json={"topics": [t]}, headers=H), 204)
    ok(await http.post(f"{inst}/subscription", json={"topics": [t2]}, headers=H), 204)  # replaced
    assert ok(await http.get(f"{inst}/subscription")) == {"topics": [t2]}
    err(await http.post(f"{inst}/subscription", json=pattern, headers=H), 409, 40903)
    err(await http.post(f"{inst}/assignments", json={"partitions": [tp(t, 0)]}, headers=H), 409, 40903)
    assert ok(await http.get(f"{inst}/subscription")) == {"topics": [t2]}

    ok(await http.delete(f"{inst}/subscription", headers=H), 204)
    ok(await http.post(f"{inst}/subscription", json=pattern, headers=H), 204)
    err(await http.post(f"{inst}/subscription", json={"topics": [t]}, headers=H), 409, 40903)
    err(await http.post(f"{inst}/assignments", json={"partitions": [tp(t, 0)]}, headers=H), 409, 40903)

    ok(await http.delete(f"{inst}/subscription", headers=H), 204)
    ok(await http.post(f"{inst}/assignments", json={"partitions": [tp(t, 0)]}, headers=H), 204)
    err(await http.post(f"{inst}/subscription", json={"topics": [t]}, headers=H), 409, 40903)
    err(await http.post(f"{inst}/subscription", json=pattern, headers=H), 409, 40903)
    ok(await http.delete(inst, headers=H), 204)


async def test_an_empty_topics_list_unsubscribes(bclient: KafkaClient, http: httpx.AsyncClient,
                                                 topic_name: str) -> None:
    """Confluent passes the list to Java's KafkaConsumer.subscribe, for which an empty list means
    unsubscribe(): 204, the subscription is empty, and a pattern may follow without a 40903."""
    t = topic_name
    await bclient.create_topics({t: 1})
    group = f"g-{t}"
    inst = f"/consumers/{group}/instances/{(await create(http, group, {'name': 'empty'}))['instance_id']}"
    ok(await http.post(f"{inst}/subscription", json={"topics": [t]}, headers=H), 204)
    ok(await http.post(f"{inst}/subscription", json={"topics": []}, headers=H), 204)
    assert ok(await http.get(f"{inst}/subscription")) == {"topics": []}
    ok(await http.post(f"{inst}/subscription", json={"topic_pattern": f"{t}.*"}, headers=H), 204)
    ok(await http.delete(inst, headers=H), 204)


# -- committed offsets -------------------------------------------------------------------------------------
async def test_committed_offsets_list_only_committed_partitions(broker: AnyBroker, bclient: KafkaClient,
                                                                http: httpx.AsyncClient, topic_name: str) -> None:
    """API reference "GET .../offsets": the last committed offsets (committed by this process or another);
    Confluent's KafkaConsumerState.committed leaves out partitions without one. "POST .../offsets"
    commits offset + 1 (as the doc example's 20 → 21)."""
    t = topic_name
    await bclient.create_topics({t: 3})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, b"x%d" % i, 0) for i in range(5)])
    group = f"g-{t}"
    inst = f"/consumers/{group}/instances/{(await create(http, group, {'name': 'committer'}))['instance_id']}"
    ok(await http.post(f"{inst}/assignments", json={"partitions": [tp(t, p) for p in range(3)]}, headers=H), 204)
    query = {"partitions": [tp(t, p) for p in range(3)]}

    async def committed(url: str) -> list[dict[str, Any]]:
        out = ok(await http.request("GET", f"{url}/offsets", json=query, headers=H))
        assert set(out) == {"offsets"}, out
        return sorted(out["offsets"], key=lambda o: o["partition"])  # type: ignore[no-any-return]

    assert await committed(inst) == []
    assert ok(await http.post(f"{inst}/offsets", json={"offsets": [{**tp(t, 0), "offset": 4}]}, headers=H)) == []
    assert await committed(inst) == [{**tp(t, 0), "offset": 5, "metadata": ""}]
    assert ok(await http.post(f"{inst}/offsets", json={"offsets": [{**tp(t, 2), "offset": 0}]}, headers=H)) == []
    expected = [{**tp(t, 0), "offset": 5, "metadata": ""}, {**tp(t, 2), "offset": 1, "metadata": ""}]
    assert await committed(inst) == expected
    # another instance of the group sees the same committed offsets
    other = f"/consumers/{group}/instances/{(await create(http, group, {'name': 'reader'}))['instance_id']}"
    assert await committed(other) == expected
    for url in (inst, other):
        ok(await http.delete(url, headers=H), 204)


# -- topics and partitions (metadata) ----------------------------------------------------------------------
async def test_topic_and_partition_metadata(broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient,
                                            topic_name: str) -> None:
    """API reference "Topics" and "Partitions" (v2): GET /topics, /topics/(name), .../partitions,
    .../partitions/(id); Confluent's v2 PartitionsResource adds .../partitions/(id)/offsets with
    beginning_offset and end_offset. Unknown topic 404 / 40401, unknown partition 404 / 40402."""
    t = topic_name
    await bclient.create_topics({t: 2})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, b"a", 0), (None, b"b", 0), (None, b"c", 0),
                                                             (None, b"d", 1)])
    # The quick start sends no Accept header. Confluent lists topics afresh on each call; the gateway answers
    # from a listing up to GATEWAY_TOPIC_METADATA_TTL_S (5 s) old, so a just-created topic may take that long.
    deadline = time.monotonic() + 10
    while True:
        names = ok(await http.get("/topics"))
        assert isinstance(names, list) and all(isinstance(n, str) for n in names), names
        if t in names or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)  # polling for a condition (the cached listing's refresh), with a deadline
    assert t in names
    r = await http.get("/topics", headers={"Accept": ACCEPT_METADATA})
    assert t in ok(r) and r.headers["content-type"].startswith(V2)

    r = await http.get(f"/topics/{t}", headers={"Accept": ACCEPT_METADATA})
    topic = ok(r)
    assert r.headers["content-type"].startswith(V2)
    assert set(topic) == {"name", "configs", "partitions"} and topic["name"] == t
    assert isinstance(topic["configs"], dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in topic["configs"].items())
    parts = topic["partitions"]
    assert [p["partition"] for p in parts] == [0, 1]
    for p in parts:
        assert set(p) == {"partition", "leader", "replicas"} and isinstance(p["leader"], int)
        assert p["replicas"] and all(set(x) == {"broker", "leader", "in_sync"} for x in p["replicas"])
        assert [x["broker"] for x in p["replicas"] if x["leader"]] == [p["leader"]]
        assert all(isinstance(x["in_sync"], bool) for x in p["replicas"])

    assert ok(await http.get(f"/topics/{t}/partitions", headers={"Accept": ACCEPT_METADATA})) == parts
    assert ok(await http.get(f"/topics/{t}/partitions/1", headers={"Accept": ACCEPT_METADATA})) == parts[1]
    for p, end in ((0, 3), (1, 1)):
        got = ok(await http.get(f"/topics/{t}/partitions/{p}/offsets", headers={"Accept": V2}))
        assert (got["beginning_offset"], got["end_offset"]) == (0, end), got

    missing = f"{t}-missing"
    for path in (f"/topics/{missing}", f"/topics/{missing}/partitions", f"/topics/{missing}/partitions/0",
                 f"/topics/{missing}/partitions/0/offsets"):
        err(await http.get(path, headers={"Accept": V2}), 404, 40401)
    for path in (f"/topics/{t}/partitions/2", f"/topics/{t}/partitions/2/offsets"):
        err(await http.get(path, headers={"Accept": V2}), 404, 40402)


# -- produce --------------------------------------------------------------------------------------------------
def check_produce_response(r: httpx.Response, n: int) -> list[dict[str, Any]]:
    """API reference "POST /topics/(string:topic_name)": offsets[i] = partition, offset, error_code, error;
    key_schema_id and value_schema_id are null for binary and json (quick start responses)."""
    out = ok(r)
    assert r.headers["content-type"].startswith(V2), r.headers.get("content-type")
    assert set(out) == {"offsets", "key_schema_id", "value_schema_id"}, out
    assert out["key_schema_id"] is None and out["value_schema_id"] is None
    offsets = out["offsets"]
    assert len(offsets) == n
    for o in offsets:
        assert set(o) == {"partition", "offset", "error_code", "error"}, o
        assert o["error_code"] is None and o["error"] is None
        assert isinstance(o["partition"], int) and isinstance(o["offset"], int) and o["offset"] >= 0
    assert len({(o["partition"], o["offset"]) for o in offsets}) == n
    return offsets  # type: ignore[no-any-return]


async def read_back(http: httpx.AsyncClient, group: str, topic: str, partitions: list[int], fmt: str, n: int
                    ) -> dict[tuple[int, int], tuple[Any, Any]]:
    """Consume what was produced through a consumer instance in the same format: {(partition, offset): (key,
    value)}."""
    out = await create(http, group, {"name": "reader", "format": fmt, "auto.offset.reset": "earliest"})
    inst = f"/consumers/{group}/instances/{out['instance_id']}"
    ok(await http.post(f"{inst}/assignments", json={"partitions": [tp(topic, p) for p in partitions]},
                       headers=H), 204)
    recs = await poll(http, f"{inst}/records", n, accept=BIN if fmt == "binary" else JSN)
    ok(await http.delete(inst, headers=H), 204)
    assert all(r["topic"] == topic for r in recs)
    got = {(r["partition"], r["offset"]): (r["key"], r["value"]) for r in recs}
    assert len(got) == len(recs) == n, recs
    return got


async def test_produce_binary_to_a_topic_and_consume_it_back(bclient: KafkaClient, http: httpx.AsyncClient,
                                                             topic_name: str) -> None:
    """API reference "POST /topics/(string:topic_name)", example binary request: base64 keys and values,
    an optional partition per record."""
    t = topic_name
    await bclient.create_topics({t: 2})
    sent = [(b64(b"key"), b64(b"confluent"), None), (None, b64(b"kafka"), 1), (None, b64(b"logs"), None)]
    records = [{k: v for k, v in (("key", key), ("value", value), ("partition", part)) if v is not None}
               for key, value, part in sent]
    r = await http.post(f"/topics/{t}", json={"records": records}, headers={"Content-Type": BIN, "Accept": V2})
    offsets = check_produce_response(r, 3)
    assert offsets[1]["partition"] == 1
    assert all(o["partition"] in (0, 1) for o in offsets)
    got = await read_back(http, f"g-{t}", t, [0, 1], "binary", 3)
    assert got == {(o["partition"], o["offset"]): (key, value)
                   for o, (key, value, _) in zip(offsets, sent, strict=True)}


async def test_produce_json_to_a_topic_and_consume_it_back(bclient: KafkaClient, http: httpx.AsyncClient,
                                                           topic_name: str) -> None:
    """API reference "POST /topics/(string:topic_name)", example JSON request: keys and values are any
    JSON, embedded as is; a json-format consumer gets the same JSON back."""
    t = topic_name
    await bclient.create_topics({t: 2})
    sent: list[tuple[Any, Any, int | None]] = [
        ("somekey", {"foo": "bar"}, None), (None, ["foo", "bar"], 1), (None, 53.5, None),
        ({"id": 7}, {"nested": {"a": [1, 2, {"b": None}], "s": "é ✓"}, "t": True}, 0), ("k", "just a string", 1),
        (None, 0, None), (None, False, 0)]
    records = [{"value": value, **({"key": key} if key is not None else {}),
                **({"partition": part} if part is not None else {})} for key, value, part in sent]
    r = await http.post(f"/topics/{t}", json={"records": records}, headers={"Content-Type": JSN, "Accept": V2})
    offsets = check_produce_response(r, len(sent))
    for o, (_, _, part) in zip(offsets, sent, strict=True):
        if part is not None:
            assert o["partition"] == part
    got = await read_back(http, f"g-{t}", t, [0, 1], "json", len(sent))
    assert got == {(o["partition"], o["offset"]): (key, value)
                   for o, (key, value, _) in zip(offsets, sent, strict=True)}


async def test_produce_to_a_partition(bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    """API reference "POST /topics/(string:topic_name)/partitions/(int:partition_id)": every offset is in
    that partition; binary and json requests; read back exactly."""
    t = topic_name
    await bclient.create_topics({t: 2})
    r = await http.post(f"/topics/{t}/partitions/1", headers={"Content-Type": BIN, "Accept": V2}, json={
        "records": [{"key": b64(b"key"), "value": b64(b"confluent")}, {"value": b64(b"kafka")}]})
    first = check_produce_response(r, 2)
    r = await http.post(f"/topics/{t}/partitions/1", headers={"Content-Type": JSN, "Accept": V2}, json={
        "records": [{"key": "somekey", "value": {"foo": "bar"}}, {"value": 53.5}]})
    second = check_produce_response(r, 2)
    assert [(o["partition"], o["offset"]) for o in first + second] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    got = await read_back(http, f"g-{t}", t, [1], "binary", 4)
    assert [got[(1, i)] for i in range(2)] == [(b64(b"key"), b64(b"confluent")), (None, b64(b"kafka"))]
    # the json records as bytes: JSON text of the same values (serialisation spacing is the producer's)
    k2, v2 = got[(1, 2)]
    assert json.loads(base64.b64decode(k2)) == "somekey" and json.loads(base64.b64decode(v2)) == {"foo": "bar"}
    assert got[(1, 3)][0] is None and json.loads(base64.b64decode(got[(1, 3)][1])) == 53.5
    assert ok(await http.get(f"/topics/{t}/partitions/0/offsets"))["end_offset"] == 0


async def test_produce_to_an_unknown_topic_or_partition_is_404(bclient: KafkaClient, http: httpx.AsyncClient,
                                                               topic_name: str) -> None:
    """API reference "POST /topics/..." and ".../partitions/(int)": 404 / 40401 topic not found,
    404 / 40402 partition not found."""
    t = topic_name
    await bclient.create_topics({t: 2})
    body = {"records": [{"value": b64(b"x")}]}
    hdrs = {"Content-Type": BIN, "Accept": V2}
    err(await http.post(f"/topics/{t}/partitions/2", json=body, headers=hdrs), 404, 40402)
    err(await http.post(f"/topics/{t}-missing/partitions/0", json=body, headers=hdrs), 404, 40401)
    err(await http.post(f"/topics/{t}-missing", json=body, headers=hdrs), 404, 40401)


# -- create-consumer properties ---------------------------------------------------------------------------
async def test_kafka_consumer_properties_are_accepted_and_typos_are_42204(
        broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    """API reference "POST /consumers/...": 422 / 42204 for an invalid consumer configuration. Bodies as
    clients of other proxies send them (Kafka consumer properties, values as strings) create a working
    instance; a key that is no consumer property at all (a typo) is refused and reserves no name."""
    t = topic_name
    await bclient.create_topics({t: 1})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, b"props", 0)])
    group = f"g-{t}"
    props = {"fetch.max.wait.ms": "100", "max.poll.records": "10", "session.timeout.ms": "2000",
             "heartbeat.interval.ms": "500", "max.poll.interval.ms": "300000",
             "consumer.request.max.bytes": "1000000", "topic.metadata.refresh.interval.ms": "30000",
             "enable.auto.commit": "false", "auto.commit.interval.ms": "5000"}
    out = await create(http, group, {"name": "props", "format": "binary", "auto.offset.reset": "earliest", **props})
    inst = f"/consumers/{group}/instances/{out['instance_id']}"
    ok(await http.post(f"{inst}/subscription", json={"topics": [t]}, headers=H), 204)
    recs = await poll(http, f"{inst}/records", 1)
    assert base64.b64decode(recs[0]["value"]) == b"props"
    ok(await http.delete(inst, headers=H), 204)
    for key, value in props.items():  # each one alone, as JSON numbers/booleans where they are such
        typed: Any = value == "true" if value in ("true", "false") else int(value)
        out = await create(http, f"{group}-{key}", {key: typed})
        ok(await http.delete(f"/consumers/{group}-{key}/instances/{out['instance_id']}", headers=H), 204)

    r = await http.post(f"/consumers/{group}", json={"name": "typo", "auto.ofset.reset": "earliest"}, headers=H)
    err(r, 422, 42204)
    assert "auto.ofset.reset" in r.json()["message"]
    assert (await create(http, group, {"name": "typo"}))["instance_id"] == "typo"
    ok(await http.delete(f"/consumers/{group}/instances/typo", headers=H), 204)


# -- the quick start, end to end ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["binary", "json"])
async def test_quick_start_flow(bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str, fmt: str) -> None:
    """Quick start "Produce and Consume Binary/JSON Messages": produce over HTTP, create a named consumer,
    subscribe, GET records until everything arrived (clients loop: a first GET may be [] while the group
    forms), commit (API reference "POST .../offsets", with offsets and with an empty body: 200 []), read the
    committed offsets, DELETE (204), after which the instance is gone (404 / 40403)."""
    t = topic_name
    await bclient.create_topics({t: 1})
    media = BIN if fmt == "binary" else JSN
    if fmt == "binary":
        sent = [(None, b64(b"Kafka")), (b64(b"k1"), b64(b"second")), (b64(b"k2"), b64(b"\x00\xff binary"))]
    else:
        sent = [(None, {"foo": "bar"}), ("k1", [1, "two", None]), ("k2", {"n": 3.25})]
    records = [{"value": v, **({"key": k} if k is not None else {})} for k, v in sent]
    offsets = check_produce_response(
        await http.post(f"/topics/{t}", json={"records": records}, headers={"Content-Type": media, "Accept": V2}),
        len(sent))
    assert [o["partition"] for o in offsets] == [0, 0, 0]

    group = f"my_{fmt}_consumer-{t}"
    out = await create(http, group, {"name": "my_consumer_instance", "format": fmt, "auto.offset.reset": "earliest"})
    assert out["instance_id"] == "my_consumer_instance"
    inst = f"/consumers/{group}/instances/my_consumer_instance"
    ok(await http.post(f"{inst}/subscription", json={"topics": [t]}, headers=H), 204)
    recs = await poll(http, f"{inst}/records", len(sent), accept=media)
    assert len(recs) == len(sent)
    for rec in recs:
        assert {"topic", "key", "value", "partition", "offset"} <= set(rec), rec
    assert [(r["topic"], r["partition"], r["offset"], r["key"], r["value"]) for r in recs] == [
        (t, o["partition"], o["offset"], k, v) for o, (k, v) in zip(offsets, sent, strict=True)]

    last = recs[-1]["offset"]
    r = await http.post(f"{inst}/offsets", json={"offsets": [{**tp(t, 0), "offset": last}]}, headers=H)
    assert ok(r) == [] and r.headers["content-type"] == V2  # Confluent: 200, an empty list
    query = {"partitions": [tp(t, 0)]}
    expected = {"offsets": [{**tp(t, 0), "offset": last + 1, "metadata": ""}]}
    assert ok(await http.request("GET", f"{inst}/offsets", json=query, headers=H)) == expected
    assert ok(await http.post(f"{inst}/offsets", headers=H)) == []  # empty body: commit everything fetched
    assert ok(await http.request("GET", f"{inst}/offsets", json=query, headers=H)) == expected

    ok(await http.delete(inst, headers=H), 204)
    err(await http.get(f"{inst}/records", headers={"Accept": media}), 404, 40403)
    err(await http.delete(inst, headers=H), 404, 40403)
