"""Topic metadata and partition offsets for the Confluent REST Proxy v2 ``/topics`` endpoints (no HTTP here).

:class:`TopicCatalog` (one per tenant client) answers topic lists and descriptions from cached Metadata
responses: a full listing is kept for ``ttl`` seconds, so tools that probe ``GET /topics`` in a loop cost
one Metadata request per ``ttl``; a topic missing from the cache is looked up at once (a just-created topic
appears) and then joins the cached listing. Concurrent callers share one broker request per key.
Topic configs come from DescribeConfigs (cached likewise); offsets are always read live.

Offsets are taken the way the consumer engine takes end offsets (``service.fetch.oneshot.probe_fetch``):
the high watermark and the last stable offset come from a Fetch response, which every broker computes
correctly, while Tansu's ListOffsets(latest) miscounts multi-record batches and answers 0 under
read_committed. The beginning offset is ListOffsets(earliest), as Confluent's REST Proxy reports it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from service.client.client import KafkaClient
from service.client.errors import BrokerResponseError, NoCommonVersionError
from service.consumer.subscription import TopicPartition
from service.errors import GatewayError
from service.fetch.offsets import PartitionOffsets, read_offsets
from service.protocol import error_codes as EC
from service.protocol import messages as M

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 5.0
# Kafka's legal topic names; anything else cannot exist, so it is answered without asking the broker.
TOPIC_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def is_legal_topic_name(name: str) -> bool:
    """Kafka's rules for a topic name (the one definition): 1-249 of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``."""
    return TOPIC_NAME_RE.fullmatch(name) is not None and name not in (".", "..")


RESOURCE_TOPIC = 2  # DescribeConfigs resource type
# Metadata answers for one topic that mean "no such topic" (not an access or broker problem).
_MISSING_CODES = frozenset({EC.UNKNOWN_TOPIC_OR_PARTITION, 17})  # 17: INVALID_TOPIC_EXCEPTION

_ListTopic = M.struct("ListOffsetsRequest", "ListOffsetsTopic")
_ListPartition = M.struct("ListOffsetsRequest", "ListOffsetsPartition")
_MetaTopic = M.struct("MetadataRequest", "MetadataRequestTopic")
_ConfigResource = M.struct("DescribeConfigsRequest", "DescribeConfigsResource")


class TopicNotFound(GatewayError):
    status = 404
    error_code = 40401


class PartitionNotFound(GatewayError):
    status = 404
    error_code = 40402


def require_legal_topic_name(name: str) -> None:
    """404/40401 for a name Kafka forbids: such a topic cannot exist, so the broker is never asked."""
    if not is_legal_topic_name(name):
        raise TopicNotFound(f"topic {name!r} not found (not a legal Kafka topic name)")


# -- views (pure) ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartitionView:
    partition: int
    leader: int  # -1: no leader
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """Confluent v2 ``GetPartitionResponse``: partition, leader, replicas [{broker, leader, in_sync}]."""
        return {
            "partition": self.partition,
            "leader": self.leader,
            "replicas": [{"broker": b, "leader": b == self.leader, "in_sync": b in self.isr} for b in self.replicas],
        }


@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    internal: bool
    partitions: tuple[PartitionView, ...]  # by partition number

    def partition(self, partition: int) -> PartitionView | None:
        for p in self.partitions:
            if p.partition == partition:
                return p
        return None

    def to_json(self, configs: dict[str, str | None]) -> dict[str, Any]:
        """Confluent v2 ``GetTopicResponse``: name, configs (name → value), partitions."""
        return {"name": self.name, "configs": configs, "partitions": [p.to_json() for p in self.partitions]}


def topic_view(t: Any) -> TopicView:
    """A view of one topic of a decoded MetadataResponse."""
    parts = sorted(
        (PartitionView(p.partition_index, p.leader_id if p.leader_id >= 0 else -1,
                       tuple(p.replica_nodes), tuple(p.isr_nodes)) for p in t.partitions),
        key=lambda p: p.partition,
    )
    return TopicView(t.name, bool(getattr(t, "is_internal", False)), tuple(parts))


def topics_from_metadata(resp: Any) -> dict[str, TopicView]:
    """The existing topics of an all-topics MetadataResponse (topics answered with an error are left out,
    except LEADER_NOT_AVAILABLE: such a topic exists, its leaders are being elected)."""
    out: dict[str, TopicView] = {}
    for t in resp.topics:
        if t.name is None or (t.error_code and t.error_code != EC.LEADER_NOT_AVAILABLE):
            continue
        out[t.name] = topic_view(t)
    return out


def visible_topic_names(topics: Iterable[TopicView], allowed: Callable[[str], bool]) -> list[str]:
    """Sorted names of the non-internal topics a tenant may see (Confluent lists topics without the
    internal ones: the Admin client's listTopics() default)."""
    return sorted(t.name for t in topics if not t.internal and allowed(t.name))


def configs_from_response(resp: Any, topic: str) -> dict[str, str | None]:
    """name → value of a DescribeConfigsResponse for one topic (sensitive values are null, as in Kafka)."""
    for r in resp.results:
        if r.resource_name != topic:
            continue
        if r.error_code:
            raise BrokerResponseError(r.error_code, f"DescribeConfigs {topic}", r.error_message)
        return {c.name: c.value for c in sorted(r.configs, key=lambda c: c.name)}
    return {}


# -- a small TTL cache with shared in-flight loads -----------------------------------------------------------
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values loaded on demand and kept ``ttl`` seconds. Concurrent loads of one key share one load (a
    caller that gives up does not cancel it for the others); a failed load is not cached."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._values: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Task[V]] = {}
        self._generation = 0  # bumped by discard(): loads started before it do not store their value
        self.loads = 0  # loads started (for tests and metrics)

    def peek(self, key: K) -> V | None:
        """The value if it is fresh, else None (no load)."""
        entry = self._values.get(key)
        if entry is None:
            return None
        if self.clock() - entry[0] >= self.ttl:
            del self._values[key]
            return None
        return entry[1]

    def put(self, key: K, value: V) -> None:
        self._values[key] = (self.clock(), value)

    def replace(self, key: K, value: V) -> None:
        """Change a cached value without making it any younger."""
        entry = self._values.get(key)
        if entry is not None:
            self._values[key] = (entry[0], value)

    def clear(self) -> None:
        self._values.clear()

    def discard(self, key: K) -> None:
        """Forget ``key``'s value; a load of it already in flight still answers its waiters but neither
        stores its value nor serves later callers (they start a new load)."""
        self._values.pop(key, None)
        self._loading.pop(key, None)
        self._generation += 1

    async def get(self, key: K, load: Callable[[], Awaitable[V]], *, fresh: bool = False,
                  keep: Callable[[V], bool] | None = None) -> V:
        """The cached value, or the result of ``load()`` (joined if one is in flight). ``fresh`` skips the
        cached value; ``keep`` decides whether a loaded value is cached (default: always)."""
        if not fresh:
            entry = self._values.get(key)
            if entry is not None and self.clock() - entry[0] < self.ttl:
                return entry[1]
        task = self._loading.get(key)
        if task is None:
            task = asyncio.ensure_future(self._load(key, load, keep, self._generation))
            self._loading[key] = task
            task.add_done_callback(lambda t: self._loaded(key, t))
            self.loads += 1
        return await asyncio.shield(task)

    async def _load(self, key: K, load: Callable[[], Awaitable[V]], keep: Callable[[V], bool] | None,
                    generation: int) -> V:
        value = await load()
        if generation == self._generation and (keep is None or keep(value)):
            self.put(key, value)
        return value

    def _loaded(self, key: K, task: asyncio.Task[V]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have given up


# -- the catalog -----------------------------------------------------------------------------------------
class TopicCatalog:
    """A tenant's cached view of its cluster's topics (see the module docstring)."""

    def __init__(self, client: KafkaClient, ttl: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._listing: TtlCache[None, dict[str, TopicView]] = TtlCache(ttl, clock)
        self._topics: TtlCache[str, TopicView | None] = TtlCache(ttl, clock)
        self._configs: TtlCache[str, dict[str, str | None]] = TtlCache(ttl, clock)
        self._no_describe_configs = False

    @property
    def metadata_requests(self) -> int:
        return self._listing.loads + self._topics.loads

    async def list_topics(self) -> list[TopicView]:
        listing = await self._listing.get(None, self._load_all)
        return list(listing.values())

    async def topic(self, name: str, *, fresh: bool = False) -> TopicView:
        """The topic from the cache, else (or with ``fresh``) from the broker; TopicNotFound if none."""
        require_legal_topic_name(name)
        if not fresh:
            listing = self._listing.peek(None)
            if listing is not None and name in listing:
                return listing[name]
        view = await self._topics.get(name, lambda: self._load_one(name), fresh=fresh,
                                      keep=lambda v: v is not None)
        if view is None:
            raise TopicNotFound(f"topic {name!r} not found")
        return view

    async def partition(self, topic: str, partition: int) -> PartitionView:
        view = await self.topic(topic)
        p = view.partition(partition)
        if p is None:
            # perhaps added since the cache was filled
            p = (await self.topic(topic, fresh=True)).partition(partition)
        if p is None:
            raise PartitionNotFound(f"partition {partition} of topic {topic!r} not found")
        return p

    async def configs(self, topic: str) -> dict[str, str | None]:
        """The topic's configuration (DescribeConfigs; ``{}`` from a broker without that API)."""
        if self._no_describe_configs:
            return {}
        return await self._configs.get(topic, lambda: self._load_configs(topic))

    def forget(self, topic: str) -> None:
        """Drop the cached listing and what is cached about ``topic`` (after it was created or deleted
        through the gateway): the next read asks the broker."""
        self._listing.discard(None)
        self._topics.discard(topic)
        self._configs.discard(topic)

    async def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        await self.partition(topic, partition)
        return await read_offsets(self.client, TopicPartition(topic, partition))

    # -- loads ---------------------------------------------------------------------------------------------
    async def _load_all(self) -> dict[str, TopicView]:
        resp = await self.client.send_any(M.MetadataRequest(topics=None, allow_auto_topic_creation=False))
        self._topics.clear()  # the listing supersedes single-topic lookups
        return topics_from_metadata(resp)

    async def _load_one(self, name: str) -> TopicView | None:
        resp = await self.client.send_any(
            M.MetadataRequest(topics=[_MetaTopic(name=name)], allow_auto_topic_creation=False))
        t = next((t for t in resp.topics if t.name == name), None)
        view: TopicView | None = None
        if t is None or t.error_code in _MISSING_CODES:
            view = None
        elif t.error_code and t.error_code != EC.LEADER_NOT_AVAILABLE:
            raise BrokerResponseError(t.error_code, f"Metadata {name}")
        else:
            view = topic_view(t)
        # Keep a cached listing consistent with what was just learnt (a new topic appears, a deleted one goes).
        listing = self._listing.peek(None)
        if listing is not None and (view is None) == (name in listing):
            listing = dict(listing)
            if view is None:
                del listing[name]
            else:
                listing[name] = view
            self._listing.replace(None, listing)
        return view

    async def _load_configs(self, topic: str) -> dict[str, str | None]:
        req = M.DescribeConfigsRequest(resources=[_ConfigResource(
            resource_type=RESOURCE_TOPIC, resource_name=topic, configuration_keys=None)])
        try:
            resp = await self.client.send_any(req)
        except NoCommonVersionError:
            log.info("the broker does not support DescribeConfigs: topic configs are reported as {}")
            self._no_describe_configs = True
            return {}
        return configs_from_response(resp, topic)


