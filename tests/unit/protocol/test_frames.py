"""Request/response headers and size-prefixed frames (service/protocol/frames.py)."""

from __future__ import annotations

import re
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.protocol import frames
from service.protocol.definitions import ALL_SCHEMAS
from service.protocol.errors import KafkaProtocolError, ProtocolDecodeError, UnsupportedVersionError
from service.protocol.messages import REQUESTS, RESPONSES, ApiKey, compiled

# -- header version selection -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api_key", "version", "expected"),
    [
        (ApiKey.API_VERSIONS, 0, 1),
        (ApiKey.API_VERSIONS, 2, 1),
        (ApiKey.API_VERSIONS, 3, 2),  # flexible from v3: the request header is v2 even for ApiVersions
        (ApiKey.METADATA, 8, 1),
        (ApiKey.METADATA, 9, 2),
        (ApiKey.FETCH, 11, 1),
        (ApiKey.FETCH, 12, 2),
        (ApiKey.PRODUCE, 8, 1),
        (ApiKey.PRODUCE, 9, 2),
        (ApiKey.OFFSET_COMMIT, 7, 1),
        (ApiKey.OFFSET_COMMIT, 8, 2),
        (ApiKey.SASL_HANDSHAKE, 0, 1),
        (ApiKey.SASL_HANDSHAKE, 1, 1),  # SaslHandshake is never flexible
        (ApiKey.SASL_AUTHENTICATE, 1, 1),
        (ApiKey.SASL_AUTHENTICATE, 2, 2),
    ],
)
def test_request_header_version(api_key: int, version: int, expected: int) -> None:
    assert frames.request_header_version(api_key, version) == expected


@pytest.mark.parametrize(
    ("api_key", "version", "expected"),
    [
        (ApiKey.API_VERSIONS, 0, 0),
        (ApiKey.API_VERSIONS, 3, 0),  # always v0, although the body is flexible
        (ApiKey.API_VERSIONS, 4, 0),
        (ApiKey.METADATA, 8, 0),
        (ApiKey.METADATA, 9, 1),
        (ApiKey.FETCH, 11, 0),
        (ApiKey.FETCH, 12, 1),
        (ApiKey.SASL_HANDSHAKE, 1, 0),
        (ApiKey.SASL_AUTHENTICATE, 2, 1),
        (ApiKey.CREATE_TOPICS, 4, 0),
        (ApiKey.CREATE_TOPICS, 5, 1),
    ],
)
def test_response_header_version(api_key: int, version: int, expected: int) -> None:
    assert frames.response_header_version(api_key, version) == expected


def test_header_versions_follow_flexible_versions_everywhere() -> None:
    for key, cm in REQUESTS.items():
        lo, hi = cm.schema.versions
        for v in range(lo, hi + 1):
            assert frames.request_header_version(key, v) == (2 if cm.schema.is_flexible(v) else 1)
    for key, cm in RESPONSES.items():
        lo, hi = cm.schema.versions
        for v in range(lo, hi + 1):
            flexible = cm.schema.is_flexible(v) and key != ApiKey.API_VERSIONS
            assert frames.response_header_version(key, v) == (1 if flexible else 0)


def test_sasl_handshake_is_never_flexible() -> None:
    for cm in (REQUESTS[ApiKey.SASL_HANDSHAKE], RESPONSES[ApiKey.SASL_HANDSHAKE]):
        assert not any(cm.schema.is_flexible(v) for v in range(0, 100))


def test_unknown_api_key() -> None:
    with pytest.raises(UnsupportedVersionError):
        frames.request_header_version(999, 0)
    with pytest.raises(UnsupportedVersionError):
        frames.response_header_version(999, 0)


def test_api_key_constants_match_schemas() -> None:
    for s in ALL_SCHEMAS:
        if s.kind != "request":
            continue
        const = re.sub(r"(?<!^)(?=[A-Z])", "_", s.name.removesuffix("Request")).upper()
        assert getattr(ApiKey, const) == s.api_key, s.name


# -- request frames ---------------------------------------------------------------------------------------


def _heartbeat() -> Any:
    return compiled("HeartbeatRequest").cls(group_id="g", generation_id=7, member_id="m", group_instance_id=None)


def test_request_frame_header_v1_bytes() -> None:
    frame = frames.encode_request(_heartbeat(), 3, correlation_id=0x01020304, client_id="cid")
    expected_body = b"\x00\x01g" + b"\x00\x00\x00\x07" + b"\x00\x01m" + b"\xff\xff"
    expected = (struct.pack(">hhi", ApiKey.HEARTBEAT, 3, 0x01020304) + b"\x00\x03cid" + expected_body)
    assert frame == struct.pack(">i", len(expected)) + expected


def test_request_frame_header_v2_bytes() -> None:
    frame = frames.encode_request(_heartbeat(), 4, correlation_id=5, client_id="cid")
    # header v2: the client id stays a classic (non-compact) nullable string, followed by empty tagged fields
    header = struct.pack(">hhi", ApiKey.HEARTBEAT, 4, 5) + b"\x00\x03cid" + b"\x00"
    body = b"\x02g" + b"\x00\x00\x00\x07" + b"\x02m" + b"\x00" + b"\x00"
    assert frame == struct.pack(">i", len(header + body)) + header + body


def test_request_frame_null_client_id() -> None:
    frame = frames.encode_request(_heartbeat(), 0, correlation_id=1, client_id=None)
    assert frame[12:14] == b"\xff\xff"
    hdr, _ = frames.decode_request(frame[4:])
    assert hdr.client_id is None


def test_sasl_handshake_request_uses_header_v1() -> None:
    req = compiled("SaslHandshakeRequest").cls(mechanism="PLAIN")
    frame = frames.encode_request(req, 1, correlation_id=9, client_id="c")
    assert frame[4:] == struct.pack(">hhi", ApiKey.SASL_HANDSHAKE, 1, 9) + b"\x00\x01c" + b"\x00\x05PLAIN"


@pytest.mark.parametrize("version", [0, 3, 4])
def test_request_frame_roundtrip(version: int) -> None:
    obj = _heartbeat()
    frame = frames.encode_request(obj, version, correlation_id=-7, client_id="clïent")
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    hdr, body = frames.decode_request(frame[4:])
    assert hdr == frames.RequestHeader(ApiKey.HEARTBEAT, version, -7, "clïent")
    assert body == obj
    hdr2, pos = frames.decode_request_header(memoryview(frame)[4:])
    assert hdr2 == hdr
    assert compiled("HeartbeatRequest").decode(frame[4:], version, pos) == obj


def test_request_header_tagged_fields_are_skipped() -> None:
    frame = bytearray(frames.encode_request(_heartbeat(), 4, correlation_id=5, client_id="cid"))
    tags_at = 4 + 8 + 5
    assert frame[tags_at] == 0
    frame[tags_at:tags_at + 1] = b"\x02\x00\x03abc\x07\x00"  # two unknown header tags
    hdr, body = frames.decode_request(bytes(frame[4:]))
    assert hdr.correlation_id == 5
    assert body == _heartbeat()


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x00\x0c\x00", b"\x00\x0c\x00\x04\x00\x00\x00\x01", b"\x00\x0c\x00\x04\x00\x00\x00\x01\x00\x05ab",
     b"\x00\x0c\x00\x04\x00\x00\x00\x01\xff\xff", b"\x00\x0c\x00\x04\x00\x00\x00\x01\xff\xff\x01\x00\x09xy"],
)
def test_malformed_request_header(payload: bytes) -> None:
    with pytest.raises(ProtocolDecodeError):
        frames.decode_request_header(payload)


def test_decode_request_unknown_api_key() -> None:
    payload = struct.pack(">hhi", 999, 0, 1) + b"\xff\xff"
    hdr, pos = frames.decode_request_header(payload)
    assert (hdr.api_key, pos) == (999, 10)
    with pytest.raises(UnsupportedVersionError):
        frames.decode_request(payload)


def test_decode_request_unsupported_version() -> None:
    payload = struct.pack(">hhi", ApiKey.HEARTBEAT, 9, 1) + b"\xff\xff\x00"
    with pytest.raises(UnsupportedVersionError):
        frames.decode_request(payload)


def test_encode_request_rejects_non_requests() -> None:
    with pytest.raises(TypeError):
        frames.encode_request(compiled("HeartbeatResponse").cls(), 0, 1, None)
    with pytest.raises(TypeError):
        frames.encode_response(_heartbeat(), 0, 1)
    with pytest.raises(TypeError):
        frames.api_key_of(compiled("ConsumerProtocolAssignment").cls())
    assert frames.api_key_of(_heartbeat()) == ApiKey.HEARTBEAT


# -- response frames --------------------------------------------------------------------------------------


def test_response_header_v0_and_v1_bytes() -> None:
    cm = compiled("HeartbeatResponse")
    resp = cm.cls(throttle_time_ms=1, error_code=27)
    v3 = frames.encode_response(resp, 3, correlation_id=42)  # header v0: size, correlation id, body
    assert v3 == struct.pack(">iiih", 4 + 4 + 2, 42, 1, 27)
    v4 = frames.encode_response(resp, 4, correlation_id=42)  # header v1 adds (empty) tagged fields
    assert v4 == struct.pack(">ii", 4 + 1 + 4 + 2 + 1, 42) + b"\x00" + struct.pack(">ih", 1, 27) + b"\x00"
    assert frames.decode_response(ApiKey.HEARTBEAT, 3, v3[4:]) == resp
    assert frames.decode_response(ApiKey.HEARTBEAT, 4, v4[4:]) == resp
    assert frames.response_correlation_id(v4[4:]) == 42


def test_api_versions_response_header_is_always_v0() -> None:
    cm = compiled("ApiVersionsResponse")
    resp = cm.cls(error_code=0, api_keys=[cm.classes["ApiVersion"](api_key=18, min_version=0, max_version=4)],
                  throttle_time_ms=0)
    frame = frames.encode_response(resp, 3, correlation_id=11)
    # correlation id then the body directly (error code 0, compact array of 1): no header tagged fields
    assert frame[4:8] == struct.pack(">i", 11)
    assert frame[8:11] == b"\x00\x00\x02"
    assert frame[4 + 4:] == cm.encode(resp, 3)
    assert frames.decode_response(ApiKey.API_VERSIONS, 3, frame[4:]) == resp


def test_response_header_tagged_fields_are_skipped() -> None:
    resp = compiled("HeartbeatResponse").cls(throttle_time_ms=1, error_code=0)
    frame = bytearray(frames.encode_response(resp, 4, correlation_id=3))
    frame[8:9] = b"\x01\x05\x02zz"
    assert frames.decode_response(ApiKey.HEARTBEAT, 4, bytes(frame[4:])) == resp


@pytest.mark.parametrize("payload", [b"", b"\x00\x00", b"\x00\x00\x00\x01", b"\x00\x00\x00\x01\x00",
                                     b"\x00\x00\x00\x01\x01\x05\x09", b"\x00\x00\x00\x01\x00\x00\x00"])
def test_malformed_responses(payload: bytes) -> None:
    with pytest.raises(ProtocolDecodeError):
        frames.decode_response(ApiKey.HEARTBEAT, 4, payload)


def test_response_correlation_id_too_short() -> None:
    with pytest.raises(ProtocolDecodeError):
        frames.response_correlation_id(b"\x00\x01")


def test_decode_response_unknown_api_key() -> None:
    with pytest.raises(UnsupportedVersionError):
        frames.decode_response(999, 0, b"\x00\x00\x00\x01")


# -- garbage from the wire only ever raises the protocol layer's typed errors ------------------------------

_KEYS_AND_VERSIONS = [
    (k, v) for k, cm in REQUESTS.items() for v in range(cm.schema.versions[0], cm.schema.versions[1] + 1)
]


@settings(max_examples=300, deadline=None, database=None)
@given(kv=st.sampled_from(_KEYS_AND_VERSIONS), correlation_id=st.integers(-(2**31), 2**31 - 1),
       tail=st.binary(max_size=40))
def test_garbage_requests_raise_protocol_errors_only(kv: tuple[int, int], correlation_id: int, tail: bytes) -> None:
    api_key, version = kv
    payload = struct.pack(">hhi", api_key, version, correlation_id) + tail
    try:
        hdr, _ = frames.decode_request(payload)
    except KafkaProtocolError:
        return
    assert (hdr.api_key, hdr.api_version, hdr.correlation_id) == (api_key, version, correlation_id)


@settings(max_examples=300, deadline=None, database=None)
@given(kv=st.sampled_from(_KEYS_AND_VERSIONS), body=st.binary(max_size=40))
def test_garbage_responses_raise_protocol_errors_only(kv: tuple[int, int], body: bytes) -> None:
    api_key, version = kv
    try:
        frames.decode_response(api_key, version, b"\x00\x00\x00\x01" + body)
    except KafkaProtocolError:
        pass
