"""/metrics of a real gateway process (over the real Tansu broker) after real consumption: every metric the
gateway promises is there, with tenant labels and values that match what the test did; no secret leaks."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import yaml
from confluent_kafka import Producer as CKProducer
from prometheus_client.parser import text_string_to_metric_families

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
H = {"Content-Type": V2}
TENANT = "team-m"
KEY = "kcg-metrics-key-Vb81q"  # API key of TENANT
SASL_TENANT = "team-sasl"
SASL_KEY = "kcg-sasl-key-0pLm3"  # API key of SASL_TENANT
ADMIN_TOKEN = "metrics-admin-token-8d2e"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SASL_PASSWORD = "sasl-Pa55word-4f9c"  # from a file named in the tenants file
IDLE_TIMEOUT_S = 4.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def sha256(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("metrics")
    (d / "sasl-password").write_text(SASL_PASSWORD + "\n")
    (d / "tenants.yaml").write_text(yaml.safe_dump({"tenants": [
        {"id": TENANT, "api_keys": [f"sha256:{sha256(KEY)}"]},
        {"id": SASL_TENANT, "api_keys": [{"hash": f"sha256:{sha256(SASL_KEY)}", "name": "sasl-team-key"}],
         "kafka": {"bootstrap": broker.bootstrap, "security_protocol": "SASL_PLAINTEXT",
                   "sasl": {"mechanism": "PLAIN", "username": "alice", "password_file": "sasl-password"}}},
    ]}))
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(d / "tenants.yaml"),
                                                 "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
                                                 "GATEWAY_INSTANCE_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S),
                                                 "GATEWAY_REQUEST_TIMEOUT_MS": "5000"},
                           log_file=d / "gateway.log") as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers={"X-API-Key": KEY}) as c:
        yield c


async def scrape(http: httpx.AsyncClient) -> Samples:
    r = await http.get("/metrics", headers={"X-API-Key": "", **ADMIN})  # multi-tenant: the admin token
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels; 0 when absent (a counter or gauge not yet created)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def matching(samples: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    want = set(labels.items())
    return {lbl: v for (n, lbl), v in samples.items() if n == name and want <= lbl}


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], partitions: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i, (k, v) in enumerate(records):
        p.produce(topic, key=k, value=v, partition=i % partitions)
    assert p.flush(30) == 0


async def create(http: httpx.AsyncClient, group: str, **cfg: object) -> str:
    r = await http.post(f"/consumers/{group}", json={"auto.offset.reset": "earliest", **cfg}, headers=H)
    assert r.status_code == 200, r.text
    return f"/consumers/{group}/instances/{r.json()['instance_id']}"


async def test_consume_cycle(broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient,
                             topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    records = [(b"key-%d" % i, b"v" * (10 + i)) for i in range(30)]
    payload = sum(len(k) + len(v) for k, v in records)
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, records, 2)
    group = f"g-{topic_name}"
    before = await scrape(http)

    base = await create(http, group, **{"auto.commit.enable": "false"})
    instance_id = base.rsplit("/", 1)[1]
    assert (await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)).status_code == 204
    got: list[dict[str, object]] = []
    polls = 0
    r = await http.get(f"{base}/records", params={"timeout": 10000, "max_records": 5}, headers={"Accept": BIN})
    polls += 1
    assert r.status_code == 200, r.text
    got += r.json()
    assert 0 < len(got) <= 5

    # part-way: lag counts what is not delivered yet, per partition, with the tenant and group as labels
    deadline = time.monotonic() + 10
    while True:
        lag = matching(await scrape(http), "kcg_consumer_lag", tenant=TENANT, group=group, topic=topic_name)
        if (len(lag) == 2 and sum(lag.values()) == len(records) - len(got)) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)  # lag is computed from fetch responses the consumer receives in the background
    assert {dict(lbl)["partition"] for lbl in lag} == {"0", "1"}
    assert sum(lag.values()) == len(records) - len(got)

    deadline = time.monotonic() + 20
    while len(got) < len(records) and time.monotonic() < deadline:
        r = await http.get(f"{base}/records", params={"timeout": 1000}, headers={"Accept": BIN})
        polls += 1
        assert r.status_code == 200, r.text
        got += r.json()
    assert len(got) == len(records)
    consumed = sum(len(base64.b64decode(str(x["key"]))) + len(base64.b64decode(str(x["value"]))) for x in got)
    assert consumed == payload
    last: dict[int, int] = {}
    for x in got:
        last[int(str(x["partition"]))] = max(last.get(int(str(x["partition"])), -1), int(str(x["offset"])))
    r = await http.post(f"{base}/offsets", headers=H, json={"offsets": [
        {"topic": topic_name, "partition": p, "offset": o} for p, o in last.items()]})
    assert r.status_code == 200, r.text

    deadline = time.monotonic() + 10
    while True:  # everything consumed: lag 0 on both partitions, nothing left in the prefetch buffer
        after = await scrape(http)
        lag = matching(after, "kcg_consumer_lag", tenant=TENANT, group=group, topic=topic_name)
        done = (len(lag) == 2 and set(lag.values()) == {0.0}
                and value(after, "kcg_prefetch_buffer_bytes", tenant=TENANT) == 0
                and value(after, "kcg_heartbeat_latency_seconds", tenant=TENANT) > 0)
        if done or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)  # heartbeats run every 300 ms in the gateway
    assert set(lag.values()) == {0.0} and len(lag) == 2, lag
    assert value(after, "kcg_prefetch_buffer_bytes", tenant=TENANT) == 0
    assert 0 < value(after, "kcg_heartbeat_latency_seconds", tenant=TENANT) < 1

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # per-tenant counters and histograms
    assert delta("kcg_consumer_instances", tenant=TENANT) == 1
    assert delta("kcg_records_delivered_total", tenant=TENANT) == len(records)
    assert delta("kcg_record_bytes_delivered_total", tenant=TENANT) == payload
    assert delta("kcg_poll_wait_seconds_count", tenant=TENANT) == polls
    waited = delta("kcg_poll_wait_seconds_sum", tenant=TENANT)
    assert 0 < waited < 40
    assert delta("kcg_poll_wait_seconds_bucket", tenant=TENANT, le="+Inf") == polls
    assert delta("kcg_commit_duration_seconds_count", tenant=TENANT) == 1
    assert 0 < delta("kcg_commit_duration_seconds_sum", tenant=TENANT) < 5
    assert value(after, "kcg_fetch_requests_total", tenant=TENANT, kind="full") > 0
    if broker.name == "tansu":  # no fetch sessions: every fetch is full. On Kafka, whether the fetch after the first
        # (incremental) was answered yet depends on timing: test_kafka_fetch_sessions.py counts them
        assert value(after, "kcg_fetch_requests_total", tenant=TENANT, kind="incremental") == 0
        assert value(after, "kcg_fetch_session_resets_total", tenant=TENANT) == 0
    assert value(after, "kcg_rebalances_total", tenant=TENANT) >= 1
    assert 0 <= value(after, "kcg_event_loop_lag_seconds") < 0.5

    # HTTP requests by route template, method and status: what this test sent
    def http_delta(route: str, method: str, status: str) -> float:
        return delta("kcg_http_request_duration_seconds_count", tenant=TENANT, route=route, method=method,
                     status=status)

    inst = "/consumers/{group}/instances/{instance_id}"
    assert http_delta("/consumers/{group}", "POST", "200") == 1
    assert http_delta(inst + "/subscription", "POST", "204") == 1
    assert http_delta(inst + "/records", "GET", "200") == polls
    assert http_delta(inst + "/offsets", "POST", "200") == 1
    routes = {dict(lbl)["route"] for lbl in matching(after, "kcg_http_request_duration_seconds_count")}
    assert not any(group in r or instance_id in r for r in routes), routes  # templates, not raw paths
    r = await http.get("/no/such/path")
    assert r.status_code == 404
    assert value(await scrape(http), "kcg_http_request_duration_seconds_count",
                 tenant="", route="unmatched", method="GET", status="404") >= 1

    assert (await http.delete(base)).status_code == 204
    assert value(await scrape(http), "kcg_consumer_instances", tenant=TENANT) == value(
        before, "kcg_consumer_instances", tenant=TENANT)


async def _stream(http: httpx.AsyncClient, base: str, n: int) -> list[dict[str, str]]:
    got: list[dict[str, str]] = []
    async with http.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line:
                got.append(json.loads(line))
            if len(got) == n:
                break
    return got


async def _streamed(broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient,
                    topic_name: str) -> tuple[Samples, Samples, list[tuple[bytes, bytes]]]:
    await bclient.create_topics({topic_name: 1})
    records = [(b"s%d" % i, b"x" * (20 + i)) for i in range(12)]
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, records, 1)
    base = await create(http, f"g-{topic_name}")
    assert (await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)).status_code == 204
    before = await scrape(http)
    got = await _stream(http, base, len(records))
    assert [base64.b64decode(x["value"]) for x in got] == [v for _, v in records]
    after = await scrape(http)
    assert (await http.delete(base)).status_code == 204
    return before, after, records


async def test_streamed_records_are_counted(broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient,
                                            topic_name: str) -> None:
    before, after, records = await _streamed(broker, bclient, http, topic_name)
    name = "kcg_records_delivered_total"
    assert value(after, name, tenant=TENANT) - value(before, name, tenant=TENANT) == len(records)


async def test_streamed_bytes_are_counted(broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient,
                                          topic_name: str) -> None:
    before, after, records = await _streamed(broker, bclient, http, topic_name)
    name = "kcg_record_bytes_delivered_total"
    assert value(after, name, tenant=TENANT) - value(before, name, tenant=TENANT) == sum(
        len(k) + len(v) for k, v in records)


async def test_no_secret_in_metrics(gw: GatewayProcess, http: httpx.AsyncClient) -> None:
    """The SASL tenant's password is used (its subscribe fails: Tansu has no SASL), API keys right and
    wrong are presented; none of them, nor the keys' hashes, shows in /metrics."""
    sasl = {"X-API-Key": SASL_KEY}
    r = await http.post("/consumers/g-sasl", json={}, headers={**H, **sasl})
    assert r.status_code == 200, r.text
    base = f"/consumers/g-sasl/instances/{r.json()['instance_id']}"
    r = await http.post(f"{base}/subscription", json={"topics": ["any"]}, headers={**H, **sasl})
    assert r.status_code == 503 and r.json()["error_code"] == 50302, r.text
    assert SASL_PASSWORD not in r.text
    wrong = "kcg-wrong-key-Zt5"
    assert (await http.get(f"{base}/subscription", headers={"X-API-Key": wrong})).status_code == 401
    assert (await http.get(f"{base}/subscription", headers={"Authorization": f"Bearer {wrong}"})).status_code == 401
    text = (await http.get("/metrics", headers=ADMIN)).text
    samples = await scrape(http)
    assert value(samples, "kcg_consumer_instances", tenant=SASL_TENANT) >= 1  # the tenant is there, by id
    for secret in (SASL_PASSWORD, KEY, SASL_KEY, wrong, sha256(KEY), sha256(SASL_KEY), sha256(SASL_PASSWORD)):
        assert secret not in text
    assert (await http.delete(base, headers=sasl)).status_code == 204


async def test_instances_gauge_follows_idle_expiry(http: httpx.AsyncClient) -> None:
    before = value(await scrape(http), "kcg_consumer_instances", tenant=TENANT)
    base = await create(http, "g-expiry")
    after_create = await scrape(http)
    assert value(after_create, "kcg_consumer_instances", tenant=TENANT) == before + 1, (
        matching(after_create, "kcg_consumer_instances"))
    await asyncio.sleep(IDLE_TIMEOUT_S + 2)  # idle (no request to the instance) past the idle timeout
    r = await http.get(f"{base}/subscription")
    assert r.status_code == 410, r.text
    assert value(await scrape(http), "kcg_consumer_instances", tenant=TENANT) == before


async def test_http_metrics_carry_the_tenant(http: httpx.AsyncClient) -> None:
    base = await create(http, "g-http-tenant")
    samples = await scrape(http)
    assert matching(samples, "kcg_http_request_duration_seconds_count", route="/consumers/{group}", tenant=TENANT)
    await http.delete(base)



async def test_readiness_heartbeat_and_task_series(http: httpx.AsyncClient, bclient: KafkaClient,
                                                   topic_name: str) -> None:
    """kcg_ready / kcg_broker_reachable (the /readyz probe, run in the background by scrapes), heartbeats
    completed and their age, and a 0 series per background task, from the real gateway."""
    await bclient.create_topics({topic_name: 1})
    base = await create(http, f"g-{topic_name}")
    assert (await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)).status_code == 204
    r = await http.get(f"{base}/records", params={"timeout": 3000}, headers={"Accept": BIN})  # joins the group
    assert r.status_code == 200, r.text
    try:
        deadline = time.monotonic() + 15
        while True:  # the first scrape starts the probe, a later one reports it; heartbeats every 300 ms
            samples = await scrape(http)
            reachable = matching(samples, "kcg_broker_reachable")
            if ((TENANT,) in {(dict(lbl)["tenant"],) for lbl in reachable}
                    and value(samples, "kcg_heartbeats_total", tenant=TENANT) >= 3) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert value(samples, "kcg_broker_reachable", tenant=TENANT) == 1, reachable
        # ready exactly when every probed tenant is reachable (the SASL tenant, if a test touched it, is not:
        # Tansu has no SASL)
        assert value(samples, "kcg_ready") == min(reachable.values()), reachable
        assert value(samples, "kcg_heartbeats_total", tenant=TENANT) >= 3
        assert 0 <= value(samples, "kcg_heartbeat_age_seconds", tenant=TENANT) < 2
        tasks = {dict(lbl)["task"]: v for lbl, v in matching(samples, "kcg_background_task_failures_total",
                                                               tenant=TENANT).items()}
        assert tasks == dict.fromkeys(("autocommit", "fetcher", "membership", "pattern", "positions"), 0.0)
    finally:
        assert (await http.delete(base)).status_code == 204
    # the instance's heartbeats stay counted after it is gone: the counter does not go down
    assert value(await scrape(http), "kcg_heartbeats_total", tenant=TENANT) >= value(
        samples, "kcg_heartbeats_total", tenant=TENANT)
