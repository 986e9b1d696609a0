"""Confluent REST Proxy v2 topic endpoints (metadata and partition offsets), read-only.

Shapes follow Confluent's v2 entities: ``GET /topics`` → names; ``GET /topics/{topic}`` → ``{name, configs,
partitions}``; a partition → ``{partition, leader, replicas: [{broker, leader, in_sync}]}``; offsets →
``{beginning_offset, end_offset}`` plus our ``last_stable_offset``. The logic lives in :mod:`service.topics`.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from api.auth import current_tenant
from api.consumers import ERRORS, check_topic, runtime, v2
from service.tenants import Tenant
from service.topics import TopicCatalog, visible_topic_names

router = APIRouter(tags=["topics"])


class Replica(BaseModel):
    broker: int
    leader: bool
    in_sync: bool


class PartitionInfo(BaseModel):
    partition: int
    leader: int
    replicas: list[Replica]


class TopicInfo(BaseModel):
    name: str
    configs: dict[str, str | None]
    partitions: list[PartitionInfo]


class PartitionOffsetsInfo(BaseModel):
    beginning_offset: int
    end_offset: int
    last_stable_offset: int


def catalog(request: Request, tenant: Tenant) -> TopicCatalog:
    rt = runtime(request, tenant)
    if rt.topics is None:
        rt.topics = TopicCatalog(rt.client, ttl=request.app.state.settings.topic_metadata_ttl_s)
    cat: TopicCatalog = rt.topics
    return cat


@router.get("/topics", response_model=list[str], responses=ERRORS,
            summary="Names of the topics this tenant may read (internal topics left out)")
async def list_topics(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
    topics = await catalog(request, tenant).list_topics()
    return v2(visible_topic_names(topics, tenant.allows_topic))


@router.get("/topics/{topic}", response_model=TopicInfo, responses=ERRORS,
            summary="A topic: its configs and partitions")
async def get_topic(request: Request, topic: str, tenant: Tenant = Depends(current_tenant)) -> Response:
    check_topic(tenant, topic)
    cat = catalog(request, tenant)
    view = await cat.topic(topic)
    return v2(view.to_json(await cat.configs(topic)))


@router.get("/topics/{topic}/partitions", response_model=list[PartitionInfo], responses=ERRORS,
            summary="The partitions of a topic")
async def list_partitions(request: Request, topic: str, tenant: Tenant = Depends(current_tenant)) -> Response:
    check_topic(tenant, topic)
    view = await catalog(request, tenant).topic(topic)
    return v2([p.to_json() for p in view.partitions])


@router.get("/topics/{topic}/partitions/{partition}", response_model=PartitionInfo, responses=ERRORS,
            summary="One partition of a topic")
async def get_partition(request: Request, topic: str, partition: int,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
    check_topic(tenant, topic)
    p = await catalog(request, tenant).partition(topic, partition)
    return v2(p.to_json())


@router.get("/topics/{topic}/partitions/{partition}/offsets", response_model=PartitionOffsetsInfo,
            responses=ERRORS, summary="Beginning and end offsets of a partition (and its last stable offset)")
async def get_partition_offsets(request: Request, topic: str, partition: int,
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    check_topic(tenant, topic)
    offsets = await catalog(request, tenant).offsets(topic, partition)
    return v2(offsets.to_json())
