"""Independent cross-check of our codecs against kafka-python 3.x's own schema-driven protocol classes.

kafka-python builds its encoders/decoders from the Kafka JSON schemas with its own code generator, so
agreement between the two is evidence that neither misreads the wire format. For random objects (drawn
from the same strategies as the round-trip tests):

* bytes we encode decode with kafka-python to the same values;
* kafka-python encodes the same object to the very same bytes, and we decode its bytes to the same object;
* complete frames (size, request/response header, body) agree byte for byte, and each side parses the
  other's headers.
"""

from __future__ import annotations

import dataclasses
import uuid
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.protocol import frames
from service.protocol import primitives as P
from service.protocol.definitions import ALL_SCHEMAS
from service.protocol.dsl import CompiledMessage, F, MessageSchema, Struct, _default_value
from service.protocol.messages import compiled
from tests.unit.protocol.test_roundtrip import message_strategy

with warnings.catch_warnings():
    # kafka-python loads its JSON with importlib.resources.read_text (deprecated) at import time.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol import admin as k_admin
    from kafka.protocol import consumer as k_consumer
    from kafka.protocol import metadata as k_metadata
    from kafka.protocol import producer as k_producer
    from kafka.protocol import sasl as k_sasl
    from kafka.protocol.schemas.fields.codecs.types import BitField


def _kafka_class(name: str) -> Any:
    for mod in (k_metadata, k_consumer, k_producer, k_admin, k_sasl):
        cls = getattr(mod, name, None)
        if cls is not None:
            return cls
    return None


# The share-group (KIP-932) and consumer-group-protocol (KIP-848) messages are newer than kafka-python's
# schema set: checked against the kafka-clients jar's schemas by test_conformance.py and by round trips, not here.
# Listed by name, so anything else missing fails.
NOT_IN_KAFKA_PYTHON = frozenset(
    f"{api}{kind}" for api in ("ShareGroupHeartbeat", "ShareGroupDescribe", "ShareFetch", "ShareAcknowledge",
                               "DescribeShareGroupOffsets", "AlterShareGroupOffsets", "DeleteShareGroupOffsets",
                               "ConsumerGroupHeartbeat", "ConsumerGroupDescribe")
    for kind in ("Request", "Response"))
CROSSCHECKED = tuple(s for s in ALL_SCHEMAS if s.name not in NOT_IN_KAFKA_PYTHON)
KAFKA_CLASSES = {s.name: _kafka_class(s.name) for s in CROSSCHECKED}

# kafka-python patches two schemas (json_patch): MetadataResponse's cluster/topic authorized operations are
# renamed to ``authorized_operations`` and, like DescribeGroupsResponse's, typed as a bit *set*.
RENAMED = {
    ("MetadataResponse", "cluster_authorized_operations"): "authorized_operations",
    ("MetadataResponseTopic", "topic_authorized_operations"): "authorized_operations",
}


def _kname(struct_name: str, f: F) -> str:
    return RENAMED.get((struct_name, f.name), f.name)


def _bits_to_int32(bits: set[int] | None) -> int:
    if bits is None:
        return -(2**31)  # kafka-python decodes the "unknown" sentinel {31} to None
    value = BitField.to_32_bit_field(bits)
    return value - 2**32 if value >= 2**31 else value


# -- conversions ----------------------------------------------------------------------------------------


def ours_plain(cm: CompiledMessage, obj: Any, struct_name: str, v: int) -> Any:
    """Our object as nested dicts of the fields present in ``v``."""
    out = {}
    for f in cm.struct_fields[struct_name]:
        if not f.present(v):
            continue
        val = getattr(obj, f.name)
        if f.is_struct and val is not None:
            val = ([ours_plain(cm, e, f.element_type, v) for e in val] if f.is_array
                   else ours_plain(cm, val, f.element_type, v))
        out[f.name] = val
    return out


def kafka_plain(cm: CompiledMessage, kobj: Any, struct_name: str, v: int) -> Any:
    """A kafka-python object in the same shape as :func:`ours_plain`, with kafka-python's conventions
    (None for a zero UUID or an absent tagged struct, bit sets, memoryviews) mapped to ours."""
    out = {}
    for f in cm.struct_fields[struct_name]:
        if not f.present(v):
            continue
        kf = type(kobj)._struct.fields[_kname(struct_name, f)]
        val = getattr(kobj, _kname(struct_name, f))
        if kf._type_str == "bitfield":
            val = _bits_to_int32(val)
        elif f.is_struct:
            if val is None and not f.is_array and not f.nullable_in(v):
                val = cm.classes[f.element_type]()  # absent tagged struct = its default
                val = ours_plain(cm, val, f.element_type, v)
            elif val is not None:
                val = ([kafka_plain(cm, e, f.element_type, v) for e in val] if f.is_array
                       else kafka_plain(cm, val, f.element_type, v))
        elif f.element_type == "uuid":
            val = [P.ZERO_UUID if x is None else x for x in val] if f.is_array else (
                P.ZERO_UUID if val is None else val)
        elif isinstance(val, (memoryview, bytearray)):
            val = bytes(val)
        out[f.name] = val
    return out


def to_kafka(cm: CompiledMessage, obj: Struct, struct_name: str, kcls: Any, v: int) -> Any:
    """Build the equivalent kafka-python object (``kcls`` is the kafka-python data class)."""
    kw: dict[str, Any] = {}
    kfields = kcls._struct.fields
    for f in cm.struct_fields[struct_name]:
        if not f.present(v):
            continue
        val = getattr(obj, f.name)
        if f.tagged_in(v):
            dflt = cm.classes[f.element_type]() if f.is_struct and not f.is_array else _default_value(f)
            if val == dflt:
                continue  # kafka-python's default for tagged structs is None: leave the field unset
        kf = kfields[_kname(struct_name, f)]
        if kf._type_str == "bitfield":
            val = BitField.from_32_bit_field(val)
        elif f.is_struct and val is not None:
            sub = kf.data_class
            val = ([to_kafka(cm, e, f.element_type, sub, v) for e in val] if f.is_array
                   else to_kafka(cm, val, f.element_type, sub, v))
        kw[_kname(struct_name, f)] = val
    return kcls(version=v, **kw)


def _kafka_encode(kobj: Any, v: int, is_data: bool) -> bytes:
    return bytes(kobj.encode(version=v, header=False) if is_data else kobj.encode(version=v))


def _kafka_decode(kcls: Any, data: bytes, v: int, is_data: bool) -> Any:
    return kcls.decode(data, version=v, header=False) if is_data else kcls.decode(data, version=v)


def _draw(data: st.DataObject, name: str, v: int) -> Any:
    obj = data.draw(message_strategy(name, v), label=name)
    if name == "ApiVersionsResponse":
        # kafka-python (like the Java client) decodes an ApiVersions response with a non-zero error code
        # as v0, because a broker answers UNSUPPORTED_VERSION in v0 whatever version was asked for.
        obj.error_code = 0
    return obj


def check_both_directions(name: str, v: int, obj: Any, cm: CompiledMessage | None = None) -> None:
    cm = cm or compiled(name)
    kcls = KAFKA_CLASSES[name]
    is_data = cm.schema.kind == "data"
    ours = cm.encode(obj, v)
    # 1. our bytes -> kafka-python -> same values
    kobj = _kafka_decode(kcls, ours, v, is_data)
    assert kafka_plain(cm, kobj, name, v) == ours_plain(cm, obj, name, v)
    # 2. the same object encoded by kafka-python: the same bytes, and we decode them to the same object
    theirs = _kafka_encode(to_kafka(cm, obj, name, kcls, v), v, is_data)
    assert theirs == ours
    assert cm.decode(theirs, v) == obj


# -- samples named in the test plan (more examples) and a sweep over every other version --------------

SAMPLE_VERSIONS = {
    "ApiVersions": (0, 3),
    "Metadata": (1, 9, 12),
    "FindCoordinator": (0, 4),
    "JoinGroup": (5, 9),
    "SyncGroup": (3, 5),
    "OffsetCommit": (2, 8),
    "OffsetFetch": (1, 8),
    "ListOffsets": (1, 7),
    "Fetch": (4, 12, 13, 17),
    "Produce": (3, 9),
    "DescribeGroups": (0, 5),
    "SaslHandshake": (1,),
    "SaslAuthenticate": (2,),
    "CreateTopics": (2, 5),
}
SAMPLES = [(f"{api}{kind}", v) for api, vs in SAMPLE_VERSIONS.items() for kind in ("Request", "Response") for v in vs]
SAMPLES += [(name, v) for name in ("ConsumerProtocolSubscription", "ConsumerProtocolAssignment") for v in range(4)]
SWEEP = [(s.name, v) for s in CROSSCHECKED for v in range(s.versions[0], s.versions[1] + 1)
         if (s.name, v) not in SAMPLES]

CROSS_SETTINGS = settings(
    max_examples=15, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_kafka_python_has_every_message() -> None:
    assert all(KAFKA_CLASSES.values()), [n for n, c in KAFKA_CLASSES.items() if c is None]
    assert NOT_IN_KAFKA_PYTHON <= {s.name for s in ALL_SCHEMAS}
    # ... and the exemption must stay true: once kafka-python carries them, cross-check them too.
    assert not any(_kafka_class(n) for n in NOT_IN_KAFKA_PYTHON)
    assert {n for n, _ in SAMPLES} <= set(KAFKA_CLASSES)


@pytest.mark.parametrize(("name", "version"), SAMPLES, ids=[f"{n}-v{v}" for n, v in SAMPLES])
@CROSS_SETTINGS
@given(data=st.data())
def test_crosscheck_samples(name: str, version: int, data: st.DataObject) -> None:
    check_both_directions(name, version, _draw(data, name, version))


@pytest.mark.parametrize(("name", "version"), SWEEP, ids=[f"{n}-v{v}" for n, v in SWEEP])
@settings(CROSS_SETTINGS, max_examples=3)
@given(data=st.data())
def test_crosscheck_every_other_version(name: str, version: int, data: st.DataObject) -> None:
    check_both_directions(name, version, _draw(data, name, version))


# -- frames: request and response headers --------------------------------------------------------------

FRAME_SAMPLES = [(f"{api}Request", v) for api, vs in SAMPLE_VERSIONS.items() for v in vs]


@pytest.mark.parametrize(("name", "version"), FRAME_SAMPLES, ids=[f"{n}-v{v}" for n, v in FRAME_SAMPLES])
@settings(CROSS_SETTINGS, max_examples=5)
@given(data=st.data(), correlation_id=st.integers(-(2**31), 2**31 - 1),
       client_id=st.none() | st.text(max_size=10))
def test_request_frames_match_kafka_python(name: str, version: int, data: st.DataObject, correlation_id: int,
                                           client_id: str | None) -> None:
    cm = compiled(name)
    obj = _draw(data, name, version)
    ours = frames.encode_request(obj, version, correlation_id, client_id)
    kobj = to_kafka(cm, obj, name, KAFKA_CLASSES[name], version)
    kobj.with_header(correlation_id=correlation_id, client_id=client_id)
    theirs = bytes(kobj.encode(header=True, framed=True))
    assert ours == theirs
    # each side parses the other's frame
    hdr, body = frames.decode_request(theirs[4:])
    assert (hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id) == (
        cm.schema.api_key, version, correlation_id, client_id)
    assert body == obj
    kdec = KAFKA_CLASSES[name].decode(ours, version=version, header=True, framed=True)
    kh = kdec.header
    assert (kh.request_api_key, kh.request_api_version, kh.correlation_id, kh.client_id) == (
        cm.schema.api_key, version, correlation_id, client_id)


RESPONSE_FRAME_SAMPLES = [(f"{api}Response", v) for api, vs in SAMPLE_VERSIONS.items() for v in vs]


@pytest.mark.parametrize(("name", "version"), RESPONSE_FRAME_SAMPLES,
                         ids=[f"{n}-v{v}" for n, v in RESPONSE_FRAME_SAMPLES])
@settings(CROSS_SETTINGS, max_examples=3)
@given(data=st.data(), correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_response_frames_match_kafka_python(name: str, version: int, data: st.DataObject,
                                            correlation_id: int) -> None:
    cm = compiled(name)
    obj = _draw(data, name, version)
    ours = frames.encode_response(obj, version, correlation_id)
    kobj = to_kafka(cm, obj, name, KAFKA_CLASSES[name], version)
    kobj.with_header(correlation_id=correlation_id)
    theirs = bytes(kobj.encode(header=True, framed=True))
    assert ours == theirs
    assert frames.response_correlation_id(theirs[4:]) == correlation_id
    assert frames.decode_response(cm.schema.api_key, version, theirs[4:]) == obj
    kdec = KAFKA_CLASSES[name].decode(ours, version=version, header=True, framed=True)
    assert kdec.header.correlation_id == correlation_id


# -- a few hand-written values, readable on failure --------------------------------------------------------


def test_fetch_v13_topic_ids_and_records_by_hand() -> None:
    cm = compiled("FetchResponse")
    c = cm.classes
    tid = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    obj = cm.cls(throttle_time_ms=3, error_code=0, session_id=12, responses=[c["FetchableTopicResponse"](
        topic_id=tid, partitions=[c["PartitionData"](
            partition_index=0, error_code=0, high_watermark=10, last_stable_offset=10, log_start_offset=0,
            aborted_transactions=None, preferred_read_replica=-1, records=b"RECORDS",
            current_leader=c["LeaderIdAndEpoch"](leader_id=1, leader_epoch=5),
        )],
    )])
    k = k_consumer.FetchResponse.decode(cm.encode(obj, 13), version=13)
    part = k.responses[0].partitions[0]
    assert k.session_id == 12
    assert k.responses[0].topic_id == tid
    assert bytes(part.records) == b"RECORDS"
    assert part.aborted_transactions is None
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (1, 5)
    assert part.diverging_epoch is None  # default tagged struct: not written
    check_both_directions("FetchResponse", 13, obj)


def test_join_group_v5_by_hand() -> None:
    kreq = k_consumer.JoinGroupRequest(
        version=5, group_id="grp", session_timeout_ms=10_000, rebalance_timeout_ms=30_000, member_id="",
        group_instance_id="inst-1", protocol_type="consumer",
        protocols=[k_consumer.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")],
    )
    ours = compiled("JoinGroupRequest").decode(bytes(kreq.encode()), 5)
    assert (ours.group_id, ours.session_timeout_ms, ours.rebalance_timeout_ms) == ("grp", 10_000, 30_000)
    assert ours.group_instance_id == "inst-1"
    assert [(p.name, p.metadata) for p in ours.protocols] == [("range", b"\x00\x01")]
    assert ours.reason is None  # v8+ only: default null


def _mutated(schema: MessageSchema, fields: tuple[F, ...]) -> CompiledMessage:
    return CompiledMessage(dataclasses.replace(schema, fields=fields))


def _join_group_fields(**changes: dict[str, Any]) -> tuple[F, ...]:
    schema = next(s for s in ALL_SCHEMAS if s.name == "JoinGroupRequest")
    return tuple(dataclasses.replace(f, **changes[f.name]) if f.name in changes else f for f in schema.fields)


def _join_group_v5(cm: CompiledMessage) -> Any:
    return cm.cls(group_id="g", session_timeout_ms=3_000, rebalance_timeout_ms=9_000, member_id="m",
                  group_instance_id="i", protocol_type="consumer", protocols=[], reason="why")


def test_crosscheck_accepts_the_real_schema() -> None:
    cm = compiled("JoinGroupRequest")
    obj = _join_group_v5(cm)
    obj.reason = None  # v8+ only
    check_both_directions("JoinGroupRequest", 5, obj)


def test_crosscheck_detects_swapped_fields() -> None:
    """The comparison must be able to fail: two int32 fields in the wrong order still parse, but differ."""
    schema = next(s for s in ALL_SCHEMAS if s.name == "JoinGroupRequest")
    f = list(schema.fields)
    f[1], f[2] = f[2], f[1]  # session_timeout_ms <-> rebalance_timeout_ms
    bad = _mutated(schema, tuple(f))
    obj = _join_group_v5(bad)
    obj.reason = None
    with pytest.raises(AssertionError):
        check_both_directions("JoinGroupRequest", 5, obj, cm=bad)


def test_crosscheck_detects_a_field_in_the_wrong_version() -> None:
    schema = next(s for s in ALL_SCHEMAS if s.name == "JoinGroupRequest")
    bad = _mutated(schema, _join_group_fields(reason={"versions": "5+", "nullable": "5+"}))
    with pytest.raises(AssertionError):
        check_both_directions("JoinGroupRequest", 5, _join_group_v5(bad), cm=bad)


def test_crosscheck_detects_a_wrong_width() -> None:
    schema = next(s for s in ALL_SCHEMAS if s.name == "JoinGroupRequest")
    bad = _mutated(schema, _join_group_fields(session_timeout_ms={"type": "int16"}))
    obj = _join_group_v5(bad)
    obj.reason = None
    with pytest.raises(Exception):  # noqa: B017 - kafka-python misparses: an assertion or a decode error
        check_both_directions("JoinGroupRequest", 5, obj, cm=bad)
