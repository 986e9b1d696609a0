"""Share-group administration over our client: find a group's coordinator, list and describe share groups, read
their start offsets and lag, reset them, delete them (KIP-932 ShareGroupDescribe, DescribeShareGroupOffsets,
AlterShareGroupOffsets, DeleteShareGroupOffsets; ListGroups with the ``share`` type filter)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from service.client.client import KafkaClient, find_coordinator
from service.client.errors import BrokerResponseError
from service.protocol import error_codes as EC
from service.protocol import messages as M

_OffsetsGroup = M.struct("DescribeShareGroupOffsetsRequest", "DescribeShareGroupOffsetsRequestGroup")
_OffsetsTopic = M.struct("DescribeShareGroupOffsetsRequest", "DescribeShareGroupOffsetsRequestTopic")
_AlterTopic = M.struct("AlterShareGroupOffsetsRequest", "AlterShareGroupOffsetsRequestTopic")
_AlterPartition = M.struct("AlterShareGroupOffsetsRequest", "AlterShareGroupOffsetsRequestPartition")
_DeleteTopic = M.struct("DeleteShareGroupOffsetsRequest", "DeleteShareGroupOffsetsRequestTopic")
_ConfigResource = M.struct("IncrementalAlterConfigsRequest", "AlterConfigsResource")
_Config = M.struct("IncrementalAlterConfigsRequest", "AlterableConfig")

GROUP_RESOURCE = 32  # ConfigResource type GROUP
_SET, _DELETE = 0, 1


@dataclass(frozen=True, slots=True)
class ShareOffset:
    """A share partition's start offset (the first record not yet settled) and its lag (-1: unknown)."""

    start_offset: int
    lag: int
    leader_epoch: int
    error_code: int


async def list_share_groups(client: KafkaClient) -> dict[str, str]:
    """Every share group of the cluster and its state (ListGroups v5+ to every broker)."""
    await client.ensure_metadata()

    async def one(node: int) -> Any:
        return await client.send(node, M.ListGroupsRequest(states_filter=[], types_filter=["share"]))

    out: dict[str, str] = {}
    for resp in await asyncio.gather(*(one(n) for n in client.metadata.brokers)):
        if resp.error_code:
            raise BrokerResponseError(resp.error_code, "ListGroups")
        out.update({g.group_id: g.group_state for g in resp.groups})
    return out


async def describe_share_group(client: KafkaClient, group_id: str) -> Any:
    """The group as its coordinator describes it (state, epochs, members with their assignment); a group the
    coordinator does not know raises GROUP_ID_NOT_FOUND."""
    node = await find_coordinator(client, group_id)
    resp = await client.send(node, M.ShareGroupDescribeRequest(group_ids=[group_id]))
    group = next((g for g in resp.groups if g.group_id == group_id), None)
    if group is None:
        raise BrokerResponseError(EC.UNKNOWN_SERVER_ERROR, f"ShareGroupDescribe({group_id}): no answer for it")
    if group.error_code:
        raise BrokerResponseError(group.error_code, f"ShareGroupDescribe({group_id})", group.error_message)
    return group


async def share_group_offsets(client: KafkaClient, group_id: str,
                              partitions: dict[str, list[int]] | None = None) -> dict[tuple[str, int], ShareOffset]:
    """Start offset and lag per share partition of the group (all it has, or those of ``partitions``)."""
    node = await find_coordinator(client, group_id)
    topics = None if partitions is None else [_OffsetsTopic(topic_name=t, partitions=ps)
                                              for t, ps in partitions.items()]
    resp = await client.send(node, M.DescribeShareGroupOffsetsRequest(
        groups=[_OffsetsGroup(group_id=group_id, topics=topics)]))
    out: dict[tuple[str, int], ShareOffset] = {}
    for g in resp.groups:
        if g.error_code:
            raise BrokerResponseError(g.error_code, f"DescribeShareGroupOffsets({group_id})", g.error_message)
        for t in g.topics:
            for p in t.partitions:
                out[(t.topic_name, p.partition_index)] = ShareOffset(p.start_offset, p.lag, p.leader_epoch,
                                                                     p.error_code)
    return out


async def alter_share_group_offsets(client: KafkaClient, group_id: str,
                                    offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Set share partitions' start offsets (the group must have no members: NON_EMPTY_GROUP otherwise);
    the error code per partition."""
    node = await find_coordinator(client, group_id)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(_AlterPartition(partition_index=partition, start_offset=offset))
    resp = await client.send(node, M.AlterShareGroupOffsetsRequest(
        group_id=group_id, topics=[_AlterTopic(topic_name=t, partitions=ps) for t, ps in by_topic.items()]))
    if resp.error_code:
        raise BrokerResponseError(resp.error_code, f"AlterShareGroupOffsets({group_id})", resp.error_message)
    return {(t.topic_name, p.partition_index): p.error_code for t in resp.responses for p in t.partitions}


async def delete_share_group_offsets(client: KafkaClient, group_id: str, topics: list[str]) -> dict[str, int]:
    """Forget the group's share partitions of ``topics`` (no members allowed); the error code per topic."""
    node = await find_coordinator(client, group_id)
    resp = await client.send(node, M.DeleteShareGroupOffsetsRequest(
        group_id=group_id, topics=[_DeleteTopic(topic_name=t) for t in topics]))
    if resp.error_code:
        raise BrokerResponseError(resp.error_code, f"DeleteShareGroupOffsets({group_id})", resp.error_message)
    return {t.topic_name: t.error_code for t in resp.responses}



async def alter_group_config(client: KafkaClient, group_id: str, configs: dict[str, str | None]) -> None:
    """Set (or, with None, remove) group-level configs, e.g. ``share.auto.offset.reset``,
    ``share.record.lock.duration.ms`` (within the broker's ``group.share.min/max.record.lock.duration.ms``)."""
    conf = [_Config(name=k, config_operation=_DELETE if v is None else _SET, value=v) for k, v in configs.items()]
    resp = await client.send_any(M.IncrementalAlterConfigsRequest(
        resources=[_ConfigResource(resource_type=GROUP_RESOURCE, resource_name=group_id, configs=conf)]))
    for r in resp.responses:
        if r.error_code:
            raise BrokerResponseError(r.error_code, f"IncrementalAlterConfigs(group {group_id})", r.error_message)


_ListTopic = M.struct("ListOffsetsRequest", "ListOffsetsTopic")
_ListPartition = M.struct("ListOffsetsRequest", "ListOffsetsPartition")
EARLIEST, LATEST = -2, -1


async def offsets_at(client: KafkaClient, partitions: list[tuple[str, int]],
                     timestamp: int) -> dict[tuple[str, int], int]:
    """Each partition's offset at ``timestamp`` (ListOffsets to its leader): EARLIEST (-2), LATEST (-1), or the
    first record at or after a time in ms (the end of the partition when there is none)."""
    await client.ensure_metadata({t for t, _ in partitions})
    by_leader: dict[int, list[tuple[str, int]]] = {}
    for t, p in partitions:
        leader = await client.leader_id(t, p)
        by_leader.setdefault(leader, []).append((t, p))

    async def ask(node: int, tps: list[tuple[str, int]], ts: int) -> dict[tuple[str, int], int]:
        topics: dict[str, list[Any]] = {}
        for t, p in tps:
            topics.setdefault(t, []).append(_ListPartition(partition_index=p, timestamp=ts, current_leader_epoch=-1))
        resp = await client.send(node, M.ListOffsetsRequest(
            replica_id=-1, isolation_level=0, topics=[_ListTopic(name=t, partitions=ps) for t, ps in topics.items()]))
        out = {}
        for rt in resp.topics:
            for rp in rt.partitions:
                if rp.error_code:
                    raise BrokerResponseError(rp.error_code, f"ListOffsets {rt.name}-{rp.partition_index}")
                out[(rt.name, rp.partition_index)] = rp.offset
        return out

    found: dict[tuple[str, int], int] = {}
    for got in await asyncio.gather(*(ask(n, tps, timestamp) for n, tps in by_leader.items())):
        found.update(got)
    missing = [tp for tp, o in found.items() if o < 0]
    if missing and timestamp >= 0:  # no record at or after the time: the end of the partition
        by_node: dict[int, list[tuple[str, int]]] = {}
        for t, p in missing:
            by_node.setdefault(await client.leader_id(t, p), []).append((t, p))
        for got in await asyncio.gather(*(ask(n, tps, LATEST) for n, tps in by_node.items())):
            found.update(got)
    return found
