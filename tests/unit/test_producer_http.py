"""The produce endpoints' pure helpers (api/produce.py): body parsing, record validation, response rendering."""

from __future__ import annotations

import base64

import orjson
import pytest

from api.produce import _parse_body, parse_records, render
from service.gateway import GatewayError
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


@pytest.mark.parametrize("body,code,fragment", [
    ({"records": [{"value": "eA=="}, {"value": "eA"}]}, 42206, "records[1].value is not valid base64"),
    ({"records": [{"key": 5}]}, 42206, "records[0].key must be a base64 string"),
    ({"records": [{"value": "é"}]}, 42206, "records[0].value is not valid base64"),
    ({"records": [{"value": "eA==", "x": 1}]}, 42206, "unknown field(s) 'x'"),
    ({"records": [{"value": "eA==", "partition": 2**31}]}, 42207, "partition"),
    ({"records": [{"value": "eA==", "timestamp": 2**63}]}, 42207, "timestamp"),
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
        {"partition": None, "offset": None, "error_code": 50003, "error": "NOT_LEADER"},
        {"partition": None, "offset": None, "error_code": 50002, "error": "INVALID_RECORD"},
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
