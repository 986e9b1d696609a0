"""Sink throughput: gateway → Spark (local[2]) → parquet, beside a direct baseline in the same run.

N x 100-byte records (8-byte keys) are produced into a P-partition topic of an embedded Tansu broker; then
- direct: confluent-kafka (read_committed, tuned like bench/consume.py) → pyarrow → one parquet file (no Spark);
- spark: ``consumer-gateway sink`` logic (the ``kafka_gateway`` source, available-now, parquet file sink with a
  checkpoint) in a local[2] session against a gateway process; the session start is reported apart.
Both tables are checked to hold N rows. Prints one line per path and a JSON summary.

Usage: .venv/bin/python bench/sink.py [--records N] [--partitions P] [--max-offsets-per-task M]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.embedded import EmbeddedBroker, free_port  # noqa: E402


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                    "queue.buffering.max.messages": 1_000_000})
    value = b"x" * 100
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, key=b"%08d" % i, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def direct(bootstrap: str, topic: str, partitions: int, n: int, out: Path) -> float:
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
    table = pa.table({"topic": pa.array(cols["topic"], pa.string()), "partition": pa.array(cols["partition"], pa.int32()),
                      "offset": pa.array(cols["offset"], pa.int64()),
                      "timestamp": pa.array(cols["timestamp"], pa.int64()).cast(pa.timestamp("ms")),
                      "key": pa.array(cols["key"], pa.binary()), "value": pa.array(cols["value"], pa.binary())})
    pq.write_table(table, out / "direct.parquet")
    elapsed = time.perf_counter() - t0
    assert pq.read_metadata(out / "direct.parquet").num_rows == n, got
    return elapsed


def start_gateway(bootstrap: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "GATEWAY_KAFKA_BOOTSTRAP": bootstrap, "GATEWAY_PORT": str(port), "GATEWAY_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "service.main"], cwd=REPO, env=env, stdout=open(log, "ab"),
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--max-offsets-per-task", type=int, default=200_000)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sink-"))
    broker = EmbeddedBroker(log_file=tmp / "tansu.log")
    broker.start()
    gw = None
    try:
        topic = "bench-sink"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(topic, a.partitions, 1)]).values():
            f.result(30)
        t = time.perf_counter()
        produce(broker.bootstrap, topic, a.records, a.partitions)
        print(f"produced {a.records:,} x 100 B into {a.partitions} partitions in {time.perf_counter() - t:.1f} s",
              flush=True)

        d = direct(broker.bootstrap, topic, a.partitions, a.records, tmp)
        print(f"direct  confluent-kafka → pyarrow → parquet: {d:6.1f} s  {a.records / d:>10,.0f} rows/s", flush=True)

        gw, url = start_gateway(broker.bootstrap, tmp / "gw.log")
        from sink.cli import build_session, parse_args, run

        t = time.perf_counter()
        spark = build_session()
        session_s = time.perf_counter() - t
        try:
            args = parse_args(["--gateway", url, "--topics", topic, "--table", str(tmp / "spark-table"),
                               "--checkpoint", str(tmp / "cp"), "--max-offsets-per-task",
                               str(a.max_offsets_per_task), "--quiet"])
            summary = run(spark, args, out=io.StringIO())
            rows = spark.read.parquet(str(tmp / "spark-table")).count()
        finally:
            spark.stop()
        assert rows == a.records, rows
        s = summary["seconds"]
        print(f"spark   gateway → Spark local[2] → parquet:  {s:6.1f} s  {a.records / s:>10,.0f} rows/s "
              f"({summary['batches']} batch(es); session start {session_s:.1f} s not included)", flush=True)
        print(json.dumps({"records": a.records, "partitions": a.partitions, "direct_s": round(d, 2),
                          "direct_rows_per_s": round(a.records / d), "spark_s": s,
                          "spark_rows_per_s": round(a.records / s), "spark_session_start_s": round(session_s, 1),
                          "ratio_direct_over_spark": round(s / d, 2)}))
    finally:
        if gw is not None:
            gw.terminate()
            gw.wait(20)
        broker.stop()


if __name__ == "__main__":
    main()
