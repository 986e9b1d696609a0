"""service/cluster/topic_admin.py (v3 topic administration) and TopicCatalog.forget, with a fake client (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.client.errors import BrokerResponseError
from service.client.metadata import BrokerInfo, ClusterMetadata
from service.cluster.topic_admin import (
    AdminRefused,
    ConfigEntry,
    ConfigSynonym,
    ResourceNotFound,
    TopicAdmin,
    check_assignments,
    check_counts,
    config_entries,
    validate_topic_name,
)
from service.cluster.topics import TopicCatalog, TtlCache, visible_topic_names
from service.protocol import error_codes as EC
from service.protocol import messages as M

Topic = M.struct("MetadataResponse", "MetadataResponseTopic")
Part = M.struct("MetadataResponse", "MetadataResponsePartition")
Result = M.struct("DescribeConfigsResponse", "DescribeConfigsResult")
Entry = M.struct("DescribeConfigsResponse", "DescribeConfigsResourceResult")
Synonym = M.struct("DescribeConfigsResponse", "DescribeConfigsSynonym")
Created = M.struct("CreateTopicsResponse", "CreatableTopicResult")
Deleted = M.struct("DeleteTopicsResponse", "DeletableTopicResult")


# -- pure checks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad[x]", "sp ace", "é", "a/b", "__consumer_offsets"])
def test_invalid_topic_names_are_refused(name: str) -> None:
    with pytest.raises(AdminRefused) as info:
        validate_topic_name(name)
    assert (info.value.status, info.value.error_code) == (400, 40002)


@pytest.mark.parametrize("name", ["a", "a" * 249, "A.b-c_9", "...", "_x"])
def test_legal_topic_names_pass(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("partitions,rf,brokers", [(0, 1, 1), (-2, 1, 1), (1, 0, 1), (1, -3, 1), (1, 2, 1),
                                                   (3, 4, 3)])
def test_bad_counts_are_refused(partitions: int, rf: int, brokers: int) -> None:
    with pytest.raises(AdminRefused):
        check_counts(partitions, rf, brokers)


@pytest.mark.parametrize("partitions,rf,brokers", [(1, 1, 1), (-1, -1, 1), (12, 3, 3), (1, 5, 0)])
def test_good_counts_pass(partitions: int, rf: int, brokers: int) -> None:
    check_counts(partitions, rf, brokers)


@pytest.mark.parametrize("assignments", [{1: [1]}, {0: [1], 1: [1, 2]}, {0: []}, {0: [1, 1]}, {0: [9]}])
def test_bad_assignments_are_refused(assignments: dict[int, list[int]]) -> None:
    with pytest.raises(AdminRefused):
        check_assignments(assignments, {1, 2})


def test_config_entries_map_sources_defaults_and_sensitive_values() -> None:
    resp = M.DescribeConfigsResponse(results=[Result(error_code=0, resource_type=2, resource_name="t", configs=[
        Entry(name="retention.ms", value="1000", read_only=False, config_source=1, is_sensitive=False,
              synonyms=[Synonym(name="retention.ms", value="1000", source=1),
                        Synonym(name="log.retention.ms", value="5", source=5)]),
        Entry(name="cleanup.policy", value="delete", read_only=True, config_source=5, is_sensitive=False),
        Entry(name="secret", value="hunter2", read_only=False, config_source=99, is_sensitive=True),
    ])])
    entries = config_entries(resp, "t")
    assert [e.name for e in entries] == ["cleanup.policy", "retention.ms", "secret"]
    assert entries[0] == ConfigEntry("cleanup.policy", "delete", True, True, False, "DEFAULT_CONFIG", ())
    assert entries[1] == ConfigEntry("retention.ms", "1000", False, False, False, "DYNAMIC_TOPIC_CONFIG", (
        ConfigSynonym("retention.ms", "1000", "DYNAMIC_TOPIC_CONFIG"),
        ConfigSynonym("log.retention.ms", "5", "DEFAULT_CONFIG")))
    assert (entries[2].value, entries[2].is_sensitive, entries[2].source) == (None, True, "UNKNOWN")
    err = M.DescribeConfigsResponse(results=[Result(error_code=EC.UNKNOWN_TOPIC_OR_PARTITION, resource_type=2,
                                                    resource_name="t", configs=[])])
    with pytest.raises(BrokerResponseError):
        config_entries(err, "t")


# -- the admin with a fake client ----------------------------------------------------------------------------
class FakeAdminClient:
    """One broker (node 1, the controller); CreateTopics/DeleteTopics change ``topics``; counts requests."""

    def __init__(self) -> None:
        self.topics: dict[str, int] = {"old": 2}
        self.requests: list[Any] = []
        self.invalidated: list[str | None] = []
        self.metadata = ClusterMetadata()
        self.metadata.brokers = {1: BrokerInfo(1, "h", 9092)}
        self.metadata.controller_id = 1
        self.configs: dict[str, list[Any]] = {}

    async def ensure_metadata(self, topics: Any = ()) -> ClusterMetadata:
        return self.metadata

    def invalidate(self, topic: str | None = None) -> None:
        self.invalidated.append(topic)

    async def send(self, node: int, req: Any, version: int | None = None, timeout: float | None = None) -> Any:
        assert node == 1
        return await self.send_any(req)

    async def send_any(self, req: Any, version: int | None = None, timeout: float | None = None) -> Any:
        name = type(req).__name__
        self.requests.append(req)
        if name == "MetadataRequest":
            names = list(self.topics) if req.topics is None else [t.name for t in req.topics]
            return M.MetadataResponse(brokers=[], topics=[
                Topic(name=n, error_code=0, partitions=[Part(partition_index=i, leader_id=1, replica_nodes=[1],
                                                             isr_nodes=[1]) for i in range(self.topics[n])])
                if n in self.topics else Topic(name=n, error_code=EC.UNKNOWN_TOPIC_OR_PARTITION, partitions=[])
                for n in names])
        if name == "CreateTopicsRequest":
            t = req.topics[0]
            if t.name in self.topics:
                return M.CreateTopicsResponse(topics=[Created(name=t.name, error_code=EC.TOPIC_ALREADY_EXISTS)])
            if any(c.name == "bogus" for c in t.configs):
                return M.CreateTopicsResponse(topics=[Created(name=t.name, error_code=40, error_message="bogus")])
            n = t.num_partitions if t.num_partitions > 0 else (len(t.assignments) or 3)
            self.topics[t.name] = n
            return M.CreateTopicsResponse(topics=[Created(name=t.name, error_code=0, num_partitions=n,
                                                          replication_factor=1)])
        if name == "DeleteTopicsRequest":
            n = req.topics[0].name
            code = 0 if self.topics.pop(n, None) is not None else EC.UNKNOWN_TOPIC_OR_PARTITION
            return M.DeleteTopicsResponse(responses=[Deleted(name=n, error_code=code)])
        if name == "DescribeConfigsRequest":
            r = req.resources[0]
            assert req.include_synonyms
            return M.DescribeConfigsResponse(results=[Result(
                error_code=0, resource_type=2, resource_name=r.resource_name,
                configs=self.configs.get(r.resource_name, []))])
        raise AssertionError(name)

    def sent(self, name: str) -> list[Any]:
        return [r for r in self.requests if type(r).__name__ == name]


@pytest.fixture
def client() -> FakeAdminClient:
    return FakeAdminClient()


def make(client: FakeAdminClient) -> tuple[TopicAdmin, TopicCatalog]:
    cat = TopicCatalog(client, ttl=60.0)  # type: ignore[arg-type]
    return TopicAdmin(client, cat), cat  # type: ignore[arg-type]


async def test_create_is_seen_at_once_by_a_cached_listing(client: FakeAdminClient) -> None:
    admin, cat = make(client)
    assert visible_topic_names(await cat.list_topics(), lambda n: True) == ["old"]  # listing cached (60 s)
    created = await admin.create_topic("new", 4, 1, {"cleanup.policy": "compact"})
    assert (created.name, created.partitions_count, created.replication_factor) == ("new", 4, 1)
    req = client.sent("CreateTopicsRequest")[0]
    assert [(c.name, c.value) for c in req.topics[0].configs] == [("cleanup.policy", "compact")]
    assert not req.validate_only
    assert visible_topic_names(await cat.list_topics(), lambda n: True) == ["new", "old"]
    assert client.invalidated == ["new"]


async def test_delete_is_seen_at_once_and_unknown_topics_are_404(client: FakeAdminClient) -> None:
    admin, cat = make(client)
    assert len((await cat.topic("old")).partitions) == 2
    await cat.list_topics()
    await admin.delete_topic("old")
    assert visible_topic_names(await cat.list_topics(), lambda n: True) == []
    with pytest.raises(ResourceNotFound) as info:
        await admin.topic("old")
    assert (info.value.status, info.value.error_code) == (404, 404)
    with pytest.raises(ResourceNotFound):
        await admin.delete_topic("old")


async def test_create_refusals(client: FakeAdminClient) -> None:
    admin, _ = make(client)
    for call in (admin.create_topic("old", 1, 1), admin.create_topic("x", 1, 1, {"bogus": "1"}),
                 admin.create_topic("x", 1, 2), admin.create_topic("x", 0, 1), admin.create_topic("bad[x]")):
        with pytest.raises(AdminRefused) as info:
            await call
        assert info.value.error_code == 40002
    assert "already exists" in str((await _refusal(admin.create_topic("old"))).message)
    # the gateway's own checks never reached the broker
    assert [r.topics[0].name for r in client.sent("CreateTopicsRequest")] == ["old", "x", "old"]


async def _refusal(call: Any) -> AdminRefused:
    try:
        await call
    except AdminRefused as exc:
        return exc
    raise AssertionError("not refused")


async def test_validate_only_never_sends_create_topics(client: FakeAdminClient) -> None:
    admin, _ = make(client)
    created = await admin.create_topic("dry", 2, 1, validate_only=True)
    assert (created.partitions_count, created.replication_factor) == (2, 1)
    assert client.sent("CreateTopicsRequest") == [] and "dry" not in client.topics
    with pytest.raises(AdminRefused):
        await admin.create_topic("old", 2, 1, validate_only=True)


async def test_assignments_replace_counts(client: FakeAdminClient) -> None:
    admin, _ = make(client)
    created = await admin.create_topic("asg", assignments={0: [1], 1: [1]})
    assert created.partitions_count == 2
    t = client.sent("CreateTopicsRequest")[0].topics[0]
    assert (t.num_partitions, t.replication_factor) == (-1, -1)
    assert [(a.partition_index, a.broker_ids) for a in t.assignments] == [(0, [1]), (1, [1])]
    with pytest.raises(AdminRefused):
        await admin.create_topic("asg2", 2, -1, assignments={0: [1]})


async def test_topic_configs_need_an_existing_topic(client: FakeAdminClient) -> None:
    admin, _ = make(client)
    client.configs["old"] = [Entry(name="cleanup.policy", value="compact", read_only=False, config_source=1,
                                   is_sensitive=False)]
    entries = await admin.topic_configs("old")
    assert [(e.name, e.value, e.source, e.is_default) for e in entries] == [
        ("cleanup.policy", "compact", "DYNAMIC_TOPIC_CONFIG", False)]
    with pytest.raises(ResourceNotFound):
        await admin.topic_configs("missing")  # some brokers answer an unknown topic with no configs, no error


async def test_discard_keeps_an_in_flight_load_from_storing_its_value() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0)
    gate = asyncio.Event()

    async def stale() -> int:
        await gate.wait()
        return 1

    async def fresh() -> int:
        return 2

    waiter = asyncio.ensure_future(cache.get("k", stale))
    await asyncio.sleep(0)  # let the load start
    cache.discard("k")
    assert await cache.get("k", fresh) == 2  # a new load, not joined to the stale one
    gate.set()
    assert await waiter == 1  # the stale load still answers its own waiter
    assert cache.peek("k") == 2  # but did not overwrite the fresh value


async def test_an_answer_without_the_topic_is_a_broker_error(client: FakeAdminClient) -> None:
    """A CreateTopics/DeleteTopics answer that leaves the topic out is UNKNOWN_SERVER_ERROR (it used to raise
    AttributeError: the code had no name in error_codes)."""
    admin, _ = make(client)
    real = client.send_any

    async def empty(req: Any, version: int | None = None, timeout: float | None = None) -> Any:
        name = type(req).__name__
        if name == "CreateTopicsRequest":
            return M.CreateTopicsResponse(topics=[])
        if name == "DeleteTopicsRequest":
            return M.DeleteTopicsResponse(responses=[])
        return await real(req, version, timeout)

    client.send_any = empty  # type: ignore[method-assign]
    for call in (admin.create_topic("new", 1, 1), admin.delete_topic("old")):
        with pytest.raises(BrokerResponseError) as info:
            await call
        assert info.value.code == EC.UNKNOWN_SERVER_ERROR == -1
