"""Produce throughput: through the gateway over HTTP vs a direct confluent-kafka producer, same run.

Workload: N x 100-byte values, no keys (sticky partitions), into a 4-partition topic of the embedded
Tansu broker (memory://), acks=all and idempotence on for every producer.

- **gateway over HTTP**: POST /topics/{topic} with the binary format, ``--batch`` records per request,
  ``--connections`` requests in flight, driven by ``wrk`` (a C client with a Lua script; ``apt-get install
  wrk``) for ``--seconds`` (wrk runs for a time, not a count), so the client costs little CPU; without wrk,
  an httpx client sends N records (and then caps the figure). wrk runs as a user runs it (no Lua callback
  per answer: on 2 cores that client work took a fifth of the rate); a record counts once its request
  answered 2xx, checked against the gateway's own count of acknowledged records (``kcg_records_produced_total``,
  none failed) and the topic's stored records afterwards (what was acknowledged is stored exactly once; wrk
  may abandon up to one request per connection at the end of its run).
- **gateway, shipped defaults**: the same wrk run against a gateway started as a user starts it, with no
  limit overrides (the rows above turn the per-tenant request rate and poll limits off): a default that
  throttles one heavy client shows up here as a lower rate and a count of 429 answers (``--no-defaults-row``:
  skip it).
- **engine in-process**: the same records through ``service.producer.Producer`` directly (no HTTP), in
  ``--batch``-record ``send_many`` calls with ``--connections`` in flight: what the HTTP layer costs.
- **direct confluent-kafka**: librdkafka with acks=all, enable.idempotence=true, linger.ms=5
  (its default), in this process.

Each row of each round runs on a fresh broker (Tansu's in-memory log slows it as it grows) and, with wrk, the
engine and direct rows write as many records as the HTTP row's timed run did (``--no-equal-volume``: ``--records``
each), so every row is the time to write the same N records into an empty broker. Everything shares this
machine's cores (broker, gateway, client).

The HTTP row's time split: the gateway process's CPU per record during the wrk run (from /proc),
next to the engine's CPU per record in-process (same records, no HTTP) and the body's JSON + base64 parse
(``parse_body_records``, the route's own body parse, timed in this process on the same body); the rest is HTTP handling
(uvicorn, routing, rendering the answer). ``--profile DIR`` samples the gateway with py-spy during the HTTP
rows and prints the top frames.

Usage: .venv/bin/python bench/produce.py [--records N] [--batch B] [--connections C] [--rounds R]
       [--seconds S] [--no-equal-volume] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402
from confluent_kafka import Consumer as CKConsumer  # noqa: E402
from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka import Producer as CKProducer  # noqa: E402
from confluent_kafka import TopicPartition as CKTopicPartition  # noqa: E402

from api.v2.produce import parse_body_records  # noqa: E402
from bench.http_capacity import Profiler  # noqa: E402
from bench.http_consume import cpu_seconds, machine_busy_seconds  # noqa: E402
from bench.http_consume import metric_sum as http_metric_sum  # noqa: E402
from service.client.client import KafkaClient  # noqa: E402
from service.embedded.tansu import EmbeddedBroker  # noqa: E402
from service.producer import ProduceFailure, Producer  # noqa: E402
from tests.integration.gateway_proc import GatewayProcess  # noqa: E402

BIN = "application/vnd.kafka.binary.v2+json"
PARTITIONS = 4
HTTP_ROW = "gateway over HTTP"  # limits off: the engine's and the HTTP layer's speed
DEFAULTS_ROW = "gateway, shipped defaults"  # as a user starts it: a default that throttles shows here
LIMITS_OFF = {"GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0", "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"}
VALUE = b"x" * 100

#: wrk as a user runs it: method, headers and body only. A Lua ``response()`` callback (counting records per answer)
#: makes wrk hand every answer's headers and body to Lua: on this 2-core machine that client work took 15-25% of
#: the rate from the gateway (517k vs 668k records/s, same run). What was acknowledged is counted on the server
#: side instead (its metrics) and checked against wrk's 2xx answers and the stored records.
LUA = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/vnd.kafka.binary.v2+json"
local f = io.open(os.getenv("BENCH_BODY"), "rb"); wrk.body = f:read("*a"); f:close()
function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d duration_us=%d p50_us=%d p99_us=%d\n", summary.requests,
    summary.errors.status, summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


def body(batch: int) -> bytes:
    v = base64.b64encode(VALUE).decode()
    return orjson.dumps({"records": [{"value": v}] * batch})


def count_stored(bootstrap: str, topic: str) -> int:
    """Records stored in the topic, counted by reading it to the end (Tansu's ListOffsets(latest) miscounts
    multi-record batches, so watermarks cannot be used)."""
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": "bench-produce-check", "enable.partition.eof": True,
                    "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
    try:
        c.assign([CKTopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        total = 0
        at_end: set[int] = set()
        deadline = time.monotonic() + 120
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(num_messages=10000, timeout=1.0):
                err = m.error()
                if err is None:
                    total += 1
                    at_end.discard(m.partition())
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
        return total
    finally:
        c.close()


def create_topic(bootstrap: str, topic: str) -> None:
    async def go() -> None:
        client = KafkaClient(bootstrap)
        try:
            await client.create_topics({topic: PARTITIONS})
        finally:
            await client.close()
    asyncio.run(go())


def metric_sum(url: str, name: str, match: str = "") -> float:
    return http_metric_sum(url, name, match) or 0.0


def via_wrk(url: str, topic: str, seconds: float, batch: int, connections: int, tmp: Path) -> tuple[float, int, str]:
    """wrk keeps ``connections`` requests in flight for ``seconds`` (it cannot stop after N requests: a
    stopped thread still waits for the end of the run). Records acknowledged: the gateway's own count
    (``kcg_records_produced_total``), checked against wrk's 2xx answers (those it abandoned at the end of its run
    may have been acknowledged too); 429s from the gateway's request metrics."""
    threads = min(2, connections)
    (tmp / "body.json").write_bytes(body(batch))
    (tmp / "produce.lua").write_text(LUA)
    env = {**os.environ, "BENCH_BODY": str(tmp / "body.json")}
    counters = ("kcg_records_produced_total", "kcg_produce_failures_total")
    before = [metric_sum(url, m) for m in counters]
    throttled0 = metric_sum(url, "kcg_http_request_duration_seconds_count", 'status="429"')
    out = subprocess.run(["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s", "--timeout",
                          "60s", "-s", str(tmp / "produce.lua"), f"{url}/topics/{topic}"],
                         env=env, capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    f = dict(kv.split("=") for kv in line.split()[1:])
    acked, failed = (int(metric_sum(url, m) - b) for m, b in zip(counters, before, strict=True))
    throttled = int(metric_sum(url, "kcg_http_request_duration_seconds_count", 'status="429"') - throttled0)
    answered_ok = (int(f["requests"]) - int(f["non2xx"])) * batch
    secs = int(f["duration_us"]) / 1e6
    note = (f"p50 {int(f['p50_us']) / 1000:.1f} ms, p99 {int(f['p99_us']) / 1000:.1f} ms per request, "
            f"{throttled} x 429")
    if int(f["non2xx"]) - throttled:
        note += f", {int(f['non2xx']) - throttled} other non-2xx answers"
    if failed:
        note += f", {failed} records failed"
    if not answered_ok <= acked <= answered_ok + batch * connections:
        note += f", MISMATCH: wrk saw {answered_ok:,} records answered 2xx, the gateway acknowledged {acked:,}"
    return answered_ok / secs, answered_ok, note


def via_httpx(url: str, topic: str, n: int, batch: int, connections: int) -> tuple[float, int, str]:
    payload = body(batch)

    async def go() -> tuple[float, int]:
        ok = 0
        left = n // batch
        async with httpx.AsyncClient(base_url=url, timeout=60,
                                     limits=httpx.Limits(max_connections=connections)) as http:
            async def worker() -> None:
                nonlocal ok, left
                while left > 0:
                    left -= 1
                    r = await http.post(f"/topics/{topic}", content=payload, headers={"Content-Type": BIN})
                    if r.status_code == 200:
                        ok += r.content.count(b'"error_code":null')
                    elif r.status_code == 429:  # honour the back-off, send the same records again
                        left += 1
                        await asyncio.sleep(int(r.headers.get("Retry-After", "1")))
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(connections)))
            return ok / (time.perf_counter() - t0), ok
    rate, ok = asyncio.run(go())
    return rate, ok, "httpx client (wrk not installed)"


def parse_cost_us(batch: int) -> float:
    """CPU µs per record of the gateway's body parsing (JSON, then base64 and checks per record)."""
    payload = body(batch)
    rounds = max(1, 200_000 // batch)
    t0 = time.process_time()
    for _ in range(rounds):
        parse_body_records(payload, "binary", None)
    return (time.process_time() - t0) / (rounds * batch) * 1e6


def engine(bootstrap: str, topic: str, n: int, batch: int, connections: int) -> tuple[float, int, str]:
    async def go() -> tuple[float, int]:
        client = KafkaClient(bootstrap)
        p = Producer(client)
        try:
            recs = [(None, VALUE, (), None, None)] * batch
            await p.send_many(topic, recs[:1])  # producer id, metadata
            left = n // batch
            ok = 0

            async def worker() -> None:
                nonlocal left, ok
                while left > 0:
                    left -= 1
                    res = await p.send_many(topic, recs)
                    ok += sum(1 for r in res if not isinstance(r, ProduceFailure))
            t0 = time.perf_counter()
            c0 = time.process_time()
            await asyncio.gather(*(worker() for _ in range(connections)))
            cpu[0] = (time.process_time() - c0) / max(1, ok) * 1e6
            return ok / (time.perf_counter() - t0), ok + 1
        finally:
            await p.close()
            await client.close()
    cpu = [0.0]
    rate, ok = asyncio.run(go())
    return rate, ok, f"{connections} send_many calls of {batch} in flight; {cpu[0]:.2f} µs CPU per record"


def direct(bootstrap: str, topic: str, n: int) -> tuple[float, int, str]:
    acked = 0

    def cb(err: object, msg: object) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    p = CKProducer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                    "queue.buffering.max.messages": 1_000_000, "on_delivery": cb})
    p.produce(topic, value=VALUE)  # connect, producer id
    p.flush(30)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        while True:
            try:
                p.produce(topic, value=VALUE)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(120)
    return (n - 1) / (time.perf_counter() - t0), acked, "acks=all, enable.idempotence=true, linger.ms=5"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    # the HTTP row: 100 records per POST, 8 connections, vs the idempotent direct producer (linger 5 ms)
    ap.add_argument("--batch", type=int, default=100, help="records per HTTP request / send_many call")
    ap.add_argument("--connections", type=int, default=8, help="HTTP requests (send_many calls) in flight")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of the wrk run (wrk runs for a time)")
    ap.add_argument("--equal-volume", action=argparse.BooleanOptionalAction, default=True,
                    help="the engine and direct rows write as many records as the HTTP row's wrk run did "
                    "(at least --records); --no-equal-volume: --records each")
    ap.add_argument("--gateway-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--profile", type=Path, default=None, help="directory for py-spy profiles of the HTTP rows")
    ap.add_argument("--defaults-row", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the HTTP row against a gateway with the shipped defaults (no limit overrides)")
    a = ap.parse_args()
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    n = a.records - a.records % (a.batch * min(2, a.connections))
    print(f"machine: {os.cpu_count()} cores shared by Tansu, the gateway process, the HTTP client and this process; "
          f"{n:,} x {len(VALUE)}-byte records, {PARTITIONS} partitions, batches of {a.batch}, "
          f"{a.connections} in flight", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-produce-"))
    rows: dict[str, list[tuple[float, str]]] = {}
    split: dict[str, list[float]] = {}
    try:
        for rnd in range(a.rounds):
            volume = n
            names = [HTTP_ROW, *([DEFAULTS_ROW] if a.defaults_row else []), "engine in-process",
                     "direct confluent-kafka"]
            for name in names:
                # a fresh broker per row: Tansu's in-memory log slows it as it grows, so a shared broker made each
                # later row pay for the records of the rows before it
                with fresh_broker(tmp, a.gateway_env, gateway=name.startswith("gateway"),
                                  shipped=name == DEFAULTS_ROW) as (broker, gw):
                    ok = run_row(a, rnd, name, volume, broker, gw, tmp, rows, split)
                if name == HTTP_ROW and a.equal_volume:
                    # the other rows write as many records as wrk's timed run did (time to write N records)
                    unit = a.batch * min(2, a.connections)
                    volume = max(n, -(-ok // unit) * unit)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, split, a.batch)


@contextlib.contextmanager
def fresh_broker(tmp: Path, gateway_env: list[str], *, gateway: bool, shipped: bool = False
                 ) -> Iterator[tuple[EmbeddedBroker, GatewayProcess | None]]:
    """An embedded Tansu broker (memory://), and a gateway on it when ``gateway``, stopped afterwards: with the
    per-tenant request rate and poll limits off, or with ``shipped`` the shipped defaults (no quota settings,
    whatever this process's environment says; ``--gateway-env`` still applies)."""
    broker = EmbeddedBroker()
    broker.start()
    if not gateway:
        try:
            yield broker, None
        finally:
            broker.stop()
        return
    overrides = dict(kv.split("=", 1) for kv in gateway_env)
    gw = GatewayProcess(broker.bootstrap, overrides, tmp / "gateway.log",
                        base_env={"GATEWAY_LOG_LEVEL": "warning"} if shipped else {
                            "GATEWAY_LOG_LEVEL": "warning", **LIMITS_OFF}, cwd=ROOT)
    if shipped:
        for key in [k for k in gw.env if k.startswith("GATEWAY_DEFAULT_") or k == "GATEWAY_TENANTS_FILE"]:
            if key not in overrides:
                del gw.env[key]
    try:
        gw.start()
        yield broker, gw
    finally:
        gw.stop()
        broker.stop()


def run_row(a: argparse.Namespace, rnd: int, name: str, n: int, broker: EmbeddedBroker, gw: GatewayProcess | None,
            tmp: Path, rows: dict[str, list[tuple[float, str]]], split: dict[str, list[float]]) -> int:
    """One row of a round; returns the records acknowledged."""
    topic = f"bench-produce-{rnd}-{name.split()[0].strip(',')}-{time.time_ns()}"
    create_topic(broker.bootstrap, topic)
    assert broker.proc is not None
    tansu0, busy0, t0 = cpu_seconds(broker.proc.pid), machine_busy_seconds(), time.perf_counter()
    if name.startswith("gateway"):
        assert gw is not None and gw.proc is not None
        cpu0 = cpu_seconds(gw.proc.pid)
        with Profiler(a.profile, gw.proc.pid, f"produce round {rnd + 1}"):
            if shutil.which("wrk"):
                rate, ok, note = via_wrk(gw.url, topic, a.seconds, a.batch, a.connections, tmp)
            else:
                rate, ok, note = via_httpx(gw.url, topic, n, a.batch, a.connections)
        gw_us = (cpu_seconds(gw.proc.pid) - cpu0) / max(1, ok) * 1e6
        note += f"; gateway {gw_us:.2f} µs CPU per record"
        if name == HTTP_ROW:
            split.setdefault("gateway", []).append(gw_us)
    elif name.startswith("engine"):
        rate, ok, note = engine(broker.bootstrap, topic, n, a.batch, a.connections)
        split.setdefault("engine", []).append(float(note.rsplit("; ", 1)[1].split()[0]))
    else:
        rate, ok, note = direct(broker.bootstrap, topic, n)
    tansu_us = (cpu_seconds(broker.proc.pid) - tansu0) / max(1, ok) * 1e6
    busy = (machine_busy_seconds() - busy0) / (time.perf_counter() - t0) / (os.cpu_count() or 1)
    note += f"; Tansu {tansu_us:.2f} µs CPU per record; machine {busy:.0%} busy"
    stored = count_stored(broker.bootstrap, topic)
    # wrk abandons the requests in flight when its time is up: their records may be stored
    slack = a.batch * a.connections if name.startswith("gateway") else 0
    check = "ok" if ok <= stored <= ok + slack else f"MISMATCH: {ok} acknowledged, {stored} stored"
    rows.setdefault(name, []).append((rate, f"{note}; stored {stored:,} ({check})"))
    print(f"  round {rnd + 1}: {name:<24} {rate:>10,.0f} records/s   {ok:,} records; {note}; stored {check}",
          flush=True)
    return ok


def report(rows: dict[str, list[tuple[float, str]]], split: dict[str, list[float]], batch: int) -> None:
    base = statistics.median(r for r, _ in rows["direct confluent-kafka"])
    targets = {HTTP_ROW: "0.6x", DEFAULTS_ROW: "0.6x"}  # the row with the shipped defaults has the same target
    print(f"\n{'scenario':<26}{'records/s (median)':>20}{'ratio to direct':>18}{'target':>8}  (rounds)  429s")
    for name, vals in rows.items():
        med = statistics.median(r for r, _ in vals)
        each = ", ".join(f"{r / base:.2f}" for r, _ in vals)
        throttled = [int(m[1]) for _, note in vals if (m := re.search(r"(\d+) x 429", note))]
        print(f"{name:<26}{med:>20,.0f}{med / base:>18.2f}{targets.get(name, ''):>8}  ({each})"
              + (f"  {sum(throttled):,}" if throttled else ""))
    print(f"({HTTP_ROW!r}: per-tenant request rate and poll limits off; {DEFAULTS_ROW!r}: the gateway as shipped)")
    gw_us, eng_us, parse_us = (statistics.median(split["gateway"]), statistics.median(split["engine"]),
                               parse_cost_us(batch))
    print(f"\nHTTP row, gateway CPU per record (median): {gw_us:.2f} µs = JSON + base64 parse {parse_us:.2f} µs "
          f"+ engine {eng_us:.2f} µs (in-process row) + HTTP handling and the rest {gw_us - parse_us - eng_us:.2f} µs")


if __name__ == "__main__":
    main()
