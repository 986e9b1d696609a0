"""v3 lag against Tansu with a real gateway process: produce, consume and commit exactly half, check every
lag number (per partition, total, maximum, its partition and consumer), consume the rest, commit, lag 0.

Tansu's DescribeGroups gives members without client id and assignment; the gateway fills them in for its
own members (see service/cluster/group_admin.py), so the lag's consumer is the HTTP instance's group member.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.http_client import poll_until
from tests.v3_shapes import check

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
H = {"Content-Type": V2}
PER_PARTITION = {0: 10, 1: 20}  # records produced to each partition


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, log_file=tmp_path_factory.mktemp(f"gw-{broker.name}") / "gateway.log") as g:
        yield g


def produce(bootstrap: str, topic: str) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for partition, n in PER_PARTITION.items():
        for i in range(n):
            p.produce(topic, value=b"p%d-%d" % (partition, i), partition=partition)
    assert p.flush(30) == 0


async def commit(http: httpx.AsyncClient, base: str, body: dict[str, Any] | None = None) -> None:
    """Commit (a commit while the group rebalances is refused with 409/40903: poll, then retry)."""
    deadline = time.monotonic() + 20
    while True:
        r = await http.post(f"{base}/offsets", json=body, headers=H)
        if r.status_code == 200:
            return
        assert r.status_code == 409 and r.json()["error_code"] == 40903, r.text
        assert time.monotonic() < deadline, r.text
        await http.get(f"{base}/records", params={"timeout": 200}, headers={"Accept": BIN})


async def test_lag_while_behind_and_after_catching_up(http: httpx.AsyncClient, bclient: KafkaClient,
                                                      broker: AnyBroker, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    produce(broker.bootstrap, topic_name)
    group = f"lag-{topic_name}"
    r = await http.post(f"/consumers/{group}", json={"name": "c1", "format": "binary", "auto.offset.reset": "earliest",
                                                      "auto.commit.enable": "false"}, headers=H)
    assert r.status_code == 200, r.text
    base = f"/consumers/{group}/instances/c1"
    r = await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
    assert r.status_code == 204, r.text

    def half(got: list[dict[str, Any]]) -> bool:
        return all(sum(1 for x in got if x["partition"] == p) >= n // 2 for p, n in PER_PARTITION.items())

    consumed = await poll_until(http, base, half)
    # commit exactly half of each partition: the offsets of records n/2 - 1 (Confluent commits offset + 1)
    assert {(x["partition"], x["offset"]) for x in consumed} >= {(p, n // 2 - 1) for p, n in PER_PARTITION.items()}
    await commit(http, base, {"offsets": [{"topic": topic_name, "partition": p, "offset": n // 2 - 1}
                                          for p, n in PER_PARTITION.items()]})

    cid = (await http.get("/v3/clusters")).json()["data"][0]["cluster_id"]
    v3 = f"/v3/clusters/{cid}/consumer-groups/{group}"
    # Tansu describes any unknown group as an empty simple group: without committed offsets it is not found
    for path in ("", "/consumers", "/lags", "/lag-summary"):
        r = await http.get(f"/v3/clusters/{cid}/consumer-groups/never-{topic_name}{path}")
        assert r.status_code == 404 and r.json()["error_code"] == 404, (path, r.text)
    consumers = (await http.get(f"{v3}/consumers")).json()
    check(consumers, "KafkaConsumerList")
    assert len(consumers["data"]) == 1, consumers
    me = consumers["data"][0]
    assert me["client_id"], me  # filled in by the gateway: Tansu answers an empty client id
    assignments = (await http.get(f"{v3}/consumers/{me['consumer_id']}/assignments")).json()
    check(assignments, "KafkaConsumerAssignmentList")
    assert [(a["topic_name"], a["partition_id"]) for a in assignments["data"]] == [(topic_name, 0), (topic_name, 1)]

    r = await http.get(v3 + "/lags")
    assert r.status_code == 200, r.text
    lags = r.json()
    check(lags, "KafkaConsumerLagList")
    assert [(x["topic_name"], x["partition_id"], x["current_offset"], x["log_end_offset"], x["lag"],
             x["consumer_id"], x["client_id"]) for x in lags["data"]] == [
        (topic_name, 1, 10, 20, 10, me["consumer_id"], me["client_id"]),
        (topic_name, 0, 5, 10, 5, me["consumer_id"], me["client_id"])]
    r = await http.get(v3 + "/lag-summary")
    assert r.status_code == 200, r.text
    summary = r.json()
    check(summary, "KafkaConsumerGroupLagSummary")
    assert (summary["max_lag"], summary["total_lag"], summary["max_lag_topic_name"], summary["max_lag_partition_id"],
            summary["max_lag_consumer_id"], summary["max_lag_client_id"]) == (
        10, 15, topic_name, 1, me["consumer_id"], me["client_id"])
    assert summary["max_lag_consumer"]["related"].endswith(f"{v3}/consumers/{me['consumer_id']}")
    group_body = (await http.get(v3)).json()
    check(group_body, "KafkaConsumerGroup")
    assert (group_body["is_simple"], group_body["state"]) == (False, "STABLE")
    # Tansu names no protocol: the gateway's member does
    assert group_body["partition_assignor"] in ("range", "roundrobin", "cooperative-sticky"), group_body
    listing = (await http.get(f"/v3/clusters/{cid}/consumer-groups")).json()
    check(listing, "KafkaConsumerGroupList")
    assert group in [g["consumer_group_id"] for g in listing["data"]]

    # consume the rest, commit everything consumed: no lag left
    seen = {(x["partition"], x["offset"]) for x in consumed}
    await poll_until(http, base, lambda got: len(seen | {(x["partition"], x["offset"]) for x in got}) == 30)
    await commit(http, base)
    lags = (await http.get(v3 + "/lags")).json()
    check(lags, "KafkaConsumerLagList")
    assert sorted((x["partition_id"], x["current_offset"], x["log_end_offset"], x["lag"]) for x in lags["data"]) == [
        (0, 10, 10, 0), (1, 20, 20, 0)]
    summary = (await http.get(v3 + "/lag-summary")).json()
    assert (summary["max_lag"], summary["total_lag"], summary["max_lag_partition_id"]) == (0, 0, 0)
    assert (await http.delete(base, headers=H)).status_code == 204
