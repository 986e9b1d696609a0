"""A minimal transaction coordinator: InitProducerId (22) v0-5, AddPartitionsToTxn (24) v0-3 and
EndTxn (26) v0-3. Every broker acts as the coordinator (there is no FindCoordinator handler here).

* InitProducerId without a transactional id hands out a new producer id (epoch 0), for idempotent
  producers; with one, the first call allocates an id and later calls bump its epoch (fencing the old
  producer) and abort its open transaction (ABORT markers in every partition it had added).
* AddPartitionsToTxn records the partitions of the producer's transaction (errors: unknown
  transactional id or producer id → INVALID_PRODUCER_ID_MAPPING 49, old epoch → INVALID_PRODUCER_EPOCH
  47, unknown partition → UNKNOWN_TOPIC_OR_PARTITION).
* EndTxn writes a COMMIT or ABORT marker into each of those partitions, as the coordinator's markers
  reach the partition leaders in Kafka (see ``PartitionLog.end_txn``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.fakes.broker.registry import HandlerRegistry, RequestContext
from tests.fakes.broker.state import ClusterState

TopicResult = M.struct("AddPartitionsToTxnResponse", "AddPartitionsToTxnTopicResult")
PartitionResult = M.struct("AddPartitionsToTxnResponse", "AddPartitionsToTxnPartitionResult")

EXTENSION_KEY = "transactions"
INVALID_PRODUCER_EPOCH = 47
INVALID_PRODUCER_ID_MAPPING = 49


@dataclass
class Transaction:
    transactional_id: str
    producer_id: int
    producer_epoch: int = 0
    partitions: set[tuple[str, int]] = field(default_factory=set)


@dataclass
class TransactionState:
    next_producer_id: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    transactions: dict[str, Transaction] = field(default_factory=dict)
    committed: int = 0
    aborted: int = 0


def transaction_state(state: ClusterState) -> TransactionState:
    ts = state.extensions.get(EXTENSION_KEY)
    if ts is None:
        ts = state.extensions[EXTENSION_KEY] = TransactionState()
    return ts


def _write_markers(state: ClusterState, txn: Transaction, commit: bool) -> None:
    for topic, index in sorted(txn.partitions):
        t = state.topics.get(topic)
        if t is None or index >= len(t.partitions):
            continue
        p = t.partitions[index]
        p.log.end_txn(txn.producer_id, commit, producer_epoch=txn.producer_epoch, leader_epoch=p.leader_epoch)
    txn.partitions.clear()


async def init_producer_id(ctx: RequestContext, req: Any) -> Any:
    ts = transaction_state(ctx.state)
    if req.transactional_id is None:
        return M.InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=next(ts.next_producer_id),
                                        producer_epoch=0)
    txn = ts.transactions.get(req.transactional_id)
    if txn is None:
        txn = ts.transactions[req.transactional_id] = Transaction(req.transactional_id, next(ts.next_producer_id))
    else:
        if txn.partitions:
            _write_markers(ctx.state, txn, commit=False)
            ts.aborted += 1
        txn.producer_epoch += 1
    return M.InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=txn.producer_id,
                                    producer_epoch=txn.producer_epoch)


def _check(ts: TransactionState, transactional_id: str, producer_id: int, producer_epoch: int
           ) -> tuple[Transaction | None, int]:
    txn = ts.transactions.get(transactional_id)
    if txn is None or txn.producer_id != producer_id:
        return None, INVALID_PRODUCER_ID_MAPPING
    if producer_epoch != txn.producer_epoch:
        return None, INVALID_PRODUCER_EPOCH
    return txn, 0


async def add_partitions(ctx: RequestContext, req: Any) -> Any:
    ts = transaction_state(ctx.state)
    txn, code = _check(ts, req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                       req.v3_and_below_producer_epoch)
    results = []
    for t in req.v3_and_below_topics:
        parts = []
        topic = ctx.state.topics.get(t.name)
        for index in t.partitions:
            pcode = code
            if not pcode and (topic is None or not 0 <= index < len(topic.partitions)):
                pcode = EC.UNKNOWN_TOPIC_OR_PARTITION
            if not pcode and txn is not None:
                txn.partitions.add((t.name, index))
            parts.append(PartitionResult(partition_index=index, partition_error_code=pcode))
        results.append(TopicResult(name=t.name, results_by_partition=parts))
    return M.AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=results)


async def end_txn(ctx: RequestContext, req: Any) -> Any:
    ts = transaction_state(ctx.state)
    txn, code = _check(ts, req.transactional_id, req.producer_id, req.producer_epoch)
    if txn is not None:
        _write_markers(ctx.state, txn, commit=req.committed)
        if req.committed:
            ts.committed += 1
        else:
            ts.aborted += 1
    return M.EndTxnResponse(throttle_time_ms=0, error_code=code)


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.INIT_PRODUCER_ID, init_producer_id)
    registry.register(M.ApiKey.ADD_PARTITIONS_TO_TXN, add_partitions)
    registry.register(M.ApiKey.END_TXN, end_txn)
