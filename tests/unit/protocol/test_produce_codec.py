"""The hand-written Produce codec (service/protocol/produce_codec.py) against the generated one."""

from __future__ import annotations

import random

import pytest

from service.protocol import frames
from service.protocol import messages as M
from service.protocol import produce_codec as PC

_TopicData = M.struct("ProduceRequest", "TopicProduceData")
_PartitionData = M.struct("ProduceRequest", "PartitionProduceData")
_TopicResp = M.struct("ProduceResponse", "TopicProduceResponse")
_PartResp = M.struct("ProduceResponse", "PartitionProduceResponse")
_RecordError = M.struct("ProduceResponse", "BatchIndexAndErrorMessage")
_Leader = M.struct("ProduceResponse", "LeaderIdAndEpoch")
_Endpoint = M.struct("ProduceResponse", "NodeEndpoint")

VERSIONS = range(PC.MIN_VERSION, PC.MAX_VERSION + 1)


def _topics(rng: random.Random, n_topics: int, n_parts: int) -> list[tuple[str, list[tuple[int, bytes | None]]]]:
    out = []
    for t in range(n_topics):
        name = f"topic-{t}-" + "é" * rng.randrange(3) + "x" * rng.choice((0, 1, 130))  # long names: 2-byte varints
        parts: list[tuple[int, bytes | None]] = []
        for p in range(n_parts):
            size = rng.choice((0, 1, 61, 126, 127, 128, 300, 20_000))
            parts.append((rng.choice((p, 2**31 - 1 - p)), None if rng.random() < 0.1 else rng.randbytes(size)))
        out.append((name, parts))
    return out


def _generated(version: int, corr: int, client_id: str | None, acks: int, timeout_ms: int,
               topics: list[tuple[str, list[tuple[int, bytes | None]]]], tid: str | None) -> bytes:
    req = M.ProduceRequest(transactional_id=tid, acks=acks, timeout_ms=timeout_ms, topic_data=[
        _TopicData(name=name, partition_data=[_PartitionData(index=i, records=r) for i, r in parts])
        for name, parts in topics])
    return frames.encode_request(req, version, corr, client_id)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (3, 2), (0, 0), (200, 1), (1, 130)])
@pytest.mark.parametrize("tid", [None, "", "txn-é"])
def test_request_bytes_match_the_generated_encoder(version: int, shape: tuple[int, int], tid: str | None) -> None:
    rng = random.Random(version * 1000 + shape[0] * 10 + shape[1])
    topics = _topics(rng, *shape)
    for corr, client_id, acks, timeout_ms in ((0, "gw", -1, 30_000), (2**31 - 1, None, 1, 0), (7, "", 0, 2**31 - 1)):
        want = _generated(version, corr, client_id, acks, timeout_ms, topics, tid)
        assert PC.produce_frame(version, corr, client_id, acks, timeout_ms, topics, tid) == want
        # the body alone is what send_frames_nowait puts behind its own header
        assert want.endswith(PC.produce_body(version, acks, timeout_ms, topics, tid))


def test_request_versions_outside_the_hand_path_are_refused() -> None:
    for v in (PC.MIN_VERSION - 1, PC.MAX_VERSION + 1):
        with pytest.raises(ValueError):
            PC.produce_body(v, -1, 1000, [])


def _response(version: int, corr: int, topics: list[tuple[str, list[_PartResp]]], **kw: object) -> bytes:
    resp = M.ProduceResponse(responses=[_TopicResp(name=n, partition_responses=ps) for n, ps in topics], **kw)
    return frames.encode_response(resp, version, corr)[4:]  # without the size prefix, as the connection hands it out


def _ok(index: int, base_offset: int, **kw: object) -> _PartResp:
    return _PartResp(index=index, error_code=0, base_offset=base_offset, **kw)


def _as_tuples(version: int, payload: bytes) -> list[tuple[str, int, int]]:
    resp = frames.decode_response(0, version, payload)
    return [(t.name, p.index, p.base_offset) for t in resp.responses for p in t.partition_responses]


@pytest.mark.parametrize("version", VERSIONS)
def test_ok_answers_decode_like_the_generated_decoder(version: int) -> None:
    rng = random.Random(version)
    for n_topics, n_parts in ((1, 1), (1, 4), (3, 3), (0, 0), (2, 126)):
        topics = [(f"t{t}" + "y" * rng.choice((0, 200)),
                   [_ok(rng.randrange(2**31), rng.choice((0, -1, 2**62, rng.randrange(2**40))),
                        log_append_time_ms=rng.choice((-1, 1_700_000_000_000)),
                        log_start_offset=rng.choice((-1, 0, 5)))
                    for _ in range(n_parts)])
                  for t in range(n_topics)]
        payload = _response(version, rng.randrange(2**31), topics, throttle_time_ms=rng.choice((0, 5)))
        got = PC.decode_produce_ok(version, payload)
        long = any(len(name) + 1 >= 0x80 for name, _ in topics) or n_parts + 1 >= 0x80
        if long and version >= PC.FIRST_FLEXIBLE:
            assert got is None  # multi-byte varint lengths: declined (the generated decoder reads them)
        else:
            assert got == _as_tuples(version, payload)
        assert PC.decode_produce_ok(version, memoryview(payload)) == got
        assert PC.decode_produce_ok(version, bytearray(payload)) == got


@pytest.mark.parametrize("version", VERSIONS)
def test_unusual_answers_decline(version: int) -> None:
    base = [("t", [_ok(0, 10), _ok(1, 20)])]
    assert PC.decode_produce_ok(version, _response(version, 1, base)) == [("t", 0, 10), ("t", 1, 20)]
    err = [("t", [_ok(0, 10), _PartResp(index=1, error_code=6, base_offset=-1)])]
    assert PC.decode_produce_ok(version, _response(version, 1, err)) is None
    payload = _response(version, 1, base)
    for cut in range(len(payload)):
        assert PC.decode_produce_ok(version, payload[:cut]) is None  # truncated
    assert PC.decode_produce_ok(version, payload + b"\x00") is None  # trailing bytes
    if version >= 8:
        rec_err = [("t", [_ok(0, 10, record_errors=[_RecordError(batch_index=0, batch_index_error_message="x")])])]
        assert PC.decode_produce_ok(version, _response(version, 1, rec_err)) is None
        msg = [("t", [_ok(0, 10, error_message="odd")])]
        assert PC.decode_produce_ok(version, _response(version, 1, msg)) is None
    if version >= 10:
        tagged = [("t", [_ok(0, 10, current_leader=_Leader(leader_id=1, leader_epoch=2))])]
        assert PC.decode_produce_ok(version, _response(version, 1, tagged)) is None
        ends = _response(version, 1, base, node_endpoints=[_Endpoint(node_id=1, host="h", port=1, rack=None)])
        assert PC.decode_produce_ok(version, ends) is None
    assert PC.decode_produce_ok(2, payload) is None
    assert PC.decode_produce_ok(12, payload) is None


def test_length_varints_match_the_primitive() -> None:
    from service.protocol import primitives as P

    edges = [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 2**28, 2**31 - 1]
    for v in edges + list(range(0, 70_000, 7)):
        assert PC._uv(v) == P.uvarint_bytes(v), v
