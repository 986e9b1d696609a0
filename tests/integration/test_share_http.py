"""Share groups (KIP-932) over HTTP through a real gateway process against Apache Kafka 4.4 (Tansu has no share
groups: a clear 409/40912). Every record produced is counted: delivered to exactly one worker at a time and
accepted once; released ones come back with delivery_count + 1, rejected ones never; an acknowledgement of a
record the instance does not hold is reported not applied."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer
from confluent_kafka.admin import AdminClient, NewTopic

from service.embedded.kafka import EmbeddedKafka
from tests.conftest import REPO
from tests.fakes.registry.server import TestRegistry
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_readme import FENCE, HTTP_LINE, curl_wrapper, expected_outputs, section

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/vnd.kafka.v2+json"}
EARLIEST = {"share.auto.offset.reset": "earliest"}


@pytest.fixture(scope="module")
def gw(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("share-gw") / "gw.log"
    with TestRegistry() as registry, GatewayProcess(
            kafka.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": registry.url}, log_file=log) as g:
        yield g
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, f"the gateway logged an unexpected exception:\n{text[-4000:]}"


def new_topic(bootstrap: str, partitions: int) -> str:
    topic = f"share-http-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    return topic


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=i % partitions)
    assert p.flush(15) == 0


async def create(http: httpx.AsyncClient, group: str, name: str, topic: str, **body: Any) -> str:
    r = await http.post(f"/share-groups/{group}", json={"name": name, "configs": EARLIEST, **body}, headers=JSON)
    assert r.status_code == 200, r.text
    base = r.json()["base_uri"]
    assert base.endswith(f"/share-groups/{group}/instances/{name}")
    path = f"/share-groups/{group}/instances/{name}"
    r = await http.post(f"{path}/subscription", json={"topics": [topic]}, headers=JSON)
    assert r.status_code == 204, r.text
    return path


async def poll(http: httpx.AsyncClient, path: str, max_records: int = 500, timeout: int = 500) -> list[dict[str, Any]]:
    r = await http.get(f"{path}/records", params={"max_records": max_records, "timeout": timeout})
    assert r.status_code == 200, r.text
    return r.json()


async def ack(http: httpx.AsyncClient, path: str, acks: list[dict[str, Any]],
              wait: bool = True) -> list[dict[str, Any]]:
    r = await http.post(f"{path}/acknowledgements", json={"acknowledgements": acks, "wait": wait}, headers=JSON)
    assert r.status_code == 200, r.text
    return r.json()["acknowledgements"]


async def cluster_id(http: httpx.AsyncClient) -> str:
    r = await http.get("/v3/clusters")
    return r.json()["data"][0]["cluster_id"]


async def test_eight_workers_two_partitions_each_record_once(kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 2)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        paths = [await create(http, group, f"w{i}", topic) for i in range(8)]
        cid = await cluster_id(http)
        # every worker is a member with an assignment (the share assignor gives partitions to several members)
        deadline = time.monotonic() + 20
        while True:
            r = await http.get(f"/v3/clusters/{cid}/share-groups/{group}")
            assert r.status_code == 200, r.text
            members = r.json()["members"]
            if len(members) == 8 and all(m["assignment"].get(topic) for m in members):
                break
            assert time.monotonic() < deadline, members
            await asyncio.sleep(0.1)
        assert r.json()["state"] == "Stable"
        groups = (await http.get(f"/v3/clusters/{cid}/share-groups")).json()["data"]
        assert group in {g["share_group_id"] for g in groups}

        n = 200
        await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 2)
        held: set[tuple[int, int]] = set()  # records some worker holds right now
        delivered: list[tuple[int, int, int]] = []  # (worker, partition, offset)

        async def worker(i: int) -> None:
            while len(delivered) < n:
                got = await poll(http, paths[i], max_records=5, timeout=300)
                for rec in got:
                    key = (rec["partition"], rec["offset"])
                    assert key not in held, f"{key} held by two workers at once"
                    held.add(key)
                    delivered.append((i, *key))
                    assert rec["delivery_count"] == 1 and rec["lock_expires_at"] > time.time() * 1000
                    assert rec["topic"] == topic and rec["value"] and rec["key"]
                if got:
                    answers = await ack(http, paths[i], [{"topic": topic, "partition": rec["partition"],
                                                          "offset": rec["offset"]} for rec in got])
                    assert [a["applied"] for a in answers] == [True] * len(got), answers
                    for rec in got:
                        held.discard((rec["partition"], rec["offset"]))

        await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(8))), 40)
        counts = Counter((p, o) for _, p, o in delivered)
        assert len(counts) == n and set(counts.values()) == {1}, "each record delivered once"
        by_worker = Counter(w for w, _, _ in delivered)
        assert len(by_worker) >= 4, by_worker  # spread over the workers (8 in practice; no timing assumption)
        # all accepted: nothing comes back; lag 0 on both partitions
        assert not any(await asyncio.gather(*(poll(http, p, timeout=300) for p in paths)))
        r = await http.get(f"/v3/clusters/{cid}/share-groups/{group}/offsets")
        assert {(o["partition_id"], o["lag"]) for o in r.json()["data"]} == {(0, 0), (1, 0)}
        for p in paths:
            assert (await http.delete(p)).status_code == 204
        r = await http.get(f"{paths[0]}/subscription")
        assert r.status_code == 404 and r.json()["error_code"] == 40410


async def test_release_reject_renew_not_held_and_admin(kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(produce, kafka.bootstrap, topic, 6, 1)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        path = await create(http, group, "solo", topic, format="json")
        got: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + 20
        while len(got) < 6:
            assert time.monotonic() < deadline, got
            got.update({r["offset"]: r for r in await poll(http, path)})
        assert {r["delivery_count"] for r in got.values()} == {1}
        assert got[0]["value"] is None and got[0]["value_base64"]  # json format: "v0" is not JSON
        answers = await ack(http, path, [
            {"topic": topic, "partition": 0, "offset": 0, "type": "release"},
            {"topic": topic, "partition": 0, "offset": 1, "type": "reject"},
            {"topic": topic, "partition": 0, "first_offset": 2, "last_offset": 3, "type": "accept"},
            {"topic": topic, "partition": 0, "offset": 4, "type": "renew"},
        ])
        assert [(a["offset"], a["type"], a["applied"]) for a in answers] == [
            (0, "release", True), (1, "reject", True), (2, "accept", True), (3, "accept", True), (4, "renew", True)]
        assert answers[4]["lock_expires_at"] >= got[4]["lock_expires_at"]
        # not held: settled already, or never delivered here; reported, never sent
        refused = await ack(http, path, [{"topic": topic, "partition": 0, "offset": 1},
                                         {"topic": topic, "partition": 0, "offset": 999}])
        assert [(a["applied"], a["error"]) for a in refused] == [(False, "NOT_HELD")] * 2
        # the released record comes back, one delivery later; the rejected one never
        back: list[dict[str, Any]] = []
        while not back:
            assert time.monotonic() < deadline + 10
            back = await poll(http, path)
        assert [(r["offset"], r["delivery_count"]) for r in back] == [(0, 2)]
        # the renewed record is still ours: accept it, with 0 and 5, without waiting (the outcomes come later)
        quick = await ack(http, path, [{"topic": topic, "partition": 0, "offset": o} for o in (0, 4, 5)], wait=False)
        assert quick == []  # none refused locally
        outcomes: list[dict[str, Any]] = []
        while len(outcomes) < 3:  # sent alone within ~100 ms, the client being idle
            assert time.monotonic() < deadline + 15, outcomes
            r = await http.get(f"{path}/acknowledgements")
            outcomes += r.json()["acknowledgements"]
            await asyncio.sleep(0.05)
        assert sorted((o["offset"], o["applied"]) for o in outcomes) == [(0, True), (4, True), (5, True)]
        assert await poll(http, path, timeout=300) == []

        cid = await cluster_id(http)
        offsets = f"/v3/clusters/{cid}/share-groups/{group}/offsets"
        r = await http.post(f"{offsets}/reset", json={"to": "earliest"})
        assert r.status_code == 409 and r.json()["error_code"] == 40911, r.text
        metrics = (await http.get("/metrics")).text
        for line in ('kcg_share_acknowledgements_total{outcome="applied",tenant="default",type="reject"}',
                     'kcg_share_acknowledgements_total{outcome="refused",tenant="default",type="accept"}',
                     'kcg_share_records_redelivered_total{tenant="default"}'):
            assert line in metrics
        assert (await http.delete(path)).status_code == 204
        # empty now: reset to earliest, then delete the offsets
        r = await http.post(f"{offsets}/reset", json={"to": "earliest"})
        assert r.status_code == 200, r.text
        assert [(o["partition_id"], o["start_offset"]) for o in r.json()["data"]] == [(0, 0)]
        r = await http.post(f"{offsets}/reset", json={"to": "timestamp", "timestamp": 0, "topics": [topic]})
        assert r.status_code == 200 and [o["start_offset"] for o in r.json()["data"]] == [0], r.text
        assert (await http.delete(offsets)).status_code == 204
        assert (await http.get(offsets)).json()["data"] == []
        r = await http.get(f"/v3/clusters/{cid}/share-groups/sg-never-{uuid.uuid4().hex[:8]}")
        assert r.status_code == 404 and r.json()["error_code"] == 404, r.text


async def test_implicit_mode_accepts_on_the_next_poll(kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(produce, kafka.bootstrap, topic, 4, 1)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        path = await create(http, group, "imp", topic, **{"acknowledgement.mode": "implicit"})
        seen: list[int] = []
        deadline = time.monotonic() + 20
        while len(seen) < 4:
            assert time.monotonic() < deadline, seen
            seen += [r["offset"] for r in await poll(http, path, max_records=2)]
        assert sorted(seen) == [0, 1, 2, 3]
        await poll(http, path, timeout=300)  # accepts the last batch
        outcomes: list[dict[str, Any]] = []
        while len(outcomes) < 4:
            assert time.monotonic() < deadline + 5, outcomes
            outcomes += (await http.get(f"{path}/acknowledgements")).json()["acknowledgements"]
            if len(outcomes) < 4:
                await poll(http, path, timeout=100)
        assert sorted((o["offset"], o["type"], o["applied"]) for o in outcomes) == [
            (o, "accept", True) for o in range(4)]
        assert (await http.delete(path)).status_code == 204
        # nothing was left to redeliver to a new member
        other = await create(http, group, "after", topic)
        assert await poll(http, other, timeout=1000) == []
        assert (await http.delete(other)).status_code == 204


async def test_an_expired_lock_is_reported_and_the_record_redelivered(kafka: EmbeddedKafka,
                                                                      gw: GatewayProcess) -> None:
    """With the group's lock at 1 s (the broker's minimum here), a record left alone past it is refused as
    LOCK_EXPIRED (never sent as if still held) and comes back with delivery_count 2."""
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(produce, kafka.bootstrap, topic, 1, 1)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        path = await create(http, group, "slow", topic,
                            configs={**EARLIEST, "share.record.lock.duration.ms": "1000"})
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while not got:
            assert time.monotonic() < deadline
            got = await poll(http, path)
        assert [(r["offset"], r["delivery_count"]) for r in got] == [(0, 1)]
        # the lock deadline is a wall-clock time: wait until it passed (no event to await for a lock running out)
        await asyncio.sleep(max(0.0, got[0]["lock_expires_at"] / 1000 - time.time()) + 0.2)
        [late] = await ack(http, path, [{"topic": topic, "partition": 0, "offset": 0}])
        assert (late["applied"], late["error"]) == (False, "LOCK_EXPIRED")
        back: list[dict[str, Any]] = []
        while not back:
            assert time.monotonic() < deadline + 10
            back = await poll(http, path)
        assert [(r["offset"], r["delivery_count"]) for r in back] == [(0, 2)]
        [done] = await ack(http, path, [{"topic": topic, "partition": 0, "offset": 0}])
        assert done["applied"] is True
        assert (await http.delete(path)).status_code == 204


async def test_ndjson_stream_with_acknowledgements_alongside(kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    """An ndjson stream (explicit mode): one record per line with its delivery count, acknowledged through POST
    .../acknowledgements on another connection while the stream runs (without waiting: they ride on the stream's
    next ShareFetch; their outcomes are read back); every record accepted once."""
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 2)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    n = 60
    await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 2)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http, \
            httpx.AsyncClient(base_url=gw.url, timeout=30) as acks:
        path = await create(http, group, "nd", topic, format="json")
        seen: Counter[tuple[int, int]] = Counter()
        applied = 0
        async with http.stream("GET", f"{path}/records", params={"max_records": 7},
                               headers={"accept": "application/x-ndjson"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
            async for line in r.aiter_lines():
                rec = json.loads(line)
                assert rec["topic"] == topic and rec["delivery_count"] == 1 and rec["value"] is None, rec
                seen[(rec["partition"], rec["offset"])] += 1
                refused = await ack(acks, path, [{"topic": topic, "partition": rec["partition"],
                                                  "offset": rec["offset"]}], wait=False)
                assert refused == []
                if len(seen) == n:
                    break
            deadline = time.monotonic() + 20
            while applied < n:  # the outcomes, while the stream is still open
                assert time.monotonic() < deadline, applied
                outcomes = (await acks.get(f"{path}/acknowledgements")).json()["acknowledgements"]
                assert all(o["applied"] for o in outcomes), outcomes
                applied += len(outcomes)
                await asyncio.sleep(0.05)
        assert len(seen) == n and set(seen.values()) == {1} and applied == n
        assert await poll(http, path, timeout=300) == []
        assert (await http.delete(path)).status_code == 204


async def test_sse_stream_implicit_mode(kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    """An SSE stream in implicit mode: one data event per record; each chunk is accepted when the stream acquires
    the next one, so reading everything leaves nothing to redeliver (the accept outcomes are counted)."""
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    n = 25
    await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 1)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        path = await create(http, group, "sse", topic, **{"acknowledgement.mode": "implicit"})
        seen: list[int] = []
        async with http.stream("GET", f"{path}/records", params={"max_records": 4},
                               headers={"accept": "text/event-stream"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    rec = json.loads(line[6:])
                    assert rec["delivery_count"] == 1 and rec["lock_expires_at"] > 0
                    seen.append(rec["offset"])
                    if len(seen) == n:
                        break
        assert sorted(seen) == list(range(n))
        accepted: Counter[int] = Counter()
        deadline = time.monotonic() + 20
        while sum(accepted.values()) < n:  # the last chunk: accepted by the stream's next acquisition
            assert time.monotonic() < deadline, accepted
            for o in (await http.get(f"{path}/acknowledgements")).json()["acknowledgements"]:
                assert o["type"] == "accept" and o["applied"], o
                accepted[o["offset"]] += 1
            await asyncio.sleep(0.05)
        assert sorted(accepted) == list(range(n)) and set(accepted.values()) == {1}
        assert await poll(http, path, timeout=300) == []
        assert (await http.delete(path)).status_code == 204


async def test_a_stream_closed_early_loses_nothing(kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    """A client reads one record of an ndjson stream (explicit mode, 1 s lock), accepts it and leaves: what the
    stream acquired and did not write is released at once, what it wrote and nobody read comes back after the
    lock; a plain worker then gets every other record, each accepted once."""
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    n = 30
    await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 1)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        path = await create(http, group, "early", topic,
                            configs={**EARLIEST, "share.record.lock.duration.ms": "1000"})
        async with http.stream("GET", f"{path}/records", params={"max_records": 3},
                               headers={"accept": "application/x-ndjson"}) as r:
            first = json.loads(await r.aiter_lines().__anext__())
        [a] = await ack(http, path, [{"topic": topic, "partition": 0, "offset": first["offset"]}])
        assert a["applied"], a
        accepted = Counter([first["offset"]])
        deadline = time.monotonic() + 30
        while len(accepted) < n:
            assert time.monotonic() < deadline, sorted(accepted)
            got = await poll(http, path, max_records=10)
            for rec in got:
                assert rec["offset"] not in accepted, rec
            if got:
                answers = await ack(http, path, [{"topic": topic, "partition": 0, "offset": rec["offset"]}
                                                 for rec in got])
                assert all(x["applied"] for x in answers), answers
                accepted.update(rec["offset"] for rec in got)
        assert sorted(accepted) == list(range(n)) and set(accepted.values()) == {1}
        assert (await http.delete(path)).status_code == 204


async def test_avro_records_decoded(kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    """A share consumer instance of format avro answers the records decoded with the writer's schema, with its
    delivery count and lock deadline beside them."""
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    schema = '{"type":"record","name":"Job","fields":[{"name":"id","type":"int"}]}'
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        r = await http.post(f"/topics/{topic}", headers={"content-type": "application/vnd.kafka.avro.v2+json"},
                            json={"value_schema": schema, "records": [{"value": {"id": 1}}, {"value": {"id": 2}}]})
        assert r.status_code == 200, r.text
        path = await create(http, group, "avro", topic, format="avro")
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while len(got) < 2:
            assert time.monotonic() < deadline, got
            got += await poll(http, path)
        assert [(r["offset"], r["value"], r["delivery_count"]) for r in got] == [(0, {"id": 1}, 1), (1, {"id": 2}, 1)]
        assert all(r["lock_expires_at"] > time.time() * 1000 for r in got)
        answers = await ack(http, path, [{"topic": topic, "partition": 0, "first_offset": 0, "last_offset": 1}])
        assert [a["applied"] for a in answers] == [True, True]
        assert (await http.delete(path)).status_code == 204


KEY_A, KEY_B = "share-tenant-a-key-0001", "share-tenant-b-key-0002"


def _sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


async def test_tenants(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """Share groups and topics follow the tenant's patterns as consumer groups do: no credentials 401, another
    tenant's group or topic 403, the v3 list shows only the tenant's share groups."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(f"""
version: 1
tenants:
  - id: a
    api_keys: ["{_sha(KEY_A)}"]
    topics: ["sa-*"]
    groups: ["sga-*"]
  - id: b
    api_keys: ["{_sha(KEY_B)}"]
    topics: ["sb-*"]
    groups: ["sgb-*"]
""")
    suffix = uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for t in (f"sa-{suffix}", f"sb-{suffix}"):
        admin.create_topics([NewTopic(t, 1, 1)])[t].result(15)
    a, b = {"Authorization": f"Bearer {KEY_A}", **JSON}, {"Authorization": f"Bearer {KEY_B}", **JSON}
    with GatewayProcess(kafka.bootstrap, env={"GATEWAY_TENANTS_FILE": str(tmp_path / "tenants.yaml")},
                        log_file=tmp_path / "gw.log") as g:
        async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
            r = await http.post(f"/share-groups/sga-{suffix}", json={"name": "w"}, headers=JSON)
            assert r.status_code == 401 and r.json()["error_code"] == 40101
            r = await http.post(f"/share-groups/sgb-{suffix}", json={"name": "w"}, headers=a)
            assert r.status_code == 403 and r.json()["error_code"] == 40301
            for key, group in ((a, f"sga-{suffix}"), (b, f"sgb-{suffix}")):
                r = await http.post(f"/share-groups/{group}", json={"name": "w"}, headers=key)
                assert r.status_code == 200, r.text
            path = f"/share-groups/sga-{suffix}/instances/w"
            r = await http.post(f"{path}/subscription", json={"topics": [f"sb-{suffix}"]}, headers=a)
            assert r.status_code == 403 and r.json()["error_code"] == 40301
            # b cannot see a's instance: it is not b's
            r = await http.get(f"{path}/subscription", headers=b)
            assert r.status_code == 404 and r.json()["error_code"] == 40410
            r = await http.post(f"{path}/subscription", json={"topics": [f"sa-{suffix}"]}, headers=a)
            assert r.status_code == 204, r.text
            cid = (await http.get("/v3/clusters", headers=a)).json()["data"][0]["cluster_id"]
            deadline = time.monotonic() + 20
            while True:  # the group exists once its member's first heartbeat was answered
                listed = {x["share_group_id"] for x in (await http.get(f"/v3/clusters/{cid}/share-groups",
                                                                       headers=a)).json()["data"]}
                if f"sga-{suffix}" in listed:
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            assert all(x.startswith("sga-") for x in listed), listed
            r = await http.get(f"/v3/clusters/{cid}/share-groups/sga-{suffix}", headers=b)
            assert r.status_code == 403 and r.json()["error_code"] == 40301
            for key, group in ((a, f"sga-{suffix}"), (b, f"sgb-{suffix}")):
                assert (await http.delete(f"/share-groups/{group}/instances/w", headers=key)).status_code == 204


def test_tansu_has_no_share_groups(tansu: Any, tmp_path: Path) -> None:
    with GatewayProcess(tansu.bootstrap, log_file=tmp_path / "gw.log") as g:
        r = httpx.post(f"{g.url}/share-groups/sg-tansu", json={"name": "x"}, headers=JSON)
        assert r.status_code == 409 and r.json()["error_code"] == 40912, r.text
        assert "share groups" in r.json()["message"]
        r = httpx.get(f"{g.url}/share-groups/sg-tansu/instances/x/records")
        assert r.status_code == 404 and r.json()["error_code"] == 40410


def test_the_guide_runs_verbatim(gw: GatewayProcess, tmp_path: Path) -> None:
    """docs/share-groups.md's "Try it" block, run with bash against the Kafka gateway (its BASE line naming
    the gateway's port): every request answers 2xx and every ``# → ...`` output it shows is printed."""
    blocks = FENCE.findall(section((REPO / "docs" / "share-groups.md").read_text(), "Try it"))
    assert len(blocks) == 1
    base = "BASE=http://127.0.0.1:8080"
    lines = [f"BASE={gw.url}" if line.strip() == base else line for line in blocks[0].splitlines()]
    assert f"BASE={gw.url}" in lines
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PATH"] = f"{curl_wrapper(tmp_path)}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(lines) + "\n"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    report = f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, report
    requests = HTTP_LINE.findall(done.stderr)
    assert len(requests) == 13 and all(s.startswith("2") for s, _, _ in requests), report
    for fragments in expected_outputs(blocks):
        for fragment in fragments:
            assert fragment in done.stdout, (fragment, report)
