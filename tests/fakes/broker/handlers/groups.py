"""Group coordinator APIs: FindCoordinator (10) v0-6, JoinGroup (11) v0-9, SyncGroup (14) v0-5,
Heartbeat (12) v0-4, LeaveGroup (13) v0-5, OffsetCommit (8) v2-9, OffsetFetch (9) v1-9,
DescribeGroups (15) v0-5 and ListGroups (16) v0-5.

The group logic lives in :mod:`tests.fakes.broker.group_coordinator`; these handlers only translate each
request version to it and back:

* FindCoordinator: one key before v4, a batch of ``coordinator_keys`` from v4 on; key type 0 (group)
  and 1 (transaction) both map to the coordinator of the key; another key type is INVALID_REQUEST.
* JoinGroup v0 has no rebalance timeout (the session timeout is used); before v7 the protocol name
  is never null.
* LeaveGroup v0-2 names one member by id and reports its error at the top level; v3+ batches members
  and reports per member.
* OffsetFetch v1 has no top-level error (a group error is reported per partition); v2-7 have one;
  v8+ fetch several groups, each with its own error. A null topic list (v2+) means every committed
  partition.

Injected errors (``cluster.error(...)``) are answered by side-effect-free responses of the request's
shape (members, topics, partitions, groups mirrored) with the code in every ``error_code`` field of
the chosen depth; nothing joins, leaves or commits.
"""

from __future__ import annotations

from typing import Any

from service.protocol import messages as M
from tests.fakes.broker.group_coordinator import (
    INVALID_REQUEST,
    CommittedOffset,
    GroupPhase,
    JoinSpec,
    group_coordinator,
)
from tests.fakes.broker.registry import HandlerRegistry, RequestContext, set_error_codes

Coordinator = M.struct("FindCoordinatorResponse", "Coordinator")
JoinMember = M.struct("JoinGroupResponse", "JoinGroupResponseMember")
LeaveMember = M.struct("LeaveGroupResponse", "MemberResponse")
CommitTopic = M.struct("OffsetCommitResponse", "OffsetCommitResponseTopic")
CommitPartition = M.struct("OffsetCommitResponse", "OffsetCommitResponsePartition")
FetchTopicOld = M.struct("OffsetFetchResponse", "OffsetFetchResponseTopic")
FetchPartitionOld = M.struct("OffsetFetchResponse", "OffsetFetchResponsePartition")
FetchGroup = M.struct("OffsetFetchResponse", "OffsetFetchResponseGroup")
FetchTopics = M.struct("OffsetFetchResponse", "OffsetFetchResponseTopics")
FetchPartitions = M.struct("OffsetFetchResponse", "OffsetFetchResponsePartitions")
DescribedGroup = M.struct("DescribeGroupsResponse", "DescribedGroup")
DescribedMember = M.struct("DescribeGroupsResponse", "DescribedGroupMember")
ListedGroup = M.struct("ListGroupsResponse", "ListedGroup")

COORDINATOR_NOT_AVAILABLE = 15


# -- FindCoordinator ---------------------------------------------------------------------------------
def _lookup(ctx: RequestContext, key: str, key_type: int) -> tuple[int, int, str, int, str | None]:
    if key_type not in (0, 1):
        return INVALID_REQUEST, -1, "", -1, f"unsupported key type {key_type}"
    node = group_coordinator(ctx.cluster).coordinator_for(key)
    b = ctx.state.brokers.get(node)
    if b is None or not b.alive:
        return COORDINATOR_NOT_AVAILABLE, -1, "", -1, "the coordinator is not available"
    return 0, b.node_id, b.host, b.port, None


async def find_coordinator(ctx: RequestContext, req: Any) -> Any:
    if ctx.version >= 4:
        coords = []
        for key in req.coordinator_keys:
            code, node, host, port, msg = _lookup(ctx, key, req.key_type)
            coords.append(Coordinator(key=key, node_id=node, host=host, port=port, error_code=code, error_message=msg))
        return M.FindCoordinatorResponse(throttle_time_ms=0, coordinators=coords)
    code, node, host, port, msg = _lookup(ctx, req.key, req.key_type if ctx.version >= 1 else 0)
    return M.FindCoordinatorResponse(throttle_time_ms=0, error_code=code, error_message=msg, node_id=node,
                                     host=host, port=port)


async def find_coordinator_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    if ctx.version >= 4:
        resp = M.FindCoordinatorResponse(coordinators=[
            Coordinator(key=k, node_id=-1, host="", port=-1, error_code=0) for k in req.coordinator_keys])
    else:
        resp = M.FindCoordinatorResponse(error_code=0, error_message=None, node_id=-1, host="", port=-1)
    set_error_codes(resp, code, depth)
    return resp


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ----------------------------------------------------
def _peer_host(ctx: RequestContext) -> str:
    peer = ctx.connection.peer
    return f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""


async def join_group(ctx: RequestContext, req: Any) -> Any:
    v = ctx.version
    rebalance_timeout = req.rebalance_timeout_ms if v >= 1 and req.rebalance_timeout_ms >= 0 else req.session_timeout_ms
    spec = JoinSpec(
        group_instance_id=req.group_instance_id if v >= 5 else None,
        client_id=ctx.header.client_id or "",
        client_host=_peer_host(ctx),
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout,
        protocol_type=req.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in req.protocols),
    )
    out = await group_coordinator(ctx.cluster).join(ctx.broker.node_id, group_id=req.group_id,
                                                    member_id=req.member_id, spec=spec, version=v)
    return M.JoinGroupResponse(
        throttle_time_ms=0,
        error_code=out.error_code,
        generation_id=out.generation_id,
        protocol_type=out.protocol_type,
        protocol_name=out.protocol_name if v >= 7 else (out.protocol_name or ""),
        leader=out.leader,
        skip_assignment=out.skip_assignment,
        member_id=out.member_id,
        members=[JoinMember(member_id=mid, group_instance_id=iid, metadata=meta) for mid, iid, meta in out.members],
    )


async def join_group_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    resp = M.JoinGroupResponse(error_code=0, generation_id=-1, member_id=req.member_id, leader="",
                               protocol_name=None if ctx.version >= 7 else "", members=[])
    set_error_codes(resp, code, depth)
    return resp


async def sync_group(ctx: RequestContext, req: Any) -> Any:
    v = ctx.version
    out = await group_coordinator(ctx.cluster).sync(
        ctx.broker.node_id, group_id=req.group_id, generation_id=req.generation_id, member_id=req.member_id,
        group_instance_id=req.group_instance_id if v >= 3 else None,
        protocol_type=req.protocol_type if v >= 5 else None, protocol_name=req.protocol_name if v >= 5 else None,
        assignments=[(a.member_id, bytes(a.assignment)) for a in req.assignments])
    return M.SyncGroupResponse(throttle_time_ms=0, error_code=out.error_code, protocol_type=out.protocol_type,
                               protocol_name=out.protocol_name, assignment=out.assignment)


async def sync_group_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    resp = M.SyncGroupResponse(error_code=0, assignment=b"")
    set_error_codes(resp, code, depth)
    return resp


async def heartbeat(ctx: RequestContext, req: Any) -> Any:
    code = group_coordinator(ctx.cluster).heartbeat(
        ctx.broker.node_id, group_id=req.group_id, generation_id=req.generation_id, member_id=req.member_id,
        group_instance_id=req.group_instance_id if ctx.version >= 3 else None)
    return M.HeartbeatResponse(throttle_time_ms=0, error_code=code)


async def heartbeat_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    resp = M.HeartbeatResponse(error_code=0)
    set_error_codes(resp, code, depth)
    return resp


def _leaving(ctx: RequestContext, req: Any) -> list[tuple[str, str | None]]:
    if ctx.version >= 3:
        return [(m.member_id, m.group_instance_id) for m in req.members]
    return [(req.member_id, None)]


async def leave_group(ctx: RequestContext, req: Any) -> Any:
    code, results = group_coordinator(ctx.cluster).leave(ctx.broker.node_id, group_id=req.group_id,
                                                         members=_leaving(ctx, req))
    if ctx.version < 3:
        return M.LeaveGroupResponse(throttle_time_ms=0, error_code=code or (results[0][2] if results else 0))
    return M.LeaveGroupResponse(throttle_time_ms=0, error_code=code, members=[
        LeaveMember(member_id=mid, group_instance_id=iid, error_code=c) for mid, iid, c in results])


async def leave_group_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    members = [LeaveMember(member_id=mid, group_instance_id=iid, error_code=0) for mid, iid in _leaving(ctx, req)]
    resp = M.LeaveGroupResponse(error_code=0, members=members if ctx.version >= 3 else [])
    set_error_codes(resp, code, depth)
    return resp


# -- OffsetCommit / OffsetFetch ------------------------------------------------------------------------
async def offset_commit(ctx: RequestContext, req: Any) -> Any:
    v = ctx.version
    entries = [(t.name, p.partition_index, p.committed_offset, p.committed_leader_epoch if v >= 6 else -1,
                p.committed_metadata) for t in req.topics for p in t.partitions]
    results = group_coordinator(ctx.cluster).commit_offsets(
        ctx.broker.node_id, group_id=req.group_id, generation_id=req.generation_id_or_member_epoch,
        member_id=req.member_id, group_instance_id=req.group_instance_id if v >= 7 else None,
        offsets=entries, version=v)
    by_topic: dict[str, list[Any]] = {}
    for topic, partition, code in results:
        by_topic.setdefault(topic, []).append(CommitPartition(partition_index=partition, error_code=code))
    return M.OffsetCommitResponse(throttle_time_ms=0,
                                  topics=[CommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()])


async def offset_commit_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    resp = M.OffsetCommitResponse(topics=[
        CommitTopic(name=t.name, partitions=[CommitPartition(partition_index=p.partition_index, error_code=0)
                                             for p in t.partitions]) for t in req.topics])
    set_error_codes(resp, code, depth)
    return resp


def _offset_fields(stored: CommittedOffset | None) -> dict[str, Any]:
    if stored is None:
        return {"committed_offset": -1, "committed_leader_epoch": -1, "metadata": ""}
    return {"committed_offset": stored.offset, "committed_leader_epoch": stored.leader_epoch,
            "metadata": stored.metadata}


def _requested(topics: Any) -> list[tuple[str, list[int]]] | None:
    if topics is None:
        return None
    return [(t.name, list(t.partition_indexes)) for t in topics]


async def offset_fetch(ctx: RequestContext, req: Any) -> Any:
    gc = group_coordinator(ctx.cluster)
    node = ctx.broker.node_id
    v = ctx.version
    stable = bool(req.require_stable) if v >= 7 else False
    if v >= 8:
        groups = []
        for g in req.groups:
            code, found = gc.fetch_offsets(node, group_id=g.group_id, topics=_requested(g.topics),
                                           require_stable=stable)
            groups.append(FetchGroup(group_id=g.group_id, error_code=code, topics=[
                FetchTopics(name=t, partitions=[FetchPartitions(partition_index=p, error_code=c, **_offset_fields(s))
                                                for p, s, c in parts]) for t, parts in found]))
        return M.OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    requested = _requested(req.topics)
    code, found = gc.fetch_offsets(node, group_id=req.group_id, topics=requested, require_stable=stable)
    if code and v < 2:
        # v1 has no group-level error: report it on every requested partition
        found = [(t, [(p, None, code) for p in parts]) for t, parts in (requested or [])]
    topics = [FetchTopicOld(name=t, partitions=[FetchPartitionOld(partition_index=p, error_code=c, **_offset_fields(s))
                                                 for p, s, c in parts]) for t, parts in found]
    return M.OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=code)


async def offset_fetch_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    def parts_old(topics: Any) -> list[Any]:
        return [FetchTopicOld(name=t.name, partitions=[
            FetchPartitionOld(partition_index=p, error_code=0, **_offset_fields(None)) for p in t.partition_indexes])
            for t in topics or []]

    if ctx.version >= 8:
        resp = M.OffsetFetchResponse(groups=[FetchGroup(group_id=g.group_id, error_code=0, topics=[
            FetchTopics(name=t.name,
                        partitions=[FetchPartitions(partition_index=p, error_code=0, **_offset_fields(None))
                                                 for p in t.partition_indexes]) for t in g.topics or []])
            for g in req.groups])
    else:
        resp = M.OffsetFetchResponse(error_code=0, topics=parts_old(req.topics))
    set_error_codes(resp, code, depth)
    return resp


# -- DescribeGroups ------------------------------------------------------------------------------------
async def describe_groups(ctx: RequestContext, req: Any) -> Any:
    gc = group_coordinator(ctx.cluster)
    out = []
    for gid in req.groups:
        code, g = gc.describe(ctx.broker.node_id, gid)
        if code or g is None:
            out.append(DescribedGroup(error_code=code, group_id=gid, group_state="Dead", protocol_type="",
                                      protocol_data="", members=[]))
            continue
        stable = g.phase is GroupPhase.STABLE
        members = [DescribedMember(member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                                   client_host=m.client_host,
                                   member_metadata=m.metadata(g.protocol_name) if stable else b"",
                                   member_assignment=m.assignment if stable else b"")
                   for m in g.members.values()]
        out.append(DescribedGroup(error_code=0, group_id=gid, group_state=g.phase.value,
                                  protocol_type=g.protocol_type or "",
                                  protocol_data=(g.protocol_name or "") if stable else "", members=members))
    return M.DescribeGroupsResponse(throttle_time_ms=0, groups=out)


async def describe_groups_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    resp = M.DescribeGroupsResponse(groups=[
        DescribedGroup(error_code=0, group_id=g, group_state="", protocol_type="", protocol_data="", members=[])
        for g in req.groups])
    set_error_codes(resp, code, depth)
    return resp


# -- ListGroups ----------------------------------------------------------------------------------------
async def list_groups(ctx: RequestContext, req: Any) -> Any:
    """The groups this broker coordinates; v5's type filter knows only "classic" (every group here)."""
    states = list(req.states_filter or []) if ctx.version >= 4 else []
    types = {t.lower() for t in (req.types_filter or [])} if ctx.version >= 5 else set()
    listed = [] if types and "classic" not in types else group_coordinator(ctx.cluster).list_groups(
        ctx.broker.node_id, states)
    return M.ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=[
        ListedGroup(group_id=gid, protocol_type=ptype, group_state=state, group_type="classic")
        for gid, ptype, state in listed])


async def list_groups_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    resp = M.ListGroupsResponse(error_code=0, groups=[])
    set_error_codes(resp, code, depth)
    return resp


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.FIND_COORDINATOR, find_coordinator, error_response=find_coordinator_error)
    registry.register(M.ApiKey.JOIN_GROUP, join_group, error_response=join_group_error)
    registry.register(M.ApiKey.SYNC_GROUP, sync_group, error_response=sync_group_error)
    registry.register(M.ApiKey.HEARTBEAT, heartbeat, error_response=heartbeat_error)
    registry.register(M.ApiKey.LEAVE_GROUP, leave_group, error_response=leave_group_error)
    registry.register(M.ApiKey.OFFSET_COMMIT, offset_commit, error_response=offset_commit_error)
    registry.register(M.ApiKey.OFFSET_FETCH, offset_fetch, error_response=offset_fetch_error)
    registry.register(M.ApiKey.DESCRIBE_GROUPS, describe_groups, error_response=describe_groups_error)
    registry.register(M.ApiKey.LIST_GROUPS, list_groups, error_response=list_groups_error)
