"""Produce (key 0), v3-v11: appends each partition's record batch to its log.

Each partition must carry exactly one complete magic-2 batch (Kafka's rule since v3); the log assigns
its base offset (answered as ``base_offset``). Errors: leadership as for Fetch (with the new leader in
``current_leader`` from v10), INVALID_REQUIRED_ACKS (21) for acks other than 0, 1, -1, CORRUPT_MESSAGE
(2) for a CRC mismatch, INVALID_RECORD (87) for anything else malformed or a control batch,
INVALID_PRODUCER_EPOCH (47) for a producer epoch older than one already written. A batch from an
idempotent producer that was already appended (same producer id, epoch and base sequence) is answered
with its original offset and not appended again. A transactional batch opens a transaction for its
producer id until a COMMIT/ABORT marker (``TestCluster.end_txn`` or EndTxn). Topics with
``message.timestamp.type=LogAppendTime`` get the broker's time written into the batch. ``acks=0``:
no response.
"""

from __future__ import annotations

import time
from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.fakes.broker.handlers.partition_access import leader_partition
from tests.fakes.broker.partition_log import InvalidBatchError, parse_single_batch
from tests.fakes.broker.registry import HandlerRegistry, RequestContext
from tests.fakes.broker.state import NO_LEADER

TopicResponse = M.struct("ProduceResponse", "TopicProduceResponse")
PartitionResponse = M.struct("ProduceResponse", "PartitionProduceResponse")
LeaderIdAndEpoch = M.struct("ProduceResponse", "LeaderIdAndEpoch")
NodeEndpoint = M.struct("ProduceResponse", "NodeEndpoint")

INVALID_REQUIRED_ACKS = 21
INVALID_RECORD = 87
INVALID_PRODUCER_EPOCH = 47


def _append(ctx: RequestContext, topic: str, index: int, records: bytes | None, acks: int,
            leaders: set[int]) -> Any:
    resp = PartitionResponse(index=index, error_code=0, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                             record_errors=[], error_message=None)
    p, code = leader_partition(ctx.state, ctx.broker.node_id, topic, index)
    if code:
        resp.error_code = code
        if p is not None and code == EC.NOT_LEADER_OR_FOLLOWER and ctx.version >= 10:
            leader = p.leader if p.leader != NO_LEADER and ctx.state.is_alive(p.leader) else NO_LEADER
            resp.current_leader = LeaderIdAndEpoch(leader_id=leader, leader_epoch=p.leader_epoch)
            if leader >= 0:
                leaders.add(leader)
        return resp
    if acks not in (0, 1, -1):
        resp.error_code = INVALID_REQUIRED_ACKS
        return resp
    assert p is not None
    log = p.log
    if not records:
        resp.error_code = INVALID_RECORD
        resp.error_message = "no record batch"
        return resp
    try:
        batch = parse_single_batch(records, verify_crc=True)
    except InvalidBatchError as exc:
        resp.error_code = exc.error_code
        resp.error_message = str(exc)
        return resp
    if batch.is_control:
        resp.error_code = INVALID_RECORD
        resp.error_message = "clients may not write control batches"
        return resp
    pid = batch.producer_id
    if pid >= 0:
        known = log.producer_epochs.get(pid)
        if known is not None and batch.producer_epoch < known:
            resp.error_code = INVALID_PRODUCER_EPOCH
            return resp
        dup = log.sequences.get((pid, batch.producer_epoch, batch.base_sequence)) if batch.base_sequence >= 0 else None
        if dup is not None:
            resp.base_offset = dup
            resp.log_start_offset = log.log_start_offset
            return resp
    topic_state = ctx.state.topics[topic]
    append_time = None
    if topic_state.configs.get("message.timestamp.type", "").lower() == "logappendtime":
        append_time = int(time.time() * 1000)
    stored = log.append_batch(records, leader_epoch=p.leader_epoch, log_append_time=append_time)
    resp.base_offset = stored.base_offset
    resp.log_start_offset = log.log_start_offset
    if append_time is not None:
        resp.log_append_time_ms = append_time
    return resp


async def handle(ctx: RequestContext, req: Any) -> Any:
    leaders: set[int] = set()
    responses = [
        TopicResponse(name=t.name, partition_responses=[
            _append(ctx, t.name, pd.index, pd.records, req.acks, leaders) for pd in t.partition_data])
        for t in req.topic_data
    ]
    if req.acks == 0:
        return None
    resp = M.ProduceResponse(responses=responses, throttle_time_ms=0)
    if leaders:
        resp.node_endpoints = [NodeEndpoint(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                               for b in ctx.state.live_brokers() if b.node_id in leaders]
    return resp


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.PRODUCE, handle)
