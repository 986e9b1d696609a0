"""Fetch (key 1), v4-v17, with Apache Kafka's semantics for consumers.

Per partition (in request order, or session order for incremental requests):

* errors (see :mod:`tests.fakes.broker.handlers.partition_access`); a fetch offset below the log start or
  above the high watermark → OFFSET_OUT_OF_RANGE. An errored partition has high watermark, last stable
  offset and log start offset -1 and no records;
* records: whole batches from the one containing the fetch offset, up to the high watermark
  (isolation level 0) or the last stable offset (level 1), within ``partition_max_bytes`` and what is
  left of the request's ``max_bytes``. The first partition that has data returns at least one batch
  even when it is larger than both limits (KIP-74); later partitions return nothing instead (or, with
  ``TestCluster.fetch_partial_batches``, the leading bytes that fit, as Kafka's byte-range reads do);
* read_committed: ``aborted_transactions`` lists (producer id, first offset) of every aborted
  transaction overlapping [fetch offset, end of the returned data), in the transaction index's order
  (the order of the ABORT markers, so not sorted by first offset); read_uncommitted: null.

The answer waits (up to ``max_wait_ms``) until ``min_bytes`` are available unless some partition has
an error or nothing was asked; appends, truncations and leader moves wake it (no polling).

Fetch sessions: see :mod:`tests.fakes.broker.fetch_sessions`. An injected error at depth 0 answers with
that top-level error and no partitions, without touching the session cache.

``TestCluster.fetch_zero_topic_ids`` makes v13+ responses name every topic by the all-zero uuid.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.fakes.broker.fetch_sessions import (
    FetchSessions,
    PartitionFetch,
    PartitionKey,
    PartitionResult,
    new_context,
)
from tests.fakes.broker.handlers.partition_access import leader_partition
from tests.fakes.broker.registry import HandlerRegistry, RequestContext, set_error_codes
from tests.fakes.broker.state import NO_LEADER, ClusterState

TopicResponse = M.struct("FetchResponse", "FetchableTopicResponse")
PartitionData = M.struct("FetchResponse", "PartitionData")
AbortedTransaction = M.struct("FetchResponse", "AbortedTransaction")
LeaderIdAndEpoch = M.struct("FetchResponse", "LeaderIdAndEpoch")
NodeEndpoint = M.struct("FetchResponse", "NodeEndpoint")

EXTENSION_KEY = "fetch_sessions"
PARTIAL_BATCHES_KEY = "fetch_partial_batches"
ZERO_TOPIC_IDS_KEY = "fetch_zero_topic_ids"
TOPIC_ID_VERSION = 13
READ_COMMITTED = 1
_ZERO_UUID = uuid.UUID(int=0)


def fetch_sessions(state: ClusterState) -> FetchSessions:
    """The cluster's fetch-session settings and caches (created on first use)."""
    fs = state.extensions.get(EXTENSION_KEY)
    if fs is None:
        fs = state.extensions[EXTENSION_KEY] = FetchSessions()
    return fs


# -- request -> partitions ----------------------------------------------------------------------------
def request_partitions(state: ClusterState, req: Any, version: int) -> tuple[list[PartitionFetch], list[PartitionKey]]:
    """The partitions a request names (in order; a repeated partition keeps its last entry) and the
    ones it forgets."""
    uses_ids = version >= TOPIC_ID_VERSION
    wanted: dict[PartitionKey, PartitionFetch] = {}
    for t in req.topics:
        if uses_ids:
            topic = state.topics_by_id.get(t.topic_id)
            name, tid, key0 = (topic.name if topic else None), t.topic_id, t.topic_id
        else:
            topic = state.topics.get(t.topic)
            name, tid, key0 = t.topic, (topic.topic_id if topic else _ZERO_UUID), t.topic
        for p in t.partitions:
            key = (key0, p.partition)
            wanted.pop(key, None)
            wanted[key] = PartitionFetch(
                key=key, topic=name, topic_id=tid, partition=p.partition, fetch_offset=p.fetch_offset,
                partition_max_bytes=p.partition_max_bytes, current_leader_epoch=p.current_leader_epoch,
                last_fetched_epoch=p.last_fetched_epoch, log_start_offset=p.log_start_offset)
    forgotten: list[PartitionKey] = []
    if version >= 7:
        for f in req.forgotten_topics_data:
            key0 = f.topic_id if uses_ids else f.topic
            forgotten.extend((key0, p) for p in f.partitions)
    return list(wanted.values()), forgotten


# -- reading ------------------------------------------------------------------------------------------
def read_partitions(ctx: RequestContext, parts: Sequence[PartitionFetch], *, isolation_level: int,
                    max_bytes: int) -> dict[PartitionKey, PartitionResult]:
    state = ctx.state
    node = ctx.broker.node_id
    partial = bool(state.extensions.get(PARTIAL_BATCHES_KEY, False))
    limit = max(0, max_bytes)
    min_one = True
    out: dict[PartitionKey, PartitionResult] = {}
    for pf in parts:
        p, code = leader_partition(state, node, pf.key[0], pf.partition, pf.current_leader_epoch)
        if code:
            res = PartitionResult(error_code=code)
            if p is not None and code in (EC.NOT_LEADER_OR_FOLLOWER, EC.FENCED_LEADER_EPOCH):
                leader = p.leader if p.leader != NO_LEADER and state.is_alive(p.leader) else NO_LEADER
                res.current_leader = (leader, p.leader_epoch)
            out[pf.key] = res
            continue
        assert p is not None
        log = p.log
        if pf.fetch_offset < log.log_start_offset or pf.fetch_offset > log.high_watermark:
            out[pf.key] = PartitionResult(error_code=EC.OFFSET_OUT_OF_RANGE)
            continue
        committed = isolation_level == READ_COMMITTED
        upper = log.last_stable_offset if committed else log.high_watermark
        batches, data = log.read(pf.fetch_offset, min(pf.partition_max_bytes, limit), upper, min_one=min_one,
                                 partial=partial)
        if data:
            min_one = False
            limit = max(0, limit - len(data))
        aborted: list[tuple[int, int]] | None = None
        if committed:
            end = batches[-1].next_offset if batches else pf.fetch_offset
            aborted = [(a.producer_id, a.first_offset) for a in log.aborted_between(pf.fetch_offset, end)]
        out[pf.key] = PartitionResult(error_code=0, high_watermark=log.high_watermark,
                                      last_stable_offset=log.last_stable_offset,
                                      log_start_offset=log.log_start_offset, records=data, aborted=aborted)
    return out


def _respond_now(results: dict[PartitionKey, PartitionResult], min_bytes: int) -> bool:
    if not results:
        return True
    if any(r.error_code for r in results.values()):
        return True
    return sum(r.size for r in results.values()) >= min_bytes


# -- response -----------------------------------------------------------------------------------------
def build_response(ctx: RequestContext, error_code: int, session_id: int,
                   pairs: Sequence[tuple[PartitionFetch, PartitionResult]]) -> Any:
    v = ctx.version
    topics: list[Any] = []
    current: Any = None
    current_key: object = None
    leaders: set[int] = set()
    zero_ids = bool(ctx.state.extensions.get(ZERO_TOPIC_IDS_KEY, False))
    for pf, r in pairs:
        if current is None or pf.key[0] != current_key:
            current_key = pf.key[0]
            current = TopicResponse(topic=pf.topic if v < TOPIC_ID_VERSION else None,
                                    topic_id=_ZERO_UUID if zero_ids else pf.topic_id, partitions=[])
            if v < TOPIC_ID_VERSION:
                current.topic = pf.key[0]
            topics.append(current)
        pd = PartitionData(
            partition_index=pf.partition, error_code=r.error_code, high_watermark=r.high_watermark,
            last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
            aborted_transactions=(None if r.aborted is None else
                                  [AbortedTransaction(producer_id=pid, first_offset=first)
                                   for pid, first in r.aborted]),
            preferred_read_replica=-1, records=r.records)
        if r.current_leader is not None and v >= 16:
            pd.current_leader = LeaderIdAndEpoch(leader_id=r.current_leader[0], leader_epoch=r.current_leader[1])
            if r.current_leader[0] >= 0:
                leaders.add(r.current_leader[0])
        current.partitions.append(pd)
    resp = M.FetchResponse(throttle_time_ms=0, error_code=error_code, session_id=session_id, responses=topics)
    if leaders:
        resp.node_endpoints = [NodeEndpoint(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                               for b in ctx.state.live_brokers() if b.node_id in leaders]
    return resp


# -- handler ------------------------------------------------------------------------------------------
async def handle(ctx: RequestContext, req: Any) -> Any:
    v = ctx.version
    state = ctx.state
    fs = fetch_sessions(state)
    parts, forgotten = request_partitions(state, req, v)
    cache = fs.cache(ctx.broker.node_id) if fs.enabled else None
    privileged = v <= 14 and req.replica_id >= 0
    context = new_context(cache, version=v, session_id=req.session_id if v >= 7 else 0,
                          epoch=req.session_epoch if v >= 7 else -1, fetch=parts, forgotten=forgotten,
                          privileged=privileged, uses_topic_ids=v >= TOPIC_ID_VERSION)
    if context.kind == "error":
        return build_response(ctx, context.error_code, 0, [])
    isolation = req.isolation_level
    max_bytes = req.max_bytes

    def read() -> dict[PartitionKey, PartitionResult]:
        return read_partitions(ctx, context.to_read, isolation_level=isolation, max_bytes=max_bytes)

    results = read()
    if req.max_wait_ms > 0 and not _respond_now(results, req.min_bytes):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.max_wait_ms / 1000
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0 or not await state.changes.wait(remaining):
                break
            results = read()
            if _respond_now(results, req.min_bytes):
                break
    error, session_id, pairs = context.build(results)
    return build_response(ctx, error, session_id, pairs)


async def error_response(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    """An injected error. Depth 0: the top-level error alone. Otherwise the requested partitions are
    read (sessionless, no waiting, no session change) and the code is written at ``depth``."""
    if depth == 0:
        return build_response(ctx, code, 0, [])
    parts, _ = request_partitions(ctx.state, req, ctx.version)
    results = read_partitions(ctx, parts, isolation_level=req.isolation_level, max_bytes=req.max_bytes)
    resp = build_response(ctx, 0, 0, [(pf, results[pf.key]) for pf in parts])
    set_error_codes(resp, code, depth)
    return resp


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.FETCH, handle, error_response=error_response)
