"""v3 consumer groups and lag over HTTP against the protocol-level test broker, which answers ListGroups and
DescribeGroups like Apache Kafka (members' client id, host and assignment; group states; one coordinator
per group), so every field of every endpoint is checked, and each answer against Confluent's v3 shapes.

The app runs in-process (its tenants point at the test broker); the group's members are consumers of a
separate gateway object with their own client id, so what the app reports comes from the broker alone.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.app import create_app
from service.client.connection import ConnectionConfig
from service.cluster.group_admin import GroupAdmin
from service.consumer.subscription import TopicPartition
from service.instances.registry import ConsumerInstance, Gateway, InstanceOptions
from service.protocol.messages import ApiKey
from service.settings import Settings
from tests.fakes.broker import TestCluster, default_registry
from tests.fakes.broker.group_coordinator import GroupPhase, group_coordinator
from tests.v3_shapes import check

pytestmark = pytest.mark.integration

KEY = "key-of-tenant-a-123"
TENANTS = f"""
version: 1
tenants:
  - id: tenant-a
    api_keys: ["sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]
    topics: ["t", "u"]
    groups: ["ga-*"]
"""
AUTH = {"Authorization": f"Bearer {KEY}"}
FAST = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 100, "fetch_max_wait_ms": 50, "retry_backoff_ms": 20}
MEMBER_CLIENT = "lag-members"
ENDS = {("t", 0): 10, ("t", 1): 20, ("t", 2): 30, ("t", 3): 40, ("x", 0): 7, ("u", 0): 5}


@dataclass
class Env:
    cluster: TestCluster
    http: httpx.AsyncClient
    cid: str
    members: list[ConsumerInstance]

    def url(self, *path: str | int) -> str:
        return "/v3/clusters/" + "/".join([self.cid, *map(str, path)])

    async def get(self, *path: str | int, status: int = 200) -> Any:
        r = await self.http.get(self.url(*path), headers=AUTH)
        assert r.status_code == status, r.text
        if status >= 400:
            check(r.json(), "Error")
        return r.json()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with TestCluster(2, topics={"t": 4, "x": 1, "u": 1}, registry=default_registry(groups=True)) as cluster:
        gc = group_coordinator(cluster)
        gc.group_join_delay_ms = 0
        for (topic, p), n in ENDS.items():
            cluster.append(topic, p, [b"r%d" % i for i in range(n)])
        members_gw = Gateway(consumer_defaults=FAST)
        tenants = tmp_path / "tenants.yaml"
        tenants.write_text(TENANTS)
        app = create_app(Settings(kafka_bootstrap=cluster.bootstrap_servers, tenants_file=str(tenants)),
                         cluster.bootstrap_servers)
        try:
            rt = members_gw.tenant("members", bootstrap=cluster.bootstrap_servers,
                                   connection=ConnectionConfig(client_id=MEMBER_CLIENT))
            opts = [InstanceOptions(auto_offset_reset="earliest", auto_commit=False, group_instance_id=static)
                    for static in ("static-c0", None)]  # one static member, one dynamic
            insts = [await members_gw.create_instance(rt, "ga-active", o, f"c{i}") for i, o in enumerate(opts)]
            for inst in insts:
                await inst.consumer.subscribe(["t", "x"])
            await gc.wait_until(lambda: _settled(gc, insts), timeout=20)
            async with app.router.lifespan_context(app), httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
                r = await http.get("/v3/clusters", headers=AUTH)
                assert r.status_code == 200, r.text
                yield Env(cluster, http, r.json()["data"][0]["cluster_id"], insts)
        finally:
            await asyncio.wait_for(members_gw.close(), 20)


def _settled(gc: Any, insts: list[ConsumerInstance]) -> bool:
    g = gc.groups.get("ga-active")
    return (g is not None and g.phase is GroupPhase.STABLE and len(g.members) == 2
            and all(i.consumer.member is not None and i.consumer.member.member_id in g.members for i in insts)
            and sum(len(m.assignment) for m in g.members.values()) > 0)


def _owners(insts: list[ConsumerInstance]) -> dict[TopicPartition, str]:
    return {tp: i.consumer.member.member_id for i in insts for tp in i.consumer.assignment()}  # type: ignore[union-attr]


def _static_ids(insts: list[ConsumerInstance]) -> dict[str, str | None]:
    """member id → group.instance.id"""
    return {i.consumer.member.member_id: i.options.group_instance_id for i in insts}  # type: ignore[union-attr]


async def test_groups_consumers_and_assignments_as_kafka_describes_them(env: Env) -> None:
    gc = group_coordinator(env.cluster)
    gc.commit("ga-simple", "t", 0, 3)  # a group made by a manual commit: no members, no protocol
    gc.move_coordinator(1, "ga-simple")  # coordinated by the other broker: ListGroups must ask both
    gc.commit("gb-other", "t", 0, 1)  # outside the tenant's group patterns
    base = "http://gw/v3/clusters/" + env.cid

    listing = await env.get("consumer-groups")
    check(listing, "KafkaConsumerGroupList")
    assert listing["metadata"] == {"self": f"{base}/consumer-groups", "next": None}
    by_id = {g["consumer_group_id"]: g for g in listing["data"]}
    assert sorted(by_id) == ["ga-active", "ga-simple"]

    active = await env.get("consumer-groups", "ga-active")
    check(active, "KafkaConsumerGroup")
    assert active == by_id["ga-active"]
    protocol = gc.group("ga-active").protocol_name
    assert active == {
        "kind": "KafkaConsumerGroup",
        "metadata": {"self": f"{base}/consumer-groups/ga-active",
                     "resource_name": f"crn:///kafka={env.cid}/consumer-group=ga-active"},
        "cluster_id": env.cid, "consumer_group_id": "ga-active", "is_simple": False,
        "partition_assignor": protocol, "state": "STABLE", "group_type": "classic",
        "coordinator": {"related": f"{base}/brokers/0"},
        "consumers": {"related": f"{base}/consumer-groups/ga-active/consumers"},
        "lag_summary": {"related": f"{base}/consumer-groups/ga-active/lag-summary"}}
    simple = by_id["ga-simple"]
    assert (simple["is_simple"], simple["state"], simple["partition_assignor"], simple["coordinator"]) == (
        True, "EMPTY", "", {"related": f"{base}/brokers/1"})

    consumers = await env.get("consumer-groups", "ga-active", "consumers")
    check(consumers, "KafkaConsumerList")
    owners = _owners(env.members)
    ids = sorted(i.consumer.member.member_id for i in env.members)  # type: ignore[union-attr]
    assert [c["consumer_id"] for c in consumers["data"]] == ids
    for c in consumers["data"]:
        mid = c["consumer_id"]
        assert c == {
            "kind": "KafkaConsumer",
            "metadata": {"self": f"{base}/consumer-groups/ga-active/consumers/{mid}",
                         "resource_name": f"crn:///kafka={env.cid}/consumer-group=ga-active/consumer={mid}"},
            "cluster_id": env.cid, "consumer_group_id": "ga-active", "consumer_id": mid,
            "instance_id": _static_ids(env.members)[mid], "client_id": MEMBER_CLIENT,
            "assignments": {"related": f"{base}/consumer-groups/ga-active/consumers/{mid}/assignments"}}
        assert await env.get("consumer-groups", "ga-active", "consumers", mid) == c
        assignments = await env.get("consumer-groups", "ga-active", "consumers", mid, "assignments")
        check(assignments, "KafkaConsumerAssignmentList")
        mine = sorted(tp for tp, owner in owners.items() if owner == mid and tp.topic != "x")  # x: not the tenant's
        assert [(a["topic_name"], a["partition_id"]) for a in assignments["data"]] == mine
        for a in assignments["data"]:
            t, p = a["topic_name"], a["partition_id"]
            assert a["partition"] == {"related": f"{base}/topics/{t}/partitions/{p}"}
            assert a["lag"] == {"related": f"{base}/consumer-groups/ga-active/lags/{t}/partitions/{p}"}
            one = await env.get("consumer-groups", "ga-active", "consumers", mid, "assignments", t, "partitions", p)
            check(one, "KafkaConsumerAssignment")
            assert one == a
    assert sorted(tp for tp in owners if tp.topic == "t") == [TopicPartition("t", p) for p in range(4)]
    assert sorted(c["instance_id"] or "" for c in consumers["data"]) == ["", "static-c0"]
    # the broker saw the members' own client id and address
    assert {m.client_host for m in gc.group("ga-active").members.values()} == {"/127.0.0.1"}


async def test_lags_and_summary_follow_confluent(env: Env) -> None:
    gc = group_coordinator(env.cluster)
    base = "http://gw/v3/clusters/" + env.cid
    for (t, p), offset in {("t", 0): 5, ("t", 1): 20, ("t", 2): 0, ("x", 0): 1}.items():
        gc.commit("ga-active", t, p, offset)  # t-3 is never committed; x is not the tenant's topic
    owners = _owners(env.members)
    lags = await env.get("consumer-groups", "ga-active", "lags")
    check(lags, "KafkaConsumerLagList")
    assert lags["metadata"] == {"self": f"{base}/consumer-groups/ga-active/lags", "next": None}
    got = [(x["topic_name"], x["partition_id"], x["current_offset"], x["log_end_offset"], x["lag"], x["consumer_id"])
           for x in lags["data"]]
    assert got == [("t", 2, 0, 30, 30, owners[TopicPartition("t", 2)]),
                   ("t", 0, 5, 10, 5, owners[TopicPartition("t", 0)]),
                   ("t", 1, 20, 20, 0, owners[TopicPartition("t", 1)])]
    static = _static_ids(env.members)
    assert all(x["client_id"] == MEMBER_CLIENT and x["instance_id"] == static[x["consumer_id"]] for x in lags["data"])
    first = lags["data"][0]
    assert first["metadata"] == {
        "self": f"{base}/consumer-groups/ga-active/lags/t/partitions/2",
        "resource_name": f"crn:///kafka={env.cid}/consumer-group=ga-active/lag=t/partition=2"}
    one = await env.get("consumer-groups", "ga-active", "lags", "t", "partitions", 2)
    check(one, "KafkaConsumerLag")
    assert one == first
    await env.get("consumer-groups", "ga-active", "lags", "t", "partitions", 3, status=404)  # never committed
    r = await env.http.get(env.url("consumer-groups", "ga-active", "lags", "x", "partitions", 0), headers=AUTH)
    assert r.status_code == 403 and r.json()["error_code"] == 40301

    summary = await env.get("consumer-groups", "ga-active", "lag-summary")
    check(summary, "KafkaConsumerGroupLagSummary")
    top = owners[TopicPartition("t", 2)]
    assert summary == {
        "kind": "KafkaConsumerGroupLagSummary",
        "metadata": {"self": f"{base}/consumer-groups/ga-active/lag-summary",
                     "resource_name": f"crn:///kafka={env.cid}/consumer-group=ga-active/lag-summary"},
        "cluster_id": env.cid, "consumer_group_id": "ga-active", "max_lag_consumer_id": top,
        "max_lag_instance_id": static[top], "max_lag_client_id": MEMBER_CLIENT, "max_lag_topic_name": "t",
        "max_lag_partition_id": 2, "max_lag": 30, "total_lag": 35,
        "max_lag_consumer": {"related": f"{base}/consumer-groups/ga-active/consumers/{top}"},
        "max_lag_partition": {"related": f"{base}/topics/t/partitions/2"}}

    # a simple group: lag without consumers; the log end is the last stable offset (read_committed)
    gc.commit("ga-simple", "u", 0, 2)
    env.cluster.append_txn("u", 0, [b"open-1", b"open-2"], producer_id=77, producer_epoch=0)
    lags = await env.get("consumer-groups", "ga-simple", "lags")
    assert [(x["current_offset"], x["log_end_offset"], x["lag"], x["consumer_id"], x["client_id"])
            for x in lags["data"]] == [(2, ENDS[("u", 0)], 3, "", "")]
    assert env.cluster.high_watermark("u", 0) == ENDS[("u", 0)] + 2


async def test_refusals_and_missing_things(env: Env) -> None:
    gc = group_coordinator(env.cluster)
    gc.commit("gb-other", "t", 0, 1)
    for path in (("consumer-groups", "gb-other"), ("consumer-groups", "gb-other", "lags"),
                 ("consumer-groups", "gb-other", "lag-summary"), ("consumer-groups", "gb-other", "consumers")):
        r = await env.http.get(env.url(*path), headers=AUTH)
        assert r.status_code == 403 and r.json()["error_code"] == 40301, (path, r.text)
        check(r.json(), "Error")
    for path in (("consumer-groups", "ga-missing"), ("consumer-groups", "ga-missing", "consumers"),
                 ("consumer-groups", "ga-missing", "lag-summary"),
                 ("consumer-groups", "ga-active", "consumers", "nobody"),
                 ("consumer-groups", "ga-active", "lags"),  # a group that committed nothing has no lags
                 ("consumer-groups", "ga-active", "lag-summary")):
        body = await env.get(*path, status=404)
        assert body["error_code"] == 404, (path, body)
    r = await env.http.get("/v3/clusters/not-this-one/consumer-groups", headers=AUTH)
    assert r.status_code == 404 and r.json()["error_code"] == 404
    r = await env.http.get(env.url("consumer-groups"))
    assert r.status_code == 401 and r.json()["error_code"] == 40101


async def test_coordinator_errors_are_retried(env: Env) -> None:
    """DescribeGroups answering COORDINATOR_LOAD_IN_PROGRESS and FindCoordinator answering
    COORDINATOR_NOT_AVAILABLE are asked again; ListGroups goes to every broker; Kafka's refusal is 403."""
    mark = env.cluster.log.mark()
    env.cluster.error(ApiKey.DESCRIBE_GROUPS, 14, count=1)  # COORDINATOR_LOAD_IN_PROGRESS
    group = await env.get("consumer-groups", "ga-active")
    assert group["state"] == "STABLE"
    assert len(env.cluster.requests(ApiKey.DESCRIBE_GROUPS, since=mark)) == 2
    mark = env.cluster.log.mark()
    env.cluster.error(ApiKey.FIND_COORDINATOR, 15, count=1)  # COORDINATOR_NOT_AVAILABLE
    assert (await env.get("consumer-groups", "ga-active"))["state"] == "STABLE"
    assert len(env.cluster.requests(ApiKey.FIND_COORDINATOR, since=mark)) == 2
    mark = env.cluster.log.mark()
    await env.get("consumer-groups")
    assert sorted(e.node_id for e in env.cluster.requests(ApiKey.LIST_GROUPS, since=mark)) == [0, 1]
    env.cluster.error(ApiKey.DESCRIBE_GROUPS, 30, count=1)  # GROUP_AUTHORIZATION_FAILED: Kafka's refusal
    r = await env.http.get(env.url("consumer-groups", "ga-active"), headers=AUTH)
    assert r.status_code == 403 and r.json()["error_code"] == 40301, r.text
    env.cluster.error(ApiKey.DESCRIBE_GROUPS, 30, count=1)  # the list leaves such a group out, as Confluent's
    assert (await env.get("consumer-groups"))["data"] == []


async def test_group_admin_lists_only_consumer_groups_of_every_broker(env: Env) -> None:
    """The service layer alone: a non-consumer group (protocol type "connect") is not listed; this
    process's groups are added to the broker's list (for brokers that list only committed groups)."""
    gc = group_coordinator(env.cluster)
    gc.commit("ga-simple", "t", 0, 0)
    g = gc._get_or_create("ga-connect")
    g.protocol_type = "connect"
    from service.client.client import KafkaClient

    client = KafkaClient(env.cluster.bootstrap_servers)
    try:
        adm = GroupAdmin(client, local_groups=lambda: ["ga-local-only"])
        assert await adm.list_group_ids(lambda g: True) == ["ga-active", "ga-local-only", "ga-simple"]
        assert await adm.list_group_ids(lambda g: g != "ga-active") == ["ga-local-only", "ga-simple"]
        views = await adm.describe(["ga-local-only", "ga-simple", "ga-active"])
        assert [v.group_id for v in views] == ["ga-simple", "ga-active"]  # the local-only one does not exist
    finally:
        await client.close()
