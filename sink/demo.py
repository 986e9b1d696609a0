"""``make sink-demo``: the whole pipeline on the embedded broker.

Starts the gateway as ``make run`` does (embedded Tansu broker), produces plain records, committed
transactions and aborted transactions with confluent-kafka, runs ``consumer-gateway sink`` (available-now,
Delta format) into a temporary directory, then prints the table's row count beside the number of committed
records, and exits non-zero if they differ.

Tansu (unlike Kafka) has no aborted-transaction index: records of an aborted transaction that reached the
broker before the abort are returned under read_committed. The demo aborts its transactions before their
records are sent (a long linger), so nothing aborted is stored; the gateway's filtering of aborted records
that were stored is tested against the project's Kafka-semantics test broker.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_gateway(port: int) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_PORT=str(port), GATEWAY_LOG_LEVEL="warning")
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    bootstrap = None
    for line in proc.stdout:
        m = re.search(r"Kafka bootstrap address: (\S+)", line)
        if m:
            bootstrap = m.group(1)
        if line.startswith("gateway HTTP on"):
            break
    if bootstrap is None:
        raise SystemExit("the gateway did not start its embedded broker")
    return proc, bootstrap


def produce(bootstrap: str, topic: str) -> int:
    """Plain records, two committed and two aborted transactions; returns how many records are committed."""
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(1000):
        plain.produce(topic, key=b"k%d" % i, value=b"plain-%d" % i, partition=i % 2)
    assert plain.flush(30) == 0
    committed = 1000
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"demo-{uuid.uuid4().hex[:6]}",
                   "linger.ms": 10_000})
    tx.init_transactions(30)
    for round_ in range(2):
        tx.begin_transaction()
        for i in range(500):
            tx.produce(topic, value=b"committed-%d-%d" % (round_, i), partition=i % 2)
        tx.commit_transaction(30)  # flushes, then commits
        committed += 500
        tx.begin_transaction()
        for i in range(300):
            tx.produce(topic, value=b"aborted-%d-%d" % (round_, i), partition=i % 2)
        tx.abort_transaction(30)
    return committed


def main() -> int:
    from service.embedded.tansu import free_port

    port = free_port()
    gw, bootstrap = start_gateway(port)
    url = f"http://127.0.0.1:{port}"
    topic = f"sink-demo-{uuid.uuid4().hex[:6]}"
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
        committed = produce(bootstrap, topic)
        print(f"produced to {topic}: 1000 plain + 1000 in committed transactions + 600 in aborted ones")
        with tempfile.TemporaryDirectory(prefix="sink-demo-") as tmp:
            table, checkpoint = Path(tmp, "table"), Path(tmp, "checkpoint")
            started = time.monotonic()
            rc = subprocess.call([sys.executable, "-m", "gateway", "sink", "--gateway", url, "--topics", topic,
                                  "--table", str(table), "--checkpoint", str(checkpoint), "--format", "delta"],
                                 cwd=REPO)
            if rc != 0:
                print(f"the sink failed (exit {rc})")
                return 1
            from deltalake import DeltaTable

            rows = DeltaTable(str(table)).to_pyarrow_table()
            values = rows.column("value").to_pylist()
            aborted = sum(1 for v in values if v.startswith(b"aborted-"))
            print(f"table {table.name}: {rows.num_rows} rows in {time.monotonic() - started:.1f} s; committed "
                  f"records: {committed}; aborted rows in the table: {aborted}; distinct values: {len(set(values))}")
            ok = rows.num_rows == committed == len(set(values)) and aborted == 0
            print("OK: the table holds exactly the committed records" if ok else "MISMATCH")
            return 0 if ok else 1
    finally:
        gw.terminate()
        gw.wait(30)


if __name__ == "__main__":
    sys.exit(main())
