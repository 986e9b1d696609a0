"""Avro consume over HTTP next to binary, in the same run (target: avro GET >= 0.5x the binary GET).

One embedded Tansu broker (memory://), a real Schema Registry (Karapace, ../shared/registry/start) on a broker of
its own, one real gateway process pointed at it (production settings, as bench/http_capacity.py). Two topics of
4 partitions with N records each:

- ``cap-binary``: 100-byte values (what bench/http_capacity.py reads);
- ``cap-avro``: Avro values in the Confluent wire format, ~100 bytes each (a record of a long, two strings, a
  double, a timestamp-millis long, an array of two strings and a nullable int), written with confluent-kafka's
  AvroSerializer against the registry; keys are null in both topics.

Rows (each a fresh instance with the 4 partitions assigned from the beginning, read until N records arrived,
``wrk`` with a Lua body counter as in bench/http_capacity.py): binary GET and avro GET with the default request
and with ``max_records=5000``, the avro ndjson stream (``curl -N``), and avro in the karapace rendering. Printed:
records/s, ratio to the binary GET of the same request shape, p50/p99 of a poll, gateway CPU per record.

Usage: .venv/bin/python bench/schema_consume.py [--records N] [--rounds R] [--gateway-env KEY=VALUE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

import bench.http_capacity as cap  # noqa: E402
from bench.consume import produce as produce_binary  # noqa: E402
from bench.http_consume import GatewayProc, create_topics  # noqa: E402
from service.embedded.tansu import EmbeddedBroker, free_port  # noqa: E402

PARTITIONS = 4
REGISTRY_START = ROOT.parent / "shared" / "registry" / "start"
SCHEMA = {"type": "record", "name": "Payment", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": "string"},
    {"name": "retries", "type": ["null", "int"], "default": None}]}


def start_registry(tmp: Path) -> tuple[EmbeddedBroker, str, int]:
    if not REGISTRY_START.is_file():
        raise SystemExit(f"no registry launcher at {REGISTRY_START}")
    broker = EmbeddedBroker()
    broker.start()
    env = {**os.environ, "KARAPACE_SESSION_TIMEOUT_MS": "6000"}
    run = subprocess.run([sys.executable, str(REGISTRY_START), "--bootstrap", broker.bootstrap, "--port",
                          str(free_port()), "--background", "--log-file", str(tmp / "registry.log")],
                         capture_output=True, text=True, env=env, timeout=300)
    if run.returncode != 0:
        broker.stop()
        raise SystemExit(f"the registry did not start:\n{run.stdout}\n{run.stderr}")
    url, pid = run.stdout.split()[:2]
    return broker, url, int(pid.removeprefix("pid="))


def produce_avro(bootstrap: str, registry: str, topic: str, n: int) -> int:
    ser = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(SCHEMA))
    ctx = SerializationContext(topic, MessageField.VALUE)
    first = ser({"id": 0, "customer": "c", "amount": 0.0, "at": 0, "tags": [], "note": "", "retries": None}, ctx)
    header = first[:5]  # magic byte + schema id: encode the rest with the codec (the serializer per record is slow)
    from service.schemas.avro import AvroCodec

    codec = AvroCodec(SCHEMA, rendering="karapace")
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 1_000_000})
    for i in range(n):
        value = header + codec.encode({"id": i, "customer": f"customer-{i % 1000:06d}", "amount": i * 0.25,
                                       "at": 1_764_000_000_000 + i, "tags": ["retail", "eu-west"],
                                       "note": "paid by card, receipt sent by mail", "retries": i % 3 or None})
        while True:
            try:
                p.produce(topic, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)
    return len(value)


def stop_pid(pid: int) -> None:
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        pass


def make_instance(url: str, group: str, fmt: str, topic: str, rendering: str | None = None) -> str:
    body: dict[str, object] = {"name": "bench", "format": fmt, "auto.offset.reset": "earliest"}
    if rendering:
        body["avro.json.rendering"] = rendering
    with httpx.Client(base_url=url, headers={"Content-Type": cap.V2}, timeout=30) as http:
        http.post(f"/consumers/{group}", json=body).raise_for_status()
        base = f"/consumers/{group}/instances/bench"
        parts = [{"topic": topic, "partition": p} for p in range(PARTITIONS)]
        http.post(f"{base}/assignments", json={"partitions": parts}).raise_for_status()
        http.post(f"{base}/positions/beginning", json={"partitions": parts}).raise_for_status()
    return base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gateway-env", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    for tool in ("wrk", "curl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (tools/install-system-deps.sh)")
    cap.ACCEPT["avro"] = "application/vnd.kafka.avro.v2+json"
    n = a.records
    tmp = Path(tempfile.mkdtemp(prefix="bench-schema-"))
    reg_broker, registry, reg_pid = start_registry(tmp)
    broker = EmbeddedBroker()
    broker.start()
    try:
        asyncio.run(create_topics(broker.bootstrap, {"cap-binary": PARTITIONS, "cap-avro": PARTITIONS}))
        t = time.perf_counter()
        produce_binary(broker.bootstrap, "cap-binary", n, PARTITIONS, "none")
        size = produce_avro(broker.bootstrap, registry, "cap-avro", n)
        print(f"machine: {os.cpu_count()} cores shared by brokers, registry, gateway and clients; produced {n:,} "
              f"binary (100 B) + {n:,} avro ({size} B framed) records in {time.perf_counter() - t:.1f} s", flush=True)
        env = {"GATEWAY_SCHEMA_REGISTRY_URL": registry, **dict(kv.split("=", 1) for kv in a.gateway_env)}
        rows: dict[str, list[cap.Row]] = {}
        shapes = (("binary GET, default request", "binary", "", None),
                  ("avro GET, default request", "avro", "", None),
                  ("binary GET, max_records=5000", "binary", "?max_records=5000", None),
                  ("avro GET, max_records=5000", "avro", "?max_records=5000", None),
                  ("avro GET, karapace rendering", "avro", "", "karapace"))
        with GatewayProc(broker.bootstrap, env, tmp / "gateway.log") as gw:
            for r in range(a.rounds):
                for name, fmt, query, rendering in shapes:
                    base = make_instance(gw.url, f"sc-{r}-{time.time_ns()}", fmt, f"cap-{fmt}", rendering)
                    rows.setdefault(name, []).append(cap.via_wrk(gw, name, base, fmt, n, query, tmp))
                    cap.delete(gw, base)
                base = make_instance(gw.url, f"sc-stream-{r}-{time.time_ns()}", "avro", "cap-avro")
                rows.setdefault("avro ndjson stream", []).append(cap.via_curl_stream(gw, "ndjson", base, n))
                cap.delete(gw, base)
                print(f"  round {r + 1}: " + ", ".join(f"{k}: {v[-1].rate:,.0f}/s" for k, v in rows.items()),
                      flush=True)
        med = {k: statistics.median(x.rate for x in v) for k, v in rows.items()}
        baseline = {"avro GET, default request": "binary GET, default request",
                    "avro GET, karapace rendering": "binary GET, default request",
                    "avro GET, max_records=5000": "binary GET, max_records=5000",
                    "avro ndjson stream": "binary GET, default request"}
        print(f"\n{n:,} records, 4 partitions, one instance, one request at a time; median of {a.rounds} rounds\n"
              f"{'row':32} {'rec/s':>11} {'vs binary':>9} {'target':>6} {'p50 ms':>7} {'p99 ms':>7} {'gw us/rec':>9}")
        for name, runs in rows.items():
            def m(attr: str, runs: list[cap.Row] = runs) -> str:
                vals = [getattr(x, attr) for x in runs if getattr(x, attr) is not None]
                return f"{statistics.median(vals):.1f}" if vals else "-"
            ratio = f"{med[name] / med[baseline[name]]:.2f}" if name in baseline else "1.00"
            target = "0.5x" if name in ("avro GET, default request", "avro GET, max_records=5000") else ""
            print(f"{name:32} {med[name]:>11,.0f} {ratio:>9} {target:>6} {m('p50_ms'):>7} {m('p99_ms'):>7}"
                  f" {m('gw_us_per_rec'):>9}")
        print("(vs binary = the binary GET of the same request shape in the same run; the stream row is compared with"
              " the default binary GET)")
    finally:
        broker.stop()
        stop_pid(reg_pid)
        reg_broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
