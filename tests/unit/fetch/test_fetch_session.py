"""Pure tests of the client-side fetch session state machine (service/fetch/session.py).

Every request the handler builds is turned into a FetchRequest and pushed through our own frame codec
(encode, then decode as a broker would) so the tests also prove the requests are well formed. Responses are
encoded and decoded at the version under test, so fields a version lacks take their wire defaults.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.fetch.session import (
    FINAL_EPOCH,
    INITIAL,
    INT32_MAX,
    LEGACY,
    ZERO_UUID,
    FetchMetadata,
    FetchPartitionData,
    FetchRequestData,
    FetchSessionHandler,
    FetchSessionStateError,
    TopicIdPartition,
    TopicPartition,
    choose_version,
    next_epoch,
    sessions_supported,
    to_fetch_request,
)
from service.protocol import error_codes as EC
from service.protocol import frames
from service.protocol import messages as M

_TopicResp = M.struct("FetchResponse", "FetchableTopicResponse")
_PartResp = M.struct("FetchResponse", "PartitionData")

ALL_VERSIONS = (4, 7, 12, 13, 17)
SESSION_VERSIONS = (7, 12, 13, 17)
ID_A = uuid.UUID("11111111-1111-1111-1111-111111111111")
ID_B = uuid.UUID("22222222-2222-2222-2222-222222222222")
ID_A2 = uuid.UUID("33333333-3333-3333-3333-333333333333")
IDS = {"a": ID_A, "b": ID_B}


# -- helpers ------------------------------------------------------------------------------------------
def pd(topic: str, partition: int, offset: int, *, topic_id: uuid.UUID | None = None, **kw: Any) -> FetchPartitionData:
    return FetchPartitionData(topic=topic, topic_id=IDS.get(topic, ZERO_UUID) if topic_id is None else topic_id,
                              partition=partition, fetch_offset=offset, **kw)


def build(h: FetchSessionHandler, parts: list[FetchPartitionData]) -> FetchRequestData:
    b = h.builder()
    for p in parts:
        b.add(p)
    return b.build()


def wire(data: FetchRequestData, version: int, **kw: Any) -> tuple[bytes, Any]:
    """Encode ``data`` as a Fetch request frame at ``version`` and decode it back like a broker."""
    params: dict[str, Any] = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 52428800, "isolation_level": 1}
    params.update(kw)
    req = to_fetch_request(data, version=version, **params)
    frame = frames.encode_request(req, version, correlation_id=7, client_id="consumer-group1-1")
    hdr, decoded = frames.decode_request(frame[4:])
    assert (hdr.api_key, hdr.api_version, hdr.correlation_id) == (M.ApiKey.FETCH, version, 7)
    return frame, decoded


def sent(decoded: Any, version: int) -> list[tuple[str, int, int]]:
    """(topic name, partition, fetch offset) of a decoded request; names resolved from ids at v13+."""
    names = {v: k for k, v in IDS.items()} | {ID_A2: "a"}
    out = []
    for t in decoded.topics:
        name = names[t.topic_id] if version >= 13 else t.topic
        out.extend((name, p.partition, p.fetch_offset) for p in t.partitions)
    return out


def forgotten(decoded: Any, version: int) -> list[tuple[object, int]]:
    out: list[tuple[object, int]] = []
    for f in decoded.forgotten_topics_data:
        key = f.topic_id if version >= 13 else f.topic
        out.extend((key, p) for p in f.partitions)
    return out


def response(version: int, parts: list[tuple[str, int]], *, session_id: int = 0, error: int = 0,
             throttle_ms: int = 0, topic_ids: dict[str, uuid.UUID] | None = None) -> Any:
    """A FetchResponse as it arrives from the wire at ``version``."""
    ids = IDS if topic_ids is None else topic_ids
    topics: list[Any] = []
    for topic, partition in parts:
        if not topics or topics[-1].topic != topic:
            topics.append(_TopicResp(topic=topic, topic_id=ids.get(topic, ZERO_UUID), partitions=[]))
        topics[-1].partitions.append(_PartResp(partition_index=partition, error_code=0, high_watermark=59,
                                               last_stable_offset=59, log_start_offset=0, records=None))
    resp = M.FetchResponse(throttle_time_ms=throttle_ms, error_code=error, session_id=session_id, responses=topics)
    frame = frames.encode_response(resp, version, correlation_id=7)
    return frames.decode_response(M.ApiKey.FETCH, version, frame[4:])


def established(version: int = 12, session_id: int = 123) -> FetchSessionHandler:
    """A handler whose session (a-0, a-1, b-0) was just created by the broker."""
    h = FetchSessionHandler(node_id=2)
    build(h, [pd("a", 0, 10), pd("a", 1, 20), pd("b", 0, 30)])
    assert h.handle_response(response(version, [("a", 0), ("a", 1), ("b", 0)], session_id=session_id), version)
    assert h.metadata == FetchMetadata(session_id, 1)
    return h


# -- FetchMetadata --------------------------------------------------------------------------------------
def test_metadata_transitions_and_epoch_wrap() -> None:
    assert INITIAL == FetchMetadata(0, 0) and INITIAL.is_full and not INITIAL.is_final
    assert LEGACY == FetchMetadata(0, -1) and LEGACY.is_full and LEGACY.is_final
    assert FetchMetadata.new_incremental(123) == FetchMetadata(123, 1)
    assert not FetchMetadata(123, 1).is_full
    assert FetchMetadata(123, 7).next_incremental() == FetchMetadata(123, 8)
    assert FetchMetadata(123, 7).next_close_existing() == FetchMetadata(123, 0)
    assert FetchMetadata(123, 7).next_final() == FetchMetadata(123, FINAL_EPOCH)
    assert next_epoch(INT32_MAX) == 1
    assert next_epoch(INT32_MAX - 1) == INT32_MAX
    assert next_epoch(0) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH
    assert FetchMetadata(5, INT32_MAX).next_incremental() == FetchMetadata(5, 1)


def test_epoch_wraps_from_int32_max_to_one_in_the_handler() -> None:
    h = established()
    h._metadata = FetchMetadata(123, INT32_MAX - 1)  # fast-forward ~2^31 rounds
    for expected_next in (INT32_MAX, 1, 2):
        data = build(h, [pd("a", 0, 10), pd("a", 1, 20), pd("b", 0, 30)])
        _, dec = wire(data, 12)
        assert dec.session_epoch == data.metadata.epoch
        assert h.handle_response(response(12, [], session_id=123), 12)
        assert h.metadata == FetchMetadata(123, expected_next)


# -- the sequence of seed 000 ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", SESSION_VERSIONS)
def test_seed_000_sequence(version: int) -> None:
    h = FetchSessionHandler(node_id=2)
    parts = [pd("a", 0, 53), pd("a", 1, 100), pd("b", 0, 7)]

    # 1. Full request, session 0 / epoch 0, with every partition.
    data = build(h, parts)
    assert data.is_full and data.metadata == INITIAL
    assert list(data.to_send) == [TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)]
    _, dec = wire(data, version)
    assert (dec.session_id, dec.session_epoch) == (0, 0)
    assert sent(dec, version) == [("a", 0, 53), ("a", 1, 100), ("b", 0, 7)]
    assert dec.forgotten_topics_data == [] and dec.isolation_level == 1 and dec.max_wait_ms == 500
    assert h.in_flight

    # 2. The broker creates session 123.
    assert h.handle_response(response(version, [("a", 0), ("a", 1), ("b", 0)], session_id=123), version)
    assert not h.in_flight and h.metadata == FetchMetadata(123, 1)

    # 3. Incremental, epoch 1: only a-0 (offset 53 -> 59) is resent.
    data = build(h, [pd("a", 0, 59), pd("a", 1, 100), pd("b", 0, 7)])
    assert not data.is_full and data.metadata == FetchMetadata(123, 1)
    assert dict(data.to_send) == {TopicPartition("a", 0): pd("a", 0, 59)}
    assert data.to_forget == () and data.to_replace == ()
    _, dec = wire(data, version)
    assert (dec.session_id, dec.session_epoch) == (123, 1)
    assert sent(dec, version) == [("a", 0, 59)] and dec.forgotten_topics_data == []
    assert h.handle_response(response(version, [("a", 0)], session_id=123), version)
    assert h.metadata == FetchMetadata(123, 2)

    # 4. Nothing changed: an empty incremental request; the response may be empty too.
    data = build(h, [pd("a", 0, 59), pd("a", 1, 100), pd("b", 0, 7)])
    assert data.is_empty and data.metadata == FetchMetadata(123, 2)
    _, dec = wire(data, version)
    assert dec.topics == [] and dec.forgotten_topics_data == []
    assert h.handle_response(response(version, [], session_id=123), version)
    assert h.metadata == FetchMetadata(123, 3)

    # 5. Revoke a-1 and b-0, get c-0 (no id known: only names are usable).
    data = build(h, [pd("a", 0, 59), pd("c", 0, 0)])
    assert data.metadata == FetchMetadata(123, 3)
    assert list(data.to_send) == [TopicPartition("c", 0)]
    assert data.to_forget == (TopicIdPartition(ID_A, "a", 1), TopicIdPartition(ID_B, "b", 0))
    assert list(data.session_partitions) == [TopicPartition("a", 0), TopicPartition("c", 0)]
    assert not data.can_use_topic_ids
    v = choose_version(version, data)
    assert v == min(version, 12)
    _, dec = wire(data, v)
    assert [(t.topic, [p.partition for p in t.partitions]) for t in dec.topics] == [("c", [0])]
    assert forgotten(dec, v) == [("a", 1), ("b", 0)]
    assert h.handle_response(response(v, [("c", 0)], session_id=123), v)
    assert h.metadata == FetchMetadata(123, 4)
    assert list(h.session_partitions) == [TopicPartition("a", 0), TopicPartition("c", 0)]

    assert (h.stats.full_requests, h.stats.incremental_requests, h.stats.sessions_created) == (1, 3, 1)


def test_every_field_of_partition_data_counts_as_a_change() -> None:
    base = [pd("a", 0, 10), pd("a", 1, 20), pd("b", 0, 30)]
    changes = [
        {"fetch_offset": 11},
        {"log_start_offset": 5},
        {"partition_max_bytes": 2048},
        {"current_leader_epoch": 3},
        {"last_fetched_epoch": 2},
    ]
    for change in changes:
        h = established()
        offset = change.pop("fetch_offset", 20)
        altered = pd("a", 1, offset, **change)
        data = build(h, [base[0], altered, base[2]])
        assert dict(data.to_send) == {TopicPartition("a", 1): altered}, change
        assert h.session_partitions[TopicPartition("a", 1)] == altered


def test_incremental_order_new_partitions_first_then_altered_and_session_keeps_position() -> None:
    h = established()
    data = build(h, [pd("b", 0, 31), pd("b", 1, 0), pd("a", 0, 10), pd("a", 1, 20), pd("b", 2, 0)])
    # New partitions in the order added, then changed ones in session order.
    assert list(data.to_send) == [TopicPartition("b", 1), TopicPartition("b", 2), TopicPartition("b", 0)]
    # Existing partitions keep their place; new ones go at the end.
    assert list(data.session_partitions) == [TopicPartition(*x) for x in
                                             [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]]


# -- errors -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (EC.FETCH_SESSION_ID_NOT_FOUND, INITIAL),
        # As in Java, 71 and 106 close the (possibly still cached) session: same id, epoch 0.
        (EC.INVALID_FETCH_SESSION_EPOCH, FetchMetadata(123, 0)),
        (EC.FETCH_SESSION_TOPIC_ID_ERROR, FetchMetadata(123, 0)),
        (EC.NOT_LEADER_OR_FOLLOWER, FetchMetadata(123, 0)),
        (-1, FetchMetadata(123, 0)),  # UNKNOWN_SERVER_ERROR
    ],
)
@pytest.mark.parametrize("version", [12, 13, 17])
def test_recovery_from_top_level_errors(code: int, expected: FetchMetadata, version: int) -> None:
    h = established(version)
    parts = [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)]
    build(h, parts)
    assert not h.handle_response(response(version, [], session_id=0, error=code), version)
    assert h.metadata == expected and not h.in_flight
    assert h.stats.session_errors == {code: 1}
    # The next request is a full one with every partition, carrying the expected metadata.
    data = build(h, parts)
    assert data.is_full and data.metadata == expected
    _, dec = wire(data, version)
    assert (dec.session_id, dec.session_epoch) == (expected.session_id, expected.epoch)
    assert sent(dec, version) == [("a", 0, 11), ("a", 1, 20), ("b", 0, 30)]
    # The broker answers with a new session; incremental fetching resumes from epoch 1.
    assert h.handle_response(response(version, [("a", 0), ("a", 1), ("b", 0)], session_id=456), version)
    assert h.metadata == FetchMetadata(456, 1)


def test_error_on_a_full_request_without_session_stays_initial() -> None:
    h = FetchSessionHandler()
    build(h, [pd("a", 0, 0)])
    assert not h.handle_response(response(12, [], error=EC.NOT_LEADER_OR_FOLLOWER), 12)
    assert h.metadata == INITIAL


@pytest.mark.parametrize("exc", [ConnectionResetError("reset"), TimeoutError(), None])
def test_network_error_closes_existing_session(exc: BaseException | None) -> None:
    h = established()
    build(h, [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)])
    h.handle_error(exc)
    assert h.metadata == FetchMetadata(123, 0) and not h.in_flight and h.stats.send_errors == 1
    data = build(h, [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)])
    assert data.is_full and len(data.to_send) == 3


def test_sessionless_broker_gets_full_requests_without_churn() -> None:
    # Tansu: session id 0 in every response.
    h = FetchSessionHandler()
    parts = [pd("a", 0, 0), pd("a", 1, 0), pd("b", 0, 0)]
    frames_sent = []
    for rnd in range(6):
        parts = [pd(p.topic, p.partition, p.fetch_offset + rnd) for p in parts]
        data = build(h, parts)
        assert data.is_full and data.metadata == INITIAL and data.to_forget == ()
        frame, dec = wire(data, 12)
        frames_sent.append(frame)
        assert (dec.session_id, dec.session_epoch) == (0, 0)
        assert len(dec.topics[0].partitions) + len(dec.topics[1].partitions) == 3
        assert h.handle_response(response(12, [("a", 0), ("a", 1), ("b", 0)], session_id=0), 12)
        assert h.metadata == INITIAL
    assert len(frames_sent) == 6  # one request per round, nothing extra
    assert (h.stats.full_requests, h.stats.incremental_requests, h.stats.final_requests) == (6, 0, 0)
    assert h.stats.sessions_created == 0 and h.close_request() is None


def test_incremental_response_with_session_id_zero_means_the_broker_closed_it() -> None:
    h = established()
    build(h, [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)])
    assert h.handle_response(response(12, [("a", 0)], session_id=0), 12)
    assert h.metadata == INITIAL
    assert build(h, [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)]).is_full


def test_throttled_empty_full_response_is_not_processed() -> None:
    h = FetchSessionHandler()
    build(h, [pd("a", 0, 0)])
    assert not h.handle_response(response(12, [], session_id=123, throttle_ms=100), 12)
    assert h.metadata == INITIAL and h.stats.invalid_responses == 0


# -- response validation ------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [7, 12, 13, 17])
def test_full_response_with_unrequested_partition_is_invalid(version: int) -> None:
    h = FetchSessionHandler()
    build(h, [pd("a", 0, 0), pd("b", 0, 0)])
    ok = h.handle_response(response(version, [("a", 0), ("a", 1), ("b", 0)], session_id=123), version)
    assert not ok and h.metadata == INITIAL and h.stats.invalid_responses == 1
    assert h.stats.sessions_created == 0 and "a-1" in (h.last_problem or "")


def test_full_response_omitting_a_requested_partition_is_invalid() -> None:
    h = FetchSessionHandler()
    build(h, [pd("a", 0, 0), pd("b", 0, 0)])
    assert not h.handle_response(response(12, [("a", 0)], session_id=123), 12)
    assert h.metadata == INITIAL and "omitted b-0" in (h.last_problem or "")


@pytest.mark.parametrize("version", [7, 12, 13, 17])
def test_incremental_response_with_partition_outside_session_is_invalid(version: int) -> None:
    h = established(version)
    build(h, [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)])
    assert not h.handle_response(response(version, [("a", 0), ("b", 1)], session_id=123), version)
    # Java: an invalid incremental response closes the session (same id, epoch 0).
    assert h.metadata == FetchMetadata(123, 0) and h.stats.invalid_responses == 1


def test_incremental_response_with_unknown_topic_id_is_invalid() -> None:
    h = established(13)
    build(h, [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)])
    stray = {"a": ID_A, "x": uuid.uuid4()}
    assert not h.handle_response(response(13, [("x", 0)], session_id=123, topic_ids=stray), 13)
    assert h.metadata == FetchMetadata(123, 0) and "unknown topic ids" in (h.last_problem or "")


def test_response_partitions_resolves_topic_ids_from_the_session() -> None:
    h = FetchSessionHandler()
    build(h, [pd("a", 0, 0), pd("b", 0, 0)])
    resp = response(13, [("a", 0), ("b", 0)], session_id=9)
    assert set(h.response_partitions(resp, 13)) == {TopicPartition("a", 0), TopicPartition("b", 0)}
    assert h.handle_response(resp, 13)


# -- topic ids --------------------------------------------------------------------------------------------
def test_topic_id_change_forgets_old_id_and_adds_new_one() -> None:
    h = established(13)
    data = build(h, [pd("a", 0, 0, topic_id=ID_A2), pd("a", 1, 0, topic_id=ID_A2), pd("b", 0, 30)])
    assert data.to_replace == (TopicIdPartition(ID_A, "a", 0), TopicIdPartition(ID_A, "a", 1))
    assert data.to_forget == ()
    assert [d.topic_id for d in data.to_send.values()] == [ID_A2, ID_A2]
    assert data.can_use_topic_ids and h.session_topic_names[ID_A2] == "a"

    _, dec = wire(data, 13)
    assert [(t.topic_id, [p.partition for p in t.partitions]) for t in dec.topics] == [(ID_A2, [0, 1])]
    assert forgotten(dec, 13) == [(ID_A, 0), (ID_A, 1)]
    # With names (v12) the resent partitions overwrite the old entries; forgetting them would drop them.
    _, dec12 = wire(data, 12)
    assert sent(dec12, 12) == [("a", 0, 0), ("a", 1, 0)] and dec12.forgotten_topics_data == []

    assert h.handle_response(response(13, [("a", 0)], session_id=123, topic_ids={"a": ID_A2}), 13)
    assert h.metadata == FetchMetadata(123, 2)


def test_zero_topic_id_forces_names() -> None:
    with_ids = [pd("a", 0, 0), pd("b", 0, 0)]
    assert choose_version(17, with_ids) == 17
    assert choose_version(17, [*with_ids, pd("c", 0, 0)]) == 12
    assert choose_version(9, [pd("c", 0, 0)]) == 9
    h = FetchSessionHandler()
    data = build(h, [*with_ids, pd("c", 0, 0)])
    assert not data.can_use_topic_ids and dict(h.session_topic_names) == {}
    with pytest.raises(ValueError, match="topic ids"):
        to_fetch_request(data, version=13, max_wait_ms=500, min_bytes=1)
    assert choose_version(17, data) == 12
    # Removing the id-less partition from a session still needs names for the forget list.
    assert h.handle_response(response(12, [("a", 0), ("b", 0), ("c", 0)], session_id=5), 12)
    data = build(h, with_ids)
    assert data.to_forget == (TopicIdPartition(ZERO_UUID, "c", 0),) and not data.can_use_topic_ids


# -- close, old versions, single flight ----------------------------------------------------------------
@pytest.mark.parametrize("version", SESSION_VERSIONS)
def test_close_request_has_final_epoch_and_no_partitions(version: int) -> None:
    h = established(version)
    data = h.close_request()
    assert data is not None and data.metadata == FetchMetadata(123, FINAL_EPOCH) and data.is_full
    _, dec = wire(data, version)
    assert (dec.session_id, dec.session_epoch) == (123, -1)
    assert dec.topics == [] and dec.forgotten_topics_data == []
    assert h.metadata == INITIAL and not h.session_partitions and h.stats.final_requests == 1
    assert h.close_request() is None  # no session any more
    assert build(h, [pd("a", 0, 0)]).metadata == INITIAL


def test_close_request_refused_while_a_fetch_is_in_flight() -> None:
    h = established()
    build(h, [pd("a", 0, 0)])
    with pytest.raises(FetchSessionStateError):
        h.close_request()
    h.handle_error(TimeoutError())
    data = h.close_request()
    assert data is not None and data.metadata == FetchMetadata(123, -1)


@pytest.mark.parametrize("version", [4, 5, 6])
def test_versions_without_sessions_always_send_full_requests(version: int) -> None:
    assert not sessions_supported(version) and sessions_supported(7)
    h = FetchSessionHandler()
    for _ in range(3):
        data = build(h, [pd("a", 0, 0), pd("a", 1, 0)])
        assert data.is_full
        _, dec = wire(data, version)
        assert sent(dec, version) == [("a", 0, 0), ("a", 1, 0)]
        # Even if a broker put a session id into the response object, a v<7 response has none on the wire.
        resp = response(version, [("a", 0), ("a", 1)], session_id=123)
        assert resp.session_id == 0
        resp.session_id = 123
        assert h.handle_response(resp, version)
        assert h.metadata == INITIAL
    assert h.stats.incremental_requests == 0


def test_incremental_request_cannot_be_encoded_below_v7() -> None:
    h = established()
    data = build(h, [pd("a", 0, 11), pd("a", 1, 20), pd("b", 0, 30)])
    with pytest.raises(ValueError, match="no sessions"):
        to_fetch_request(data, version=6, max_wait_ms=500, min_bytes=1)


def test_one_fetch_in_flight() -> None:
    h = FetchSessionHandler(node_id=1)
    assert not h.in_flight
    b = h.builder()
    b.add(pd("a", 0, 0))
    b.build()
    assert h.in_flight
    with pytest.raises(FetchSessionStateError):
        b.build()  # a builder is single use
    with pytest.raises(FetchSessionStateError):
        build(h, [pd("a", 0, 0)])
    assert h.handle_response(response(12, [("a", 0)], session_id=0), 12)
    assert not h.in_flight
    with pytest.raises(FetchSessionStateError):
        h.handle_response(response(12, [("a", 0)]), 12)
    with pytest.raises(FetchSessionStateError):
        h.handle_error(TimeoutError())
    build(h, [pd("a", 0, 1)])
    assert h.in_flight


def test_request_bytes_hook() -> None:
    h = FetchSessionHandler()
    frame, _ = wire(build(h, [pd("a", 0, 0)]), 12)
    h.add_request_bytes(len(frame))
    h.add_request_bytes(10)
    assert h.stats.request_bytes == len(frame) + 10


# -- wire format ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_built_requests_encode_at_every_version(version: int) -> None:
    h = FetchSessionHandler()
    parts = [pd("a", 0, 5, partition_max_bytes=4096, current_leader_epoch=3, last_fetched_epoch=2,
                log_start_offset=1), pd("a", 1, 6), pd("b", 0, 7)]
    data = build(h, parts)
    _, dec = wire(data, version, rack_id="rack-1")
    assert sent(dec, version) == [("a", 0, 5), ("a", 1, 6), ("b", 0, 7)]
    assert (dec.max_wait_ms, dec.min_bytes, dec.max_bytes, dec.isolation_level) == (500, 1, 52428800, 1)
    assert dec.replica_id == -1 and dec.replica_state.replica_id == -1
    p0 = dec.topics[0].partitions[0]
    assert p0.partition_max_bytes == 4096
    assert p0.current_leader_epoch == (3 if version >= 9 else -1)
    assert p0.last_fetched_epoch == (2 if version >= 12 else -1)
    assert p0.log_start_offset == (1 if version >= 5 else -1)
    assert dec.rack_id == ("rack-1" if version >= 11 else "")
    if version >= 13:
        assert [t.topic_id for t in dec.topics] == [ID_A, ID_B] and all(t.topic == "" for t in dec.topics)
    else:
        assert [t.topic for t in dec.topics] == ["a", "b"]
    if not sessions_supported(version):
        assert h.handle_response(response(version, [("a", 0), ("a", 1), ("b", 0)]), version)
        return
    assert (dec.session_id, dec.session_epoch) == (0, 0)
    assert h.handle_response(response(version, [("a", 0), ("a", 1), ("b", 0)], session_id=77), version)
    # Incremental with an alteration, a removal and an addition.
    data = build(h, [pd("a", 0, 9), pd("b", 0, 7), pd("b", 1, 0)])
    _, dec = wire(data, version)
    assert (dec.session_id, dec.session_epoch) == (77, 1)
    assert sent(dec, version) == [("b", 1, 0), ("a", 0, 9)]
    assert forgotten(dec, version) == [(ID_A if version >= 13 else "a", 1)]
    # Steady state, then close.
    assert h.handle_response(response(version, [("b", 1)], session_id=77), version)
    _, dec = wire(build(h, [pd("a", 0, 9), pd("b", 0, 7), pd("b", 1, 0)]), version)
    assert (dec.session_epoch, dec.topics, dec.forgotten_topics_data) == (2, [], [])
    h.handle_error(None)
    close = h.close_request()
    assert close is not None
    _, dec = wire(close, version)
    assert (dec.session_id, dec.session_epoch, dec.topics) == (77, -1, [])


def test_empty_incremental_request_with_1000_partitions_is_tiny() -> None:
    parts = [pd("a" if i < 500 else "b", i % 500, 1000 + i) for i in range(1000)]
    sizes: dict[str, int] = {}
    for version in (12, 17):
        h = FetchSessionHandler()
        full = build(h, parts)
        frame, dec = wire(full, version)
        assert sum(len(t.partitions) for t in dec.topics) == 1000
        sizes[f"full v{version}"] = len(frame)
        assert h.handle_response(response(version, [(p.topic, p.partition) for p in parts], session_id=42), version)
        empty = build(h, parts)
        assert empty.is_empty and empty.metadata == FetchMetadata(42, 1)
        frame, dec = wire(empty, version)
        assert (dec.session_id, dec.session_epoch, dec.topics) == (42, 1, [])
        sizes[f"empty incremental v{version}"] = len(frame)
        assert len(frame) < 100
        assert sizes[f"full v{version}"] > 20_000
    print("\nFetch request sizes with 1,000 assigned partitions (bytes, frame incl. size prefix, "
          "client id 'consumer-group1-1'): " + ", ".join(f"{k}={v}" for k, v in sizes.items()))


@pytest.mark.parametrize("cause", ["session_not_found", "wrong_epoch", "send_failed"])
def test_full_request_after_a_lost_session_is_flagged_as_a_reset(cause: str) -> None:
    h = established()
    parts = [pd("a", 0, 11), pd("a", 1, 20)]
    assert not build(h, parts).resets_session  # incremental
    if cause == "send_failed":
        h.handle_error(ConnectionResetError("broker restarted"))
    else:
        code = EC.FETCH_SESSION_ID_NOT_FOUND if cause == "session_not_found" else EC.INVALID_FETCH_SESSION_EPOCH
        assert not h.handle_response(response(12, [], error=code), 12)
    assert h.stats.session_resets == 0
    data = build(h, parts)
    assert data.is_full and data.resets_session
    assert h.handle_response(response(12, [("a", 0), ("a", 1)], session_id=456), 12)
    assert h.stats.session_resets == 1 and h.metadata == FetchMetadata(456, 1)
    assert not build(h, parts).resets_session  # back to incremental in the new session


def test_first_full_request_and_sessionless_brokers_are_no_reset() -> None:
    h = FetchSessionHandler()
    for _ in range(3):  # a broker without sessions (Tansu): full requests, none a reset
        assert not build(h, [pd("a", 0, 0)]).resets_session
        assert h.handle_response(response(12, [("a", 0)], session_id=0), 12)
    # a session created then closed cleanly (epoch -1): the next full request is no reset either
    h = established()
    assert h.close_request() is not None
    data = build(h, [pd("a", 0, 0)])
    assert data.is_full and not data.resets_session
    assert h.handle_response(response(12, [("a", 0)], session_id=9), 12)
    assert h.stats.session_resets == 0


@pytest.mark.parametrize("outcome", ["ok", "session_error", "send_failed"])
def test_a_sessionless_handler_always_sends_full_requests_at_epoch_minus_one(outcome: str) -> None:
    h = FetchSessionHandler(sessionless=True)
    assert h.metadata == LEGACY
    parts = [pd("a", 0, 11), pd("a", 1, 20)]
    for _ in range(2):
        data = build(h, parts)
        assert data.is_full and data.metadata == LEGACY and set(data.to_send) == {("a", 0), ("a", 1)}
        _, dec = wire(data, 12)
        assert (dec.session_id, dec.session_epoch) == (0, -1)
        if outcome == "send_failed":
            h.handle_error(ConnectionResetError("reset"))
        else:
            error = EC.FETCH_SESSION_ID_NOT_FOUND if outcome == "session_error" else 0
            h.handle_response(response(12, [] if error else [("a", 0), ("a", 1)], error=error), 12)
        assert h.metadata == LEGACY and not h.in_flight
    assert (h.stats.full_requests, h.stats.final_requests, h.stats.session_resets) == (2, 0, 0)
    assert h.close_request() is None
