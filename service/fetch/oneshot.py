"""One-shot fetches: a single Fetch of a few partitions, outside any consumer's fetcher.

End offsets are read from a Fetch response, whose high watermark and last stable offset are right on
every broker (Tansu's ListOffsets(latest) is not): the consumer engine's end offsets and timestamp
searches (:mod:`service.consumer.consumer`), the topic offsets of :mod:`service.cluster.topics`, and the
offset-range reads of :mod:`service.fetch.ranges` (which fetch records with it) all use
:func:`probe_fetch`. It builds and resolves its request through the same session-handler pairing as the
main fetcher (:meth:`service.fetch.session.FetchSessionHandler.request`), so a failure between building
and answering never leaves a session "in flight".
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from service.client.client import KafkaClient
from service.consumer.subscription import TopicPartition
from service.fetch.session import ZERO_UUID, FetchPartitionData, FetchSessionHandler
from service.protocol import messages as M

__all__ = ["probe_fetch"]

# Per client: brokers that answered a v13+ Fetch with the all-zero topic id (their ids cannot be trusted).
_NAMES_ONLY: weakref.WeakKeyDictionary[KafkaClient, set[int]] = weakref.WeakKeyDictionary()


async def probe_fetch(client: KafkaClient, node: int, offsets: dict[TopicPartition, int], *, max_bytes: int,
                      isolation: int, max_wait_ms: int = 5, leader_epochs: bool = False, lease: bool = False,
                      request_max_bytes: int = 0x7FFFFFFF,
                      session: FetchSessionHandler | None = None) -> dict[TopicPartition, Any]:
    """A one-off Fetch (max wait 5 ms; sessionless unless ``session`` is given) of ``offsets`` from broker
    ``node``; partition responses by partition. ``leader_epochs`` sends the partitions' current leader
    epochs, ``lease`` takes an exclusive connection so the fetch never waits behind, or holds up, other
    requests; ``max_bytes`` is per partition, ``request_max_bytes`` for the whole answer.

    The version is the main fetcher's choice (:func:`service.fetch.session.choose_version`): Fetch v13+
    names topics by id, so a topic whose id the metadata does not know (the all-zero uuid) is fetched at
    v12 by name. A broker that answers v13+ with zero topic ids (the session handler then turns
    ``names_only``, as in the main fetcher) is asked again at once by name, and is remembered for this client
    so later probes name topics from the start.

    ``session``: a :class:`~service.fetch.session.FetchSessionHandler` of ``node`` to fetch through (KIP-227;
    the offset-range reads keep one per partition reader); the request is then full or incremental as the
    session says, an incremental answer may leave out a partition with nothing new, and a session the
    broker refused (unknown id, wrong epoch) is asked again at once with a full request. Any failure
    before the answer (building, connecting, sending, cancellation) leaves the session ready for a full
    request (``handle_error``) and raises."""
    md = client.metadata
    by_name = node in _NAMES_ONLY.get(client, ())
    refused = 0
    while True:
        handler = session if session is not None else FetchSessionHandler(node, sessionless=True)
        b = handler.builder()
        for tp, off in offsets.items():
            b.add(FetchPartitionData(
                topic=tp.topic, topic_id=ZERO_UUID if by_name else md.topic_id(tp.topic), partition=tp.partition,
                fetch_offset=off, partition_max_bytes=max_bytes,
                current_leader_epoch=md.leader_epoch(tp.topic, tp.partition) if leader_epochs else -1))
        async with contextlib.AsyncExitStack() as stack:
            if lease:
                conn = await (await stack.enter_async_context(client.lease(node))).get()
            else:
                conn = await client.connection(node).get()
            # max wait 5 ms / min bytes 1: Tansu answers a max_wait=0, min_bytes=0 fetch with no partitions
            with handler.request(b, max_version=conn.version_for(M.ApiKey.FETCH), max_wait_ms=max_wait_ms,
                                 min_bytes=1, max_bytes=request_max_bytes, isolation_level=isolation) as fx:
                resp = await conn.send(fx.message, fx.version)
                ok = handler.handle_response(resp, fx.version)
        if not ok and handler.names_only and not by_name:
            _NAMES_ONLY.setdefault(client, set()).add(node)  # zero topic ids in a v13+ answer: ask by name
            by_name = True
            continue
        if not ok and session is not None and refused < 2:
            refused += 1  # the broker refused the session (evicted, wrong epoch): the next request is full
            continue
        return {TopicPartition(*tp): p for tp, p in handler.response_partitions(resp, fx.version).items()}
