"""Black-box HTTP tests: a real gateway process (uvicorn) over a real broker, driven with httpx. Every test on the
module's gateway runs twice, on Tansu and on Apache Kafka (the ``broker`` fixture)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.http_client import poll_until

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
JSN = "application/vnd.kafka.json.v2+json"
H = {"Content-Type": V2}


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, log_file=tmp_path_factory.mktemp(f"gw-{broker.name}") / "gateway.log") as g:
        yield g



def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 1,
            headers: list[tuple[str, bytes]] | None = None) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i, v in enumerate(values):
        p.produce(topic, key=b"k%d" % i, value=v, partition=i % partitions, headers=headers)
    assert p.flush(30) == 0


async def create(http: httpx.AsyncClient, group: str, **cfg: object) -> str:
    r = await http.post(f"/consumers/{group}", json=cfg, headers=H)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(V2)
    body = r.json()
    assert body["base_uri"].endswith(f"/consumers/{group}/instances/{body['instance_id']}")
    return str(body["base_uri"]).split("/consumers/", 1)[1].join(["/consumers/", ""])


async def commit_all(http: httpx.AsyncClient, base: str, timeout: float = 20.0) -> None:
    """Commit everything consumed. A commit while the group rebalances is refused (409/40903, "retry after
    the next poll"), as a Kafka client's would be: poll, then retry, as the error says."""
    deadline = time.monotonic() + timeout
    while True:
        r = await http.post(f"{base}/offsets", headers=H)
        if r.status_code == 200:
            assert r.json() == [], r.text  # Confluent's answer
            return
        assert r.status_code == 409 and r.json()["error_code"] == 40903, r.text
        assert time.monotonic() < deadline, r.text
        r = await http.get(f"{base}/records", params={"timeout": 200}, headers={"Accept": BIN})
        assert r.status_code == 200 and r.json() == [], r.text  # everything was consumed already


async def test_confluent_binary_flow(broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient,
                                     topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"value-%d" % i for i in range(10)], 2,
                            [("h", b"x")])
    group = f"g-{topic_name}"
    base = await create(http, group, name="c1", format="binary", **{"auto.offset.reset": "earliest",
                                                                  "auto.commit.enable": "false"})
    assert base.endswith("/instances/c1")
    r = await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    assert r.status_code == 204, r.text
    r = await http.get(f"{base}/subscription")
    assert r.json() == {"topics": [topic_name]}
    recs = await poll_until(http, base, 10, timeout=20)
    assert sorted(base64.b64decode(r["value"]) for r in recs) == sorted(b"value-%d" % i for i in range(10))  # type: ignore[arg-type]
    one = recs[0]
    assert set(one) == {"topic", "key", "value", "partition", "offset", "timestamp", "headers"}
    assert one["headers"] == [{"key": "h", "value": base64.b64encode(b"x").decode()}]
    assert isinstance(one["timestamp"], int) and one["timestamp"] > 0
    # commit what we got, Confluent style (offset + 1 is stored)
    last = {}
    for rec in recs:
        last[rec["partition"]] = max(last.get(rec["partition"], -1), rec["offset"])  # type: ignore[call-overload]
    offsets = [{"topic": topic_name, "partition": p, "offset": o} for p, o in last.items()]
    r = await http.post(f"{base}/offsets", json={"offsets": offsets}, headers=H)
    assert r.status_code == 200 and r.json() == [], r.text
    assert r.headers["content-type"] == "application/vnd.kafka.v2+json"
    r = await http.request("GET", f"{base}/offsets", json={"partitions": [
        {"topic": topic_name, "partition": p} for p in last]}, headers=H)
    assert r.status_code == 200, r.text
    got = {o["partition"]: o["offset"] for o in r.json()["offsets"]}
    assert got == {p: o + 1 for p, o in last.items()}
    # `{"offsets": null}` is an empty body: commit everything consumed (was a 500)
    r = await http.post(f"{base}/offsets", json={"offsets": None}, headers=H)
    assert r.status_code == 200 and r.json() == [], r.text
    r = await http.get(f"{base}/assignments")
    assert sorted(p["partition"] for p in r.json()["partitions"]) == [0, 1]
    r = await http.delete(base)
    assert r.status_code == 204
    r = await http.get(f"{base}/records", headers={"Accept": BIN})
    assert r.status_code == 404 and r.json()["error_code"] == 40403


async def test_json_format_and_manual_assignment(broker: AnyBroker, bclient: KafkaClient,
                                                 http: httpx.AsyncClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    vals = [json.dumps({"n": i, "s": "é"}).encode() for i in range(5)] + [b"not json"]
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, vals)
    base = await create(http, f"g-{topic_name}", format="json")
    r = await http.post(f"{base}/assignments", json={"partitions": [{"topic": topic_name, "partition": 0}]}, headers=H)
    assert r.status_code == 204, r.text
    r = await http.post(f"{base}/positions/beginning", json={"partitions": [{"topic": topic_name, "partition": 0}]},
                        headers=H)
    assert r.status_code == 204, r.text
    recs = await poll_until(http, base, 6, accept=JSN, timeout=20)
    assert [r["value"] for r in recs[:5]] == [{"n": i, "s": "é"} for i in range(5)]
    assert recs[0]["key"] == "k0" or recs[0]["key"] is None or recs[0].get("key_error")
    bad = recs[5]
    assert bad["value"] is None and bad["value_error"] == "not valid JSON"
    assert base64.b64decode(bad["value_base64"]) == b"not json"  # type: ignore[arg-type]
    # seek to an offset
    r = await http.post(f"{base}/positions", json={"offsets": [{"topic": topic_name, "partition": 0, "offset": 3}]},
                        headers=H)
    assert r.status_code == 204
    recs = await poll_until(http, base, 1, accept=JSN, timeout=20)
    assert recs[0]["offset"] == 3
    # wrong Accept for a json instance
    r = await http.get(f"{base}/records", headers={"Accept": BIN})
    assert r.status_code == 406 and r.json()["error_code"] == 40601
    await http.delete(base)


async def test_three_instances_share_a_group_and_take_over(broker: AnyBroker, bclient: KafkaClient,
                                                           http: httpx.AsyncClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 6})
    group = f"g-{topic_name}"
    bases = [await create(http, group, **{"auto.offset.reset": "earliest"}) for _ in range(3)]
    for b in bases:
        r = await http.post(f"{b}/subscription", json={"topics": [topic_name]}, headers=H)
        assert r.status_code == 204
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"m%d" % i for i in range(300)], 6)
    seen: list[tuple[int, int]] = []

    async def loop(b: str, stop: float) -> None:
        while time.monotonic() < stop and len(seen) < 300:
            r = await http.get(f"{b}/records", params={"timeout": 500}, headers={"Accept": BIN})
            assert r.status_code == 200, r.text
            seen.extend((x["partition"], x["offset"]) for x in r.json())

    await asyncio.gather(*(loop(b, time.monotonic() + 30) for b in bases))
    assert len(seen) == 300 and len(set(seen)) == 300
    for b in bases:  # commit what was consumed
        await commit_all(http, b)
    # one instance leaves: the other two own all six partitions and consume new records
    assert (await http.delete(bases[0])).status_code == 204
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"n%d" % i for i in range(60)], 6)
    after: list[tuple[int, int]] = []

    async def loop2(b: str, stop: float) -> None:
        while time.monotonic() < stop and len(after) < 60:
            r = await http.get(f"{b}/records", params={"timeout": 500}, headers={"Accept": BIN})
            after.extend((x["partition"], x["offset"]) for x in r.json())

    await asyncio.gather(*(loop2(b, time.monotonic() + 30) for b in bases[1:]))
    assert len(set(after)) == 60 and {p for p, _ in after} == set(range(6))
    owned = []
    for b in bases[1:]:
        owned += [p["partition"] for p in (await http.get(f"{b}/assignments")).json()["partitions"]]
        await http.delete(b)
    assert sorted(owned) == list(range(6))


async def test_long_poll_wakes_up_when_data_arrives(broker: AnyBroker, bclient: KafkaClient,
                                                    http: httpx.AsyncClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    base = await create(http, f"g-{topic_name}", **{"auto.offset.reset": "latest"})
    await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    # the first poll waits for the assignment instead of returning an empty list at once
    r = await http.get(f"{base}/records", params={"timeout": 8000}, headers={"Accept": BIN})
    assert r.status_code == 200
    latencies = []
    for i in range(5):
        poll = asyncio.create_task(http.get(f"{base}/records", params={"timeout": 10000}, headers={"Accept": BIN}))
        await asyncio.sleep(0.3)  # the poll is parked in the gateway (nothing to await from outside)
        assert not poll.done()
        sent = time.monotonic()
        await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"wake-%d" % i])
        r = await poll
        latencies.append(time.monotonic() - sent)
        assert [base64.b64decode(x["value"]) for x in r.json()] == [b"wake-%d" % i]
    latencies.sort()
    print(f"long-poll wake-up latency (produce -> HTTP response): median {latencies[2] * 1000:.1f} ms, "
          f"max {latencies[-1] * 1000:.1f} ms")
    assert latencies[-1] < 2.0  # not the 10 s timeout
    await http.delete(base)


async def test_first_poll_after_subscribe_returns_data(broker: AnyBroker, bclient: KafkaClient,
                                                       http: httpx.AsyncClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"ready"])
    base = await create(http, f"g-{topic_name}", **{"auto.offset.reset": "earliest"})
    await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    r = await http.get(f"{base}/records", params={"timeout": 15000}, headers={"Accept": BIN})
    assert [base64.b64decode(x["value"]) for x in r.json()] == [b"ready"]
    await http.delete(base)


async def test_max_bytes_still_returns_one_record(broker: AnyBroker, bclient: KafkaClient,
                                                  http: httpx.AsyncClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"x" * 5000, b"y" * 10])
    base = await create(http, f"g-{topic_name}", **{"auto.offset.reset": "earliest"})
    await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    r = await http.get(f"{base}/records", params={"timeout": 15000, "max_bytes": 100}, headers={"Accept": BIN})
    recs = r.json()
    assert len(recs) == 1 and base64.b64decode(recs[0]["value"]) == b"x" * 5000
    r = await http.get(f"{base}/records", params={"timeout": 5000, "max_bytes": 100}, headers={"Accept": BIN})
    assert [base64.b64decode(x["value"]) for x in r.json()] == [b"y" * 10]
    await http.delete(base)


async def test_consumer_properties_from_other_proxies_are_applied(broker: AnyBroker, bclient: KafkaClient,
                                                                   http: httpx.AsyncClient, topic_name: str) -> None:
    """max.poll.records and consumer.request.max.bytes set the defaults of a records request; Kafka
    properties a client of another proxy sends are accepted; a query parameter still wins."""
    await bclient.create_topics({topic_name: 1})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"v%02d" % i for i in range(20)])
    group = f"g-{topic_name}"
    base = await create(http, group, name="props", **{
        "auto.offset.reset": "earliest", "max.poll.records": "3", "fetch.max.wait.ms": 100,
        "heartbeat.interval.ms": "500", "session.timeout.ms": "2000", "max.poll.interval.ms": 60000,
        "topic.metadata.refresh.interval.ms": "30000", "key.deserializer": "x.y.Z", "enable.auto.commit": "false"})
    await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    sizes = []
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < 9 and time.monotonic() < deadline:
        r = await http.get(f"{base}/records", params={"timeout": 2000}, headers={"Accept": BIN})
        assert r.status_code == 200, r.text
        if r.json():
            sizes.append(len(r.json()))
            got += [base64.b64decode(x["value"]) for x in r.json()]
    assert got[:9] == [b"v%02d" % i for i in range(9)] and max(sizes) == 3
    r = await http.get(f"{base}/records", params={"timeout": 2000, "max_records": 5}, headers={"Accept": BIN})
    assert [base64.b64decode(x["value"]) for x in r.json()] == [b"v%02d" % i for i in range(len(got), len(got) + 5)]
    await http.delete(base)
    # consumer.request.max.bytes: 3-byte values, a 7-byte budget → two records per request
    base = await create(http, group + "-b", **{"auto.offset.reset": "earliest", "consumer.request.max.bytes": 7})
    await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    r = await http.get(f"{base}/records", params={"timeout": 15000}, headers={"Accept": BIN})
    assert 1 <= len(r.json()) <= 2, r.json()
    await http.delete(base)


async def test_streaming_ndjson(broker: AnyBroker, bclient: KafkaClient, gw: GatewayProcess,
                                topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"s%d" % i for i in range(50)])
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        base = await create(http, f"g-{topic_name}", **{"auto.offset.reset": "earliest"})
        await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
        got: list[bytes] = []
        async with http.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("application/x-ndjson")
            async for line in resp.aiter_lines():
                if not line:
                    continue
                got.append(base64.b64decode(json.loads(line)["value"]))
                if len(got) == 50:
                    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"late"])
                if len(got) == 51:
                    break
        assert got == [b"s%d" % i for i in range(50)] + [b"late"]
        await http.delete(base)


async def test_streaming_sse(broker: AnyBroker, bclient: KafkaClient, gw: GatewayProcess,
                             topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [b"e%d" % i for i in range(3)])
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        base = await create(http, f"g-{topic_name}", **{"auto.offset.reset": "earliest"})
        await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
        events = []
        async with http.stream("GET", f"{base}/records", headers={"Accept": "text/event-stream"}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    events.append(base64.b64decode(json.loads(line[6:])["value"]))
                    if len(events) == 3:
                        break
        assert events == [b"e0", b"e1", b"e2"]
        await http.delete(base)


def produce_transactions(bootstrap: str, topic: str, txn_id: str, plan: list[tuple[str, list[bytes]]]) -> None:
    """confluent-kafka's transactional producer: one transaction per (``commit``|``abort``, values) of ``plan``, its
    values spread over two partitions; an aborted one is flushed first, so its batches are in the log."""
    p = CKProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 2})
    p.init_transactions(30)
    for outcome, values in plan:
        p.begin_transaction()
        for i, v in enumerate(values):
            p.produce(topic, value=v, partition=i % 2)
        assert p.flush(30) == 0
        if outcome == "commit":
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


async def test_read_committed_shows_committed_records_once_and_no_aborted_one(
        broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    """Committed and aborted transactions interleaved over two partitions (with their control batches): a
    read_committed instance gets every committed record once and no aborted one, a read_uncommitted instance gets
    both. On Tansu, read_committed shows the aborted records too (no aborted-transaction index: docs/brokers.md)."""
    await bclient.create_topics({topic_name: 2})
    committed = [b"c%d" % i for i in range(8)]
    aborted = [b"a%d" % i for i in range(4)]
    await asyncio.to_thread(produce_transactions, broker.bootstrap, topic_name, f"txn-{topic_name}",
                            [("commit", committed[:4]), ("abort", aborted), ("commit", committed[4:])])
    # the last committed transaction is after the aborted one on both partitions: once it is read, every aborted
    # record has been passed
    group = f"g-{topic_name}"
    results: dict[str, list[bytes]] = {}
    for level, want in (("read_committed", committed), ("read_uncommitted", committed + aborted)):
        base = await create(http, f"{group}-{level}", **{"auto.offset.reset": "earliest", "isolation.level": level})
        r = await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
        assert r.status_code == 204, r.text
        recs = await poll_until(http, base, len(want), timeout=20)
        # one more poll: nothing further arrives (a record shown late, or twice, would show here)
        r = await http.get(f"{base}/records", params={"timeout": 500}, headers={"Accept": BIN})
        recs += r.json()
        results[level] = [base64.b64decode(x["value"]) for x in recs]
        offsets = [(x["partition"], x["offset"]) for x in recs]
        assert len(offsets) == len(set(offsets)), "a record delivered twice"
        await http.delete(base)
    assert sorted(results["read_uncommitted"]) == sorted(committed + aborted)
    got = results["read_committed"]
    assert sorted(v for v in got if v.startswith(b"c")) == sorted(committed)
    if broker.name == "kafka":
        assert [v for v in got if v.startswith(b"a")] == []
    else:  # Tansu returns flushed aborted batches at read_committed (its Fetch has no AbortedTransactions)
        assert sorted(v for v in got if v.startswith(b"a")) == sorted(aborted)


# -- error paths ----------------------------------------------------------------------------------------------
async def test_error_paths(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    group = f"g-{topic_name}"

    async def expect(resp: httpx.Response, status: int, code: int) -> None:
        assert resp.status_code == status, resp.text
        body = resp.json()
        assert body["error_code"] == code and isinstance(body["message"], str) and body["message"]
        assert "Traceback" not in resp.text

    await expect(await http.post(f"/consumers/{group}", content=b"{not json", headers=H), 400, 40001)
    await expect(await http.post(f"/consumers/{group}", content=b"{}", headers={"Content-Type": "text/plain"}),
                 415, 41501)
    await expect(await http.post(f"/consumers/{group}", json={"bogus.key": "1"}, headers=H), 422, 42204)
    await expect(await http.post(f"/consumers/{group}", json={"auto.offset.reset": "sideways"}, headers=H),
                 422, 42206)
    await expect(await http.get(f"/consumers/{group}/instances/nope/records", headers={"Accept": BIN}), 404, 40403)
    await expect(await http.post(f"/consumers/{group}", content=b"x" * (2 * 1024 * 1024), headers=H), 413, 41301)
    await expect(await http.get("/no/such/endpoint"), 404, 40400)
    base = await create(http, group, name="dup")
    await expect(await http.post(f"/consumers/{group}", json={"name": "dup"}, headers=H), 409, 40902)
    await expect(await http.post(f"{base}/positions", json={"offsets": [
        {"topic": topic_name, "partition": 0, "offset": -5}]}, headers=H), 422, 42207)
    await expect(await http.post(f"{base}/positions", json={"offsets": [
        {"topic": topic_name, "partition": 0, "offset": 5}]}, headers=H), 409, 40903)  # not assigned
    await expect(await http.get(f"{base}/records", headers={"Accept": BIN}), 409, 40903)  # not subscribed
    await expect(await http.post(f"{base}/assignments", json={"partitions": [
        {"topic": "missing-topic-x", "partition": 0}]}, headers=H), 404, 40401)
    await expect(await http.post(f"{base}/assignments", json={"partitions": [
        {"topic": topic_name, "partition": 7}]}, headers=H), 404, 40402)
    r = await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    assert r.status_code == 204
    await expect(await http.post(f"{base}/assignments", json={"partitions": [
        {"topic": topic_name, "partition": 0}]}, headers=H), 409, 40903)
    await expect(await http.get(f"{base}/records", headers={"Accept": "text/html"}), 406, 40601)
    await http.delete(base)


async def test_expired_instance_has_a_distinct_error(tansu: EmbeddedBroker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = GatewayProcess(tansu.bootstrap, env={"GATEWAY_INSTANCE_IDLE_TIMEOUT_S": "0.5"},
                       log_file=tmp_path / "gw.log")
    g.start()
    try:
        async with httpx.AsyncClient(base_url=g.url, timeout=10) as http:
            base = await create(http, "g-expiry")
            assert (await http.get(f"{base}/subscription")).status_code == 200
            await asyncio.sleep(2.0)  # stay idle (any request would renew the instance) past the timeout
            r = await http.get(f"{base}/subscription")
            assert r.status_code == 410 and r.json()["error_code"] == 41001
            assert "expired" in r.json()["message"]
    finally:
        g.stop()


async def test_base_uri_follows_forwarded_headers(http: httpx.AsyncClient) -> None:
    r = await http.post("/consumers/g-fwd", json={"name": "fwd1"},
                        headers={**H, "X-Forwarded-Proto": "https", "X-Forwarded-Host": "gw.example.com",
                                 "X-Forwarded-Prefix": "/kafka"})
    assert r.json()["base_uri"] == "https://gw.example.com/kafka/consumers/g-fwd/instances/fwd1"
    r2 = await http.post("/consumers/g-fwd", json={"name": "fwd2"},
                         headers={**H, "Forwarded": 'for=1.2.3.4;proto=https;host="api.example.org"'})
    assert r2.json()["base_uri"] == "https://api.example.org/consumers/g-fwd/instances/fwd2"
    for name in ("fwd1", "fwd2"):
        assert (await http.delete(f"/consumers/g-fwd/instances/{name}")).status_code == 204
