"""Confluent REST Proxy v3: clusters, brokers, topics (list/get/create/delete), partitions, replicas, topic
configs.

Thin routes: the tenant's cluster id and the envelopes come from :mod:`api.v3.common`, topic metadata from
the tenant's :class:`~service.cluster.topics.TopicCatalog` (as v2's ``/topics``), administration from
:class:`~service.cluster.topic_admin.TopicAdmin`. Tenant rules are v2's: a tenant's one cluster is its own, it sees and
touches only topics its patterns allow (403, 40301), internal topics are left out of lists. Creating and
deleting a topic also needs one of the tenant's ``admin_topics`` patterns (403, 40303), and a create is held to
``GATEWAY_MAX_PARTITIONS_PER_TOPIC`` (422, 42213) and the topic-config allow-list (422, 42214). An unknown cluster,
topic, partition, replica, broker or config is 404 with error code 404, as Confluent's v3 answers it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.auth import current_tenant
from api.deps import ErrorBody, runtime
from api.errors import documented_errors
from api.v2.topics import catalog
from api.v3.common import (
    Relationship,
    Resource,
    ResourceCollection,
    ResourceNotFound,
    crn,
    related,
    require_cluster,
    resource,
    resource_list,
    v3_json,
    v3_url,
)
from api.v3.common import cluster_id as tenant_cluster_id
from service.client.metadata import BrokerInfo
from service.cluster.topic_admin import ConfigEntry, TopicAdmin, check_configs_allowed, check_partitions_cap
from service.cluster.topics import PartitionView, TopicView
from service.tenants import Tenant

router = APIRouter(tags=["v3"])

# -- documentation models (the routes build dicts; these describe them) -----------------------------------


class KafkaCluster(Resource):
    cluster_id: str
    controller: Relationship | None = None
    acls: Relationship
    brokers: Relationship
    broker_configs: Relationship
    consumer_groups: Relationship
    topics: Relationship
    partition_reassignments: Relationship


class KafkaClusterList(ResourceCollection):
    data: list[KafkaCluster]


class KafkaBroker(Resource):
    cluster_id: str
    broker_id: int
    host: str | None = None
    port: int | None = None
    rack: str | None = None
    configs: Relationship
    partition_replicas: Relationship


class KafkaBrokerList(ResourceCollection):
    data: list[KafkaBroker]


class KafkaTopic(Resource):
    cluster_id: str
    topic_name: str
    is_internal: bool
    replication_factor: int
    partitions_count: int
    partitions: Relationship
    configs: Relationship
    partition_reassignments: Relationship


class KafkaTopicList(ResourceCollection):
    data: list[KafkaTopic]


class KafkaPartition(Resource):
    cluster_id: str
    topic_name: str
    partition_id: int
    leader: Relationship | None = None
    replicas: Relationship
    reassignment: Relationship


class KafkaPartitionList(ResourceCollection):
    data: list[KafkaPartition]


class KafkaReplica(Resource):
    cluster_id: str
    topic_name: str
    partition_id: int
    broker_id: int
    is_leader: bool
    is_in_sync: bool
    broker: Relationship


class KafkaReplicaList(ResourceCollection):
    data: list[KafkaReplica]


class ConfigSynonymData(BaseModel):
    name: str
    value: str | None = None
    source: str


class KafkaTopicConfig(Resource):
    cluster_id: str
    topic_name: str
    name: str
    value: str | None = None
    is_default: bool
    is_read_only: bool
    is_sensitive: bool
    source: str = Field(description="DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, "
                                    "STATIC_BROKER_CONFIG, DEFAULT_CONFIG, DYNAMIC_BROKER_LOGGER_CONFIG or UNKNOWN")
    synonyms: list[ConfigSynonymData]


class KafkaTopicConfigList(ResourceCollection):
    data: list[KafkaTopicConfig]


class TopicConfigRequest(BaseModel):
    name: str = Field(min_length=1)
    value: str | None = None


class ReplicasAssignment(BaseModel):
    partition_id: int = Field(ge=0, le=2**31 - 1)
    broker_ids: list[int]


class CreateTopicRequest(BaseModel):
    """Confluent's CreateTopicRequestData. Partitions count and replication factor default to the broker's
    (-1); ``replicas_assignments`` names the brokers of each partition instead of a count and factor."""

    model_config = ConfigDict(extra="ignore")
    topic_name: str = Field(description="1-249 of [a-zA-Z0-9._-], not '.' or '..'")
    partitions_count: int | None = Field(None, ge=-1, le=2**31 - 1)
    replication_factor: int | None = Field(None, ge=-1, le=2**15 - 1)
    replicas_assignments: list[ReplicasAssignment] | None = None
    configs: list[TopicConfigRequest] = []
    validate_only: bool = Field(False, description="check only (200, nothing created); see docs/v3.md")


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return documented_errors(ErrorBody, *statuses)


_READ_ERRORS = _errors(401, 403, 404, 429, 500, 503)
ClusterId = Annotated[str, Path(description="The Kafka cluster id (GET /v3/clusters lists the tenant's)")]
TopicName = Annotated[str, Path(description="The topic name")]
PartitionId = Annotated[int, Path(ge=0, le=2**31 - 1, description="The partition id")]
BrokerId = Annotated[int, Path(description="The broker id")]


# -- bodies (pure) ------------------------------------------------------------------------------------------
def cluster_body(request: Request, cid: str, controller: int | None) -> dict[str, Any]:
    link = lambda *s: related(v3_url(request, "clusters", cid, *s))  # noqa: E731
    body = resource("KafkaCluster", v3_url(request, "clusters", cid), crn(cid), cluster_id=cid)
    if controller is not None and controller >= 0:
        body["controller"] = link("brokers", controller)
    body.update(acls=link("acls"), brokers=link("brokers"), broker_configs=link("broker-configs"),
                consumer_groups=link("consumer-groups"), topics=link("topics"),
                partition_reassignments=link("topics", "-", "partitions", "-", "reassignment"))
    return body


def broker_body(request: Request, cid: str, b: BrokerInfo) -> dict[str, Any]:
    url = v3_url(request, "clusters", cid, "brokers", b.node_id)
    return resource("KafkaBroker", url, crn(cid, ("broker", b.node_id)), cluster_id=cid, broker_id=b.node_id,
                    host=b.host, port=b.port, rack=b.rack, configs=related(url + "/configs"),
                    partition_replicas=related(url + "/partition-replicas"))


def replication_factor(t: TopicView) -> int:
    """Replicas of the first partition, as Confluent reports a topic's replication factor (0: no partitions)."""
    return len(t.partitions[0].replicas) if t.partitions else 0


def topic_body(request: Request, cid: str, name: str, *, internal: bool, partitions: int,
               replication: int) -> dict[str, Any]:
    url = v3_url(request, "clusters", cid, "topics", name)
    return resource("KafkaTopic", url, crn(cid, ("topic", name)), cluster_id=cid, topic_name=name,
                    is_internal=internal, replication_factor=replication, partitions_count=partitions,
                    partitions=related(url + "/partitions"), configs=related(url + "/configs"),
                    partition_reassignments=related(url + "/partitions/-/reassignment"))


def topic_view_body(request: Request, cid: str, t: TopicView) -> dict[str, Any]:
    return topic_body(request, cid, t.name, internal=t.internal, partitions=len(t.partitions),
                      replication=replication_factor(t))


def _replica_ids(p: PartitionView) -> list[int]:
    return list(dict.fromkeys(p.replicas))  # a broker listed twice (Tansu does) is one replica


def partition_body(request: Request, cid: str, topic: str, p: PartitionView) -> dict[str, Any]:
    url = v3_url(request, "clusters", cid, "topics", topic, "partitions", p.partition)
    body = resource("KafkaPartition", url, crn(cid, ("topic", topic), ("partition", p.partition)),
                    cluster_id=cid, topic_name=topic, partition_id=p.partition)
    if p.leader >= 0:
        body["leader"] = related(f"{url}/replicas/{p.leader}")
    body.update(replicas=related(url + "/replicas"), reassignment=related(url + "/reassignment"))
    return body


def replica_body(request: Request, cid: str, topic: str, p: PartitionView, broker: int) -> dict[str, Any]:
    url = v3_url(request, "clusters", cid, "topics", topic, "partitions", p.partition, "replicas", broker)
    return resource("KafkaReplica", url,
                    crn(cid, ("topic", topic), ("partition", p.partition), ("replica", broker)),
                    cluster_id=cid, topic_name=topic, partition_id=p.partition, broker_id=broker,
                    is_leader=broker == p.leader, is_in_sync=broker in p.isr,
                    broker=related(v3_url(request, "clusters", cid, "brokers", broker)))


def config_body(request: Request, cid: str, topic: str, c: ConfigEntry) -> dict[str, Any]:
    url = v3_url(request, "clusters", cid, "topics", topic, "configs", c.name)
    return resource("KafkaTopicConfig", url, crn(cid, ("topic", topic), ("config", c.name)), cluster_id=cid,
                    topic_name=topic, name=c.name, value=c.value, is_default=c.is_default,
                    is_read_only=c.is_read_only, is_sensitive=c.is_sensitive, source=c.source,
                    synonyms=[{"name": s.name, "value": s.value, "source": s.source} for s in c.synonyms])


# -- helpers ------------------------------------------------------------------------------------------------
def admin(request: Request, tenant: Tenant) -> TopicAdmin:
    return TopicAdmin(runtime(request, tenant).client, catalog(request, tenant))


async def _topic(request: Request, tenant: Tenant, cluster: str, topic: str) -> tuple[str, TopicView]:
    """The cluster id and an existing topic the tenant may see (404 / 403 otherwise)."""
    cid = await require_cluster(request, tenant, cluster)
    tenant.require_topic(topic)
    return cid, await admin(request, tenant).topic(topic)


def _partition(t: TopicView, partition: int) -> PartitionView:
    p = t.partition(partition)
    if p is None:
        raise ResourceNotFound(f"Partition {partition} of topic '{t.name}' cannot be found.")
    return p


async def _brokers(request: Request, tenant: Tenant) -> dict[int, BrokerInfo]:
    client = runtime(request, tenant).client
    await client.ensure_metadata()
    return client.metadata.brokers


# -- clusters -----------------------------------------------------------------------------------------------
@router.get("/v3/clusters", response_model=KafkaClusterList, responses=_errors(401, 429, 500, 503),
            operation_id="listKafkaClusters", summary="The Kafka clusters: the one of this tenant")
async def v3_list_clusters(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await tenant_cluster_id(request, tenant)
    controller = runtime(request, tenant).client.metadata.controller_id
    return v3_json(resource_list("KafkaClusterList", v3_url(request, "clusters"),
                                 [cluster_body(request, cid, controller)]))


@router.get("/v3/clusters/{cluster_id}", response_model=KafkaCluster, responses=_READ_ERRORS,
            operation_id="getKafkaCluster", summary="A Kafka cluster (its controller and related collections)")
async def v3_get_cluster(request: Request, cluster_id: ClusterId,
                         tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    return v3_json(cluster_body(request, cid, runtime(request, tenant).client.metadata.controller_id))


# -- brokers ------------------------------------------------------------------------------------------------
@router.get("/v3/clusters/{cluster_id}/brokers", response_model=KafkaBrokerList, responses=_READ_ERRORS,
            operation_id="listKafkaBrokers", summary="The brokers of the cluster")
async def v3_list_brokers(request: Request, cluster_id: ClusterId,
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    brokers = await _brokers(request, tenant)
    return v3_json(resource_list("KafkaBrokerList", v3_url(request, "clusters", cid, "brokers"),
                                 [broker_body(request, cid, brokers[b]) for b in sorted(brokers)]))


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}", response_model=KafkaBroker, responses=_READ_ERRORS,
            operation_id="getKafkaBroker", summary="One broker of the cluster")
async def v3_get_broker(request: Request, cluster_id: ClusterId, broker_id: BrokerId,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    b = (await _brokers(request, tenant)).get(broker_id)
    if b is None:
        raise ResourceNotFound(f"Broker {broker_id} cannot be found.")
    return v3_json(broker_body(request, cid, b))


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/partition-replicas", response_model=KafkaReplicaList,
            responses=_READ_ERRORS, operation_id="searchKafkaReplicasByBroker",
            summary="The replicas a broker holds, of the topics this tenant may see")
async def v3_replicas_by_broker(request: Request, cluster_id: ClusterId, broker_id: BrokerId,
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    if broker_id not in await _brokers(request, tenant):
        raise ResourceNotFound(f"Broker {broker_id} cannot be found.")
    topics = await catalog(request, tenant).list_topics()
    data = [replica_body(request, cid, t.name, p, broker_id)
            for t in sorted(topics, key=lambda t: t.name) if not t.internal and tenant.allows_topic(t.name)
            for p in t.partitions if broker_id in p.replicas]
    url = v3_url(request, "clusters", cid, "brokers", broker_id, "partition-replicas")
    return v3_json(resource_list("KafkaReplicaList", url, data))


# -- topics -------------------------------------------------------------------------------------------------
@router.get("/v3/clusters/{cluster_id}/topics", response_model=KafkaTopicList, responses=_READ_ERRORS,
            operation_id="listKafkaTopics",
            summary="The topics this tenant may see, by name (internal topics left out)")
async def v3_list_topics(request: Request, cluster_id: ClusterId,
                         tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    topics = await catalog(request, tenant).list_topics()
    data = [topic_view_body(request, cid, t) for t in sorted(topics, key=lambda t: t.name)
            if not t.internal and tenant.allows_topic(t.name)]
    return v3_json(resource_list("KafkaTopicList", v3_url(request, "clusters", cid, "topics"), data))


@router.post("/v3/clusters/{cluster_id}/topics", status_code=201, response_model=KafkaTopic,
             responses={200: {"model": KafkaTopic, "description": "validate_only: the topic would be created"},
                        **_errors(400, 401, 403, 404, 422, 429, 500, 503)},
             operation_id="createKafkaTopic", summary="Create a topic",
             description="201 with the topic and a `Location` header; with `validate_only: true` 200 and nothing "
                         "created. A topic that exists, an invalid name, partitions count, replication factor "
                         "or config is 400 (40002); a topic outside the tenant's patterns 403 (40301), outside "
                         "its admin_topics 403 (40303); more partitions than GATEWAY_MAX_PARTITIONS_PER_TOPIC "
                         "422 (42213); a config outside the allow-list 422 (42214).")
async def v3_create_topic(request: Request, cluster_id: ClusterId, body: Annotated[CreateTopicRequest, Body()],
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    tenant.require_topic_admin(body.topic_name)
    settings = request.app.state.settings
    assignments = {a.partition_id: a.broker_ids for a in body.replicas_assignments or ()}
    check_partitions_cap(len(assignments) if assignments else body.partitions_count or -1,
                         settings.max_partitions_per_topic)
    allowed = tenant.admin_topic_configs
    check_configs_allowed([c.name for c in body.configs],
                          settings.topic_configs_allowed_set() if allowed is None else frozenset(allowed))
    created = await admin(request, tenant).create_topic(
        body.topic_name, -1 if body.partitions_count is None else body.partitions_count,
        -1 if body.replication_factor is None else body.replication_factor,
        {c.name: c.value for c in body.configs}, assignments=assignments, validate_only=body.validate_only)
    out = topic_body(request, cid, created.name, internal=False, partitions=created.partitions_count,
                     replication=created.replication_factor)
    if body.validate_only:
        return v3_json(out)
    return v3_json(out, status=201, headers={"Location": out["metadata"]["self"]})


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}", response_model=KafkaTopic, responses=_READ_ERRORS,
            operation_id="getKafkaTopic", summary="A topic")
async def v3_get_topic(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                       include_authorized_operations: Annotated[bool, Query(
                           description="accepted for compatibility; authorized_operations is not reported")] = False,
                       tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, t = await _topic(request, tenant, cluster_id, topic_name)
    return v3_json(topic_view_body(request, cid, t))


@router.delete("/v3/clusters/{cluster_id}/topics/{topic_name}", status_code=204, response_class=Response,
               responses=_errors(400, 401, 403, 404, 429, 500, 503), operation_id="deleteKafkaTopic",
               summary="Delete a topic",
               description="204. A topic outside the tenant's patterns is 403 (40301), outside its admin_topics "
                           "403 (40303).")
async def v3_delete_topic(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    await require_cluster(request, tenant, cluster_id)
    tenant.require_topic_admin(topic_name)
    await admin(request, tenant).delete_topic(topic_name)
    return Response(status_code=204)


# -- partitions and replicas --------------------------------------------------------------------------------
@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions", response_model=KafkaPartitionList,
            responses=_READ_ERRORS, operation_id="listKafkaPartitions", summary="The partitions of a topic")
async def v3_list_partitions(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                             tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, t = await _topic(request, tenant, cluster_id, topic_name)
    url = v3_url(request, "clusters", cid, "topics", t.name, "partitions")
    return v3_json(resource_list("KafkaPartitionList", url,
                                 [partition_body(request, cid, t.name, p) for p in t.partitions]))


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}",
            response_model=KafkaPartition, responses=_READ_ERRORS, operation_id="getKafkaPartition",
            summary="One partition of a topic")
async def v3_get_partition(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                           partition_id: PartitionId, tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, t = await _topic(request, tenant, cluster_id, topic_name)
    return v3_json(partition_body(request, cid, t.name, _partition(t, partition_id)))


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/replicas",
            response_model=KafkaReplicaList, responses=_READ_ERRORS, operation_id="listKafkaReplicas",
            summary="The replicas of a partition")
async def v3_list_replicas(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                           partition_id: PartitionId, tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, t = await _topic(request, tenant, cluster_id, topic_name)
    p = _partition(t, partition_id)
    url = v3_url(request, "clusters", cid, "topics", t.name, "partitions", p.partition, "replicas")
    return v3_json(resource_list("KafkaReplicaList", url,
                                 [replica_body(request, cid, t.name, p, b) for b in _replica_ids(p)]))


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/replicas/{broker_id}",
            response_model=KafkaReplica, responses=_READ_ERRORS, operation_id="getKafkaReplica",
            summary="One replica of a partition")
async def v3_get_replica(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                         partition_id: PartitionId, broker_id: BrokerId,
                         tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, t = await _topic(request, tenant, cluster_id, topic_name)
    p = _partition(t, partition_id)
    if broker_id not in p.replicas:
        raise ResourceNotFound(f"Replica {broker_id} of partition {partition_id} of topic '{t.name}' cannot be "
                               "found.")
    return v3_json(replica_body(request, cid, t.name, p, broker_id))


# -- topic configs ------------------------------------------------------------------------------------------
@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/configs", response_model=KafkaTopicConfigList,
            responses=_READ_ERRORS, operation_id="listKafkaTopicConfigs", summary="The configs of a topic")
async def v3_list_topic_configs(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    tenant.require_topic(topic_name)
    entries = await admin(request, tenant).topic_configs(topic_name)
    url = v3_url(request, "clusters", cid, "topics", topic_name, "configs")
    return v3_json(resource_list("KafkaTopicConfigList", url,
                                 [config_body(request, cid, topic_name, c) for c in entries]))


@router.get("/v3/clusters/{cluster_id}/topics/{topic_name}/configs/{name}", response_model=KafkaTopicConfig,
            responses=_READ_ERRORS, operation_id="getKafkaTopicConfig", summary="One config of a topic")
async def v3_get_topic_config(request: Request, cluster_id: ClusterId, topic_name: TopicName,
                              name: Annotated[str, Path(description="The config name")],
                              tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    tenant.require_topic(topic_name)
    entries = await admin(request, tenant).topic_configs(topic_name)
    entry = next((c for c in entries if c.name == name), None)
    if entry is None:
        raise ResourceNotFound(f"Config {name} of topic '{topic_name}' cannot be found.")
    return v3_json(config_body(request, cid, topic_name, entry))
