"""Pure parts of the Spark sink: offset planning, read limits, options, progress and error text, the CLI
dispatch. No Spark session, no gateway."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from sink.cli import clean_error, lag_of, parse_args
from sink.source import (
    RangePartition,
    Settings,
    cap_offsets,
    parse_key,
    plan_partitions,
    resolve_offsets,
    split_range,
    tp_key,
)


def test_split_range() -> None:
    assert split_range(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert split_range(5, 5, 4) == []
    assert split_range(3, 4, 100) == [(3, 4)]
    with pytest.raises(ValueError):
        split_range(0, 1, 0)


@given(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(1, 10**4))
def test_split_range_covers_exactly(start: int, n: int, per: int) -> None:
    r = split_range(start, start + n, per)
    assert all(0 < b - a <= per for a, b in r)
    assert [x for a, b in r for x in (a, b)][1:-1:2] == [b for _, b in r][:-1]
    assert (r[0][0], r[-1][1]) == (start, start + n) if n else r == []


@given(st.dictionaries(st.sampled_from([f"t:{i}" for i in range(6)]), st.tuples(st.integers(0, 1000),
                                                                                 st.integers(0, 1000)),
                       min_size=1), st.integers(1, 3000))
def test_cap_offsets_fair_and_bounded(parts: dict[str, tuple[int, int]], limit: int) -> None:
    start = {k: a for k, (a, _) in parts.items()}
    latest = {k: a + b for k, (a, b) in parts.items()}
    end = cap_offsets(start, latest, limit)
    assert set(end) == set(latest)
    assert all(start[k] <= end[k] <= latest[k] for k in latest)
    total = sum(end[k] - start[k] for k in latest)
    assert total == min(limit, sum(latest[k] - start[k] for k in latest))
    if len(latest) > 1 and total == limit:  # a partition short of its share is short only if it ran dry
        share = limit // len(latest)
        assert all(end[k] - start[k] >= share or end[k] == latest[k] for k in latest)


def test_cap_offsets_new_partition_and_gone_partition() -> None:
    assert cap_offsets({"a:0": 5, "old:0": 3}, {"a:0": 100, "b:0": 10}, 10) == {"a:0": 15, "b:0": 10, "old:0": 3}


def test_keys_and_offsets_round_trip_json() -> None:
    assert parse_key(tp_key("my.topic-1", 12)) == ("my.topic-1", 12)
    offsets = {"t:0": {"beginning_offset": 2, "end_offset": 10, "last_stable_offset": 8},
               "t:1": {"beginning_offset": 0, "end_offset": 0, "last_stable_offset": 0}}
    assert resolve_offsets("earliest", offsets, "x") == {"t:0": 2, "t:1": 0}
    assert resolve_offsets("latest", offsets, "x") == {"t:0": 8, "t:1": 0}
    assert resolve_offsets('{"t:0": 5}', offsets, "x") == {"t:0": 5, "t:1": 0}
    assert json.loads(json.dumps(resolve_offsets("latest", offsets, "x"))) == {"t:0": 8, "t:1": 0}
    with pytest.raises(ValueError, match="unknown partitions"):
        resolve_offsets('{"u:0": 1}', offsets, "x")
    with pytest.raises(ValueError, match="expected"):
        resolve_offsets("nonsense", offsets, "x")


def test_settings_from_options() -> None:
    s = Settings.from_options({"gateway": "http://h:1/", "topics": " a, b ,", "apiKey": "k",
                               "maxOffsetsPerTask": "7", "maxRecordsPerTrigger": "9"})
    assert (s.gateway, s.topics, s.api_key, s.max_offsets_per_task, s.max_records_per_trigger) == (
        "http://h:1", ("a", "b"), "k", 7, 9)
    with pytest.raises(ValueError, match="gateway"):
        Settings.from_options({"topics": "a"})
    with pytest.raises(ValueError, match="topics"):
        Settings.from_options({"gateway": "http://h", "topics": " , "})
    with pytest.raises(ValueError, match=">= 1"):
        Settings.from_options({"gateway": "http://h", "topics": "a", "maxOffsetsPerTask": "0"})


def test_plan_partitions_are_self_contained_and_picklable() -> None:
    s = Settings.from_options({"gateway": "http://h:1", "topics": "t", "apiKey": "k", "maxOffsetsPerTask": "4"})
    parts = plan_partitions(s, {"t:0": 0, "t:1": 7}, {"t:0": 10, "t:1": 7, "t:2": 3}, {"t:2": 1})
    got = [(p.topic, p.partition, p.start, p.end) for p in parts]
    assert got == [("t", 0, 0, 4), ("t", 0, 4, 8), ("t", 0, 8, 10), ("t", 2, 1, 3)]
    p = pickle.loads(pickle.dumps(parts[0]))
    assert isinstance(p, RangePartition)
    assert (p.gateway, p.api_key, p.topic, p.partition, p.start, p.end) == ("http://h:1", "k", "t", 0, 0, 4)


def test_progress_lag_and_error_text() -> None:
    p = {"sources": [{"endOffset": '{"t:0": 5, "t:1": 7}', "latestOffset": '{"t:0": 10, "t:1": 7}'}]}
    assert lag_of(p) == 5
    assert lag_of({"sources": []}) is None
    text = ("StreamingQueryException: ... Traceback ...\n  File x\nsink.http.GatewayUnavailable: the gateway at "
            "http://h:1 is unreachable (GET /x: ConnectionRefusedError())\n\tat org.apache...")
    assert clean_error(Exception(text)) == ("GatewayUnavailable: the gateway at http://h:1 is unreachable "
                                            "(GET /x: ConnectionRefusedError())")


def test_cli_arguments() -> None:
    a = parse_args(["--gateway", "http://h", "--topics", "a,b", "--table", "t", "--checkpoint", "c"])
    assert (a.format, a.trigger, a.commit_group) == ("parquet", "available-now", None)
    a = parse_args(["--gateway", "http://h", "--topics", "a", "--table", "t", "--checkpoint", "c",
                    "--format", "delta", "--trigger", "interval=10s"])
    assert (a.format, a.trigger) == ("delta", "interval=10s")
    with pytest.raises(SystemExit):
        parse_args(["--gateway", "http://h", "--topics", "a", "--table", "t", "--checkpoint", "c",
                    "--trigger", "sometimes"])


def test_consumer_gateway_sink_dispatches_to_the_sink_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    import sink.cli
    from gateway.main import main

    seen: list[list[str]] = []
    monkeypatch.setattr(sink.cli, "main", lambda argv: seen.append(argv) or 7)
    assert main(["sink", "--gateway", "http://h"]) == 7
    assert seen == [["--gateway", "http://h"]]


def test_response_format_option_travels_in_the_partition() -> None:
    s = Settings.from_options({"gateway": "http://h:1", "topics": "t", "responseFormat": "JSON"})
    assert s.response_format == "json"
    [p] = plan_partitions(s, {"t:0": 0}, {"t:0": 3})
    assert pickle.loads(pickle.dumps(p)).response_format == "json"
    assert Settings.from_options({"gateway": "http://h:1", "topics": "t"}).response_format == "arrow"
    with pytest.raises(ValueError, match="responseFormat"):
        Settings.from_options({"gateway": "http://h", "topics": "a", "responseFormat": "xml"})


def test_json_and_arrow_pages_decode_to_the_same_batch() -> None:
    """The two answers of the gateway's records route for the same page (rendered by the gateway's own
    code) become the same Arrow batch in Spark's schema."""
    import pyarrow as pa

    from api.v2.topics import _page_json
    from service.fetch.ranges import RangePage, to_arrow_ipc
    from service.protocol.records import Record
    from sink.source import _arrow_page, _json_page, _target_schema

    recs = [Record(3, 1_700_000_000_123, b"k", b"v1", ()), Record(5, 1_700_000_000_456, None, None,
                                                                   (("h", b"x"), ("n", None))),
            Record(6, 1_700_000_000_789, b"", b"\x00\xff", ())]
    page = RangePage("orders", 2, 3, recs, next_offset=8, end_offset=9, high_watermark=9, last_stable_offset=9,
                     log_start_offset=0)
    target = _target_schema()
    body, _ = _page_json(page, "application/vnd.kafka.binary.v2+json")
    j, jn, je = _json_page(body, target)
    a, an, ae = _arrow_page(to_arrow_ipc(page), target)
    assert (jn, je) == (an, ae) == (8, 9)
    assert pa.Table.from_batches(j).equals(pa.Table.from_batches(a))
    assert pa.Table.from_batches(a).column("headers").to_pylist()[1] == [{"key": "h", "value": b"x"},
                                                                        {"key": "n", "value": None}]
    empty = RangePage("orders", 2, 9, [], next_offset=9, end_offset=9)
    assert _json_page(_page_json(empty, "application/vnd.kafka.binary.v2+json")[0], target)[0] == []
    assert _arrow_page(to_arrow_ipc(empty), target)[0] == []


def test_http_client_asks_again_after_a_retriable_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    from sink import http as sink_http

    answers = [(503, {}, b'{"error_code": 50003, "message": "busy"}'), (200, {}, b'{"ok": 1}')]
    calls: list[str] = []

    def fake_request(self: object, method: str, path: str, *a: object, **kw: object) -> tuple[int, dict, bytes]:
        calls.append(method)
        return answers.pop(0)

    monkeypatch.setattr(sink_http.GatewayHTTP, "request", fake_request)
    monkeypatch.setattr(sink_http, "BACKOFF_S", (0.0,) * 4)
    h = sink_http.GatewayHTTP("http://127.0.0.1:1")
    assert h.get_json("/x", "x") == {"ok": 1} and calls == ["GET", "GET"]
    answers[:] = [(503, {}, b'{"error_code": 50003, "message": "busy"}')] * sink_http.ATTEMPTS
    with pytest.raises(sink_http.GatewayHTTPError, match="50003"):
        h.get_json("/x", "x")
    answers[:] = [(503, {}, b'{"error_code": 50003, "message": "busy"}')]
    calls.clear()
    with pytest.raises(sink_http.GatewayHTTPError):  # not a GET: never sent twice
        h.call("POST", "/x", "x", body={})
    assert calls == ["POST"]
