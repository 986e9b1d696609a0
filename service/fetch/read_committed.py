"""Turn one partition's fetched batches into deliverable records (pure).

Under read_committed (isolation level 1):
- the aborted-transaction list of the fetch response is processed in first-offset order (it may
  arrive unsorted, and one producer may have several entries): an entry becomes active once a batch
  whose last offset reaches its first offset is seen, and stays active until that producer's ABORT
  marker;
- transactional batches of an active aborted producer are dropped; control batches are never
  returned (an empty one, left by Kafka's log cleaner on compacted topics, carries no marker: it is
  only skipped); records at or beyond the last stable offset are not delivered.
Under read_uncommitted every data record is returned. In both modes the next fetch offset moves past
control batches, aborted batches and batches left empty by compaction, and records below the fetch
position (a batch that starts before it) are skipped.

Defence in depth for brokers without an aborted-transaction index (e.g. Tansu): when an ABORT marker
arrives for a producer whose records of that transaction were already delivered, it is counted per
partition (and the owner logs it once per partition).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.protocol.records import ControlType, Record, RecordBatch

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@dataclass(slots=True)
class TxnTracker:
    """Per-partition state that outlives one fetch response (transactions span responses)."""

    delivered_open: dict[int, int] = field(default_factory=dict)  # producer id -> first delivered offset
    aborted_after_delivery: int = 0
    warned: bool = False


@dataclass(slots=True)
class FilterResult:
    records: list[Record]
    next_offset: int  # where the next fetch for this partition starts
    aborted_batches: int = 0
    control_batches: int = 0
    new_aborted_after_delivery: int = 0
    last_epoch: int | None = None


def filter_batches(
    batches: Sequence[RecordBatch],
    fetch_offset: int,
    *,
    isolation_level: int = READ_UNCOMMITTED,
    aborted_transactions: Iterable[Any] | None = None,
    last_stable_offset: int = -1,
    tracker: TxnTracker | None = None,
) -> FilterResult:
    """Deliverable records of ``batches`` (already decoded) fetched from ``fetch_offset``.

    ``aborted_transactions`` holds objects with ``producer_id`` and ``first_offset`` attributes
    (the Fetch response's AbortedTransactions entries) or ``(producer_id, first_offset)`` pairs.
    """
    read_committed = isolation_level == READ_COMMITTED
    out: list[Record] = []
    next_offset = fetch_offset
    aborted_heap: list[tuple[int, int]] = []
    if read_committed and aborted_transactions:
        for a in aborted_transactions:
            pid, first = (a if isinstance(a, tuple) else (a.producer_id, a.first_offset))
            aborted_heap.append((first, pid))
        heapq.heapify(aborted_heap)
    active_aborted: set[int] = set()
    res = FilterResult(out, next_offset)
    limit = last_stable_offset if read_committed and last_stable_offset >= 0 else None
    for batch in batches:
        if batch.next_offset <= fetch_offset:
            continue  # entirely below the position (the broker returned an earlier batch)
        if limit is not None and batch.base_offset >= limit:
            break
        pid = batch.producer_id
        if read_committed and pid >= 0:
            last = batch.last_offset
            while aborted_heap and aborted_heap[0][0] <= last:
                active_aborted.add(heapq.heappop(aborted_heap)[1])
            if batch.is_control:
                ctype = batch.control_type
                if ctype == ControlType.ABORT:
                    active_aborted.discard(pid)
            elif batch.is_transactional and pid in active_aborted:
                res.aborted_batches += 1
                next_offset = batch.next_offset
                continue
        if batch.is_control:
            res.control_batches += 1
            if tracker is not None and pid >= 0 and batch.records_count:  # an empty one ends nothing
                first = tracker.delivered_open.pop(pid, None)
                if first is not None and batch.control_type == ControlType.ABORT and read_committed:
                    tracker.aborted_after_delivery += 1
                    res.new_aborted_after_delivery += 1
            next_offset = batch.next_offset
            continue
        records = batch.records if batch.records is not None else batch.decode()
        if records and records[0].offset >= fetch_offset and (limit is None or records[-1].offset < limit):
            out.extend(records)  # the common case: the whole batch is deliverable
            res.last_epoch = batch.partition_leader_epoch
            if tracker is not None and batch.is_transactional and pid >= 0:
                tracker.delivered_open.setdefault(pid, records[0].offset)
            next_offset = batch.next_offset
            continue
        delivered_any = False
        for r in records:
            if r.offset < fetch_offset:
                continue
            if limit is not None and r.offset >= limit:
                res.next_offset = max(r.offset, fetch_offset)
                return res
            out.append(r)
            delivered_any = True
        if delivered_any:
            res.last_epoch = batch.partition_leader_epoch
            if tracker is not None and batch.is_transactional and pid >= 0:
                tracker.delivered_open.setdefault(pid, records[0].offset)
        next_offset = batch.next_offset
    res.next_offset = max(next_offset, fetch_offset)
    return res
