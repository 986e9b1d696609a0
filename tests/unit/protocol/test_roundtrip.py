"""Property tests of the generated codecs: decode(encode(x, v), v) == x for every message and version.

Objects are drawn from hypothesis strategies built recursively from the ``F`` definitions, so every field
present in a version gets a random valid value (integers over the full type range, unicode strings, None
where nullable in that version, bytes, UUIDs, empty and non-empty arrays), while fields absent in that
version keep their constructor defaults, which is also what the decoder produces for them.
"""

from __future__ import annotations

import struct
import uuid
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.protocol import primitives as P
from service.protocol.definitions import ALL_SCHEMAS
from service.protocol.dsl import CompiledMessage, F, Struct, _default_value
from service.protocol.errors import ProtocolDecodeError, UnsupportedVersionError
from service.protocol.messages import _BY_NAME, compiled

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}

MAX_LIST = 2  # nesting is up to 3 levels deep; keep objects small so ~7,800 examples stay fast


def scalar_strategy(type_: str) -> st.SearchStrategy[Any]:
    if type_ in INT_RANGES:
        lo, hi = INT_RANGES[type_]
        # Bias towards the edges: they are where struct formats and sign handling go wrong.
        return st.one_of(st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1]), st.integers(lo, hi))
    if type_ == "bool":
        return st.booleans()
    if type_ == "float64":
        return st.floats(allow_nan=False)
    if type_ == "string":
        return st.text(max_size=12)  # any unicode code point except surrogates
    if type_ in ("bytes", "records"):
        return st.binary(max_size=24)
    if type_ == "uuid":
        return st.one_of(st.just(P.ZERO_UUID), st.uuids(version=None))
    raise AssertionError(f"no strategy for {type_!r}")


def field_strategy(cm: CompiledMessage, f: F, v: int) -> st.SearchStrategy[Any]:
    if f.is_struct:
        elem = struct_strategy(cm, f.element_type, v)
    else:
        elem = scalar_strategy(f.element_type)
    s = st.lists(elem, max_size=MAX_LIST) if f.is_array else elem
    if f.nullable_in(v):
        s = st.none() | s
    return s


def struct_strategy(cm: CompiledMessage, name: str, v: int) -> st.SearchStrategy[Struct]:
    cls = cm.classes[name]
    # Fields absent in ``v`` are left out: the constructor fills in their defaults.
    kw = {f.name: field_strategy(cm, f, v) for f in cm.struct_fields[name] if f.present(v)}
    return st.fixed_dictionaries(kw).map(lambda d: cls(**d))


@cache
def message_strategy(name: str, v: int) -> st.SearchStrategy[Struct]:
    return struct_strategy(compiled(name), name, v)


def expected_default(cm: CompiledMessage, f: F) -> Any:
    """What an absent field holds: Kafka's default, a fresh default struct, or an empty list."""
    if f.is_struct and not f.is_array:
        return cm.classes[f.element_type]()
    return _default_value(f)


def assert_absent_fields_default(cm: CompiledMessage, obj: Struct, name: str, v: int, path: str = "") -> None:
    for f in cm.struct_fields[name]:
        value = getattr(obj, f.name)
        where = f"{path}{f.name}"
        if not f.present(v):
            assert value == expected_default(cm, f), f"{where} absent in v{v} but holds {value!r}"
        elif f.is_struct and value is not None:
            for item in value if f.is_array else [value]:
                assert_absent_fields_default(cm, item, f.element_type, v, where + ".")


VERSIONS = [
    pytest.param(s.name, v, id=f"{s.name}-v{v}") for s in ALL_SCHEMAS for v in range(s.versions[0], s.versions[1] + 1)
]

PROPERTY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    database=None,  # don't write .hypothesis/ into a tree shared with other engineers
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize(("name", "version"), VERSIONS)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_roundtrip_and_truncation(name: str, version: int, data: st.DataObject) -> None:
    cm = compiled(name)
    obj = data.draw(message_strategy(name, version), label=name)
    encoded = cm.encode(obj, version)
    decoded, end = cm.decoder(version)(encoded, 0)
    assert end == len(encoded), "the decoder must consume exactly what the encoder wrote"
    assert decoded == obj
    assert cm.decode(encoded, version) == obj
    assert cm.decode(memoryview(b"\x7f" + encoded), version, 1) == obj  # frames pass views with an offset
    assert cm.encode(decoded, version) == encoded, "re-encoding the decoded object must give the same bytes"
    assert cm.encode(obj, version) == encoded, "encoding must be deterministic"
    assert_absent_fields_default(cm, decoded, name, version)
    # Truncated input (any strict prefix) must raise ProtocolDecodeError, not IndexError/struct.error.
    # (Drawn in the same example to avoid generating a second set of objects.)
    if encoded:  # empty only for messages without fields in this version (ApiVersionsRequest v0-v2)
        cut = data.draw(st.integers(0, len(encoded) - 1), label="cut")
        with pytest.raises(ProtocolDecodeError):
            cm.decode(encoded[:cut], version)


@pytest.mark.parametrize(("name", "version"), [(s.name, s.versions[1]) for s in ALL_SCHEMAS])
@settings(PROPERTY_SETTINGS, max_examples=30)
@given(garbage=st.binary(max_size=48))
def test_garbage_raises_only_protocol_decode_error(name: str, version: int, garbage: bytes) -> None:
    """Random bytes either decode or raise ProtocolDecodeError: no IndexError, struct.error, MemoryError..."""
    try:
        compiled(name).decode(garbage, version)
    except ProtocolDecodeError:
        pass


# -- deterministic checks ------------------------------------------------------------------------------


def _fetch_response_v12_sample() -> Any:
    cm = compiled("FetchResponse")
    c = cm.classes
    return cm.cls(
        throttle_time_ms=5,
        error_code=0,
        session_id=77,
        responses=[
            c["FetchableTopicResponse"](
                topic="tøpic-ü",
                partitions=[
                    c["PartitionData"](
                        partition_index=3,
                        high_watermark=2**40,
                        last_stable_offset=100,
                        log_start_offset=1,
                        diverging_epoch=c["EpochEndOffset"](epoch=4, end_offset=99),
                        aborted_transactions=[c["AbortedTransaction"](producer_id=9, first_offset=10)],
                        records=b"\x00" * 40,
                    ),
                    c["PartitionData"](partition_index=4, aborted_transactions=None, records=None),
                ],
            )
        ],
    )


def _fetch_response_v4_sample() -> Any:
    """The v12 sample restricted to what v4 has: fields added later hold their defaults."""
    obj = _fetch_response_v12_sample()
    obj.error_code = 0
    obj.session_id = 0
    for part in obj.responses[0].partitions:
        part.diverging_epoch = compiled("FetchResponse").classes["EpochEndOffset"]()
        part.log_start_offset = -1
    return obj


@pytest.mark.parametrize(
    ("name", "version", "make"),
    [("FetchResponse", 12, _fetch_response_v12_sample), ("FetchResponse", 4, _fetch_response_v4_sample)],
)
def test_every_prefix_of_a_rich_message_is_rejected(name: str, version: int, make: Any) -> None:
    cm = compiled(name)
    obj = make()
    encoded = cm.encode(obj, version)
    assert cm.decode(encoded, version) == obj
    for cut in range(len(encoded)):
        with pytest.raises(ProtocolDecodeError):
            cm.decode(encoded[:cut], version)


def test_absent_fields_decode_to_their_defaults() -> None:
    cm = compiled("FetchResponse")
    # v4 has no session id (default 0), no error code (0), no tagged fields (default structs),
    # and partitions have no log start offset (default -1) or preferred read replica (default -1).
    obj = cm.cls(responses=[cm.classes["FetchableTopicResponse"](
        topic="t", partitions=[cm.classes["PartitionData"](partition_index=1, records=b"x")])])
    obj.session_id = 5  # not on the wire in v4: must come back as the default
    decoded = cm.decode(cm.encode(obj, 4), 4)
    assert decoded.session_id == 0
    part = decoded.responses[0].partitions[0]
    assert part.log_start_offset == -1
    assert part.preferred_read_replica == -1
    assert part.diverging_epoch == cm.classes["EpochEndOffset"](epoch=-1, end_offset=-1)
    assert decoded.node_endpoints == []
    assert decoded.responses[0].topic_id == P.ZERO_UUID

    mreq = compiled("MetadataRequest")
    decoded = mreq.decode(mreq.encode(mreq.cls(topics=None), 1), 1)
    assert decoded.topics is None
    assert decoded.allow_auto_topic_creation is True  # default "true" (absent before v4)
    assert decoded.include_cluster_authorized_operations is False


def test_defaults_match_kafka_spelling() -> None:
    fetch = compiled("FetchRequest").cls()
    assert fetch.max_bytes == 0x7FFFFFFF  # default "0x7fffffff"
    assert fetch.replica_id == -1
    assert fetch.cluster_id is None  # default "null"
    assert fetch.rack_id == ""
    meta = compiled("MetadataResponse")
    assert meta.classes["MetadataResponseTopic"]().topic_authorized_operations == -(2**31)
    assert compiled("InitProducerIdResponse").cls().producer_id == -1  # an int default, not a string


# -- tagged fields ---------------------------------------------------------------------------------------


def _with_unknown_tags(encoded: bytes, tail_len: int, tags: list[tuple[int, bytes]]) -> bytes:
    """Replace a trailing empty tagged-field section (``tail_len`` bytes long) with ``tags``."""
    out = bytearray(encoded[: len(encoded) - tail_len])
    P.write_uvarint(out, len(tags))
    for tag, payload in tags:
        P.write_uvarint(out, tag)
        P.write_uvarint(out, len(payload))
        out += payload
    return bytes(out)


def test_unknown_tagged_fields_are_skipped_top_level() -> None:
    cm = compiled("HeartbeatRequest")
    obj = cm.cls(group_id="g", generation_id=3, member_id="m", group_instance_id=None)
    encoded = cm.encode(obj, 4)
    assert encoded[-1] == 0  # no tagged fields
    tampered = _with_unknown_tags(encoded, 1, [(7, b"abc"), (300, b""), (2**20, b"\xff" * 200)])
    assert len(tampered) > len(encoded) + 200
    decoded, end = cm.decoder(4)(tampered, 0)
    assert end == len(tampered)
    assert decoded == obj


def test_unknown_tagged_fields_are_skipped_between_known_ones() -> None:
    cm = compiled("ApiVersionsResponse")
    c = cm.classes
    obj = cm.cls(error_code=0, api_keys=[c["ApiVersion"](api_key=1, min_version=4, max_version=17)],
                 throttle_time_ms=0, finalized_features_epoch=42, zk_migration_ready=True)
    # A hand-built v3 body whose tagged section interleaves known tags (1, 3) with unknown ones (9, 2**14).
    body = bytearray()
    body += struct.pack(">h", 0)
    P.write_uvarint(body, 2)
    body += struct.pack(">hhh", 1, 4, 17) + b"\x00"  # one ApiVersion + its empty tag section
    body += struct.pack(">i", 0)
    P.write_uvarint(body, 4)
    for tag, payload in [(1, struct.pack(">q", 42)), (9, b"??"), (3, b"\x01"), (2**14, b"")]:
        P.write_uvarint(body, tag)
        P.write_uvarint(body, len(payload))
        body += payload
    assert cm.decode(bytes(body), 3) == obj


def test_unknown_tagged_fields_are_skipped_in_nested_structs() -> None:
    cm = compiled("MetadataRequest")
    topic_cls = cm.classes["MetadataRequestTopic"]
    obj = cm.cls(topics=[topic_cls(topic_id=uuid.UUID(int=5), name="a")], allow_auto_topic_creation=False)
    encoded = cm.encode(obj, 10)
    # Layout: topics count, topic id (16), compact name "a" (2), topic tags (1), 3 bools, top-level tags (1)
    nested_tags_at = 1 + 16 + 2
    assert encoded[nested_tags_at] == 0
    tampered = bytearray(encoded[:nested_tags_at])
    tampered += b"\x01\x05\x03xyz"  # one unknown tag 5 with a 3-byte payload
    tampered += encoded[nested_tags_at + 1:]
    assert cm.decode(bytes(tampered), 10) == obj


def test_non_default_tagged_fields_are_written_and_read_back() -> None:
    cm = compiled("ApiVersionsResponse")
    c = cm.classes
    plain = cm.cls(error_code=0, api_keys=[], throttle_time_ms=1)
    plain_bytes = cm.encode(plain, 3)
    assert plain_bytes[-1] == 0, "defaults are not written"
    rich = cm.cls(
        error_code=0, api_keys=[], throttle_time_ms=1,
        supported_features=[c["SupportedFeatureKey"](name="metadata.version", min_version=1, max_version=20)],
        finalized_features_epoch=7,
        finalized_features=[c["FinalizedFeatureKey"](name="f", max_version_level=3, min_version_level=1)],
        zk_migration_ready=True,
    )
    encoded = cm.encode(rich, 3)
    tail = encoded[len(plain_bytes) - 1:]
    pos = 0
    ntags, pos = P.read_uvarint(tail, pos)
    assert ntags == 4
    seen = []
    for _ in range(ntags):
        tag, pos = P.read_uvarint(tail, pos)
        size, pos = P.read_uvarint(tail, pos)
        seen.append((tag, bytes(tail[pos:pos + size])))
        pos += size
    assert pos == len(tail)
    assert [t for t, _ in seen] == [0, 1, 2, 3], "tags are written in ascending order"
    assert seen[1] == (1, struct.pack(">q", 7))
    assert seen[3] == (3, b"\x01")
    assert cm.decode(encoded, 3) == rich
    # In v0-v2 (not flexible) the tagged fields don't exist: they are not written and decode to defaults.
    assert cm.decode(cm.encode(rich, 2), 2) == plain


def test_tagged_struct_field_roundtrip() -> None:
    cm = compiled("FetchRequest")
    rs = cm.classes["ReplicaState"]
    obj = cm.cls(replica_state=rs(replica_id=3, replica_epoch=9), cluster_id="c", max_wait_ms=1, min_bytes=1)
    enc = cm.encode(obj, 15)
    assert cm.decode(enc, 15) == obj
    default = cm.cls(max_wait_ms=1, min_bytes=1)
    assert len(cm.encode(default, 15)) < len(enc)
    assert cm.decode(cm.encode(default, 15), 15) == default


def test_tagged_field_with_wrong_size_is_rejected() -> None:
    cm = compiled("ApiVersionsResponse")
    body = struct.pack(">h", 0) + b"\x01" + struct.pack(">i", 0)
    # tag 3 (zk_migration_ready, a bool) declared as 2 bytes long
    with pytest.raises(ProtocolDecodeError):
        cm.decode(body + b"\x01\x03\x02\x01\x00", 3)


def test_unsupported_version_is_rejected() -> None:
    cm = compiled("FetchRequest")
    with pytest.raises(UnsupportedVersionError):
        cm.encode(cm.cls(), 3)
    with pytest.raises(UnsupportedVersionError):
        cm.decode(b"", 18)


def test_every_schema_is_compiled() -> None:
    assert {s.name for s in ALL_SCHEMAS} == set(_BY_NAME)
