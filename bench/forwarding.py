"""Added latency of a forwarded poll: the same GET /records sent to the replica holding the instance
(direct) and to another replica (forwarded to the holder), interleaved, in one run.

Starts an embedded Tansu broker and two gateway replicas (``a``, ``b``, GATEWAY_PEERS naming both), creates
an instance on ``a`` (a name the ring places there), subscribes it to a pre-filled topic, then alternates a
direct poll (``a``) and a forwarded poll (``b`` → ``a``), one request at a time, with a keep-alive httpx
client. Two kinds of poll:

- ``empty``: ``timeout=0`` on an instance whose topic has no new records: the request path alone.
- ``10 records``: ``max_records=10`` from the prefetch buffer of a topic with records waiting.

Prints p50 / p90 / p99 / max per kind and route, and the difference (the forwarding cost). With ``--wrk``
it also drives /usr/bin/wrk (``-c`` connections) at each URL for throughput and wrk's own percentiles.

    .venv/bin/python bench/forwarding.py [--samples 2000] [--wrk] [--connections 8] [--duration 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from confluent_kafka import Producer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.client.client import KafkaClient  # noqa: E402
from service.embedded.tansu import EmbeddedBroker, free_port  # noqa: E402
from service.ring import owner, routing_key  # noqa: E402

V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = {"Accept": "application/vnd.kafka.binary.v2+json"}


def start_replicas(bootstrap: str, ids: list[str],
                   logdir: Path) -> tuple[list[subprocess.Popen[bytes]], dict[str, str]]:
    ports = {rid: free_port() for rid in ids}
    urls = {rid: f"http://127.0.0.1:{p}" for rid, p in ports.items()}
    procs = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    for rid in ids:
        env = {**base, "GATEWAY_KAFKA_BOOTSTRAP": bootstrap, "GATEWAY_PORT": str(ports[rid]),
               "GATEWAY_REPLICA_ID": rid, "GATEWAY_PEERS": ",".join(urls.values()), "GATEWAY_PEER_REFRESH_S": "0.5",
               "GATEWAY_LOG_LEVEL": "warning", "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "6000",
               "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": "1000", "GATEWAY_PEER_TOKEN": "bench-forwarding-peer-token",
               # one tenant at full speed: the shipped per-tenant rate and poll limits off
               "GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0", "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"}
        out = open(logdir / f"gw-{rid}.log", "ab")
        procs.append(subprocess.Popen([sys.executable, "-m", "gateway"], env=env, cwd=REPO, stdout=out,
                                      stderr=subprocess.STDOUT))
    for rid, url in urls.items():
        deadline = time.monotonic() + 30
        while True:
            try:
                view = httpx.get(f"{url}/internal/peers", timeout=1,
                                 headers={"x-kcg-peer-token": "bench-forwarding-peer-token"})
                if view.status_code == 200 and sorted(view.json()["placement"]) == sorted(ids):
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"replica {rid} did not start or see its peers; see {logdir}")
            time.sleep(0.1)  # waiting for other processes
    return procs, urls


def percentiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "max": s[-1], "mean": statistics.fmean(s)}


def row(label: str, direct: list[float], forwarded: list[float]) -> str:
    d, f = percentiles(direct), percentiles(forwarded)
    cols = [f"{k} {d[k] * 1e3:7.3f} / {f[k] * 1e3:7.3f} (+{(f[k] - d[k]) * 1e3:6.3f})" for k in ("p50", "p90", "p99")]
    return f"{label:<11} " + "  ".join(cols) + f"  max {d['max'] * 1e3:.1f} / {f['max'] * 1e3:.1f}"


def run_wrk(url: str, connections: int, duration: int) -> str:
    wrk = shutil.which("wrk") or "/usr/bin/wrk"
    out = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
                          "-H", f"Accept: {BIN['Accept']}", url], capture_output=True, text=True, check=True).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    lat = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)", out, re.M))
    return (f"{float(rps.group(1)) if rps else 0:8.0f} req/s  p50 {lat.get('50', '?'):>8}"
            f"  p90 {lat.get('90', '?'):>8}  "
            f"p99 {lat.get('99', '?'):>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000, help="requests per kind and route")
    ap.add_argument("--wrk", action="store_true", help="also run wrk against both URLs (empty polls)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--duration", type=int, default=5)
    args = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="kcg-bench-forwarding-"))
    broker = EmbeddedBroker(log_file=logdir / "tansu.log")
    broker.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs, urls = start_replicas(broker.bootstrap, ["a", "b"], logdir)
        groups = {kind: f"bench-forwarding-{kind}" for kind in ("empty", "records")}  # no rebalance between them
        names = {kind: next(f"{kind}-{i}" for i in range(10_000)
                            if owner(["a", "b"], routing_key(group, f"{kind}-{i}")) == "a")
                 for kind, group in groups.items()}
        n_records = 10 * args.samples * 2 + 5000
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log.connection.close": False})

        async def topics() -> None:
            c = KafkaClient(broker.bootstrap)
            try:
                await c.create_topics({"bench-full": 1, "bench-empty": 1})
            finally:
                await c.close()

        asyncio.run(topics())
        for i in range(n_records):
            p.produce("bench-full", value=b"v%08d" % i)
            if i % 10_000 == 0:
                p.poll(0)
        p.flush(60)
        with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=4, keepalive_expiry=30)) as http:
            bases = {}
            for kind, topic, reset in (("empty", "bench-empty", "latest"), ("records", "bench-full", "earliest")):
                r = http.post(f"{urls['a']}/consumers/{groups[kind]}", headers=V2, json={
                    "name": names[kind], "format": "binary", "auto.offset.reset": reset})
                assert r.status_code == 200, r.text
                bases[kind] = f"/consumers/{groups[kind]}/instances/{names[kind]}"
                r = http.post(f"{urls['a']}{bases[kind]}/subscription", headers=V2, json={"topics": [topic]})
                assert r.status_code == 204, r.text
            # wait for the assignment: the records instance returns records
            deadline = time.monotonic() + 60
            while not http.get(f"{urls['a']}{bases['records']}/records", params={"max_records": 10, "timeout": 1000},
                               headers=BIN).json():
                assert time.monotonic() < deadline, "no assignment"
            r = http.get(f"{urls['b']}{bases['empty']}/records", params={"timeout": 0}, headers=BIN)
            assert r.status_code == 200 and r.headers.get("x-kcg-served-by") == "a", (r.status_code, r.headers)
            results: dict[str, dict[str, list[float]]] = {}
            for kind, params in (("empty", {"timeout": 0}), ("records", {"timeout": 5000, "max_records": 10})):
                times: dict[str, list[float]] = {"a": [], "b": []}
                short = {"a": 0, "b": 0}
                for _ in range(50):  # warm up both paths (connections, caches)
                    for rid in ("a", "b"):
                        http.get(f"{urls[rid]}{bases[kind]}/records", params=params, headers=BIN)
                for i in range(args.samples * 2):
                    rid = "a" if i % 2 == 0 else "b"  # interleaved: both see the same machine noise
                    t0 = time.perf_counter()
                    r = http.get(f"{urls[rid]}{bases[kind]}/records", params=params, headers=BIN)
                    times[rid].append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
                    if kind == "records" and len(r.json()) != 10:
                        short[rid] += 1
                results[kind] = times
                if kind == "records":
                    print(f"polls with fewer than 10 records (prefetch buffer momentarily empty): direct "
                          f"{short['a']}, forwarded {short['b']}")
        print(f"\nforwarded poll vs direct poll, {args.samples} samples each, one request at a time "
              f"(milliseconds: direct / forwarded (+added))")
        for kind, label in (("empty", "empty poll"), ("records", "10 records")):
            print(row(label, results[kind]["a"], results[kind]["b"]))
        if args.wrk:
            print(f"\nwrk, {args.connections} connections, {args.duration} s, empty polls (timeout=0):")
            for rid, label in (("a", "direct   "), ("b", "forwarded")):
                print(f"{label} "
                      f"{run_wrk(urls[rid] + bases['empty'] + '/records?timeout=0', args.connections, args.duration)}")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        broker.stop()


if __name__ == "__main__":
    main()
