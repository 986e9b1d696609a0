"""The typed mode of the Spark sink, without Spark or a gateway: the options, the pinned
reader schema travelling in the input partitions, the Spark schema a typed page gives, a typed page (built by
the gateway's own code) cast into it, the CLI arguments and the Delta writer's schema merge flag."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from service.fetch.ranges import RangePage
from service.fetch.typed import to_ipc, typed_table
from service.protocol.records import Record
from service.schemas.formats import ResolvedSchema
from service.schemas.registry import Schema
from service.schemas.wire import frame
from sink.cli import parse_args
from sink.source import (
    SCHEMA,
    Settings,
    _arrow_page,
    _target_schema,
    plan_partitions,
    typed_spark_schema,
)

AVRO = {"type": "record", "name": "R", "fields": [
    {"name": "n", "type": "long"}, {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "m", "type": {"type": "map", "values": "int"}}, {"name": "opt", "type": ["null", "string"]}]}


class _Resolver:
    def __init__(self) -> None:
        self.schemas = {3: ResolvedSchema(3, "AVRO", Schema(json.dumps(AVRO)), {}, None)}

    def cached(self, sid: int) -> Any:
        return self.schemas.get(sid)


def _payload(n: int) -> bytes:
    import io

    from fastavro import parse_schema, schemaless_writer

    out = io.BytesIO()
    schemaless_writer(out, parse_schema(AVRO), {"n": n, "at": 1000 + n, "m": {"a": n}, "opt": None if n % 2 else "x"})
    return frame(3, out.getvalue())


def test_value_format_options() -> None:
    base = {"gateway": "http://h:1", "topics": "t"}
    s = Settings.from_options({**base, "valueFormat": "AVRO"})
    assert s.typed and s.value_format == "avro" and s.value_schema == "latest"
    assert Settings.from_options({**base, "valueFormat": "avro", "valueSchemaId": "12"}).value_schema == "12"
    assert not Settings.from_options(base).typed and not Settings.from_options({**base, "valueFormat": "binary"}).typed
    with pytest.raises(ValueError, match="valueFormat"):
        Settings.from_options({**base, "valueFormat": "xml"})
    with pytest.raises(ValueError, match="valueSchemaId"):
        Settings.from_options({**base, "valueFormat": "avro", "valueSchemaId": "newest"})


def test_pinned_schema_travels_in_the_partitions() -> None:
    s = Settings.from_options({"gateway": "http://h:1", "topics": "t", "valueFormat": "avro"})
    from dataclasses import replace

    s = replace(s, value_schema_id=3, spark_schema=SCHEMA.json())
    [p] = plan_partitions(s, {"t:0": 0}, {"t:0": 3})
    q = pickle.loads(pickle.dumps(p))
    assert (q.value_format, q.value_schema_id, q.spark_schema) == ("avro", 3, SCHEMA.json())


def test_typed_page_casts_into_the_spark_schema_of_its_reader() -> None:
    recs = [Record(i, 1_700_000_000_000 + i, None, _payload(i), ()) for i in range(3)]
    recs.append(Record(3, 1_700_000_000_003, b"k", b"not framed", ()))
    page = RangePage("t", 0, 0, recs, next_offset=4, end_offset=4, high_watermark=4, last_stable_offset=4,
                     log_start_offset=0)
    table = typed_table(page, _Resolver(), "avro", 3)
    spark = typed_spark_schema(table.schema)
    assert [f.name for f in spark.fields] == ["topic", "partition", "offset", "timestamp", "key", "value",
                                              "headers", "value_schema_id", "error", "value_raw"]
    assert [f.name for f in spark["value"].dataType.fields] == ["n", "at", "m", "opt"]
    batches, nxt, end = _arrow_page(to_ipc(table), _target_schema(spark))
    got = pa.Table.from_batches(batches)
    assert (nxt, end) == (4, 4) and got.num_rows == 4
    assert got.schema.field("value").type.field("at").type == pa.timestamp("us", "UTC")
    rows = got.to_pylist()
    assert [r["value"]["n"] if r["value"] else None for r in rows] == [0, 1, 2, None]
    assert rows[0]["value"]["m"] == [("a", 0)] and rows[0]["value"]["opt"] == "x"
    assert [r["value_schema_id"] for r in rows] == [3, 3, 3, None]
    assert "magic byte" in rows[3]["error"] and rows[3]["value_raw"] == b"not framed"
    assert rows[0]["error"] is None and rows[0]["value_raw"] is None


def test_cli_value_format_arguments() -> None:
    base = ["--gateway", "http://h:1", "--topics", "t", "--table", "/tmp/x", "--checkpoint", "/tmp/c"]
    a = parse_args(base)
    assert (a.value_format, a.value_schema_id) == ("binary", "latest")
    a = parse_args([*base, "--value-format", "avro", "--value-schema-id", "7"])
    assert (a.value_format, a.value_schema_id) == ("avro", "7")
    with pytest.raises(SystemExit):
        parse_args([*base, "--value-format", "avro", "--value-schema-id", "x7"])


def test_delta_writer_merges_schema_only_when_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    import sink.delta as delta

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(delta, "committed_version", lambda table, app: None)
    import deltalake

    monkeypatch.setattr(deltalake, "write_deltalake", lambda table, data, **kw: calls.append(kw))
    assert delta.append_batch("/tmp/none", pa.table({"a": [1]}), "app", 0, merge_schema=True)
    assert delta.append_batch("/tmp/none", pa.table({"a": [1]}), "app", 1)
    assert calls[0]["schema_mode"] == "merge" and "schema_mode" not in calls[1]


def test_typed_keys_get_their_own_columns() -> None:
    recs = [Record(0, 1, _payload(1), _payload(2), ()), Record(1, 2, b"plain key", _payload(3), ()),
            Record(2, 3, None, None, ())]
    page = RangePage("t", 0, 0, recs, next_offset=3, end_offset=3)
    table = typed_table(page, _Resolver(), "avro", 3, _Resolver(), "avro", None)
    assert table.column_names == ["topic", "partition", "offset", "timestamp", "key", "value", "headers",
                                  "key_schema_id", "value_schema_id", "error", "value_raw", "key_raw"]
    assert table.schema.metadata[b"key_schema_id"] == b"3" and table.schema.metadata[b"key_format"] == b"avro"
    rows = table.to_pylist()
    assert rows[0]["key"]["n"] == 1 and rows[0]["value"]["n"] == 2 and rows[0]["error"] is None
    assert rows[1]["key"] is None and rows[1]["key_raw"] == b"plain key" and rows[1]["value"]["n"] == 3
    assert rows[1]["error"].startswith("key: ") and "magic byte" in rows[1]["error"]
    assert rows[2]["key"] is None and rows[2]["value"] is None and rows[2]["error"] is None
    assert [r["key_schema_id"] for r in rows] == [3, None, None]
