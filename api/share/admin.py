"""v3 share-group administration: list share groups, describe one (state, members and their assignment), its
start offsets and lag per partition, reset its start offsets (earliest, latest, a timestamp) and delete them.

Tenants: a share group outside the tenant's group patterns is 403 (40301) and left out of the list; partitions
of topics outside its topic patterns are left out of the offsets (403 when named). Resetting or deleting the
offsets of a share group that still has members is refused with 409/40911 (Kafka's NON_EMPTY_GROUP).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.auth import current_tenant
from api.deps import ErrorBody, runtime
from api.errors import documented_errors
from api.v3.common import Resource, ResourceCollection, crn, require_cluster, resource, resource_list, v3_json, v3_url
from service.client.client import KafkaClient
from service.client.errors import BrokerResponseError
from service.errors import GatewayError
from service.instances.share import require_share_groups
from service.protocol import error_codes as EC
from service.share.admin import (
    EARLIEST,
    LATEST,
    alter_share_group_offsets,
    delete_share_group_offsets,
    describe_share_group,
    list_share_groups,
    offsets_at,
    share_group_offsets,
)
from service.tenants import Tenant

router = APIRouter(tags=["v3"])

GROUPS = "share-groups"
GROUP_ID_NOT_FOUND = 69  # Kafka's error code
READ_ERRORS = documented_errors(ErrorBody, 401, 403, 404, 422, 429, 500, 503)
WRITE_ERRORS = documented_errors(ErrorBody, 400, 401, 403, 404, 409, 422, 429, 500, 503)
ClusterId = Annotated[str, Path(description="The Kafka cluster id (GET /v3/clusters lists the tenant's)")]
GroupId = Annotated[str, Path(description="The share group id")]


class ShareMemberData(BaseModel):
    member_id: str
    client_id: str
    client_host: str
    rack_id: str | None
    member_epoch: int
    subscribed_topics: list[str]
    assignment: dict[str, list[int]] = Field(description="topic -> partitions assigned to the member")


class ShareGroupData(Resource):
    cluster_id: str
    share_group_id: str
    state: str
    group_epoch: int | None = None
    assignment_epoch: int | None = None
    assignor: str | None = None
    members: list[ShareMemberData] | None = None


class ShareGroupDataList(ResourceCollection):
    data: list[ShareGroupData]


class ShareOffsetData(Resource):
    cluster_id: str
    share_group_id: str
    topic_name: str
    partition_id: int
    start_offset: int = Field(json_schema_extra={"format": "int64"},
                              description="the first offset not yet settled (acknowledged or archived)")
    lag: int = Field(json_schema_extra={"format": "int64"}, description="records not yet settled (-1: unknown)")


class ShareOffsetDataList(ResourceCollection):
    data: list[ShareOffsetData]


class ResetShareOffsets(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: Literal["earliest", "latest", "timestamp"]
    timestamp: int | None = Field(None, ge=0, json_schema_extra={"format": "int64"},
                                  description="to=timestamp: ms since the epoch (the first record at or after it)")
    topics: list[Annotated[str, Field(min_length=1, max_length=249)]] | None = Field(
        None, description="the topics to reset (default: every topic the share group has offsets for)")


async def _client(request: Request, tenant: Tenant, cluster_id: str) -> tuple[str, KafkaClient]:
    cid = await require_cluster(request, tenant, cluster_id)
    client = runtime(request, tenant).client
    await require_share_groups(client)
    return cid, client


def _group_json(request: Request, cid: str, group: str, state: str, described: Any = None) -> dict[str, Any]:
    fields: dict[str, Any] = {"cluster_id": cid, "share_group_id": group, "state": state}
    if described is not None:
        fields.update(
            group_epoch=described.group_epoch, assignment_epoch=described.assignment_epoch,
            assignor=described.assignor_name,
            members=[{"member_id": m.member_id, "client_id": m.client_id, "client_host": m.client_host,
                      "rack_id": m.rack_id, "member_epoch": m.member_epoch,
                      "subscribed_topics": list(m.subscribed_topic_names or []),
                      "assignment": {tp.topic_name: sorted(tp.partitions)
                                     for tp in (m.assignment.topic_partitions if m.assignment else [])}}
                     for m in described.members])
    return resource("KafkaShareGroup", v3_url(request, "clusters", cid, GROUPS, group),
                    crn(cid, ("share-group", group)), **fields)


def _not_found(exc: BrokerResponseError, group: str) -> None:
    if exc.code == GROUP_ID_NOT_FOUND:
        raise GatewayError(f"share group {group!r} not found", status=404, error_code=404) from None


@router.get("/v3/clusters/{cluster_id}/share-groups", response_model=ShareGroupDataList, responses=READ_ERRORS,
            summary="List the share groups (KIP-932)")
async def list_share_groups_v3(request: Request, cluster_id: ClusterId,
                               tenant: Tenant = Depends(current_tenant)) -> Response:
    cid, client = await _client(request, tenant, cluster_id)
    groups = await list_share_groups(client)
    data = [_group_json(request, cid, g, state) for g, state in sorted(groups.items()) if tenant.allows_group(g)]
    return v3_json(resource_list("KafkaShareGroupList", v3_url(request, "clusters", cid, GROUPS), data))


@router.get("/v3/clusters/{cluster_id}/share-groups/{group_id}", response_model=ShareGroupData,
            responses=READ_ERRORS, summary="Describe a share group: state, members and their assignment")
async def get_share_group(request: Request, cluster_id: ClusterId, group_id: GroupId,
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_group(group_id)
    cid, client = await _client(request, tenant, cluster_id)
    try:
        described = await describe_share_group(client, group_id)
    except BrokerResponseError as exc:
        _not_found(exc, group_id)
        raise
    if described.group_state == "Dead":
        raise GatewayError(f"share group {group_id!r} not found", status=404, error_code=404)
    return v3_json(_group_json(request, cid, group_id, described.group_state, described))


async def _offsets(request: Request, tenant: Tenant, cid: str, client: KafkaClient, group: str) -> dict[str, Any]:
    got = await share_group_offsets(client, group)
    data = [resource("KafkaShareGroupOffset",
                     v3_url(request, "clusters", cid, GROUPS, group, "offsets"),
                     crn(cid, ("share-group", group), ("topic", t), ("partition", p)),
                     cluster_id=cid, share_group_id=group, topic_name=t, partition_id=p,
                     start_offset=o.start_offset, lag=o.lag)
            for (t, p), o in sorted(got.items()) if tenant.allows_topic(t)]
    return resource_list("KafkaShareGroupOffsetList", v3_url(request, "clusters", cid, GROUPS, group, "offsets"),
                         data)


@router.get("/v3/clusters/{cluster_id}/share-groups/{group_id}/offsets", response_model=ShareOffsetDataList,
            responses=READ_ERRORS, summary="A share group's start offset and lag per partition")
async def get_share_group_offsets(request: Request, cluster_id: ClusterId, group_id: GroupId,
                                  tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_group(group_id)
    cid, client = await _client(request, tenant, cluster_id)
    return v3_json(await _offsets(request, tenant, cid, client, group_id))


async def _require_empty(client: KafkaClient, group: str) -> None:
    try:
        described = await describe_share_group(client, group)
    except BrokerResponseError as exc:
        if exc.code == GROUP_ID_NOT_FOUND:
            return
        raise
    if described.members:
        raise GatewayError(f"share group {group!r} has {len(described.members)} member(s): its offsets can only be "
                           "reset or deleted once every member left (delete its share consumer instances)",
                           status=409, error_code=40911)


def _refused(exc: BrokerResponseError, group: str) -> None:
    if exc.code == EC.NON_EMPTY_GROUP:
        raise GatewayError(f"share group {group!r} has members: its offsets can only be reset or deleted once "
                           "every member left", status=409, error_code=40911) from None


@router.post("/v3/clusters/{cluster_id}/share-groups/{group_id}/offsets/reset", response_model=ShareOffsetDataList,
             responses=WRITE_ERRORS,
             summary="Reset a share group's start offsets (to earliest, latest or a timestamp); no members allowed")
async def reset_share_group_offsets(request: Request, cluster_id: ClusterId, group_id: GroupId,
                                    body: ResetShareOffsets = Body(...),
                                    tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_group(group_id)
    cid, client = await _client(request, tenant, cluster_id)
    if body.to == "timestamp" and body.timestamp is None:
        raise GatewayError("to=timestamp needs a timestamp", status=422, error_code=42207)
    for t in body.topics or ():
        tenant.require_topic(t)
    await _require_empty(client, group_id)
    if body.topics:
        md = await client.ensure_metadata(set(body.topics))
        for t in body.topics:
            if md.topic_error(t):
                raise GatewayError(f"topic {t!r} not found", status=404, error_code=40401)
        parts = [(t, p) for t in body.topics for p in sorted(md.topics[t].partitions)]
    else:
        parts = [tp for tp in (await share_group_offsets(client, group_id)) if tenant.allows_topic(tp[0])]
    if parts:
        ts = {"earliest": EARLIEST, "latest": LATEST}.get(body.to, body.timestamp or 0)
        target = await offsets_at(client, parts, ts)
        try:
            codes = await alter_share_group_offsets(client, group_id, target)
        except BrokerResponseError as exc:
            _refused(exc, group_id)
            raise
        bad = {tp: c for tp, c in codes.items() if c}
        if bad:
            (t, p), code = next(iter(bad.items()))
            raise BrokerResponseError(code, f"AlterShareGroupOffsets {t}-{p}")
    return v3_json(await _offsets(request, tenant, cid, client, group_id))


@router.delete("/v3/clusters/{cluster_id}/share-groups/{group_id}/offsets", status_code=204,
               responses=WRITE_ERRORS, summary="Delete a share group's offsets (of some topics, or all); "
               "no members allowed")
async def delete_share_group_offsets_v3(
        request: Request, cluster_id: ClusterId, group_id: GroupId,
        topic: Annotated[list[Annotated[str, Query(min_length=1, max_length=249)]] | None, Query(
            description="the topics whose offsets to delete, repeated (default: every topic)")] = None,
        tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_group(group_id)
    _, client = await _client(request, tenant, cluster_id)
    for t in topic or ():
        tenant.require_topic(t)
    await _require_empty(client, group_id)
    topics = list(topic) if topic else sorted({t for t, _ in await share_group_offsets(client, group_id)
                                               if tenant.allows_topic(t)})
    if topics:
        try:
            codes = await delete_share_group_offsets(client, group_id, topics)
        except BrokerResponseError as exc:
            _refused(exc, group_id)
            raise
        bad = {t: c for t, c in codes.items() if c}
        if bad:
            t, code = next(iter(bad.items()))
            raise BrokerResponseError(code, f"DeleteShareGroupOffsets {t}")
    return Response(status_code=204)
