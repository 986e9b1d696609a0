"""Pure parts of the /topics endpoints (service/cluster/topics.py): response shapes, filtering, the TTL cache and the
catalog's caching decisions, with a fake client and an injected clock (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.client.connection import ConnectionConfig
from service.client.errors import BrokerResponseError, NoBrokersAvailableError, NoCommonVersionError
from service.cluster.topics import (
    PartitionNotFound,
    PartitionOffsets,
    PartitionView,
    TopicCatalog,
    TopicNotFound,
    TopicView,
    TtlCache,
    configs_from_response,
    topics_from_metadata,
    visible_topic_names,
)
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.tenants import Tenant

Topic = M.struct("MetadataResponse", "MetadataResponseTopic")
Part = M.struct("MetadataResponse", "MetadataResponsePartition")
Result = M.struct("DescribeConfigsResponse", "DescribeConfigsResult")
Entry = M.struct("DescribeConfigsResponse", "DescribeConfigsResourceResult")


def mtopic(name: str, partitions: int = 1, *, internal: bool = False, error: int = 0, leader: int = 1,
           replicas: tuple[int, ...] = (1,), isr: tuple[int, ...] = (1,)) -> Any:
    return Topic(name=name, error_code=error, is_internal=internal, partitions=[
        Part(partition_index=i, leader_id=leader, replica_nodes=list(replicas), isr_nodes=list(isr))
        for i in reversed(range(partitions))])  # out of order on purpose


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- shapes ------------------------------------------------------------------------------------------------
def test_partition_shape_matches_confluent_get_partition_response() -> None:
    p = PartitionView(3, leader=2, replicas=(1, 2, 3), isr=(2, 3))
    assert p.to_json() == {"partition": 3, "leader": 2, "replicas": [
        {"broker": 1, "leader": False, "in_sync": False},
        {"broker": 2, "leader": True, "in_sync": True},
        {"broker": 3, "leader": False, "in_sync": True}]}


def test_topic_shape_matches_confluent_get_topic_response() -> None:
    resp = M.MetadataResponse(brokers=[], topics=[mtopic("t", 3, leader=-1, replicas=(7,), isr=())])
    view = topics_from_metadata(resp)["t"]
    body = view.to_json({"retention.ms": "1000", "secret": None})
    assert list(body) == ["name", "configs", "partitions"]
    assert body["name"] == "t" and body["configs"] == {"retention.ms": "1000", "secret": None}
    assert [p["partition"] for p in body["partitions"]] == [0, 1, 2]  # sorted
    assert body["partitions"][0] == {"partition": 0, "leader": -1,
                                     "replicas": [{"broker": 7, "leader": False, "in_sync": False}]}
    assert view.partition(2) is not None and view.partition(3) is None


def test_offsets_shape() -> None:
    assert PartitionOffsets(1, 10, 7).to_json() == {"beginning_offset": 1, "end_offset": 10, "last_stable_offset": 7}


# -- filtering ---------------------------------------------------------------------------------------------
def test_listing_leaves_out_internal_and_failed_topics_and_follows_tenant_patterns() -> None:
    resp = M.MetadataResponse(brokers=[], topics=[
        mtopic("b-orders"), mtopic("a-orders"), mtopic("a-new", error=EC.LEADER_NOT_AVAILABLE),
        mtopic("__consumer_offsets", 50, internal=True), mtopic("a-denied", error=EC.TOPIC_AUTHORIZATION_FAILED),
        mtopic("c-other")])
    topics = topics_from_metadata(resp)
    assert set(topics) == {"b-orders", "a-orders", "a-new", "__consumer_offsets", "c-other"}
    assert visible_topic_names(topics.values(), lambda n: True) == ["a-new", "a-orders", "b-orders", "c-other"]
    tenant = Tenant("ta", "x:1", ConnectionConfig(), topics=["a-*", "re:c-.*"])
    assert visible_topic_names(topics.values(), tenant.allows_topic) == ["a-new", "a-orders", "c-other"]


def test_configs_from_describe_configs() -> None:
    resp = M.DescribeConfigsResponse(results=[
        Result(error_code=0, resource_type=2, resource_name="other", configs=[Entry(name="x", value="1")]),
        Result(error_code=0, resource_type=2, resource_name="t", configs=[
            Entry(name="retention.ms", value="5"), Entry(name="cleanup.policy", value="compact"),
            Entry(name="sasl.secret", value=None, is_sensitive=True)])])
    assert configs_from_response(resp, "t") == {"cleanup.policy": "compact", "retention.ms": "5", "sasl.secret": None}
    assert list(configs_from_response(resp, "t")) == ["cleanup.policy", "retention.ms", "sasl.secret"]
    failed = M.DescribeConfigsResponse(results=[Result(error_code=EC.UNKNOWN_TOPIC_OR_PARTITION,
                                                       error_message="gone", resource_type=2, resource_name="t")])
    with pytest.raises(BrokerResponseError) as info:
        configs_from_response(failed, "t")
    assert info.value.code == EC.UNKNOWN_TOPIC_OR_PARTITION


# -- the TTL cache -----------------------------------------------------------------------------------------
async def test_ttl_cache_keeps_values_for_ttl() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(5.0, clock)
    n = 0

    async def load() -> int:
        nonlocal n
        n += 1
        return n

    assert await cache.get("k", load) == 1
    clock.now += 4.9
    assert await cache.get("k", load) == 1 and cache.peek("k") == 1
    clock.now += 0.1
    assert cache.peek("k") is None
    assert await cache.get("k", load) == 2
    assert await cache.get("k", load, fresh=True) == 3
    assert await cache.get("other", load) == 4
    assert cache.loads == 4


async def test_ttl_cache_shares_one_load_between_concurrent_callers() -> None:
    cache: TtlCache[str, str] = TtlCache(5.0, Clock())
    release, entered = asyncio.Event(), asyncio.Event()
    calls = 0

    async def load() -> str:
        nonlocal calls
        calls += 1
        entered.set()
        await release.wait()
        return "v"

    waiters = [asyncio.create_task(cache.get("k", load)) for _ in range(20)]
    await entered.wait()  # the load runs after every waiter joined it (tasks run in creation order)
    waiters[0].cancel()  # one caller giving up does not cancel the load for the others
    release.set()
    results = await asyncio.gather(*waiters[1:])
    assert results == ["v"] * 19 and calls == 1
    assert waiters[0].cancelled()


async def test_ttl_cache_does_not_keep_failures_or_refused_values() -> None:
    cache: TtlCache[str, int | None] = TtlCache(5.0, Clock())
    release, entered = asyncio.Event(), asyncio.Event()
    attempts = 0

    async def failing() -> int | None:
        nonlocal attempts
        attempts += 1
        entered.set()
        await release.wait()
        raise NoBrokersAvailableError("down")

    waiters = [asyncio.create_task(cache.get("k", failing)) for _ in range(3)]
    await entered.wait()
    release.set()
    for r in await asyncio.gather(*waiters, return_exceptions=True):
        assert isinstance(r, NoBrokersAvailableError)
    assert attempts == 1

    async def none() -> int | None:
        return None

    assert await cache.get("k", none, keep=lambda v: v is not None) is None
    assert cache.peek("k") is None

    async def seven() -> int | None:
        return 7

    assert await cache.get("k", seven) == 7 and cache.peek("k") == 7


# -- the catalog with a fake client ------------------------------------------------------------------------
class FakeClient:
    """Answers Metadata from ``self.topics`` and DescribeConfigs from ``self.configs``; counts requests."""

    def __init__(self) -> None:
        self.topics: dict[str, Any] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.requests: list[tuple[str, Any]] = []
        self.down = False
        self.describe_configs_supported = True
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def send_any(self, req: Any, version: int | None = None, timeout: float | None = None) -> Any:
        name = type(req).__name__
        self.requests.append((name, req))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise NoBrokersAvailableError("no broker reachable")
        if name == "MetadataRequest":
            if req.topics is None:
                return M.MetadataResponse(brokers=[], topics=list(self.topics.values()))
            return M.MetadataResponse(brokers=[], topics=[
                self.topics.get(t.name) or Topic(name=t.name, error_code=EC.UNKNOWN_TOPIC_OR_PARTITION, partitions=[])
                for t in req.topics])
        if name == "DescribeConfigsRequest":
            if not self.describe_configs_supported:
                raise NoCommonVersionError("the broker does not support DescribeConfigs (api key 32)")
            r = req.resources[0]
            return M.DescribeConfigsResponse(results=[Result(
                error_code=0, resource_type=2, resource_name=r.resource_name,
                configs=[Entry(name=k, value=v) for k, v in self.configs.get(r.resource_name, {}).items()])])
        raise AssertionError(name)

    def count(self, name: str, *, all_topics: bool | None = None) -> int:
        return sum(1 for n, r in self.requests if n == name and (
            all_topics is None or (r.topics is None) == all_topics))


@pytest.fixture
def fake() -> FakeClient:
    c = FakeClient()
    c.topics = {"a": mtopic("a", 2), "__consumer_offsets": mtopic("__consumer_offsets", internal=True)}
    return c


async def test_listing_is_cached_for_the_ttl(fake: FakeClient) -> None:
    clock = Clock()
    cat = TopicCatalog(fake, ttl=5.0, clock=clock)  # type: ignore[arg-type]
    for _ in range(50):
        names = visible_topic_names(await cat.list_topics(), lambda n: True)
        assert names == ["a"]
    assert fake.count("MetadataRequest") == 1
    fake.topics["b"] = mtopic("b")
    clock.now += 5.0
    assert visible_topic_names(await cat.list_topics(), lambda n: True) == ["a", "b"]
    assert fake.count("MetadataRequest") == 2


async def test_concurrent_listings_share_one_metadata_request(fake: FakeClient) -> None:
    cat = TopicCatalog(fake, ttl=5.0, clock=Clock())  # type: ignore[arg-type]
    fake.gate = asyncio.Event()
    tasks = [asyncio.create_task(cat.list_topics()) for _ in range(30)]
    await fake.entered.wait()
    fake.gate.set()
    for r in await asyncio.gather(*tasks):
        assert sorted(t.name for t in r) == ["__consumer_offsets", "a"]
    assert fake.count("MetadataRequest") == 1


async def test_a_topic_missing_from_the_cache_is_looked_up_and_joins_the_listing(fake: FakeClient) -> None:
    clock = Clock()
    cat = TopicCatalog(fake, ttl=5.0, clock=clock)  # type: ignore[arg-type]
    await cat.list_topics()
    assert (await cat.topic("a")).name == "a"  # from the listing
    assert fake.count("MetadataRequest") == 1
    fake.topics["new"] = mtopic("new", 3)  # created after the listing
    view = await cat.topic("new")
    assert [p.partition for p in view.partitions] == [0, 1, 2]
    assert fake.count("MetadataRequest", all_topics=False) == 1
    assert "new" in {t.name for t in await cat.list_topics()}  # the cached listing learnt it
    await cat.topic("new")
    assert fake.count("MetadataRequest") == 2  # no request for either
    # a topic deleted and looked up again leaves the listing too
    del fake.topics["a"]
    with pytest.raises(TopicNotFound):
        await cat.topic("a", fresh=True)
    assert "a" not in {t.name for t in await cat.list_topics()}
    # learning about a topic does not make the listing any younger
    await cat.list_topics()
    assert fake.count("MetadataRequest", all_topics=True) == 1
    clock.now += 3.0
    fake.topics["newer"] = mtopic("newer")
    await cat.topic("newer")
    assert "newer" in {t.name for t in await cat.list_topics()}
    assert fake.count("MetadataRequest", all_topics=True) == 1
    clock.now += 2.0  # 5 s after the listing was loaded
    await cat.list_topics()
    assert fake.count("MetadataRequest", all_topics=True) == 2


async def test_single_topic_lookups_are_cached_but_misses_are_not(fake: FakeClient) -> None:
    clock = Clock()
    cat = TopicCatalog(fake, ttl=5.0, clock=clock)  # type: ignore[arg-type]
    for _ in range(10):
        assert (await cat.topic("a")).name == "a"
    assert fake.count("MetadataRequest") == 1
    for _ in range(3):
        with pytest.raises(TopicNotFound) as info:
            await cat.topic("missing")
        assert (info.value.status, info.value.error_code) == (404, 40401)
    assert fake.count("MetadataRequest") == 4  # a miss asks every time: a just-created topic shows up at once
    fake.topics["missing"] = mtopic("missing")
    assert (await cat.topic("missing")).name == "missing"
    # names Kafka cannot have are refused without asking
    for bad in ("a b", "", "x" * 250, "../etc"):
        with pytest.raises(TopicNotFound):
            await cat.topic(bad)
    assert fake.count("MetadataRequest") == 5
    clock.now += 5.0
    await cat.topic("a")
    assert fake.count("MetadataRequest") == 6  # expired


async def test_partition_lookup_refreshes_once_before_answering_not_found(fake: FakeClient) -> None:
    cat = TopicCatalog(fake, ttl=5.0, clock=Clock())  # type: ignore[arg-type]
    assert (await cat.partition("a", 1)).partition == 1
    assert fake.count("MetadataRequest") == 1
    fake.topics["a"] = mtopic("a", 4)  # partitions added since
    assert (await cat.partition("a", 3)).partition == 3
    assert fake.count("MetadataRequest") == 2
    with pytest.raises(PartitionNotFound) as info:
        await cat.partition("a", 4)
    assert (info.value.status, info.value.error_code) == (404, 40402)
    with pytest.raises(PartitionNotFound):
        await cat.partition("a", -1)
    with pytest.raises(TopicNotFound):
        await cat.partition("nope", 0)


async def test_topic_errors_other_than_missing_are_raised(fake: FakeClient) -> None:
    cat = TopicCatalog(fake, ttl=5.0, clock=Clock())  # type: ignore[arg-type]
    fake.topics["secret"] = mtopic("secret", error=EC.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(BrokerResponseError) as info:
        await cat.topic("secret")
    assert info.value.code == EC.TOPIC_AUTHORIZATION_FAILED
    fake.topics["electing"] = mtopic("electing", error=EC.LEADER_NOT_AVAILABLE, leader=-1)
    assert (await cat.topic("electing")).partitions[0].leader == -1
    fake.down = True
    with pytest.raises(NoBrokersAvailableError):
        await cat.list_topics()
    with pytest.raises(NoBrokersAvailableError):
        await cat.topic("other")


async def test_configs_are_cached_and_empty_without_describe_configs(fake: FakeClient) -> None:
    clock = Clock()
    cat = TopicCatalog(fake, ttl=5.0, clock=clock)  # type: ignore[arg-type]
    fake.configs["a"] = {"retention.ms": "100"}
    for _ in range(5):
        assert await cat.configs("a") == {"retention.ms": "100"}
    assert fake.count("DescribeConfigsRequest") == 1
    req = next(r for n, r in fake.requests if n == "DescribeConfigsRequest")
    assert [(r.resource_type, r.resource_name, r.configuration_keys) for r in req.resources] == [(2, "a", None)]
    clock.now += 5.0
    fake.configs["a"] = {"retention.ms": "200"}
    assert await cat.configs("a") == {"retention.ms": "200"}
    fake.describe_configs_supported = False
    clock.now += 5.0
    assert await cat.configs("a") == {}
    assert await cat.configs("b") == {}
    assert fake.count("DescribeConfigsRequest") == 3  # not asked again once the broker said it cannot


async def test_ttl_zero_asks_every_time(fake: FakeClient) -> None:
    cat = TopicCatalog(fake, ttl=0.0, clock=Clock())  # type: ignore[arg-type]
    for _ in range(3):
        await cat.list_topics()
    assert fake.count("MetadataRequest") == 3


def test_views_are_immutable() -> None:
    v = TopicView("t", False, ())
    with pytest.raises(AttributeError):
        v.name = "u"  # type: ignore[misc]
