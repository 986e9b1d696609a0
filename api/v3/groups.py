"""v3 consumer groups: groups, their consumers and assignments, consumer lags and the lag summary.

Shapes are Confluent's v3 ``KafkaConsumerGroup``, ``KafkaConsumer``, ``KafkaConsumerAssignment``,
``KafkaConsumerLag`` and ``KafkaConsumerGroupLagSummary`` (and their ``…List`` collections). The logic lives
in :mod:`service.cluster.group_admin`; these routes check the cluster id and the tenant's patterns and build envelopes.

Tenants: a group outside the tenant's group patterns is 403 (40301) and left out of the list; partitions of
topics outside its topic patterns are left out of assignments, lags and the summary (403 when named).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import Field

from api.auth import current_tenant
from api.deps import ErrorBody, runtime
from api.errors import documented_errors
from api.v3.common import (
    Relationship,
    Resource,
    ResourceCollection,
    crn,
    related,
    require_cluster,
    resource,
    resource_list,
    v3_json,
    v3_url,
)
from service.cluster.group_admin import (
    ConsumerNotFound,
    GroupAdmin,
    GroupView,
    LagNotFound,
    LagSummary,
    LocalMember,
    MemberView,
    PartitionLag,
    lag_summary,
    local_view,
)
from service.consumer.subscription import TopicPartition
from service.tenants import Tenant

router = APIRouter(tags=["v3"])

GROUPS = "consumer-groups"
READ_ERRORS = documented_errors(ErrorBody, 401, 403, 404, 429, 500, 503)
ClusterId = Annotated[str, Path(description="The Kafka cluster id (GET /v3/clusters lists the tenant's)")]
GroupId = Annotated[str, Path(description="The consumer group id")]
ConsumerId = Annotated[str, Path(description="The consumer (group member) id")]
TopicName = Annotated[str, Path(description="The topic name")]
PartitionId = Annotated[int, Path(ge=0, le=2**31 - 1, description="The partition id")]


# -- documentation models (the routes build dicts; these describe them) ------------------------------------
class ConsumerGroupData(Resource):
    cluster_id: str
    consumer_group_id: str
    is_simple: bool
    partition_assignor: str
    state: str
    group_type: Literal["classic", "consumer"] = Field(
        description="our extension: the group protocol, classic (JoinGroup/SyncGroup) or consumer (KIP-848; "
                    "partition_assignor is then the broker's assignor)")
    coordinator: Relationship
    consumers: Relationship
    lag_summary: Relationship


class ConsumerGroupDataList(ResourceCollection):
    data: list[ConsumerGroupData]


class ConsumerData(Resource):
    cluster_id: str
    consumer_group_id: str
    consumer_id: str
    instance_id: str | None
    client_id: str
    assignments: Relationship


class ConsumerDataList(ResourceCollection):
    data: list[ConsumerData]


class ConsumerAssignmentData(Resource):
    cluster_id: str
    consumer_group_id: str
    consumer_id: str
    topic_name: str
    partition_id: int
    partition: Relationship
    lag: Relationship


class ConsumerAssignmentDataList(ResourceCollection):
    data: list[ConsumerAssignmentData]


class ConsumerLagData(Resource):
    cluster_id: str
    consumer_group_id: str
    topic_name: str
    partition_id: int
    current_offset: int
    log_end_offset: int
    lag: int
    consumer_id: str
    instance_id: str | None
    client_id: str


class ConsumerLagDataList(ResourceCollection):
    data: list[ConsumerLagData]


class ConsumerGroupLagSummaryData(Resource):
    cluster_id: str
    consumer_group_id: str
    max_lag_consumer_id: str
    max_lag_instance_id: str | None
    max_lag_client_id: str
    max_lag_topic_name: str
    max_lag_partition_id: int
    max_lag: int
    total_lag: int
    max_lag_consumer: Relationship
    max_lag_partition: Relationship


# -- helpers -------------------------------------------------------------------------------------------------
def admin(request: Request, tenant: Tenant) -> GroupAdmin:
    """The tenant's GroupAdmin; this process's instances of the tenant describe their own membership (looked
    at only for the groups a request names, or all of them for the list)."""
    rt = runtime(request, tenant)
    client_id = rt.client.config.client_id

    def members(group: str) -> dict[str, LocalMember]:
        own = [inst for (g, _), inst in list(rt.instances.items()) if g == group]
        return local_view(own, client_id)[1].get(group, {})

    def groups() -> set[str]:
        return local_view(list(rt.instances.values()), client_id)[0]

    return GroupAdmin(rt.client, local_members=members, local_groups=groups)


def group_json(request: Request, cid: str, g: GroupView) -> dict[str, Any]:
    return resource(
        "KafkaConsumerGroup", v3_url(request, "clusters", cid, GROUPS, g.group_id),
        crn(cid, ("consumer-group", g.group_id)),
        cluster_id=cid, consumer_group_id=g.group_id, is_simple=g.is_simple,
        partition_assignor=g.partition_assignor, state=g.state, group_type=g.group_type,
        coordinator=related(v3_url(request, "clusters", cid, "brokers", g.coordinator)),
        consumers=related(v3_url(request, "clusters", cid, GROUPS, g.group_id, "consumers")),
        lag_summary=related(v3_url(request, "clusters", cid, GROUPS, g.group_id, "lag-summary")),
    )


def consumer_json(request: Request, cid: str, group: str, m: MemberView) -> dict[str, Any]:
    return resource(
        "KafkaConsumer", v3_url(request, "clusters", cid, GROUPS, group, "consumers", m.consumer_id),
        crn(cid, ("consumer-group", group), ("consumer", m.consumer_id)),
        cluster_id=cid, consumer_group_id=group, consumer_id=m.consumer_id, instance_id=m.instance_id,
        client_id=m.client_id,
        assignments=related(v3_url(request, "clusters", cid, GROUPS, group, "consumers", m.consumer_id,
                                   "assignments")),
    )


def assignment_json(request: Request, cid: str, group: str, consumer_id: str, tp: TopicPartition) -> dict[str, Any]:
    return resource(
        "KafkaConsumerAssignment",
        v3_url(request, "clusters", cid, GROUPS, group, "consumers", consumer_id, "assignments", tp.topic,
               "partitions", tp.partition),
        crn(cid, ("consumer-group", group), ("consumer", consumer_id), ("assignment", tp.topic),
            ("partition", tp.partition)),
        cluster_id=cid, consumer_group_id=group, consumer_id=consumer_id, topic_name=tp.topic,
        partition_id=tp.partition,
        partition=related(v3_url(request, "clusters", cid, "topics", tp.topic, "partitions", tp.partition)),
        lag=related(v3_url(request, "clusters", cid, GROUPS, group, "lags", tp.topic, "partitions", tp.partition)),
    )


def lag_json(request: Request, cid: str, group: str, x: PartitionLag) -> dict[str, Any]:
    return resource(
        "KafkaConsumerLag",
        v3_url(request, "clusters", cid, GROUPS, group, "lags", x.topic, "partitions", x.partition),
        crn(cid, ("consumer-group", group), ("lag", x.topic), ("partition", x.partition)),
        cluster_id=cid, consumer_group_id=group, topic_name=x.topic, partition_id=x.partition,
        current_offset=x.current_offset, log_end_offset=x.log_end_offset, lag=x.lag,
        consumer_id=x.consumer_id, instance_id=x.instance_id, client_id=x.client_id,
    )


def summary_json(request: Request, cid: str, group: str, s: LagSummary) -> dict[str, Any]:
    top = s.top
    return resource(
        "KafkaConsumerGroupLagSummary", v3_url(request, "clusters", cid, GROUPS, group, "lag-summary"),
        crn(cid, ("consumer-group", group)) + "/lag-summary",
        cluster_id=cid, consumer_group_id=group, max_lag_consumer_id=top.consumer_id,
        max_lag_instance_id=top.instance_id, max_lag_client_id=top.client_id, max_lag_topic_name=top.topic,
        max_lag_partition_id=top.partition, max_lag=s.max_lag, total_lag=s.total_lag,
        max_lag_consumer=related(v3_url(request, "clusters", cid, GROUPS, group, "consumers", top.consumer_id)),
        max_lag_partition=related(v3_url(request, "clusters", cid, "topics", top.topic, "partitions", top.partition)),
    )


async def _group(request: Request, tenant: Tenant, cluster_id: str, group: str) -> tuple[str, GroupView]:
    cid = await require_cluster(request, tenant, cluster_id)
    tenant.require_group(group)
    return cid, await admin(request, tenant).group(group, tenant.allows_topic)


async def _member(request: Request, tenant: Tenant, cluster_id: str, group: str,
                  consumer_id: str) -> tuple[str, MemberView]:
    cid, g = await _group(request, tenant, cluster_id, group)
    m = g.member(consumer_id)
    if m is None:
        raise ConsumerNotFound(f"Consumer {consumer_id} of consumer group {group} could not be found.")
    return cid, m


# -- routes --------------------------------------------------------------------------------------------------
@router.get("/v3/clusters/{cluster_id}/consumer-groups", response_model=ConsumerGroupDataList, responses=READ_ERRORS,
            operation_id="listKafkaConsumerGroups", summary="The consumer groups this tenant may see")
async def v3_list_consumer_groups(request: Request, cluster_id: ClusterId,
                                  tenant: Tenant = Depends(current_tenant)) -> Response:
    cid = await require_cluster(request, tenant, cluster_id)
    adm = admin(request, tenant)
    views = await adm.describe(await adm.list_group_ids(tenant.allows_group), tenant.allows_topic,
                               skip_unauthorized=True)
    return v3_json(resource_list("KafkaConsumerGroupList", v3_url(request, "clusters", cid, GROUPS),
                                 [group_json(request, cid, g) for g in views]))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}", response_model=ConsumerGroupData,
            responses=READ_ERRORS, operation_id="getKafkaConsumerGroup", summary="One consumer group")
async def v3_get_consumer_group(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, g = await _group(request, tenant, cluster_id, consumer_group_id)
    return v3_json(group_json(request, cid, g))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}/consumers",
            response_model=ConsumerDataList, responses=READ_ERRORS, operation_id="listKafkaConsumers",
            summary="The consumers (members) of a consumer group")
async def v3_list_consumers(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                            tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, g = await _group(request, tenant, cluster_id, consumer_group_id)
    return v3_json(resource_list(
        "KafkaConsumerList", v3_url(request, "clusters", cid, GROUPS, g.group_id, "consumers"),
        [consumer_json(request, cid, g.group_id, m) for m in g.members]))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}/consumers/{consumer_id}",
            response_model=ConsumerData, responses=READ_ERRORS, operation_id="getKafkaConsumer",
            summary="One consumer (member) of a consumer group")
async def v3_get_consumer(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                          consumer_id: ConsumerId, tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, m = await _member(request, tenant, cluster_id, consumer_group_id, consumer_id)
    return v3_json(consumer_json(request, cid, consumer_group_id, m))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}/consumers/{consumer_id}/assignments",
            response_model=ConsumerAssignmentDataList, responses=READ_ERRORS,
            operation_id="listKafkaConsumerAssignment", summary="The partitions assigned to a consumer")
async def v3_list_consumer_assignments(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                                       consumer_id: ConsumerId, tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, m = await _member(request, tenant, cluster_id, consumer_group_id, consumer_id)
    return v3_json(resource_list(
        "KafkaConsumerAssignmentList",
        v3_url(request, "clusters", cid, GROUPS, consumer_group_id, "consumers", consumer_id, "assignments"),
        [assignment_json(request, cid, consumer_group_id, consumer_id, tp) for tp in m.assignment]))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}/consumers/{consumer_id}/assignments"
            "/{topic_name}/partitions/{partition_id}",
            response_model=ConsumerAssignmentData, responses=READ_ERRORS, operation_id="getKafkaConsumerAssignment",
            summary="One partition assigned to a consumer")
async def v3_get_consumer_assignment(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                                     consumer_id: ConsumerId, topic_name: TopicName, partition_id: PartitionId,
                                     tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_topic(topic_name)
    cid, m = await _member(request, tenant, cluster_id, consumer_group_id, consumer_id)
    tp = TopicPartition(topic_name, partition_id)
    if tp not in m.assignment:
        raise ConsumerNotFound(f"Partition {topic_name}-{partition_id} is not assigned to consumer {consumer_id}.")
    return v3_json(assignment_json(request, cid, consumer_group_id, consumer_id, tp))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}/lags", response_model=ConsumerLagDataList,
            responses=READ_ERRORS, operation_id="listKafkaConsumerLags",
            summary="Lag of every partition with a committed offset (largest first)")
async def v3_list_consumer_lags(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, g = await _group(request, tenant, cluster_id, consumer_group_id)
    lags = await admin(request, tenant).lags(g, tenant.allows_topic)
    return v3_json(resource_list("KafkaConsumerLagList", v3_url(request, "clusters", cid, GROUPS, g.group_id, "lags"),
                                 [lag_json(request, cid, g.group_id, x) for x in lags]))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}/lags/{topic_name}/partitions"
            "/{partition_id}", response_model=ConsumerLagData, responses=READ_ERRORS,
            operation_id="getKafkaConsumerLag", summary="Lag of one partition")
async def v3_get_consumer_lag(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                              topic_name: TopicName, partition_id: PartitionId,
                              tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_topic(topic_name)
    cid, g = await _group(request, tenant, cluster_id, consumer_group_id)
    lags = await admin(request, tenant).lags(g, tenant.allows_topic)
    x = next((x for x in lags if x.topic == topic_name and x.partition == partition_id), None)
    if x is None:
        raise LagNotFound(f"Consumer lag of {topic_name}-{partition_id} in group {consumer_group_id} not found.")
    return v3_json(lag_json(request, cid, g.group_id, x))


@router.get("/v3/clusters/{cluster_id}/consumer-groups/{consumer_group_id}/lag-summary",
            response_model=ConsumerGroupLagSummaryData, responses=READ_ERRORS,
            operation_id="getKafkaConsumerGroupLagSummary", summary="Maximum and total lag of a consumer group")
async def v3_get_consumer_group_lag_summary(request: Request, cluster_id: ClusterId, consumer_group_id: GroupId,
                                            tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, g = await _group(request, tenant, cluster_id, consumer_group_id)
    s = lag_summary(await admin(request, tenant).lags(g, tenant.allows_topic))
    if s is None:  # pragma: no cover - lags() raises on an empty list
        raise LagNotFound("Consumer lags not found.")
    return v3_json(summary_json(request, cid, g.group_id, s))
