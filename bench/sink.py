"""Sink throughput: gateway → Spark (local[2]) → parquet, beside a direct baseline in the same run.

N x 100-byte records (8-byte keys) are produced into a P-partition topic of an embedded Tansu broker; then
- direct: confluent-kafka (read_committed, tuned like bench/consume.py) → pyarrow → one parquet file (no Spark);
- spark: ``consumer-gateway sink`` logic (the ``kafka_gateway`` source, available-now, parquet file sink with a
  checkpoint) in one local[2] session against a gateway process, each run into a fresh table and checkpoint.

One session (one JVM) serves every Spark run, and the numbers are reported apart:
- session start (JVM launch, Spark context; paid once per ``consumer-gateway sink`` process);
- the first (cold) Arrow run: the JVM JIT-compiles the Arrow → row → parquet path while it runs (C2 spends
  several CPU seconds on two cores), so it is slow once per process;
- the steady state: ``--rounds`` rounds of (direct, Spark Arrow) run back to back, so each round's ratio
  compares the two under the same machine load (other work on a shared 2-core machine moves both); the primary
  number is the median of the per-round ratios, rows/s are medians too;
- one JSON run (``responseFormat=json``: per-record Python decoding in the Spark workers), warm.
Every table is checked to hold exactly N rows (the distinct (partition, offset) pairs too, for Spark).

Usage: .venv/bin/python bench/sink.py [--records N] [--partitions P] [--max-offsets-per-task M] [--rounds R]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.consume import produce  # noqa: E402
from service.embedded.tansu import EmbeddedBroker, free_port  # noqa: E402


def direct(bootstrap: str, topic: str, partitions: int, n: int, out: Path) -> float:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"bench-sink-{time.time_ns()}",
                    "enable.auto.commit": False, "isolation.level": "read_committed",
                    "fetch.queue.backoff.ms": 10, "queued.max.messages.kbytes": 262144,
                    "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 4194304})
    c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
    cols: dict[str, list] = {"topic": [], "partition": [], "offset": [], "timestamp": [], "key": [], "value": []}
    got = 0
    while got < n and time.perf_counter() - t0 < 300:
        for m in c.consume(num_messages=10000, timeout=1.0):
            if m.error() is None:
                cols["topic"].append(m.topic())
                cols["partition"].append(m.partition())
                cols["offset"].append(m.offset())
                cols["timestamp"].append(m.timestamp()[1])
                cols["key"].append(m.key())
                cols["value"].append(m.value())
                got += 1
    c.close()
    table = pa.table({"topic": pa.array(cols["topic"], pa.string()),
                      "partition": pa.array(cols["partition"], pa.int32()),
                      "offset": pa.array(cols["offset"], pa.int64()),
                      "timestamp": pa.array(cols["timestamp"], pa.int64()).cast(pa.timestamp("ms")),
                      "key": pa.array(cols["key"], pa.binary()), "value": pa.array(cols["value"], pa.binary())})
    pq.write_table(table, out / "direct.parquet")
    elapsed = time.perf_counter() - t0
    assert pq.read_metadata(out / "direct.parquet").num_rows == n, got
    return elapsed


def start_gateway(bootstrap: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "GATEWAY_KAFKA_BOOTSTRAP": bootstrap, "GATEWAY_PORT": str(port),
           "GATEWAY_LOG_LEVEL": "warning",
           "GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0", "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=REPO, env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # waiting for the gateway process to bind its port
    proc.kill()
    raise RuntimeError(f"gateway did not start; see {log}")


def spark_run(spark: Any, url: str, topic: str, out: Path, n: int, max_per_task: int,
              fmt: str = "arrow") -> dict[str, Any]:
    """One available-now run into a fresh table; wall seconds from query start to its end, and the check."""
    from sink.cli import parse_args, run

    args = parse_args(["--gateway", url, "--topics", topic, "--table", str(out / "table"), "--checkpoint",
                       str(out / "cp"), "--max-offsets-per-task", str(max_per_task), "--response-format", fmt,
                       "--quiet"])
    seconds = run(spark, args, out=io.StringIO())["seconds"]
    df = spark.read.parquet(str(out / "table"))
    rows = df.count()
    distinct = df.select("partition", "offset").distinct().count()
    assert rows == distinct == n, (rows, distinct, n)
    return {"seconds": seconds, "rows_per_s": round(n / seconds)}


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--max-offsets-per-task", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3, help="steady-state rounds of (direct, Spark Arrow)")
    ap.add_argument("--no-json", action="store_true", help="skip the JSON run")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sink-"))
    broker = EmbeddedBroker(log_file=tmp / "tansu.log")
    broker.start()
    gw = None
    n = a.records
    try:
        topic = "bench-sink"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(topic, a.partitions, 1)]).values():
            f.result(30)
        t = time.perf_counter()
        produce(broker.bootstrap, topic, n, a.partitions, "none")
        print(f"produced {n:,} x 100 B into {a.partitions} partitions in {time.perf_counter() - t:.1f} s", flush=True)

        gw, url = start_gateway(broker.bootstrap, tmp / "gw.log")
        from sink.cli import build_session, stop_session

        t = time.perf_counter()
        spark = build_session()
        session_s = time.perf_counter() - t
        print(f"spark session start: {session_s:.1f} s", flush=True)
        try:
            cold = spark_run(spark, url, topic, tmp / "cold", n, a.max_offsets_per_task)
            print(f"spark cold (first run in the JVM) gateway → Spark local[2] → parquet: {cold['seconds']:6.1f} s "
                  f"{cold['rows_per_s']:>10,} rows/s", flush=True)
            rounds = []
            for i in range(a.rounds):
                d = direct(broker.bootstrap, topic, a.partitions, n, tmp / f"direct-{i}")
                s = spark_run(spark, url, topic, tmp / f"warm-{i}", n, a.max_offsets_per_task)
                r = {"direct_s": round(d, 3), "direct_rows_per_s": round(n / d), "spark_s": s["seconds"],
                     "spark_rows_per_s": s["rows_per_s"], "ratio": round(d / s["seconds"], 2)}
                rounds.append(r)
                print(f"round {i}: direct confluent-kafka → pyarrow → parquet {d:5.1f} s {n / d:>10,.0f} rows/s | "
                      f"spark arrow {s['seconds']:5.1f} s {s['rows_per_s']:>10,} rows/s | ratio {r['ratio']:.2f}",
                      flush=True)
            js = None
            if not a.no_json:
                js = spark_run(spark, url, topic, tmp / "json", n, a.max_offsets_per_task, fmt="json")
                print(f"spark json (warm): {js['seconds']:6.1f} s {js['rows_per_s']:>10,} rows/s", flush=True)
        finally:
            stop_session(spark)
        summary = {
            "records": n, "partitions": a.partitions, "max_offsets_per_task": a.max_offsets_per_task,
            "spark_session_start_s": round(session_s, 1),
            "cold_spark_s": cold["seconds"], "cold_spark_rows_per_s": cold["rows_per_s"],
            "steady_direct_rows_per_s": round(median([r["direct_rows_per_s"] for r in rounds])),
            "steady_spark_rows_per_s": round(median([r["spark_rows_per_s"] for r in rounds])),
            "steady_ratio_spark_over_direct": round(median([r["ratio"] for r in rounds]), 2),
            "cold_ratio_spark_over_direct": round(
                cold["rows_per_s"] / median([r["direct_rows_per_s"] for r in rounds]), 2),
            "json_spark_rows_per_s": js["rows_per_s"] if js else None,
            "rounds": rounds,
        }
        print(json.dumps(summary))
    finally:
        if gw is not None:
            gw.terminate()
            gw.wait(20)
        broker.stop()


if __name__ == "__main__":
    main()
