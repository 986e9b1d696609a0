"""The Spark sink (``sink``), end to end through a real gateway process on the module's broker. On Tansu:
committed transactions, an open transaction holding partition 0 at its LSO, plain records; available-now runs
into parquet (read back through Spark) and Delta (read back with delta-rs / pyarrow); a second run picks up only
the new records. On both: the batch reader and its commit group; bad input. On Apache Kafka: aborted transactions
never reach the table, and Spark's own Kafka source with read_committed writes the same rows. One Spark session
(local[2]) for the module."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as CKProducer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_kafka_transactions import assert_exactly, write_interleaved
from tests.integration.test_kafka_transactions import create_topic as create_txn_topic
from tests.integration.test_topics_tansu import open_transaction

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
pyspark = pytest.importorskip("pyspark")
deltalake = pytest.importorskip("deltalake")

Row = tuple[str, int, int, bytes | None, bytes]  # topic, partition, offset, key, value


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("sink-gw")
    g = GatewayProcess(broker.bootstrap, log_file=d / "gw.log")
    g.start()
    try:
        yield g
    finally:
        g.stop()


def create_topic(bootstrap: str, partitions: int = 2) -> str:
    name = f"sink-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, partitions, 1)])
    for f in fs.values():
        f.result(30)
    return name


def produce(bootstrap: str, topic: str, partition: int, n: int, tag: str, txn: str | None = None,
            size: int = 0) -> list[Row]:
    """``n`` records to one partition (in one committed transaction when ``txn`` is given); what was written."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 20}
    if txn:
        conf["transactional.id"] = txn
    p = CKProducer(conf)
    if txn:
        p.init_transactions(30)
        p.begin_transaction()
    out: list[Row] = []

    def done(err: Any, msg: Any) -> None:
        assert err is None, err
        out.append((topic, msg.partition(), msg.offset(), msg.key(), msg.value()))

    for i in range(n):
        v = f"{tag}-{i}".encode().ljust(size, b".")
        p.produce(topic, key=b"k%d" % i if i % 2 else None, value=v, partition=partition, on_delivery=done)
    assert p.flush(30) == 0
    if txn:
        p.commit_transaction(30)
    return out


def sink_args(gw: GatewayProcess, topic: str, tmp: Path, fmt: str, **kw: Any) -> argparse.Namespace:
    from sink.cli import parse_args

    argv = ["--gateway", gw.url, "--topics", topic, "--table", str(tmp / f"table-{fmt}"),
            "--checkpoint", str(tmp / f"cp-{fmt}"), "--format", fmt]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return parse_args(argv)


def table_rows(spark: Any, path: Path, fmt: str) -> list[Row]:
    if fmt == "parquet":
        rows = spark.read.parquet(str(path)).select("topic", "partition", "offset", "key", "value").collect()
        return sorted((r[0], r[1], r[2], bytes(r[3]) if r[3] is not None else None, bytes(r[4])) for r in rows)
    t = deltalake.DeltaTable(str(path)).to_pyarrow_table(columns=["topic", "partition", "offset", "key", "value"])
    return sorted(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))


# Tansu only: on Kafka, test_on_kafka_aborted_transactions_never_reach_the_table covers committed transactions, an
# open one holding its partition and a second run taking what it held (the formats and triggers are the sink's)
@pytest.mark.parametrize("broker", ["tansu"], indirect=True, scope="module")
@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_available_now_exactly_the_committed_records_then_only_new_ones(
        broker: AnyBroker, gw: GatewayProcess, spark: Any, tmp_path: Path, fmt: str) -> None:
    from sink.cli import run

    topic = create_topic(broker.bootstrap, 2)
    b = broker.bootstrap
    want = produce(b, topic, 0, 50, "plain0")
    want += produce(b, topic, 0, 40, "txn0", txn=f"tx-{topic}-a")
    want += produce(b, topic, 1, 30, "txn1", txn=f"tx-{topic}-b")
    want += produce(b, topic, 1, 20, "plain1")
    with open_transaction(b, topic, 5, f"tx-{topic}-open") as txn:
        held = produce(b, topic, 0, 10, "after-open")  # past the LSO of partition 0 until the txn ends
        out = io.StringIO()
        s1 = run(spark, sink_args(gw, topic, tmp_path, fmt, max_records_per_trigger=60, max_offsets_per_task=25),
                 out=out)
        assert table_rows(spark, tmp_path / f"table-{fmt}", fmt) == sorted(want)
        assert s1["rows"] == len(want) and s1["batches"] >= 3, (s1, out.getvalue())
        assert "rows/s" in out.getvalue() and "lag" in out.getvalue()
        txn.commit_transaction(30)
    # the 5 committed transactional records (values t0..t4) and the held ones, then more
    more = produce(b, topic, 1, 25, "more1", txn=f"tx-{topic}-c") + produce(b, topic, 0, 7, "more0")
    s2 = run(spark, sink_args(gw, topic, tmp_path, fmt), out=io.StringIO())
    got = table_rows(spark, tmp_path / f"table-{fmt}", fmt)
    txn_rows = [r for r in got if r[4].startswith(b"t") and r[4][1:].isdigit()]
    assert sorted(r[4] for r in txn_rows) == [b"t%d" % i for i in range(5)]
    assert got == sorted(want + held + more + txn_rows)
    assert s2["rows"] == len(held) + len(more) + 5
    assert len({(r[1], r[2]) for r in got}) == len(got)  # no duplicates
    # a third run: nothing new, nothing written
    s3 = run(spark, sink_args(gw, topic, tmp_path, fmt), out=io.StringIO())
    assert s3["rows"] == 0 and table_rows(spark, tmp_path / f"table-{fmt}", fmt) == got


def test_batch_reader_and_commit_group(broker: AnyBroker, gw: GatewayProcess, spark: Any,
                                       tmp_path: Path) -> None:
    from sink.cli import run
    from sink.groups import GroupCommitter

    topic = create_topic(broker.bootstrap, 3)
    want = [r for p in range(3) for r in produce(broker.bootstrap, topic, p, 40 + p, f"p{p}")]
    df = (spark.read.format("kafka_gateway").option("gateway", gw.url).option("topics", topic)
          .option("maxOffsetsPerTask", "16").option("maxBytesPerPage", "200").load())
    assert df.rdd.getNumPartitions() == 3 + 3 + 3
    got = sorted((r.topic, r.partition, r.offset, r.key, r.value) for r in df.collect())
    assert got == sorted(want)
    ts = df.select("timestamp").collect()
    assert all(r.timestamp is not None and r.timestamp.year >= 2024 for r in ts)
    # the streaming job with --commit-group mirrors its end offsets into the group
    group = f"g-{topic}"
    run(spark, sink_args(gw, topic, tmp_path, "parquet", commit_group=group), out=io.StringIO())
    c = GroupCommitter(gw.url, group)
    try:
        c.commit({f"{topic}:0": 1})  # creates an instance to read the group's offsets with (then restore)
        c.commit({f"{topic}:0": 40})
        got_offsets = c.committed([f"{topic}:{p}" for p in range(3)])
    finally:
        c.close()
    assert got_offsets == {f"{topic}:{p}": 40 + p for p in range(3)}


def test_unknown_topic_is_a_clear_error_and_writes_nothing(gw: GatewayProcess, spark: Any, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from sink.cli import main, run

    argv = ["--gateway", gw.url, "--topics", "no-such-topic-x", "--table", str(tmp_path / "t"),
            "--checkpoint", str(tmp_path / "cp")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no-such-topic-x" in err and "404" in err, err
    assert not (tmp_path / "t").exists()
    # the same through Spark itself (no preflight): the query fails with the gateway's answer
    with pytest.raises(Exception, match="40401"):
        run(spark, sink_args(gw, "no-such-topic-y", tmp_path, "parquet"), out=io.StringIO())
    assert not list((tmp_path / "table-parquet").glob("*.parquet"))
    with pytest.raises(Exception, match="40401"):
        run(spark, sink_args(gw, "no-such-topic-y", tmp_path, "delta"), out=io.StringIO())
    assert not (tmp_path / "table-delta").exists()
    assert main([*argv[:1], "http://127.0.0.1:9", *argv[2:]]) == 1
    assert "unreachable" in capsys.readouterr().err


# -- on Apache Kafka only (the module's Spark session and its Kafka gateway: paid once) --
@pytest.mark.parametrize("broker", ["kafka"], indirect=True, scope="module")
def test_on_kafka_aborted_transactions_never_reach_the_table(broker: AnyBroker, gw: GatewayProcess,
                                                             spark: Any, tmp_path: Path) -> None:
    """Kafka has the aborted-transaction index Tansu lacks: two transactional producers interleave committed and
    aborted transactions over three partitions (tests/integration/test_kafka_transactions.py); the table holds
    every committed record once, at its offset, and no aborted one. An open transaction holds its partition at the
    LSO (later plain records too); once it commits, the next run adds exactly what was held."""
    from sink.cli import run

    b = broker.bootstrap
    topic = create_txn_topic(b, 3)
    w = write_interleaved(b, topic, rounds=2)
    assert len(w.committed) == 2 * 6 + 2 * 3 + 3 and len(w.aborted) == 2 * 6
    with open_transaction(b, topic, 4, f"tx-{topic}-open") as txn:  # values t0..t3 on partition 0
        after = {(r[1], r[2], r[4]) for p in range(3) for r in produce(b, topic, p, 3, f"after{p}")}
        s1 = run(spark, sink_args(gw, topic, tmp_path, "parquet"), out=io.StringIO())
        first = [(r[1], r[2], r[4]) for r in table_rows(spark, tmp_path / "table-parquet", "parquet")]
        shown = w.committed | {r for r in after if r[0] != 0}  # partition 0 is held at the open transaction
        assert_exactly(first, shown)
        assert s1["rows"] == len(shown) == 21 + 6
        txn.commit_transaction(30)
    s2 = run(spark, sink_args(gw, topic, tmp_path, "parquet"), out=io.StringIO())
    got = [(r[1], r[2], r[4]) for r in table_rows(spark, tmp_path / "table-parquet", "parquet")]
    opened = {r for r in got if r[2] in {b"t%d" % i for i in range(4)}}
    assert {r[0] for r in opened} == {0} and len(opened) == 4
    assert_exactly(got, w.committed | after | opened)
    assert s2["rows"] == 4 + 3


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka source (tools/install-spark-kafka.sh: Maven Central, then a cache), minus the jars PySpark
    ships; the install fails with its reason when the connector cannot be resolved."""
    done = subprocess.run(["sh", str(REPO / "tools" / "install-spark-kafka.sh")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    lib = Path(done.stdout.strip().splitlines()[-1])
    bare = re.compile(r"-\d[\w.+-]*\.jar$")
    shipped = {bare.sub("", p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(p) for p in lib.glob("*.jar") if bare.sub("", p.name) not in shipped)


@pytest.mark.parametrize("broker", ["kafka"], indirect=True, scope="module")
def test_on_kafka_spark_kafka_source_read_committed_writes_the_rows_the_sink_writes(
        broker: AnyBroker, gw: GatewayProcess, spark: Any, tmp_path: Path) -> None:
    """The baseline a Spark user would pick instead of the sink, Spark's own Kafka source (added to this module's
    session with ADD JAR), available-now into parquet with kafka.isolation.level=read_committed, writes exactly the
    committed records of interleaved committed and aborted transactions, as the sink does (no failure on the
    offsets the markers and aborted records leave, with failOnDataLoss at its default, true); with its default
    isolation level, read_uncommitted, it shows the aborted records too."""
    from sink.cli import run

    for jar in spark_kafka_jars():
        spark.sql(f"ADD JAR '{jar}'")
    b = broker.bootstrap
    topic = create_txn_topic(b, 3)
    w = write_interleaved(b, topic, rounds=2)
    assert len(w.committed) == 21 and len(w.aborted) == 12
    run(spark, sink_args(gw, topic, tmp_path, "parquet"), out=io.StringIO())
    ours = [(r[1], r[2], r[4]) for r in table_rows(spark, tmp_path / "table-parquet", "parquet")]
    assert_exactly(ours, w.committed)

    def kafka_source(isolation: str) -> Any:
        return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", b).option("subscribe", topic)
                .option("startingOffsets", "earliest").option("kafka.isolation.level", isolation).load()
                .select("topic", "partition", "offset", "timestamp", "key", "value"))

    q = (kafka_source("read_committed").writeStream.format("parquet").option("path", str(tmp_path / "spark-kafka"))
         .option("checkpointLocation", str(tmp_path / "spark-kafka-cp")).trigger(availableNow=True).start())
    assert q.awaitTermination(120), "Spark's Kafka source did not end"
    assert q.exception() is None, q.exception()
    theirs = [(r[1], r[2], r[4]) for r in table_rows(spark, tmp_path / "spark-kafka", "parquet")]
    assert_exactly(theirs, w.committed)
    q = (kafka_source("read_uncommitted").writeStream.format("parquet")
         .option("path", str(tmp_path / "spark-kafka-all"))
         .option("checkpointLocation", str(tmp_path / "spark-kafka-all-cp")).trigger(availableNow=True).start())
    assert q.awaitTermination(120), "Spark's Kafka source did not end"
    everything = [(r[1], r[2], r[4]) for r in table_rows(spark, tmp_path / "spark-kafka-all", "parquet")]
    assert_exactly(everything, w.committed | w.aborted)
