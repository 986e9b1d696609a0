"""A partition's live offsets from its leader: beginning, end (high watermark) and last stable offset.

ListOffsets gives the beginning and a guess of the end; a one-byte read_committed fetch from there gives the true
high watermark and last stable offset (Tansu's ListOffsets(latest) is wrong for multi-record batches). A stale
leader is looked up again with fresh metadata after short pauses.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from service.client.client import KafkaClient
from service.client.errors import BrokerResponseError, KafkaError
from service.consumer.subscription import TopicPartition
from service.fetch.oneshot import probe_fetch
from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED
from service.protocol import error_codes as EC
from service.protocol import messages as M

log = logging.getLogger(__name__)

LATEST_TIMESTAMP = -1  # ListOffsets: the end of the log
EARLIEST_TIMESTAMP = -2  # ListOffsets: the start of the log
#: pauses (s) before asking a partition's leader again after NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH and
#: the like, each time with fresh metadata: the first at once, 1.5 s in all
LEADER_RETRY_PAUSES = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)

_ListTopic = M.struct("ListOffsetsRequest", "ListOffsetsTopic")
_ListPartition = M.struct("ListOffsetsRequest", "ListOffsetsPartition")


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    beginning_offset: int
    end_offset: int  # the high watermark (Confluent: ListOffsets(latest), read_uncommitted)
    last_stable_offset: int  # our extension: the end for read_committed consumers

    def to_json(self) -> dict[str, int]:
        return {"beginning_offset": self.beginning_offset, "end_offset": self.end_offset,
                "last_stable_offset": self.last_stable_offset}


async def _list_offset(client: KafkaClient, node: int, tp: TopicPartition, timestamp: int) -> int:
    req = M.ListOffsetsRequest(replica_id=-1, isolation_level=READ_UNCOMMITTED, topics=[_ListTopic(
        name=tp.topic, partitions=[_ListPartition(
            partition_index=tp.partition, timestamp=timestamp,
            current_leader_epoch=client.metadata.leader_epoch(tp.topic, tp.partition))])])
    resp = await client.send(node, req)
    for t in resp.topics:
        for p in t.partitions:
            if t.name == tp.topic and p.partition_index == tp.partition:
                if p.error_code:
                    client.handle_error_code(p.error_code, tp.topic)
                    raise BrokerResponseError(p.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
                return max(0, p.offset)
    raise KafkaError(f"ListOffsets: no answer for {tp.topic}-{tp.partition}", retriable=True)


async def _leader(client: KafkaClient, tp: TopicPartition, refresh: bool) -> int:
    return await client.leader_id(tp.topic, tp.partition, refresh=refresh)


async def _read_offsets_once(client: KafkaClient, tp: TopicPartition, refresh: bool) -> PartitionOffsets:
    node = await _leader(client, tp, refresh)
    beginning, guess = await asyncio.gather(_list_offset(client, node, tp, EARLIEST_TIMESTAMP),
                                            _list_offset(client, node, tp, LATEST_TIMESTAMP))
    # Fetch from ListOffsets' idea of the end: nothing (Kafka) or the last batch (Tansu) comes back, and the
    # response carries the true high watermark and last stable offset. A read_committed fetch returns no
    # records past the LSO, and its high watermark is still the partition's.
    start = guess
    for _ in range(2):
        parts = await probe_fetch(client, node, {tp: start}, max_bytes=1, isolation=READ_COMMITTED)
        p = parts.get(tp)
        if p is None:
            raise KafkaError(f"Fetch: no answer for {tp.topic}-{tp.partition}", retriable=True)
        if p.error_code == EC.OFFSET_OUT_OF_RANGE and start != beginning:
            start = beginning  # the log moved (or ListOffsets was wrong): ask from its start
            continue
        if p.error_code:
            client.handle_error_code(p.error_code, tp.topic)
            raise BrokerResponseError(p.error_code, f"end offset of {tp.topic}-{tp.partition}")
        end = p.high_watermark
        lso = p.last_stable_offset if p.last_stable_offset >= 0 else end
        return PartitionOffsets(beginning, end, lso)
    raise BrokerResponseError(EC.OFFSET_OUT_OF_RANGE, f"end offset of {tp.topic}-{tp.partition}")


async def read_offsets(client: KafkaClient, tp: TopicPartition) -> PartitionOffsets:
    """Beginning, end (high watermark) and last stable offset of one partition, from its leader. A stale
    leader (NOT_LEADER_OR_FOLLOWER and the like; UNKNOWN_LEADER_EPOCH from a partition Apache Kafka just created)
    is looked up again, after the pauses of :data:`LEADER_RETRY_PAUSES`."""
    refresh = False
    for pause in LEADER_RETRY_PAUSES:
        try:
            return await _read_offsets_once(client, tp, refresh=refresh)
        except BrokerResponseError as exc:
            if exc.code not in EC.METADATA_REFRESH_CODES:
                raise
            log.debug("offsets of %s-%d: %s; retrying with fresh metadata", tp.topic, tp.partition, exc)
        if pause:
            await asyncio.sleep(pause)
        refresh = True
    return await _read_offsets_once(client, tp, refresh=True)
