"""Crash safety of the Spark sink: the ``consumer-gateway sink`` CLI as a subprocess, its whole process group
(Python driver, Spark JVM, Python workers) killed with SIGKILL in the middle of a run, then restarted on the
same checkpoint: zero lost and zero duplicated rows, read through Spark (parquet) and pyarrow (delta). And a
gateway that goes away mid-run: a clear error, only whole batches visible, and a later run completes.

Each format meets each fault once (every case starts two Spark runs, ~40 s): the kill -9 on parquet here and on
delta in the typed-avro case below; the gateway going away on delta (the sink's error handling does not depend on
the format; what a run leaves visible after a crash is checked per format by the kill -9 cases)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_sink_tansu import create_topic, produce, table_rows

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.timeout(900)]
pytest.importorskip("pyspark")
pytest.importorskip("deltalake")
REPO = Path(__file__).resolve().parents[2]


def start_cli(url: str, topic: str, tmp: Path, fmt: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "gateway", "sink", "--gateway", url, "--topics", topic,
            "--table", str(tmp / "table"), "--checkpoint", str(tmp / "cp"), "--format", fmt, *extra]
    return subprocess.Popen(argv, cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_batches(proc: subprocess.Popen[bytes], log: Path, n: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count("\nbatch ") + log.read_text(errors="replace").startswith(
                "batch ") >= n:
            return
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)  # polling another process's output file
    raise AssertionError(f"no {n} batches in {timeout} s: {log.read_text()}")


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise AssertionError(log.read_text()) from None


def check_exact(spark: Any, path: Path, fmt: str, want: list[Any]) -> None:
    got = table_rows(spark, path, fmt)
    keys = [(r[1], r[2]) for r in got]
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} duplicated rows"
    missing = set((r[1], r[2]) for r in want) - set(keys)
    assert not missing, f"{len(missing)} lost rows"
    assert got == sorted(want)


def prefix_ok(spark: Any, path: Path, fmt: str, want: list[Any]) -> int:
    """Whatever is visible is whole: per partition a contiguous run of the wanted offsets, no duplicates."""
    if fmt == "delta" and not (path / "_delta_log").exists():
        return 0
    if fmt == "parquet" and not (path / "_spark_metadata").exists():
        return 0
    got = table_rows(spark, path, fmt)
    assert len({(r[1], r[2]) for r in got}) == len(got)
    by_part: dict[int, list[Any]] = {}
    for r in sorted(want):
        by_part.setdefault(r[1], []).append(r)
    for p, rows in by_part.items():
        mine = [r for r in got if r[1] == p]
        assert mine == rows[:len(mine)]
    return len(got)


@pytest.mark.parametrize("fmt", ["parquet"])
def test_kill_9_mid_run_then_restart_no_loss_no_duplicates(
        tansu: EmbeddedBroker, spark: Any, tmp_path: Path, fmt: str) -> None:
    gw = GatewayProcess(tansu.bootstrap, log_file=tmp_path / "gw.log")
    gw.start()
    try:
        topic = create_topic(tansu.bootstrap, 2)
        want = produce(tansu.bootstrap, topic, 0, 6000, "a", txn=f"tx-{topic}", size=100)
        want += produce(tansu.bootstrap, topic, 1, 6000, "b", size=100)
        log = tmp_path / "run1.log"
        proc = start_cli(gw.url, topic, tmp_path, fmt, log, "--max-records-per-trigger", "800")
        wait_for_batches(proc, log, 3)
        kill_group(proc)
        seen = prefix_ok(spark, tmp_path / "table", fmt, want)
        assert 0 < seen < len(want), seen
        log2 = tmp_path / "run2.log"
        proc2 = start_cli(gw.url, topic, tmp_path, fmt, log2, "--max-records-per-trigger", "4000")
        assert finish(proc2, log2) == 0, log2.read_text()
        assert "done:" in log2.read_text()
        check_exact(spark, tmp_path / "table", fmt, want)
    finally:
        gw.stop()


@pytest.mark.parametrize("fmt", ["delta"])
def test_gateway_going_away_is_a_clear_error_and_leaves_whole_batches(
        tansu: EmbeddedBroker, spark: Any, tmp_path: Path, fmt: str) -> None:
    gw = GatewayProcess(tansu.bootstrap, log_file=tmp_path / "gw.log")
    gw.start()
    try:
        topic = create_topic(tansu.bootstrap, 2)
        want = produce(tansu.bootstrap, topic, 0, 5000, "a", size=100)
        want += produce(tansu.bootstrap, topic, 1, 5000, "b", txn=f"tx-{topic}", size=100)
        log = tmp_path / "run1.log"
        proc = start_cli(gw.url, topic, tmp_path, fmt, log, "--max-records-per-trigger", "500")
        wait_for_batches(proc, log, 2)
        assert gw.proc is not None
        gw.proc.kill()
        gw.proc.wait()
        assert finish(proc, log) == 1
        text = log.read_text()
        assert "error: the sink failed:" in text and "unreachable" in text, text
        seen = prefix_ok(spark, tmp_path / "table", fmt, want)
        assert 0 < seen < len(want)
    finally:
        gw.stop()
    gw2 = GatewayProcess(tansu.bootstrap, log_file=tmp_path / "gw2.log")
    gw2.start()
    try:
        log2 = tmp_path / "run2.log"
        assert finish(start_cli(gw2.url, topic, tmp_path, fmt, log2), log2) == 0, log2.read_text()
        check_exact(spark, tmp_path / "table", fmt, want)
    finally:
        gw2.stop()


# -- typed: an Avro topic into a typed Delta table -------------------------------------------------------------
AVRO_V1 = {"type": "record", "name": "Reading", "namespace": "sink", "fields": [
    {"name": "n", "type": "long"}, {"name": "label", "type": "string"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
AVRO_V2 = {**AVRO_V1, "fields": [*AVRO_V1["fields"], {"name": "unit", "type": ["null", "string"], "default": None}]}


def produce_avro(bootstrap: str, registry: str, topic: str, partition: int, n: int) -> list[tuple[int, int, int]]:
    """``n`` Avro records (confluent-kafka's AvroSerializer: the first half with v1, then v2, the subject's
    latest); (partition, offset, n) of each."""
    import json

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = AvroSerializer(client, json.dumps(AVRO_V1)), AvroSerializer(client, json.dumps(AVRO_V2))
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    out: list[tuple[int, int, int]] = []
    for i in range(n):
        value = (v1 if i < n // 2 else v2)({"n": i, "label": f"r{i}".ljust(60, "."), "at": 1_700_000_000_000 + i,
                                            **({"unit": "C"} if i >= n // 2 else {})}, ctx)
        p.produce(topic, value=value, partition=partition,
                  on_delivery=lambda err, msg, i=i: out.append((msg.partition(), msg.offset(), i)))
    assert p.flush(30) == 0
    return out


def test_kill_9_mid_run_typed_avro_delta(tansu: EmbeddedBroker, schema_registry: str, tmp_path: Path) -> None:
    import deltalake

    gw = GatewayProcess(tansu.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": schema_registry},
                        log_file=tmp_path / "gw.log")
    gw.start()
    try:
        topic = create_topic(tansu.bootstrap, 2)
        want = sorted(produce_avro(tansu.bootstrap, schema_registry, topic, 0, 4000)
                      + produce_avro(tansu.bootstrap, schema_registry, topic, 1, 4000))
        log = tmp_path / "run1.log"
        typed = ("--value-format", "avro")
        proc = start_cli(gw.url, topic, tmp_path, "delta", log, "--max-records-per-trigger", "800", *typed)
        wait_for_batches(proc, log, 3)
        kill_group(proc)
        first = deltalake.DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
        assert 0 < first.num_rows < len(want)
        log2 = tmp_path / "run2.log"
        proc2 = start_cli(gw.url, topic, tmp_path, "delta", log2, "--max-records-per-trigger", "4000", *typed)
        assert finish(proc2, log2) == 0, log2.read_text()
        t = deltalake.DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
    finally:
        gw.stop()
    value = t.schema.field("value").type
    assert [f.name for f in value] == ["n", "label", "at", "unit"]  # typed columns, the latest schema's
    rows = sorted((r["partition"], r["offset"], r["value"]["n"]) for r in
                  t.select(["partition", "offset", "value"]).to_pylist())
    assert len(rows) == len(set(rows)), "duplicated rows"
    assert rows == want  # nothing lost, nothing twice, each value decoded
    assert set(t.column("error").to_pylist()) == {None}
    units = {r["n"]: r["unit"] for r in t.column("value").to_pylist()}
    assert units[0] is None and units[3999] == "C"  # v1 rows resolved into v2 (the default)
    assert len(set(t.column("value_schema_id").to_pylist())) == 2
