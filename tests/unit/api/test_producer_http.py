"""The produce endpoints' pure helpers (api/v2/produce.py): body parsing, record validation, response rendering."""

from __future__ import annotations

import base64

import orjson
import pytest

from api.v2.produce import _parse_body, parse_records, render
from service.errors import GatewayError
from service.producer import ProduceFailure, RecordMetadata


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def test_binary_fast_and_full_paths_agree() -> None:
    records = [{"key": b64(b"k"), "value": b64(b"v")}, {"value": None}, {"key": None}, {},
               {"value": b64(b"w"), "partition": 1, "headers": [{"key": "h", "value": None}], "timestamp": 5}]
    out, sizes = parse_records({"records": records}, "binary", None)
    assert out == [(b"k", b"v", (), None, None), (None, None, (), None, None), (None, None, (), None, None),
                   (None, None, (), None, None), (None, b"w", [("h", None)], 1, 5)]
    assert sizes == [2, 0, 0, 0, 1]
    out, _ = parse_records({"records": [{"value": b64(b"v")}, {"value": b64(b"w"), "partition": 3}]}, "binary", 3)
    assert [r[3] for r in out] == [3, 3]


def test_json_values_are_their_compact_json_text() -> None:
    body = _parse_body(b'{"records":[{"key":{"a": [1, 2]},"value":"s"},{"value":123456789012345678901234567890},'
                       b'{"value":null},{"value":0.5}]}', "json")
    out, sizes = parse_records(body, "json", None)
    assert [(k, v) for k, v, *_ in out] == [(b'{"a":[1,2]}', b'"s"'), (None, b"123456789012345678901234567890"),
                                            (None, None), (None, b"0.5")]
    assert sizes[0] == len(b'{"a":[1,2]}') + 3
    # the binary format never needs the exact-integer path (its numbers are partitions and timestamps)
    assert _parse_body(b'{"records":[{"value":"eA==","timestamp":1234567890123456789}]}', "binary")["records"][0][
        "timestamp"] == 1234567890123456789


def test_integral_floats_missing_header_values_and_the_path_partition() -> None:
    """Schema-valid bodies schemathesis found rejected: 1.0 is an integer for JSON Schema, a header without a
    value has a null one, and on the partition route the path's partition wins over a record's (Confluent)."""
    records = [{"value": b64(b"v"), "partition": 1012638.0, "timestamp": 406.0, "headers": [{"key": "h"}]},
               {"value": None, "partition": None, "timestamp": 0}]
    out, _ = parse_records({"records": records}, "binary", None)
    assert out == [(None, b"v", [("h", None)], 1012638, 406), (None, None, (), None, 0)]
    assert type(out[0][3]) is int and type(out[0][4]) is int
    out, _ = parse_records({"records": [{"value": None, "partition": 2147483646, "timestamp": 0, "headers": []},
                                        {"value": 2.7086731049929216e16, "partition": 1.0}]}, "json", 0)
    assert [(r[1], r[3], r[4]) for r in out] == [(None, 0, 0), (b"2.7086731049929216e+16", 0, None)]


@pytest.mark.parametrize("body,code,fragment", [
    ({"records": [{"value": "eA=="}, {"value": "eA"}]}, 42206, "records[1].value is not valid base64"),
    ({"records": [{"key": 5}]}, 42206, "records[0].key must be a base64 string"),
    ({"records": [{"value": "é"}]}, 42206, "records[0].value is not valid base64"),
    ({"records": [{"value": "eA==", "x": 1}]}, 42206, "unknown field(s) 'x'"),
    ({"records": [{"value": "eA==", "partition": 2**31}]}, 42207, "partition"),
    ({"records": [{"value": "eA==", "timestamp": 2**63}]}, 42207, "timestamp"),
    ({"records": [{"value": "eA==", "partition": 0.5}]}, 42207, "partition"),
    ({"records": [{"value": "eA==", "timestamp": 9.3e18}]}, 42207, "timestamp"),
    ({"records": [{"value": "eA==", "partition": float("inf")}]}, 42207, "partition"),
    ({"records": [{"value": "eA==", "partition": True}]}, 42207, "partition"),
    ({"records": [{"value": "eA==", "headers": [{"key": "h", "value": "eA==", "x": 1}]}]}, 42206, "headers[0]"),
    ({"records": None}, 42206, "non-empty array"),
    ({"value_schema": "x"}, 42206, "non-empty array"),
])
def test_invalid_records(body: object, code: int, fragment: str) -> None:
    with pytest.raises(GatewayError) as e:
        parse_records(body, "binary", None)
    assert e.value.status == 422 and e.value.error_code == code and fragment in e.value.message


def test_render_confluent_shape_and_status() -> None:
    body, status, failed, oks = render([RecordMetadata(1, 7), ProduceFailure(6, "NOT_LEADER", True, 1),
                                        ProduceFailure(87, "INVALID_RECORD", False, 1)])
    assert status == 200 and failed == 2 and oks == [True, False, False]
    assert orjson.loads(body) == {"offsets": [
        {"partition": 1, "offset": 7, "error_code": None, "error": None},
        # the error's name and code, never the failure's text (it may hold the broker's message: logged)
        {"partition": None, "offset": None, "error_code": 50003, "error": "Kafka error NOT_LEADER_OR_FOLLOWER (6)"},
        {"partition": None, "offset": None, "error_code": 50002, "error": "Kafka error INVALID_RECORD (87)"},
    ], "key_schema_id": None, "value_schema_id": None}
    _, status, _, _ = render([RecordMetadata(0, 1), ProduceFailure(29, "TOPIC_AUTHORIZATION_FAILED", False)])
    assert status == 403
    body, status, _, _ = render([ProduceFailure(58, "SASL", False)])
    assert status == 401 and orjson.loads(body)["offsets"][0]["error_code"] == 40101


def test_empty_and_malformed_bodies() -> None:
    with pytest.raises(GatewayError) as e:
        _parse_body(b"  ", "binary")
    assert e.value.error_code == 42206
    with pytest.raises(GatewayError) as e:
        _parse_body(b'{"records": [', "json")
    assert (e.value.status, e.value.error_code) == (400, 40001)
