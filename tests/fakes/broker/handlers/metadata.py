"""Metadata (key 3), v1-v12.

Brokers: every running broker. Topics: all (null request list) or the requested ones, by name or, from
v10 on, by topic id (name null). A missing topic is UNKNOWN_TOPIC_OR_PARTITION (or created, when the
cluster auto-creates topics and the request allows it), an unknown id UNKNOWN_TOPIC_ID, an invalid
name INVALID_TOPIC_EXCEPTION. A partition whose leader is down (or absent) reports leader -1 with
LEADER_NOT_AVAILABLE; stopped replicas are listed as offline and left out of the ISR.
"""

from __future__ import annotations

import uuid
from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.fakes.broker.registry import HandlerRegistry, RequestContext, set_error_codes
from tests.fakes.broker.state import NO_LEADER, ClusterState, TopicState, valid_topic_name

Broker = M.struct("MetadataResponse", "MetadataResponseBroker")
Topic = M.struct("MetadataResponse", "MetadataResponseTopic")
Partition = M.struct("MetadataResponse", "MetadataResponsePartition")
INVALID_TOPIC_EXCEPTION = 17
_ZERO_UUID = uuid.UUID(int=0)


def topic_entry(state: ClusterState, topic: TopicState) -> Any:
    parts = []
    for p in topic.partitions:
        leader = p.leader if p.leader != NO_LEADER and state.is_alive(p.leader) else NO_LEADER
        parts.append(Partition(
            error_code=EC.LEADER_NOT_AVAILABLE if leader == NO_LEADER else 0,
            partition_index=p.index,
            leader_id=leader,
            leader_epoch=p.leader_epoch,
            replica_nodes=list(p.replicas),
            isr_nodes=[r for r in p.isr if state.is_alive(r)],
            offline_replicas=[r for r in p.replicas if not state.is_alive(r)],
        ))
    return Topic(error_code=0, name=topic.name, topic_id=topic.topic_id, is_internal=topic.internal,
                 partitions=parts)


def _error_topic(code: int, name: str | None, version: int, topic_id: uuid.UUID = _ZERO_UUID) -> Any:
    if name is None and version < 12:
        name = ""  # names are only nullable from v12 on
    return Topic(error_code=code, name=name, topic_id=topic_id, partitions=[])


async def handle(ctx: RequestContext, req: Any) -> Any:
    return build(ctx, req, may_create=True)


async def error_response(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    resp = build(ctx, req, may_create=False)  # an injected error must not auto-create topics
    set_error_codes(resp, code, depth)
    return resp


def build(ctx: RequestContext, req: Any, *, may_create: bool) -> Any:
    state = ctx.state
    v = ctx.version
    topics: list[Any] = []
    if req.topics is None:
        topics = [topic_entry(state, t) for t in state.sorted_topics()]
    else:
        seen: set[object] = set()
        allow_create = may_create and state.auto_create_topics and (v < 4 or req.allow_auto_topic_creation)
        for rt in req.topics:
            if v >= 10 and rt.name is None:
                if rt.topic_id in seen:
                    continue
                seen.add(rt.topic_id)
                t = state.topics_by_id.get(rt.topic_id)
                topics.append(topic_entry(state, t) if t is not None
                              else _error_topic(EC.UNKNOWN_TOPIC_ID, None, v, rt.topic_id))
                continue
            if rt.name in seen:
                continue
            seen.add(rt.name)
            t = state.topics.get(rt.name)
            if t is None and not valid_topic_name(rt.name):
                topics.append(_error_topic(INVALID_TOPIC_EXCEPTION, rt.name, v))
            elif t is None and allow_create:
                topics.append(topic_entry(state, state.create_topic(rt.name)))
            elif t is None:
                topics.append(_error_topic(EC.UNKNOWN_TOPIC_OR_PARTITION, rt.name, v))
            else:
                topics.append(topic_entry(state, t))
    brokers = [Broker(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack) for b in state.live_brokers()]
    return M.MetadataResponse(throttle_time_ms=0, brokers=brokers, cluster_id=state.cluster_id,
                              controller_id=state.controller_id, topics=topics)


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.METADATA, handle, error_response=error_response)
