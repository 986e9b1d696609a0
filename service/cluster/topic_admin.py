"""Topic administration for the v3 API: create, delete, full config descriptions (no HTTP here).

:class:`TopicAdmin` works on a tenant's :class:`~service.client.client.KafkaClient` and its
:class:`~service.cluster.topics.TopicCatalog`: after a create or a delete the catalog forgets what it cached about the
topic (and its listing), and the client's metadata is marked stale, so the next read asks the broker.

The gateway checks what a broker might not (Tansu accepts names Kafka forbids, zero partitions, replication
factors above the broker count and ignores ``validate_only``): Kafka's topic-name rules, a partition count
and replication factor of at least 1 (or -1: the broker's default), a replication factor no larger than the
brokers in the metadata. A dry run (``validate_only``) is answered from these checks and the catalog; it never
sends CreateTopics, since a broker that ignores the flag would create the topic.

Tenant limits are checked before any of this (:func:`check_partitions_cap`: 422/42213 past
``GATEWAY_MAX_PARTITIONS_PER_TOPIC``; :func:`check_configs_allowed`: 422/42214 for a config outside the allow-list),
so a dry run answers them too.

Broker refusals map to Confluent's codes: 400/40002 for a topic that exists and for invalid partitions,
replication factors, configs, names or policy violations; 404 for a topic that does not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from service.client.client import KafkaClient
from service.client.errors import BrokerResponseError, NoCommonVersionError
from service.cluster.topics import RESOURCE_TOPIC, TopicCatalog, TopicNotFound, TopicView, is_legal_topic_name
from service.errors import GatewayError
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.protocol.primitives import ZERO_UUID

log = logging.getLogger(__name__)

#: Kafka's own internal topics: never created or deleted through the gateway.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
DEFAULT_TIMEOUT_MS = 30_000

# DescribeConfigs config_source / synonym source → the name Confluent's v3 API reports.
CONFIG_SOURCES = {
    0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
}

# Broker error codes that mean "the request is wrong" (Confluent: 400, 40002).
# 17 INVALID_TOPIC_EXCEPTION, 37-40, 42, 44
_REFUSALS = frozenset({EC.TOPIC_ALREADY_EXISTS, 17, 37, 38, 39, 40, 42, 44})

_Creatable = M.struct("CreateTopicsRequest", "CreatableTopic")
_CreatableConfig = M.struct("CreateTopicsRequest", "CreatableTopicConfig")
_Assignment = M.struct("CreateTopicsRequest", "CreatableReplicaAssignment")
_DeleteState = M.struct("DeleteTopicsRequest", "DeleteTopicState")
_ConfigResource = M.struct("DescribeConfigsRequest", "DescribeConfigsResource")


class AdminRefused(GatewayError):
    """The request cannot succeed as given (Confluent's Kafka bad request: 400, 40002)."""

    status = 400
    error_code = 40002


class TooManyPartitions(GatewayError):
    """A create asks for more partitions than ``GATEWAY_MAX_PARTITIONS_PER_TOPIC`` (422, 42213)."""

    status = 422
    error_code = 42213


class ConfigNotAllowed(GatewayError):
    """A create sets a topic config outside the allow-list (422, 42214); the message names it."""

    status = 422
    error_code = 42214


class ResourceNotFound(GatewayError):
    """A v3 resource (cluster, topic, partition, config, broker) that does not exist: Confluent's v3 answers
    404 with the bare status as the error code."""

    status = 404
    error_code = 404


# -- pure views ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: str


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None  # None for sensitive values, as Kafka answers them
    is_default: bool
    is_read_only: bool
    is_sensitive: bool
    source: str
    synonyms: tuple[ConfigSynonym, ...]


def config_source(code: int) -> str:
    return CONFIG_SOURCES.get(code, "UNKNOWN")


def config_entries(resp: Any, resource_name: str) -> list[ConfigEntry]:
    """The entries of one resource of a DescribeConfigsResponse, sorted by name (is_default as Kafka's Admin
    client reports it: the value comes from the default config). A resource answered with an error raises
    :class:`BrokerResponseError`."""
    for r in resp.results:
        if r.resource_name != resource_name:
            continue
        if r.error_code:
            raise BrokerResponseError(r.error_code, f"DescribeConfigs {resource_name}", r.error_message)
        out = []
        for c in sorted(r.configs, key=lambda c: c.name):
            source = config_source(c.config_source)
            synonyms = tuple(ConfigSynonym(s.name, s.value, config_source(s.source)) for s in c.synonyms or ())
            out.append(ConfigEntry(c.name, None if c.is_sensitive else c.value, source == "DEFAULT_CONFIG",
                                   bool(c.read_only), bool(c.is_sensitive), source, synonyms))
        return out
    return []


def validate_topic_name(name: str) -> None:
    """Kafka's rules for a topic name: 1-249 of ``[a-zA-Z0-9._-]``, not ``.`` or ``..`` (400, 40002)."""
    if not is_legal_topic_name(name):
        raise AdminRefused(f"invalid topic name {name!r}: use 1 to 249 of the characters a-z, A-Z, 0-9, '.', "
                           "'_', '-' (not '.' or '..')")
    if name in INTERNAL_TOPICS:
        raise AdminRefused(f"{name!r} is a Kafka internal topic")


def check_counts(partitions: int, replication_factor: int, brokers: int) -> None:
    """A partition count and replication factor of at least 1 or -1 (the broker's default); a replication
    factor no larger than the number of brokers (when any is known)."""
    if partitions == 0 or partitions < -1:
        raise AdminRefused(f"invalid partitions_count {partitions}: at least 1 (or -1 for the broker default)")
    if replication_factor == 0 or replication_factor < -1:
        raise AdminRefused(f"invalid replication_factor {replication_factor}: at least 1 (or -1 for the broker "
                           "default)")
    if brokers and replication_factor > brokers:
        raise AdminRefused(f"replication_factor {replication_factor} is larger than the {brokers} available "
                           f"broker{'s' if brokers != 1 else ''}")


def check_partitions_cap(partitions: int, cap: int) -> None:
    """At most ``cap`` partitions (``GATEWAY_MAX_PARTITIONS_PER_TOPIC``): 422/42213 beyond."""
    if partitions > cap:
        raise TooManyPartitions(f"partitions_count {partitions} is more than the {cap} partitions a topic may have "
                                "here (GATEWAY_MAX_PARTITIONS_PER_TOPIC)")


def check_configs_allowed(names: Sequence[str], allowed: Set[str]) -> None:
    """Every config name in ``allowed`` (``*`` in it: any); else 422/42214 naming the first one that is not."""
    if "*" in allowed:
        return
    for name in names:
        if name not in allowed:
            shown = ", ".join(sorted(allowed)) or "none"
            raise ConfigNotAllowed(f"topic config {name[:255]!r} may not be set through the gateway (allowed: {shown})")


def check_assignments(assignments: Mapping[int, Sequence[int]], brokers: set[int]) -> None:
    """Partitions 0..n-1, each with the same number (at least 1) of distinct, known brokers."""
    if sorted(assignments) != list(range(len(assignments))):
        raise AdminRefused("replicas_assignments must name partitions 0 to n-1, each once")
    sizes = {len(b) for b in assignments.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise AdminRefused("every partition of replicas_assignments needs the same number (at least 1) of brokers")
    for p, ids in assignments.items():
        if len(set(ids)) != len(ids):
            raise AdminRefused(f"replicas_assignments: partition {p} names a broker twice")
        unknown = set(ids) - brokers
        if brokers and unknown:
            raise AdminRefused(f"replicas_assignments: partition {p} names unknown brokers {sorted(unknown)}")


def refusal(exc: BrokerResponseError) -> GatewayError | BrokerResponseError:
    """The HTTP error for a broker's refusal of an admin request (others are left to the Kafka error mapping)."""
    if exc.code in _REFUSALS:
        if exc.broker_message:  # it may name brokers and hosts: logged, never answered
            log.warning("admin request refused: %s", exc)
        return AdminRefused(exc.public_message)
    return exc


@dataclass(frozen=True, slots=True)
class CreatedTopic:
    name: str
    partitions_count: int
    replication_factor: int


# -- the admin -----------------------------------------------------------------------------------------------
class TopicAdmin:
    """Create, delete and describe the configs of topics for one tenant client (see the module docstring)."""

    def __init__(self, client: KafkaClient, catalog: TopicCatalog, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self.client = client
        self.catalog = catalog
        self.timeout_ms = timeout_ms

    async def _to_controller(self, req: Any) -> Any:
        """Send to the controller when the metadata names one (Kafka before KRaft requires it), else anywhere."""
        await self.client.ensure_metadata()
        target = self.client.metadata.controller_id
        if target is not None and target >= 0 and self.client.metadata.broker(target) is not None:
            return await self.client.send(target, req)
        return await self.client.send_any(req)

    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           configs: Mapping[str, str | None] | None = None, *,
                           assignments: Mapping[int, Sequence[int]] | None = None,
                           validate_only: bool = False) -> CreatedTopic:
        """Create a topic. ``assignments`` (partition → broker ids) replaces the count and factor, which
        must then be -1, as in Kafka."""
        validate_topic_name(name)
        await self.client.ensure_metadata()
        brokers = self.client.metadata.brokers
        if assignments:
            if partitions != -1 or replication_factor != -1:
                raise AdminRefused("replicas_assignments excludes partitions_count and replication_factor")
            check_assignments(assignments, set(brokers))
            partitions = len(assignments)
            replication_factor = len(next(iter(assignments.values())))
        else:
            check_counts(partitions, replication_factor, len(brokers))
        if validate_only:
            if await self._exists(name):
                raise AdminRefused(f"Topic '{name}' already exists.")
            return CreatedTopic(name, partitions, replication_factor)
        req = M.CreateTopicsRequest(topics=[_Creatable(
            name=name, num_partitions=-1 if assignments else partitions,
            replication_factor=-1 if assignments else replication_factor,
            assignments=[_Assignment(partition_index=p, broker_ids=list(b)) for p, b in (assignments or {}).items()],
            configs=[_CreatableConfig(name=k, value=v) for k, v in (configs or {}).items()])],
            timeout_ms=self.timeout_ms, validate_only=False)
        try:
            resp = await self._to_controller(req)
        finally:
            self.forget(name)  # whatever happened, the next read asks the broker
        result = next((t for t in resp.topics if t.name == name), None)
        if result is None:
            raise BrokerResponseError(EC.UNKNOWN_SERVER_ERROR, f"CreateTopics {name}", "no result for the topic")
        if result.error_code == EC.TOPIC_ALREADY_EXISTS:
            raise AdminRefused(f"Topic '{name}' already exists.")
        if result.error_code:
            raise refusal(BrokerResponseError(result.error_code, f"CreateTopics {name}", result.error_message))
        # v5+ answers the partitions and replication factor the broker chose; older versions answer -1
        got_partitions = getattr(result, "num_partitions", -1)
        got_rf = getattr(result, "replication_factor", -1)
        return CreatedTopic(name, got_partitions if got_partitions > 0 else partitions,
                            got_rf if got_rf > 0 else replication_factor)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic; :class:`ResourceNotFound` if there is none."""
        validate_topic_name(name)
        req = M.DeleteTopicsRequest(topics=[_DeleteState(name=name, topic_id=ZERO_UUID)], topic_names=[name],
                                    timeout_ms=self.timeout_ms)
        try:
            resp = await self._to_controller(req)
        finally:
            self.forget(name)
        result = next((r for r in resp.responses if r.name in (name, None)), None)
        code = result.error_code if result is not None else EC.UNKNOWN_SERVER_ERROR
        if code == EC.UNKNOWN_TOPIC_OR_PARTITION:
            raise ResourceNotFound(f"Topic '{name}' cannot be found.")
        if code:
            raise refusal(BrokerResponseError(code, f"DeleteTopics {name}",
                                              getattr(result, "error_message", None)))

    async def topic_configs(self, name: str) -> list[ConfigEntry]:
        """Every config of an existing topic (DescribeConfigs with synonyms); ``[]`` from a broker without
        DescribeConfigs. :class:`ResourceNotFound` if the topic does not exist (asked of the catalog first:
        some brokers answer an unknown topic with no configs and no error)."""
        await self.topic(name)
        req = M.DescribeConfigsRequest(resources=[_ConfigResource(
            resource_type=RESOURCE_TOPIC, resource_name=name, configuration_keys=None)], include_synonyms=True)
        try:
            resp = await self.client.send_any(req)
        except NoCommonVersionError:
            return []
        try:
            return config_entries(resp, name)
        except BrokerResponseError as exc:
            if exc.code == EC.UNKNOWN_TOPIC_OR_PARTITION:
                self.forget(name)
                raise ResourceNotFound(f"Topic '{name}' cannot be found.") from None
            raise

    async def topic(self, name: str) -> TopicView:
        """The topic from the catalog; :class:`ResourceNotFound` if there is none."""
        try:
            return await self.catalog.topic(name)
        except TopicNotFound:
            raise ResourceNotFound(f"Topic '{name}' cannot be found.") from None

    async def _exists(self, name: str) -> bool:
        try:
            await self.catalog.topic(name, fresh=True)
        except GatewayError:
            return False
        return True

    def forget(self, name: str) -> None:
        """Drop what the catalog and the client's metadata know about ``name`` (after a create or delete)."""
        self.catalog.forget(name)
        self.client.invalidate(name)
