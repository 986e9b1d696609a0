"""The gateway's Spark sink beside Spark's own Kafka source, on one embedded Apache Kafka broker, in one run.

The baseline a Spark user would pick instead of the sink is Spark's Kafka source
(``org.apache.spark:spark-sql-kafka-0-10_2.13``). Both run as available-now streaming queries from the same topic
into the same table format (Spark's parquet file sink with a checkpoint, what ``consumer-gateway sink`` writes by
default), each into a fresh table and checkpoint:
- gateway: the ``kafka_gateway`` source (``sink.cli.run``) against a gateway process pointed at the broker;
- spark-kafka: ``spark.readStream.format("kafka")`` with ``kafka.isolation.level=read_committed``,
  ``startingOffsets=earliest``, ``includeHeaders=true``, the same seven columns selected.

The connector's jars come from Maven Central through ``tools/install-spark-kafka.sh`` (a cache outside the
repository) and are given to the session as ``spark.jars`` (local paths; no ``--packages`` download at run time);
jars PySpark already ships (Hadoop, Scala, compression codecs, slf4j) are left out. The connector's version is
the pom's (``tools/spark-kafka/pom.xml``: PySpark's, or the newest Maven Central serves when it does not serve
PySpark's yet) unless ``--spark-kafka-version`` says otherwise.

Reported:
- cold: each side's first run in a fresh process (session start + JVM warm-up), ``--cold-runs`` child processes
  per side in ABBA order, medians;
- warm: ``--rounds`` rounds in one session, both sides back to back (order alternating), medians of rows/s and of
  the per-round ratio gateway / spark-kafka (the machine's load moves both sides of a round alike);
- transactions: a second topic written by two transactional producers at once (one commits, the other aborts, each
  round, then the roles swap; the log ends with an aborted transaction and its markers); each side's table is
  compared with the committed records (partition, offset) the producers were told: rows, committed rows missing,
  aborted rows present, or the query's error. Spark's source runs with ``failOnDataLoss`` true (its default), again
  with false if that failed, and once with read_uncommitted (its default isolation level) for reference.

Usage: .venv/bin/python bench/sink_peers.py [--records N] [--partitions P] [--rounds R] [--txn-records T]
       [--spark-kafka-version V]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer as CKProducer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.consume import produce  # noqa: E402
from bench.sink import start_gateway  # noqa: E402

SIDES = ("gateway", "spark-kafka")
VERSION_RE = re.compile(r"-\d[\w.+-]*\.jar$")


def pom_version() -> str:
    pom = (REPO / "tools" / "spark-kafka" / "pom.xml").read_text()
    m = re.search(r"<spark.version>(.+?)</spark.version>", pom)
    assert m, "tools/spark-kafka/pom.xml has no <spark.version>"
    return m.group(1)


def resolve_jars(version: str | None = None) -> list[str]:
    """The connector's jars for ``version`` (default: the pom's; resolved into the cache on first use), minus
    those PySpark ships."""
    import pyspark

    version = version or pom_version()
    env = {**os.environ, "KCG_SPARK_KAFKA_VERSION": version}
    r = subprocess.run(["sh", str(REPO / "tools" / "install-spark-kafka.sh")], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"sink_peers: org.apache.spark:spark-sql-kafka-0-10_2.13:{version} could not be resolved "
                         f"(PySpark is {pyspark.__version__}); pass --spark-kafka-version with a version Maven Central "
                         f"serves")
    lib = Path(r.stdout.strip().splitlines()[-1])
    shipped = {VERSION_RE.sub("", p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(p) for p in lib.glob("*.jar") if VERSION_RE.sub("", p.name) not in shipped)


def session(jars: list[str]) -> Any:
    from sink.cli import build_session

    return build_session(app_name="bench-sink-peers", conf={"spark.jars": ",".join(jars)})


def table_check(spark: Any, table: Path) -> tuple[int, int]:
    if not table.exists():
        return 0, 0
    df = spark.read.parquet(str(table))
    return df.count(), df.select("partition", "offset").distinct().count()


def table_offsets(spark: Any, table: Path) -> list[tuple[int, int]]:
    if not table.exists():
        return []
    t = spark.read.parquet(str(table)).select("partition", "offset").toArrow()
    return list(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))


def run_gateway(spark: Any, url: str, topic: str, out: Path) -> dict[str, Any]:
    """One available-now ``consumer-gateway sink`` run into a fresh parquet table."""
    from sink.cli import parse_args, run

    args = parse_args(["--gateway", url, "--topics", topic, "--table", str(out / "table"), "--checkpoint",
                       str(out / "cp"), "--quiet"])
    t0 = time.monotonic()
    try:
        run(spark, args, out=io.StringIO())
        error = None
    except Exception as e:
        error = first_line(e)
    return {"seconds": round(time.monotonic() - t0, 3), "error": error}


def run_spark_kafka(spark: Any, bootstrap: str, topic: str, out: Path, isolation: str = "read_committed",
                    fail_on_data_loss: bool = True) -> dict[str, Any]:
    """One available-now run of Spark's Kafka source into a fresh parquet table (the sink's columns)."""
    t0 = time.monotonic()
    error = None
    try:
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("kafka.isolation.level", isolation).option("includeHeaders", "true")
              .option("failOnDataLoss", str(fail_on_data_loss).lower()).load()
              .select("topic", "partition", "offset", "timestamp", "key", "value", "headers"))
        q = (df.writeStream.format("parquet").option("path", str(out / "table"))
             .option("checkpointLocation", str(out / "cp")).trigger(availableNow=True).start())
        q.awaitTermination()
    except Exception as e:
        error = first_line(e)
    return {"seconds": round(time.monotonic() - t0, 3), "error": error}


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        if "Exception" in line or "Error" in line:
            return line.strip()[:400]
    return (text.splitlines()[0] if text else repr(e))[:400]


def one(spark: Any, side: str, cfg: dict[str, Any], out: Path) -> dict[str, Any]:
    """A throughput run of ``side`` on the bulk topic; checked to hold exactly ``n`` distinct rows."""
    if side == "gateway":
        r = run_gateway(spark, cfg["url"], cfg["topic"], out)
    else:
        r = run_spark_kafka(spark, cfg["bootstrap"], cfg["topic"], out)
    if r["error"]:
        raise RuntimeError(f"{side}: {r['error']}")
    rows, distinct = table_check(spark, out / "table")
    assert rows == distinct == cfg["n"], (side, rows, distinct, cfg["n"])
    r["rows_per_s"] = round(cfg["n"] / r["seconds"])
    return r


def child(side: str, cfg_json: str) -> None:
    """A fresh process: session start, then ``side``'s first (cold) run; one JSON line on stdout."""
    cfg = json.loads(cfg_json)
    t = time.perf_counter()
    spark = session(cfg["jars"])
    start_s = time.perf_counter() - t
    from sink.cli import stop_session

    try:
        r = one(spark, side, cfg, Path(cfg["out"]))
    finally:
        stop_session(spark)
    print(json.dumps({"session_start_s": round(start_s, 1), **r}), flush=True)


def cold(side: str, cfg: dict[str, Any]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--child", side, "--child-config", json.dumps(cfg)], cwd=REPO,
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"cold {side} run failed:\n{p.stderr[-3000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def write_transactions(bootstrap: str, topic: str, partitions: int, total: int, per_txn: int) -> dict[str, set]:
    """Two transactional producers open at the same time on every partition, one committing and the other aborting
    (roles swapped each round; the abort comes last), ``per_txn`` records each per round, about ``total`` records in
    all; the (partition, offset) of each record by outcome."""
    got: dict[str, list[tuple[int, int]]] = {"A": [], "B": []}
    outcome: dict[str, set[tuple[int, int]]] = {"committed": set(), "aborted": set()}

    def report(name: str) -> Any:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            got[name].append((msg.partition(), msg.offset()))
        return done

    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000}
    prods = {n: CKProducer({**conf, "transactional.id": f"{topic}-{n}"}) for n in ("A", "B")}
    for p in prods.values():
        p.init_transactions(30)
    value = b"y" * 100
    rounds = max(1, total // (2 * per_txn))
    for r in range(rounds):
        commit = "A" if r % 2 == 0 else "B"
        for p in prods.values():
            p.begin_transaction()
        for i in range(per_txn):
            for name, p in prods.items():
                p.produce(topic, value=value, key=b"%s%08d" % (name.encode(), i), partition=i % partitions,
                          on_delivery=report(name))
            if i % 1000 == 0:
                for p in prods.values():
                    p.poll(0)
        for p in prods.values():
            assert p.flush(60) == 0
        abort = "B" if commit == "A" else "A"
        prods[commit].commit_transaction(30)
        prods[abort].abort_transaction(30)
        outcome["committed"].update(got[commit])
        outcome["aborted"].update(got[abort])
        got = {"A": [], "B": []}
    return outcome


def txn_row(spark: Any, name: str, r: dict[str, Any], table: Path, want: dict[str, set]) -> dict[str, Any]:
    offs = table_offsets(spark, table)
    s = set(offs)
    row = {"side": name, "seconds": r["seconds"], "rows": len(offs), "duplicates": len(offs) - len(s),
           "committed_missing": len(want["committed"] - s), "aborted_present": len(s & want["aborted"]),
           "other": len(s - want["committed"] - want["aborted"]), "error": r["error"]}
    row["exactly_committed"] = r["error"] is None and s == want["committed"] and len(offs) == len(s)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="warm rounds of (gateway, spark-kafka)")
    ap.add_argument("--cold-runs", type=int, default=2, help="cold runs (fresh processes) of each side")
    ap.add_argument("--txn-records", type=int, default=100_000, help="records in the transactional topic")
    ap.add_argument("--txn-size", type=int, default=2_000, help="records per transaction")
    ap.add_argument("--spark-kafka-version", help="the connector's version (default: tools/spark-kafka/pom.xml's)")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--child-config", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.child_config)
        return

    import pyspark

    from service.embedded.kafka import EmbeddedKafka
    from sink.cli import stop_session

    version = a.spark_kafka_version or pom_version()
    jars = resolve_jars(version)
    print(f"pyspark {pyspark.__version__}, spark-sql-kafka-0-10_2.13 {version}"
          f"{'' if version == pyspark.__version__ else ' (not the same version)'}: "
          f"{', '.join(Path(j).name for j in jars)}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sink-peers-"))
    broker = EmbeddedKafka(heap="1g", fast_start=False, log_file=tmp / "kafka.log")
    broker.start()
    gw = None
    n = a.records
    try:
        b = broker.bootstrap
        topic, txn_topic = "bench-sink-peers", "bench-sink-peers-txn"
        admin = AdminClient({"bootstrap.servers": b})
        for f in admin.create_topics([NewTopic(t, a.partitions, 1) for t in (topic, txn_topic)]).values():
            f.result(30)
        del admin  # its librdkafka handle would log connection errors once the broker stops
        t = time.perf_counter()
        produce(b, topic, n, a.partitions, "none")
        print(f"Apache Kafka {broker.bootstrap}: produced {n:,} x 100 B into {a.partitions} partitions in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        gw, url = start_gateway(b, tmp / "gw.log")
        cfg = {"url": url, "bootstrap": b, "topic": topic, "n": n, "jars": jars}

        colds: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        order = [SIDES[i % 2] if (i // 2) % 2 == 0 else SIDES[1 - i % 2] for i in range(2 * a.cold_runs)]
        for i, side in enumerate(order):  # ABBA: neither side always pays for the first JVM's cold page cache
            c = cold(side, {**cfg, "out": str(tmp / f"cold-{i}-{side}")})
            colds[side].append(c)
            print(f"cold {side:11}: session start {c['session_start_s']:4.1f} s, first run {c['seconds']:6.1f} s "
                  f"{c['rows_per_s']:>9,} rows/s", flush=True)

        spark = session(jars)
        try:
            for side in SIDES:  # the warm-up of both paths in this JVM, not timed
                one(spark, side, cfg, tmp / f"warmup-{side}")
            rounds = []
            for i in range(a.rounds):
                order = SIDES if i % 2 == 0 else SIDES[::-1]
                res = {side: one(spark, side, cfg, tmp / f"warm-{i}-{side}") for side in order}
                g, s = res["gateway"], res["spark-kafka"]
                ratio = round(g["rows_per_s"] / s["rows_per_s"], 2)
                rounds.append({"gateway_rows_per_s": g["rows_per_s"], "spark_kafka_rows_per_s": s["rows_per_s"],
                               "ratio": ratio})
                print(f"warm round {i}: gateway {g['seconds']:5.1f} s {g['rows_per_s']:>9,} rows/s | spark-kafka "
                      f"{s['seconds']:5.1f} s {s['rows_per_s']:>9,} rows/s | gateway/spark-kafka {ratio:.2f}",
                      flush=True)

            t = time.perf_counter()
            want = write_transactions(b, txn_topic, a.partitions, a.txn_records, a.txn_size)
            print(f"transactions: {len(want['committed']):,} committed + {len(want['aborted']):,} aborted records "
                  f"in {time.perf_counter() - t:.1f} s", flush=True)
            txn = []
            d = tmp / "txn-gateway"
            txn.append(txn_row(spark, "gateway", run_gateway(spark, url, txn_topic, d), d / "table", want))
            d = tmp / "txn-spark-kafka"
            txn.append(txn_row(spark, "spark-kafka read_committed", run_spark_kafka(spark, b, txn_topic, d),
                               d / "table", want))
            if txn[-1]["error"]:
                d = tmp / "txn-spark-kafka-nofail"
                txn.append(txn_row(spark, "spark-kafka read_committed failOnDataLoss=false",
                                   run_spark_kafka(spark, b, txn_topic, d, fail_on_data_loss=False), d / "table",
                                   want))
            d = tmp / "txn-spark-kafka-uncommitted"
            txn.append(txn_row(spark, "spark-kafka read_uncommitted",
                               run_spark_kafka(spark, b, txn_topic, d, isolation="read_uncommitted"), d / "table",
                               want))
            for r in txn:
                print(f"txn {r['side']:48}: {r['rows']:>7,} rows ({len(want['committed']):,} committed), "
                      f"committed missing {r['committed_missing']:,}, aborted present {r['aborted_present']:,}, "
                      f"duplicates {r['duplicates']}, {r['seconds']:.1f} s"
                      + (f", error: {r['error']}" if r["error"] else ""), flush=True)
        finally:
            stop_session(spark)
        med = statistics.median
        summary = {
            "records": n, "partitions": a.partitions, "pyspark": pyspark.__version__, "spark_sql_kafka": version,
            "broker": "Apache Kafka (embedded)",
            "cold": {side: {"session_start_s": med([c["session_start_s"] for c in cs]),
                            "seconds": med([c["seconds"] for c in cs]),
                            "rows_per_s": round(med([c["rows_per_s"] for c in cs])),
                            "runs": [c["rows_per_s"] for c in cs]} for side, cs in colds.items()},
            "warm_gateway_rows_per_s": round(med([r["gateway_rows_per_s"] for r in rounds])),
            "warm_spark_kafka_rows_per_s": round(med([r["spark_kafka_rows_per_s"] for r in rounds])),
            "warm_ratio_gateway_over_spark_kafka": round(med([r["ratio"] for r in rounds]), 2),
            "rounds": rounds,
            "transactions": {"committed": len(want["committed"]), "aborted": len(want["aborted"]), "runs": txn},
        }
        print(json.dumps(summary))
    finally:
        if gw is not None:
            gw.terminate()
            gw.wait(20)
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
