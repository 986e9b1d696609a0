"""The v3 API on Apache Kafka, where the broker has what Tansu lacks: a cluster id of its own, internal topics
(``__consumer_offsets``, ``__transaction_state``), every config of a topic with its source and synonyms, groups whose
members Kafka describes itself (client id, host, instance id, assignment) and a last stable offset below the high
watermark while a transaction is open.

One gateway with a tenants file on the session Kafka; its tenant ``ops`` may use every topic and group (``*``), so
the refusals of internal topics below are the gateway's rule for every tenant, not a pattern of this one. The
members are confluent-kafka (librdkafka) consumers: nothing the gateway fills in for its own members.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.client import KafkaClient
from service.embedded.kafka import EmbeddedKafka
from service.protocol import messages as M
from tests.integration.gateway_proc import GatewayProcess
from tests.v3_shapes import check

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
KEY = "v3-kafka-ops-key"
TENANTS = f"""
version: 1
tenants:
  - id: ops
    api_keys: ["sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]
    topics: ["*"]
    groups: ["*"]
    admin_topics: ["*"]
"""
AUTH = {"Authorization": f"Bearer {KEY}"}
INTERNAL = ("__consumer_offsets", "__transaction_state")
MetaTopic = M.struct("MetadataRequest", "MetadataRequestTopic")


@pytest.fixture(scope="module")
def gw(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("v3-kafka")
    (d / "tenants.yaml").write_text(TENANTS)
    with GatewayProcess(kafka.bootstrap, env={"GATEWAY_TENANTS_FILE": str(d / "tenants.yaml")},
                        log_file=d / "gw.log") as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60, headers=AUTH) as c:
        yield c


async def cluster_id(http: httpx.AsyncClient) -> str:
    r = await http.get("/v3/clusters")
    assert r.status_code == 200, r.text
    return str(r.json()["data"][0]["cluster_id"])


def error(r: httpx.Response, status: int, code: int) -> None:
    assert r.status_code == status, (r.request.method, r.request.url.path, r.status_code, r.text)
    body = r.json()
    assert body["error_code"] == code and isinstance(body["message"], str), body


async def create_topic(kafka: EmbeddedKafka, topic: str, partitions: int) -> None:
    client = KafkaClient(kafka.bootstrap)
    try:
        await client.create_topics({topic: partitions})
    finally:
        await client.close()


def transaction(kafka: EmbeddedKafka, topic: str, values: list[bytes], partition: int = 0) -> CKProducer:
    """An open transaction holding ``values`` (flushed to the broker, neither committed nor aborted)."""
    p = CKProducer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                    "linger.ms": 1})
    p.init_transactions(30)
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v, partition=partition)
    assert p.flush(30) == 0
    return p


async def test_the_cluster_id_is_the_brokers(http: httpx.AsyncClient, kafka: EmbeddedKafka) -> None:
    cid = await cluster_id(http)
    assert cid == kafka.cluster_id and len(cid) == 22  # 16 random bytes, URL-safe base64 without padding
    body = (await http.get(f"/v3/clusters/{cid}")).json()
    check(body, "KafkaCluster")
    assert body["cluster_id"] == kafka.cluster_id
    brokers = (await http.get(f"/v3/clusters/{cid}/brokers")).json()
    check(brokers, "KafkaBrokerList")
    host, port = kafka.bootstrap.rsplit(":", 1)
    assert [(b["broker_id"], b["host"], b["port"]) for b in brokers["data"]] == [(1, host, int(port))]
    controller = (await http.get(body["controller"]["related"])).json()
    assert controller["broker_id"] == 1


async def test_internal_topics_exist_on_the_broker_and_are_refused_to_tenants(
        http: httpx.AsyncClient, kafka: EmbeddedKafka, topic_name: str) -> None:
    await create_topic(kafka, topic_name, 1)
    # a committed transaction and a committed group offset: both internal topics exist
    p = transaction(kafka, topic_name, [b"x"])
    p.commit_transaction(30)
    c = CKConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"g-{topic_name}", "enable.auto.commit": False})
    c.commit(offsets=[CKTopicPartition(topic_name, 0, 1)], asynchronous=False)
    c.close()
    client = KafkaClient(kafka.bootstrap)
    try:
        md = await client.send_any(M.MetadataRequest(topics=[MetaTopic(name=t) for t in INTERNAL],
                                                     allow_auto_topic_creation=False))
    finally:
        await client.close()
    assert {t.name: (t.error_code, t.is_internal) for t in md.topics} == dict.fromkeys(INTERNAL, (0, True))
    assert md.cluster_id == kafka.cluster_id

    cid = await cluster_id(http)
    v3 = f"/v3/clusters/{cid}/topics"
    listed = [t["topic_name"] for t in (await http.get(v3)).json()["data"]]
    assert topic_name in listed and not [n for n in listed if n.startswith("__")], listed
    assert not [n for n in (await http.get("/topics")).json() if n.startswith("__")]
    replicas = (await http.get(f"/v3/clusters/{cid}/brokers/1/partition-replicas")).json()["data"]
    assert replicas and not [r for r in replicas if r["topic_name"] in INTERNAL]
    for name in INTERNAL:
        for path in (f"{v3}/{name}", f"{v3}/{name}/partitions", f"{v3}/{name}/partitions/0",
                     f"{v3}/{name}/partitions/0/replicas", f"{v3}/{name}/configs", f"{v3}/{name}/configs/retention.ms",
                     f"/topics/{name}", f"/topics/{name}/partitions", f"/topics/{name}/partitions/0/offsets"):
            error(await http.get(path), 403, 40301)
        error(await http.get(f"/topics/{name}/partitions/0/records", params={"offset": 0}), 403, 40301)
        error(await http.post(v3, json={"topic_name": name}), 403, 40301)
        error(await http.delete(f"{v3}/{name}"), 403, 40301)
        error(await http.post(f"/topics/{name}", json={"records": [{"value": "eA=="}]},
                              headers={"Content-Type": "application/vnd.kafka.binary.v2+json"}), 403, 40301)
        error(await http.post(f"{v3}/{name}/records", json={"value": {"type": "BINARY", "data": "eA=="}}), 403, 40301)
    group = f"sub-{topic_name}"
    r = await http.post(f"/consumers/{group}", json={"name": "c"},
                        headers={"Content-Type": "application/vnd.kafka.v2+json"})
    assert r.status_code == 200, r.text
    base = f"/consumers/{group}/instances/c"
    error(await http.post(f"{base}/subscription", json={"topics": ["__consumer_offsets"]},
                          headers={"Content-Type": "application/vnd.kafka.v2+json"}), 403, 40301)
    error(await http.post(f"{base}/assignments",
                          json={"partitions": [{"topic": "__transaction_state", "partition": 0}]},
                          headers={"Content-Type": "application/vnd.kafka.v2+json"}), 403, 40301)
    assert (await http.delete(base, headers={"Content-Type": "application/vnd.kafka.v2+json"})).status_code == 204


async def test_every_config_of_a_topic_with_sources_and_synonyms(http: httpx.AsyncClient, topic_name: str) -> None:
    cid = await cluster_id(http)
    r = await http.post(f"/v3/clusters/{cid}/topics", json={
        "topic_name": topic_name, "partitions_count": 2,
        "configs": [{"name": "cleanup.policy", "value": "compact"}, {"name": "retention.ms", "value": "1234567"}]})
    assert r.status_code == 201, r.text
    r = await http.get(f"/v3/clusters/{cid}/topics/{topic_name}/configs")
    assert r.status_code == 200, r.text
    body = r.json()
    check(body, "KafkaTopicConfigList")
    by_name = {c["name"]: c for c in body["data"]}
    # Kafka describes every topic config, defaults included (Tansu: only the ones set)
    assert len(by_name) >= 30 and {"segment.bytes", "min.insync.replicas", "max.message.bytes",
                                   "message.timestamp.after.max.ms",
                                   "compression.type"} <= set(by_name), sorted(by_name)
    assert [c["name"] for c in body["data"]] == sorted(by_name)
    for name, value in (("cleanup.policy", "compact"), ("retention.ms", "1234567")):
        c = by_name[name]
        assert (c["value"], c["is_default"], c["source"], c["is_read_only"], c["is_sensitive"]) == (
            value, False, "DYNAMIC_TOPIC_CONFIG", False, False), c
    # synonyms as Kafka answers them (include_synonyms): the topic's own value first, then the broker's it
    # overrides, when the broker has one (retention.ms's log.retention.ms has no value here)
    assert by_name["cleanup.policy"]["synonyms"] == [
        {"name": "cleanup.policy", "value": "compact", "source": "DYNAMIC_TOPIC_CONFIG"},
        {"name": "log.cleanup.policy", "value": "delete", "source": "DEFAULT_CONFIG"}]
    assert by_name["retention.ms"]["synonyms"] == [
        {"name": "retention.ms", "value": "1234567", "source": "DYNAMIC_TOPIC_CONFIG"}]
    # a cluster-wide dynamic default: Kafka 4 formats its storage with min.insync.replicas=1 for the cluster
    isr = by_name["min.insync.replicas"]
    assert (isr["value"], isr["is_default"], isr["source"]) == ("1", False, "DYNAMIC_DEFAULT_BROKER_CONFIG"), isr
    assert isr["synonyms"] == [
        {"name": "min.insync.replicas", "value": "1", "source": "DYNAMIC_DEFAULT_BROKER_CONFIG"},
        {"name": "min.insync.replicas", "value": "1", "source": "DEFAULT_CONFIG"}]
    seg = by_name["segment.bytes"]
    assert (seg["value"], seg["is_default"], seg["source"]) == ("1073741824", True, "DEFAULT_CONFIG"), seg
    assert seg["synonyms"] == [{"name": "log.segment.bytes", "value": "1073741824", "source": "DEFAULT_CONFIG"}]
    after = by_name["message.timestamp.after.max.ms"]
    assert (after["value"], after["source"]) == ("3600000", "DEFAULT_CONFIG"), after  # docs/brokers.md: 1 h
    one = (await http.get(by_name["retention.ms"]["metadata"]["self"])).json()
    check(one, "KafkaTopicConfig")
    assert one == by_name["retention.ms"]


def _consume_until(consumers: list[CKConsumer], want: int, timeout: float = 30) -> dict[str, list[Any]]:
    """Poll every consumer until ``want`` records were received in all; the records by consumer client id."""
    got: dict[str, list[Any]] = {}
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in got.values()) < want:
        assert time.monotonic() < deadline, {k: len(v) for k, v in got.items()}
        for c in consumers:
            m = c.poll(0.1)
            if m is not None:
                assert m.error() is None, m.error()
                got.setdefault(c.memberid() or "", []).append(m)
    return got


async def test_a_group_as_kafka_describes_it_with_exact_lags(http: httpx.AsyncClient, kafka: EmbeddedKafka,
                                                             topic_name: str) -> None:
    """Two librdkafka members (one static), four partitions with 10, 20, 30 and 40 records; each member commits
    a known prefix of its partitions: every lag is ``end - committed``; then an open transaction adds records
    that the lag does not count (the end is the last stable offset) until it commits."""
    await create_topic(kafka, topic_name, 4)
    per_partition = {0: 10, 1: 20, 2: 30, 3: 40}
    group = f"ck-{topic_name}"
    common = {"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "partition.assignment.strategy": "range",
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 300}
    c1 = CKConsumer({**common, "client.id": "ck-one", "group.instance.id": "static-one"})
    c2 = CKConsumer({**common, "client.id": "ck-two"})
    try:
        c1.subscribe([topic_name])
        c2.subscribe([topic_name])
        # both members hold their two partitions before the first record: each record is read by its owner once
        deadline = time.monotonic() + 30
        while sorted(len(c.assignment()) for c in (c1, c2)) != [2, 2]:
            assert time.monotonic() < deadline, [c.assignment() for c in (c1, c2)]
            for c in (c1, c2):
                assert c.poll(0.05) is None
        p = CKProducer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 2})
        for part, n in per_partition.items():
            for i in range(n):
                p.produce(topic_name, value=b"%d-%d" % (part, i), partition=part)
        assert p.flush(30) == 0
        got = _consume_until([c1, c2], 100)
        assert sorted(len(v) for v in got.values()) == [30, 70], {k: len(v) for k, v in got.items()}
        assert len({(m.partition(), m.offset()) for v in got.values() for m in v}) == 100
        # commit 3 fewer than each partition holds (offset n - 3: the next to read)
        for c in (c1, c2):
            mine = sorted({m.partition() for m in got[c.memberid()]})
            c.commit(offsets=[CKTopicPartition(topic_name, q, per_partition[q] - 3) for q in mine], asynchronous=False)
        ids = {"ck-one": c1.memberid(), "ck-two": c2.memberid()}

        cid = await cluster_id(http)
        v3 = f"/v3/clusters/{cid}/consumer-groups/{group}"
        g = (await http.get(v3)).json()
        check(g, "KafkaConsumerGroup")
        assert (g["is_simple"], g["state"], g["partition_assignor"]) == (False, "STABLE", "range"), g
        assert g["coordinator"]["related"].endswith(f"/v3/clusters/{cid}/brokers/1")
        consumers = (await http.get(f"{v3}/consumers")).json()
        check(consumers, "KafkaConsumerList")
        seen = {m["client_id"]: (m["consumer_id"], m["instance_id"]) for m in consumers["data"]}
        assert seen == {"ck-one": (ids["ck-one"], "static-one"), "ck-two": (ids["ck-two"], None)}, seen
        owner: dict[int, str] = {}
        for m in consumers["data"]:
            a = (await http.get(m["assignments"]["related"])).json()
            check(a, "KafkaConsumerAssignmentList")
            for x in a["data"]:
                owner[x["partition_id"]] = m["client_id"]
        # range: two consecutive partitions each (librdkafka, the leader, orders the members)
        assert sorted(owner) == [0, 1, 2, 3] and owner[0] == owner[1] != owner[2] == owner[3], owner
        instance = {"ck-one": "static-one", "ck-two": None}

        lags = (await http.get(f"{v3}/lags")).json()
        check(lags, "KafkaConsumerLagList")
        assert [(x["partition_id"], x["current_offset"], x["log_end_offset"], x["lag"], x["client_id"],
                 x["consumer_id"]) for x in lags["data"]] == [
            (q, n - 3, n, 3, owner[q], ids[owner[q]]) for q, n in sorted(per_partition.items())]
        summary = (await http.get(f"{v3}/lag-summary")).json()
        check(summary, "KafkaConsumerGroupLagSummary")
        assert (summary["max_lag"], summary["total_lag"], summary["max_lag_partition_id"],
                summary["max_lag_client_id"], summary["max_lag_instance_id"]) == (3, 12, 0, owner[0],
                                                                                  instance[owner[0]])

        # an open transaction on partition 3: its records are past the last stable offset, not lag
        tx = transaction(kafka, topic_name, [b"t1", b"t2", b"t3", b"t4", b"t5"], partition=3)
        lag3 = (await http.get(f"{v3}/lags/{topic_name}/partitions/3")).json()
        check(lag3, "KafkaConsumerLag")
        assert (lag3["log_end_offset"], lag3["lag"]) == (40, 3), lag3
        tx.commit_transaction(30)
        # the COMMIT marker takes an offset; Kafka moves the LSO a moment after commit_transaction() returns
        deadline = time.monotonic() + 10
        while (lag3 := (await http.get(f"{v3}/lags/{topic_name}/partitions/3")).json())["log_end_offset"] != 46:
            assert lag3["log_end_offset"] == 40 and time.monotonic() < deadline, lag3
        assert lag3["lag"] == 9
        summary = (await http.get(f"{v3}/lag-summary")).json()
        assert (summary["max_lag"], summary["total_lag"], summary["max_lag_partition_id"],
                summary["max_lag_client_id"]) == (9, 18, 3, owner[3]), summary
    finally:
        c1.close()
        c2.close()
    # members gone (the static one stays until its session times out): the group and its offsets remain
    r = await http.get(f"/v3/clusters/{await cluster_id(http)}/consumer-groups/{group}/lags")
    assert r.status_code == 200 and len(r.json()["data"]) == 4, r.text


async def test_a_group_that_only_commits_is_simple_and_has_lags(http: httpx.AsyncClient, kafka: EmbeddedKafka,
                                                               topic_name: str) -> None:
    """Offsets committed by an ``assign`` user (no membership): Kafka keeps an empty group with no protocol type,
    which v3 shows as simple, with lags and no consumer."""
    await create_topic(kafka, topic_name, 2)
    p = CKProducer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 2})
    for i in range(12):
        p.produce(topic_name, value=b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    group = f"simple-{topic_name}"
    c = CKConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[CKTopicPartition(topic_name, 0, 2), CKTopicPartition(topic_name, 1, 5)], asynchronous=False)
    c.close()
    cid = await cluster_id(http)
    v3 = f"/v3/clusters/{cid}/consumer-groups/{group}"
    g = (await http.get(v3)).json()
    check(g, "KafkaConsumerGroup")
    assert (g["is_simple"], g["state"]) == (True, "EMPTY"), g
    assert (await http.get(f"{v3}/consumers")).json()["data"] == []
    lags = (await http.get(f"{v3}/lags")).json()
    check(lags, "KafkaConsumerLagList")
    assert [(x["partition_id"], x["current_offset"], x["log_end_offset"], x["lag"], x["consumer_id"])
            for x in lags["data"]] == [(0, 2, 6, 4, ""), (1, 5, 6, 1, "")]
    listing = (await http.get(f"/v3/clusters/{cid}/consumer-groups")).json()
    assert group in [x["consumer_group_id"] for x in listing["data"]]
    # a group Kafka does not know: 404 on every group path
    for path in ("", "/consumers", "/lags", "/lag-summary"):
        error(await http.get(f"/v3/clusters/{cid}/consumer-groups/never-{topic_name}{path}"), 404, 404)
