"""ListOffsets (key 2), v1-v9, with Apache Kafka's semantics.

Per partition: errors as for Fetch (:mod:`tests.fakes.broker.handlers.partition_access`), then by target
timestamp:

* -2 (earliest) and -4 (earliest local): the log start offset, timestamp -1;
* -1 (latest): the high watermark, or the last stable offset when isolation level is 1
  (read_committed) — Kafka's behaviour, unlike Tansu's; timestamp -1, the current leader epoch;
* -3 (max timestamp, v7+): the record with the largest timestamp;
* -5 (latest tiered, v9): offset -1 (no tiered storage here);
* t >= 0: the first record whose timestamp is >= t below the high watermark / last stable offset,
  else offset -1 and timestamp -1.
"""

from __future__ import annotations

from typing import Any

from service.protocol import messages as M
from tests.fakes.broker.handlers.partition_access import leader_partition
from tests.fakes.broker.registry import HandlerRegistry, RequestContext

TopicResponse = M.struct("ListOffsetsResponse", "ListOffsetsTopicResponse")
PartitionResponse = M.struct("ListOffsetsResponse", "ListOffsetsPartitionResponse")

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5


def answer(ctx: RequestContext, topic: str, index: int, timestamp: int, current_leader_epoch: int,
           isolation_level: int) -> Any:
    p, code = leader_partition(ctx.state, ctx.broker.node_id, topic, index, current_leader_epoch)
    if code:
        return PartitionResponse(partition_index=index, error_code=code, timestamp=-1, offset=-1, leader_epoch=-1)
    assert p is not None
    log = p.log
    fetchable = log.last_stable_offset if isolation_level == 1 else log.high_watermark
    ts, off, epoch = -1, -1, -1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        off, epoch = log.log_start_offset, log.epoch_at(log.log_start_offset)
    elif timestamp == LATEST:
        off, epoch = fetchable, p.leader_epoch
    elif timestamp == MAX_TIMESTAMP:
        found = log.max_timestamp_offset()
        if found is not None and found.offset < fetchable:
            ts, off, epoch = found
    elif timestamp == LATEST_TIERED:
        pass
    elif timestamp >= 0:
        found = log.offset_for_timestamp(timestamp, upper_bound=fetchable)
        if found is not None:
            ts, off, epoch = found
    return PartitionResponse(partition_index=index, error_code=0, timestamp=ts, offset=off, leader_epoch=epoch)


async def handle(ctx: RequestContext, req: Any) -> Any:
    isolation = req.isolation_level if ctx.version >= 2 else 0
    topics = [
        TopicResponse(name=t.name, partitions=[
            answer(ctx, t.name, p.partition_index, p.timestamp, p.current_leader_epoch, isolation)
            for p in t.partitions])
        for t in req.topics
    ]
    return M.ListOffsetsResponse(throttle_time_ms=0, topics=topics)


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.LIST_OFFSETS, handle)
