"""Sans-io parts of the client: version negotiation, metadata cache, backoff, bootstrap parsing."""

from __future__ import annotations

import random
import uuid

import pytest

from service.client.client import parse_bootstrap
from service.client.connection import RECONNECT_BACKOFF_MAX_S, Backoff
from service.client.errors import BrokerResponseError, NoCommonVersionError
from service.client.metadata import ClusterMetadata
from service.client.versions import NegotiatedVersions
from service.protocol import messages as M

Broker = M.struct("MetadataResponse", "MetadataResponseBroker")
Topic = M.struct("MetadataResponse", "MetadataResponseTopic")
Part = M.struct("MetadataResponse", "MetadataResponsePartition")


def test_negotiation_picks_highest_common_version() -> None:
    nv = NegotiatedVersions({M.ApiKey.FETCH: (0, 13), M.ApiKey.METADATA: (0, 20)})
    assert nv.version(M.ApiKey.FETCH) == 13
    assert nv.version(M.ApiKey.METADATA) == 12  # capped by what we implement
    assert nv.supports(M.ApiKey.FETCH, 12)
    assert not nv.supports(M.ApiKey.FETCH, 14)


def test_negotiation_without_overlap_is_a_clear_error() -> None:
    nv = NegotiatedVersions({M.ApiKey.FETCH: (0, 3)})
    with pytest.raises(NoCommonVersionError, match=r"broker supports v0-v3.*implements v4-v17"):
        nv.version(M.ApiKey.FETCH)
    with pytest.raises(NoCommonVersionError, match="does not support JoinGroup"):
        nv.version(M.ApiKey.JOIN_GROUP)
    assert not nv.has(M.ApiKey.JOIN_GROUP)


def _resp(epoch: int, leader: int, tid: uuid.UUID, error: int = 0) -> object:
    return M.MetadataResponse(
        brokers=[Broker(node_id=1, host="h1", port=1), Broker(node_id=2, host="h2", port=2)],
        controller_id=1,
        topics=[Topic(error_code=error, name="a", topic_id=tid,
                      partitions=[Part(partition_index=0, leader_id=leader, leader_epoch=epoch,
                                       replica_nodes=[1, 2], isr_nodes=[1, 2])])],
    )


def test_metadata_cache_never_regresses_leader_epoch() -> None:
    md = ClusterMetadata()
    tid = uuid.uuid4()
    md.update(_resp(5, 2, tid), requested_topics=["a"])
    assert md.leader("a", 0) == 2 and md.leader_epoch("a", 0) == 5
    md.update(_resp(4, 1, tid), requested_topics=["a"])  # stale answer from a lagging broker
    assert md.leader("a", 0) == 2
    md.update(_resp(6, 1, tid), requested_topics=["a"])
    assert md.leader("a", 0) == 1 and md.leader_epoch("a", 0) == 6
    assert md.topic_names[tid] == "a"
    assert md.broker(2).host == "h2"


def test_metadata_cache_recreated_topic_takes_new_id_and_epochs() -> None:
    md = ClusterMetadata()
    old, new = uuid.uuid4(), uuid.uuid4()
    md.update(_resp(9, 2, old), requested_topics=["a"])
    md.update(_resp(0, 1, new), requested_topics=["a"])
    assert md.leader("a", 0) == 1 and md.topic_id("a") == new
    assert old not in md.topic_names


def test_metadata_cache_unknown_topic_and_stale_marks() -> None:
    md = ClusterMetadata()
    assert md.needs_refresh
    md.update(_resp(0, 1, uuid.uuid4(), error=3), requested_topics=None)
    assert not md.needs_refresh
    assert md.leader("a", 0) is None and md.topic_error("a") == 3
    md.mark_stale("a")
    assert md.needs_refresh and md.stale_topics() == {"a"}
    md.update(_resp(0, 1, uuid.uuid4()), requested_topics=["a"])
    assert not md.needs_refresh


def test_backoff_grows_with_jitter_and_resets() -> None:
    b = Backoff(initial=0.1, maximum=1.0, jitter=0.2, rng=random.Random(7))
    delays = [b.failure(now=0.0) for _ in range(8)]
    assert 0.08 <= delays[0] <= 0.12
    assert 0.16 <= delays[1] <= 0.24
    assert all(d <= 1.2 for d in delays) and delays[-1] >= 0.8
    assert b.remaining(now=0.0) == pytest.approx(delays[-1])
    b.success()
    assert b.remaining(now=0.0) == 0.0 and b.failures == 0


def test_parse_bootstrap() -> None:
    assert parse_bootstrap("a:1, PLAINTEXT://b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]
    with pytest.raises(ValueError):
        parse_bootstrap("nohostport")
    with pytest.raises(ValueError):
        parse_bootstrap("")


def test_broker_response_error_carries_code_and_retriability() -> None:
    e = BrokerResponseError(6, "t-0")
    assert e.code == 6 and e.retriable and "NOT_LEADER_OR_FOLLOWER" in str(e)
    e2 = BrokerResponseError(22)
    assert not e2.retriable and e2.name == "ILLEGAL_GENERATION"


def test_reconnect_backoff_is_capped_at_a_second() -> None:
    """A broker that was down for a while is tried again at least once a second (Kafka's Java client:
    reconnect.backoff.max.ms = 1000), so a restarted broker is found again within about a second."""
    b = Backoff(rng=random.Random(3))
    delays = [b.failure(now=0.0) for _ in range(30)]
    assert 0.08 <= delays[0] <= 0.12
    assert max(delays) <= RECONNECT_BACKOFF_MAX_S * 1.2 and RECONNECT_BACKOFF_MAX_S == 1.0
    assert delays[-1] >= 0.8
