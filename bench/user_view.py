"""Throughput as a user measures it: one broker, one run, time to read (or write) N records from a cold start.

bench/http_capacity.py and bench/produce.py isolate the gateway (records assigned and positioned before the
clock starts, 1M records, the median of 3 rounds, a fresh broker per produce row). A user comparing the gateway
with a Kafka client does none of that: they start a broker, fill a topic, and time one run of each client on
the same broker, the gateway with its default request parameters. This script does exactly that, and also
prints the isolated variants beside them so the difference between the two ways is visible in one run:

consume (one embedded Tansu broker, 4 partitions of N x 100-byte records, binary and JSON topics):

- ``direct, assign``: the tuned librdkafka consumer (bench/http_consume.py), assign, from consumer creation.
- ``direct, subscribe``: the same consumer joining a new group (auto.offset.reset=earliest); both subscribing
  clients use the session timeout and heartbeat interval ``make run`` gives an instance on its embedded broker
  (2 s / 0.5 s; Tansu holds a new group's JoinGroup for about half the session timeout: the join is ~1 s of the
  subscribe rows).
- ``GET, subscribe``: create an instance, subscribe, then ``wrk`` (one connection, one request at a time, no
  ``max_records``: the defaults) polls until N records arrived; timed from the create request (the join is
  part of the user's time).
- ``GET, assign``: the same instance shape with the 4 partitions assigned and positioned first (what
  http_capacity.py times).
- ``GET max_records=5000``, ``json GET``, ``ndjson stream`` (``curl -N``): subscribe, as a user.

produce (same broker, after the consume rows; ``--no-consume``: only these, on an empty broker): a fresh gateway,
``wrk`` with ``--connections`` (8) connections POSTing ``--batch`` (100) binary records each for ``--seconds``
into a new topic (a plain wrk script, as a user runs it: records counted from its 2xx answers, checked against the
gateway's own count), next to a confluent-kafka idempotent producer (acks=all, linger.ms 5) writing N records into
another, timed from its creation to the end of ``flush()``.

Ratios: each GET row against ``direct, assign`` (the tuned baseline), json against the same
(records of the same count and size), produce against the direct producer. The gateway runs as shipped except
that the per-tenant request rate and poll limits are off (they are off by default already; explicit here).

Usage: .venv/bin/python bench/user_view.py [--records N] [--seconds S] [--no-produce] [--no-consume]
       [--gateway-env K=V]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from confluent_kafka import Consumer as CKConsumer  # noqa: E402
from confluent_kafka import Producer as CKProducer  # noqa: E402

from bench import http_capacity as cap  # noqa: E402
from bench import produce as prod  # noqa: E402
from bench.consume import produce as produce_binary  # noqa: E402
from bench.http_consume import TUNED_DIRECT, GatewayProc, create_topics, direct, produce_json  # noqa: E402
from service.embedded.tansu import EmbeddedBroker  # noqa: E402
from service.settings import EMBEDDED_HEARTBEAT_INTERVAL_MS, EMBEDDED_SESSION_TIMEOUT_MS  # noqa: E402

PARTITIONS = cap.PARTITIONS
V2 = cap.V2
#: the session timeout of both subscribing clients: what `make run` gives an instance on its embedded Tansu, which
#: holds a new group's JoinGroup for about half of it (Kafka's 45 s default would add ~23 s to every subscribe row)
SESSION_MS = EMBEDDED_SESSION_TIMEOUT_MS


def direct_subscribe(bootstrap: str, topic: str, n: int) -> float:
    """The tuned librdkafka consumer joining a new group: records/s from its creation to the N-th record."""
    t0 = time.perf_counter()
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"user-direct-{time.time_ns()}",
                    "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
                    "heartbeat.interval.ms": EMBEDDED_HEARTBEAT_INTERVAL_MS, **TUNED_DIRECT})
    c.subscribe([topic])
    got = 0
    while got < n and time.perf_counter() - t0 < 300:
        got += sum(1 for m in c.consume(num_messages=10000, timeout=1.0) if m.error() is None)
    elapsed = time.perf_counter() - t0
    c.close()
    if got < n:
        raise RuntimeError(f"direct subscribe: only {got} of {n} records")
    return n / elapsed


def subscribed(url: str, fmt: str, topic: str) -> tuple[str, float]:
    """A new instance subscribed to ``topic``, as a user creates it; the time the user's clock starts."""
    t0 = time.perf_counter()
    group = f"user-{fmt}-{time.time_ns()}"
    with httpx.Client(base_url=url, headers={"Content-Type": V2}, timeout=30) as http:
        r = http.post(f"/consumers/{group}", json={"name": "u", "format": fmt, "auto.offset.reset": "earliest"})
        r.raise_for_status()
        base = f"/consumers/{group}/instances/u"
        http.post(f"{base}/subscription", json={"topics": [topic]}).raise_for_status()
    return base, t0


def direct_produce(bootstrap: str, topic: str, n: int) -> float:
    """confluent-kafka, idempotent, acks=all, default linger: records/s from creation to the end of flush()."""
    t0 = time.perf_counter()
    p = CKProducer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                    "queue.buffering.max.messages": 1_000_000})
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value=prod.VALUE)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    left = p.flush(120)
    if left:
        raise RuntimeError(f"direct produce: {left} records not delivered")
    return n / (time.perf_counter() - t0)


def consume_rows(broker: EmbeddedBroker, n: int, env: dict[str, str], tmp: Path,
                 row: Callable[..., None]) -> None:
    """The consume rows: direct (assign, subscribe), then the gateway's GET, json, stream rows."""
    t = time.perf_counter()
    produce_binary(broker.bootstrap, "u-binary", n, PARTITIONS, "none")
    produce_json(broker.bootstrap, "u-json", n, PARTITIONS)
    print(f"machine: {os.cpu_count()} cores shared by broker, gateway and clients; {n:,} binary + {n:,} JSON "
          f"records of 100 B produced in {time.perf_counter() - t:.1f} s", flush=True)
    assert broker.proc is not None
    d = direct(broker.bootstrap, "u-binary", PARTITIONS, n, broker.proc.pid)
    row("direct, assign", d.records / d.total_s, "")
    row("direct, subscribe", direct_subscribe(broker.bootstrap, "u-binary", n))
    with GatewayProc(broker.bootstrap, env, tmp / "gateway.log") as gw:
        for name, fmt, query in (("GET, subscribe", "binary", ""),
                                 ("GET max_records=5000, subscribe", "binary", "?max_records=5000"),
                                 ("json GET, subscribe", "json", "")):
            base, t0 = subscribed(gw.url, fmt, f"u-{fmt}")
            r = cap.via_wrk(gw, name, base, fmt, n, query, tmp, t0=t0)
            row(name, r.rate, note=f"(p99 {r.p99_ms} ms, {r.requests} requests, {r.gw_us_per_rec:.2f} µs/rec)")
            cap.delete(gw, base)
        base, t0 = subscribed(gw.url, "binary", "u-binary")
        row("ndjson stream, subscribe", cap.via_curl_stream(gw, "ndjson", base, n, t0=t0).rate)
        cap.delete(gw, base)
        base = cap.make_instance(gw.url, f"user-assign-{time.time_ns()}", "binary", "u-binary")
        r = cap.via_wrk(gw, "GET, assign", base, "binary", n, "", tmp)
        row("GET, assign (http_capacity.py's way)", r.rate, note=f"(p99 {r.p99_ms} ms)")
        cap.delete(gw, base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of the produce wrk run")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--produce", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--consume", action=argparse.BooleanOptionalAction, default=True,
                    help="the consume rows (--no-consume: only the produce rows, on an empty broker)")
    ap.add_argument("--gateway-env", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    for tool in ("wrk", "curl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (tools/install-system-deps.sh)")
    n = a.records
    env = {"GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS),
           "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": str(EMBEDDED_HEARTBEAT_INTERVAL_MS),
           **dict(kv.split("=", 1) for kv in a.gateway_env)}
    tmp = Path(tempfile.mkdtemp(prefix="bench-user-"))
    broker = EmbeddedBroker()
    broker.start()
    rows: list[tuple[str, float, str, str]] = []  # name, rec/s, baseline name, note

    def row(name: str, rate: float, baseline: str = "direct, assign", note: str = "") -> None:
        rows.append((name, rate, baseline, note))
        print(f"  {name}: {rate:,.0f}/s {note}", flush=True)

    try:
        asyncio.run(create_topics(broker.bootstrap, {"u-binary": PARTITIONS, "u-json": PARTITIONS,
                                                     "u-produce-http": PARTITIONS, "u-produce-direct": PARTITIONS}))
        if a.consume:
            consume_rows(broker, n, env, tmp, row)
        if a.produce:
            with GatewayProc(broker.bootstrap, env, tmp / "gateway.log") as gw:
                rate, ok, note = prod.via_wrk(gw.url, "u-produce-http", a.seconds, a.batch, a.connections, tmp)
                row(f"produce, wrk {a.connections} connections x {a.batch} records", rate, "direct produce",
                    f"({ok:,} records; {note})")
            row("direct produce", direct_produce(broker.bootstrap, "u-produce-direct", n), "")
        print(f"\n{n:,} records x 100 B, 4 partitions, one broker, one run (no warm-up, no median)\n"
              f"{'row':48} {'rec/s':>11} {'ratio':>6}  vs")
        rates = {name: rate for name, rate, _, _ in rows}
        for name, rate, baseline, _ in rows:
            ratio = f"{rate / rates[baseline]:.2f}" if baseline else "1.00"
            print(f"{name:48} {rate:>11,.0f} {ratio:>6}  {baseline or '-'}")
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
