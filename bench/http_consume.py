"""Consume over HTTP through the gateway vs a tuned direct confluent-kafka consumer, in the same run.

One embedded Tansu broker and one real gateway process (``python -m gateway``); the HTTP client is
``bench/_http_client.py`` in another process (httpx, HTTP/1.1 keep-alive, bodies parsed with orjson and
every record counted and checked). Scenarios:

1. Throughput: 200,000 x 100-byte records in a 4-partition topic (binary format) and 100-byte JSON values
   in another 4-partition topic (json format). Rows: 1 instance with all partitions assigned explicitly
   (like the direct consumer); 1 instance that subscribes (its time to first record includes the group
   join; session.timeout.ms=6000 because Tansu holds a JoinGroup for about half the session timeout);
   4 instances, one partition each (explicit assignment: no rebalances mid-run); for binary also one
   instance with two GETs in flight (the gateway serialises them per instance, so it serves the next
   while the client parses the last) and an ndjson stream. GET records with max_records=10000 until all
   arrived. Beside them the tuned direct consumer of bench/consume.py (``fetch.queue.backoff.ms=10``) on
   the same topic. Gateway and broker CPU and the gateway's RSS are read from /proc around each run, the
   client reports its own CPU, and /proc/stat gives what every other process of the machine used.
2. Produce -> HTTP delivery latency: one instance long-polling (timeout 10 s) an idle topic while a
   persistent producer (linger.ms=0, flush per record) sends one record every 50 ms with its send time
   in the value; receive time - send time (time.time(), same machine). Direct confluent-kafka consumers
   read the same records at the same time (fetch.wait.max.ms 500 and 10) as a baseline for the broker.
3. Idle capacity: 10,000 idle subscribed instances (100 groups of 100 members, one topic with 100
   partitions and one record per partition shared by the groups, so every member owns a partition) in a
   fresh gateway process: session timeout 45 s (Kafka's default), heartbeat 15 s (Kafka's 1/3 rule; at
   3 s, 10,000 members would send 3,300 heartbeats/s, far more than Tansu answers on this machine, and at
   10 s a co-located Tansu saturated in one of three runs, expiring sessions), max poll interval 1 h (idle
   = not polled; the default 5 minutes would make the first groups leave before the build is over).
   Groups are built 20 at a time: each member subscribes and long-polls until it owns a partition (Tansu
   holds a JoinGroup for about half the session timeout, so a group takes one to two of those). Then:
   RSS delta per instance after the fetchers paused and pooled broker connections were reaped, idle CPU
   (heartbeats), event-loop health (/healthz round trips; kcg_event_loop_lag_seconds from /metrics), and
   how many instances still own a partition. ``--idle-instances 1000,2000`` for smaller runs.

All of it shares the machine's cores (printed): gateway, broker, client and other processes compete.

Usage: .venv/bin/python bench/http_consume.py [--records N] [--rounds R] [--quick] [--skip-throughput]
       [--skip-latency] [--skip-idle] [--idle-instances 10000] [--only 'binary, 1 instance']
       [--gateway-env KEY=VALUE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx
import orjson
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from bench.consume import produce as produce_binary
from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from service.settings import EMBEDDED_LONG_POLL_FETCH_WAIT_MS
from tests.integration.gateway_proc import GatewayProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT = os.path.join(ROOT, "bench", "_http_client.py")
CLK = os.sysconf("SC_CLK_TCK")
SUBSCRIBE_SESSION_MS = 6000  # Tansu holds a JoinGroup ~half the session timeout: 45 s (default) -> ~23 s join
TUNED_DIRECT = {"enable.auto.commit": False, "fetch.queue.backoff.ms": 10, "queued.max.messages.kbytes": 262144,
                "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 4194304}


# -- /proc ---------------------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def proc_status(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def machine_busy_seconds() -> float:
    """CPU time all processes of the machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / CLK  # minus idle and iowait


def own_cpu_seconds() -> float:
    """This process plus its exited (waited-for) children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def rss(pid: int) -> int:
    return proc_status(pid, "VmRSS")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


MB = 1024 * 1024


# -- processes -----------------------------------------------------------------------------------------------
class GatewayProc(GatewayProcess):
    """The real gateway process (``python -m gateway``) against an external broker: the bench's
    Tansu, configured as the gateway configures its embedded Tansu (short broker-side fetch wait while a
    client long-polls; see GATEWAY_CONSUMER_LONG_POLL_FETCH_MAX_WAIT_MS in the README), with the
    gateway's default timeouts (not the tests' fast ones)."""

    def __init__(self, bootstrap: str, env: dict[str, str], log_file: Path, *, shipped: bool = False) -> None:
        """``shipped``: the tenant limits as shipped (no quota settings, whatever this process's environment
        says; ``env`` still applies), as a user starts the gateway; else the per-tenant rate and poll limits
        are off."""
        limits_off = {} if shipped else {
            # one tenant at full speed: the per-tenant rate and poll limits off
            "GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0", "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"}
        super().__init__(bootstrap, env, log_file, cwd=ROOT, base_env={
            "GATEWAY_LOG_LEVEL": "warning", **limits_off,
            "GATEWAY_CONSUMER_LONG_POLL_FETCH_MAX_WAIT_MS": str(EMBEDDED_LONG_POLL_FETCH_WAIT_MS)})
        if shipped:
            for key in [k for k in self.env if k.startswith("GATEWAY_DEFAULT_") or k == "GATEWAY_TENANTS_FILE"]:
                if key not in env:
                    del self.env[key]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def metric(self, name: str) -> float | None:
        """Sum of a metric's samples from /metrics (None when absent)."""
        return metric_sum(self.url, name)


def metric_sum(url: str, name: str, match: str = "") -> float | None:
    """The sum of a metric's samples on a gateway's /metrics (those whose line contains ``match``; None when
    there are none)."""
    total = None
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{") and match in line:
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def run_client(args: list[str], timeout: float = 600) -> dict[str, Any]:
    out = subprocess.run([sys.executable, CLIENT, *args], capture_output=True, timeout=timeout, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"client failed ({out.returncode}): {out.stderr.decode()[-3000:]}")
    return orjson.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


# -- data --------------------------------------------------------------------------------------------------
def json_value(i: int) -> bytes:
    """A JSON object of exactly 100 bytes."""
    head = b'{"id":%d,"user":"user-%05d","amount":%d.%02d,"ok":true,"tags":["a","b"],"note":"' % (
        i, i % 100000, i % 1000, i % 100)
    return head + b"x" * (100 - len(head) - 2) + b'"}'


def produce_json(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                    "queue.buffering.max.messages": 1_000_000})
    for i in range(n):
        v = json_value(i)
        while True:
            try:
                p.produce(topic, value=v, key=b'"k%08d"' % i, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise RuntimeError("produce did not complete")


async def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics(topics)
    finally:
        await client.close()


# -- results -----------------------------------------------------------------------------------------------
@dataclass
class Run:
    records: int
    first_record_s: float
    steady_rate: float
    total_s: float
    window_s: float = 0.0  # from sending the request that got the first records to the last records
    polls: list[float] = field(default_factory=list)
    gw_cpu_s: float = 0.0
    broker_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    client_steady_us: float = 0.0  # HTTP client CPU per record after the first response (no start-up costs)
    rss_before: int = 0
    rss_after: int = 0
    rss_peak: int = 0
    anomalies: int = 0
    batch_mean: float = 0.0
    others_cpu_s: float = 0.0  # CPU of every other process of the machine during the run
    wall_s: float = 0.0

    @property
    def overall_rate(self) -> float:
        return self.records / max(1e-9, self.total_s)


@dataclass
class Scenario:
    name: str
    runs: list[Run] = field(default_factory=list)

    def med(self, fn: Callable[[Run], float]) -> float:
        return statistics.median(fn(r) for r in self.runs)


class Meter:
    """CPU of gateway and broker and RSS of the gateway around one run."""

    def __init__(self, gw: GatewayProc | None, broker_pid: int) -> None:
        self.gw = gw
        self.broker_pid = broker_pid

    def __enter__(self) -> Meter:
        self.m0, self.s0, self.w0 = machine_busy_seconds(), own_cpu_seconds(), time.perf_counter()
        self.b0 = cpu_seconds(self.broker_pid)
        if self.gw is not None:
            self.g0 = cpu_seconds(self.gw.pid)
            self.rss0 = rss(self.gw.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.broker_cpu = cpu_seconds(self.broker_pid) - self.b0
        self.gw_cpu = 0.0
        if self.gw is not None:
            self.gw_cpu = cpu_seconds(self.gw.pid) - self.g0
            self.rss1 = rss(self.gw.pid)
            self.peak = proc_status(self.gw.pid, "VmHWM")
        self.wall = time.perf_counter() - self.w0
        self.others = (machine_busy_seconds() - self.m0) - self.broker_cpu - self.gw_cpu - (own_cpu_seconds() - self.s0)

    def fill(self, run: Run) -> Run:
        run.broker_cpu_s, run.others_cpu_s, run.wall_s = self.broker_cpu, max(0.0, self.others), self.wall
        if self.gw is not None:
            run.gw_cpu_s, run.rss_before, run.rss_after, run.rss_peak = self.gw_cpu, self.rss0, self.rss1, self.peak
        return run


def direct(bootstrap: str, topic: str, partitions: int, n: int, broker_pid: int) -> Run:
    """bench/consume.py's tuned direct consumer, with this file's steady-rate definition."""
    cpu0 = time.process_time()
    with Meter(None, broker_pid) as m:
        c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"bench-direct-{time.time_ns()}", **TUNED_DIRECT})
        t0 = time.perf_counter()
        c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
        got = first_batch = 0
        first = last = 0.0
        while got < n:
            msgs = c.consume(num_messages=10000, timeout=1.0)
            now = time.perf_counter()
            k = sum(1 for msg in msgs if msg.error() is None)
            if k:
                if got == 0:
                    first, first_batch = now, k
                got += k
                last = now
            if now - t0 > 120:
                break
        c.close()
    run = m.fill(Run(got, first - t0, (got - first_batch) / max(1e-9, last - first), last - t0, last - t0))
    run.client_cpu_s = time.process_time() - cpu0
    return run


def http_run(gw: GatewayProc, broker_pid: int, topic: str, fmt: str, instances: int, n: int, max_records: int,
             mode: str, stream: bool = False, depth: int = 1) -> Run:
    args = ["throughput", "--url", gw.url, "--group", f"bench-{fmt}-{instances}-{time.time_ns()}",
            "--topic", topic, "--format", fmt, "--instances", str(instances), "--records", str(n),
            "--max-records", str(max_records), "--mode", mode]
    if stream:
        args.append("--stream")
    if depth > 1:
        args += ["--depth", str(depth)]
    if mode == "subscribe":
        args += ["--session-timeout-ms", str(SUBSCRIBE_SESSION_MS)]
    with Meter(gw, broker_pid) as m:
        res = run_client(args)
    if res["records"] < n:
        raise RuntimeError(f"only {res['records']} of {n} records arrived over HTTP")
    run = m.fill(Run(res["records"], res["first_record_s"], res["steady_rate"], res["total_s"], res["window_s"],
                     res["polls"],
                     client_cpu_s=res["client_cpu_s"], anomalies=res["anomalies"], batch_mean=res["batch_mean"],
                     client_steady_us=res["client_steady_cpu_s"] / max(1, res["steady_records"]) * 1e6))
    return run


# -- reports --------------------------------------------------------------------------------------------------
def report_throughput(title: str, base: Scenario, rows: list[Scenario]) -> None:
    print(f"\n{title}")
    print(f"{'consumer':36} {'first rec':>9} {'steady rec/s':>13} {'overall rec/s':>13} {'ratio':>11}"
          f" {'poll p50':>8} {'poll p99':>8} {'rec/poll':>8} {'gw CPU':>7} {'gw us/rec':>9} {'broker CPU':>10}"
          f" {'client CPU':>10} {'cl us/rec':>9} {'cl max':>7} {'others':>7} {'gw RSS before/after/peak MB':>27}")
    for sc in [base, *rows]:
        steady = sc.med(lambda r: r.steady_rate)
        overall = sc.med(lambda r: r.overall_rate)
        polls = [p for r in sc.runs for p in r.polls]
        is_http = sc is not base
        # ratio per round (same machine state for both), then the median over rounds
        r_steady = statistics.median(r.steady_rate / b.steady_rate for r, b in zip(sc.runs, base.runs, strict=True))
        r_overall = statistics.median(r.overall_rate / b.overall_rate for r, b in zip(sc.runs, base.runs, strict=True))
        ratio = f"{r_steady:.2f}/{r_overall:.2f}x" if is_http else "1.00/1.00x"
        busy = sc.med(lambda r: r.window_s)
        gw_cpu = sc.med(lambda r: r.gw_cpu_s)
        line = (f"{sc.name:36} {sc.med(lambda r: r.first_record_s) * 1000:>6.0f} ms {steady:>13,.0f} {overall:>13,.0f}"
                f" {ratio:>11}")
        if is_http and polls:
            line += f" {pct(polls, 50) * 1000:>5.1f} ms {pct(polls, 99) * 1000:>5.1f} ms"
        else:
            line += f" {'-':>8} {'-':>8}"
        line += f" {sc.med(lambda r: r.batch_mean):>8,.0f}" if is_http else f" {'-':>8}"
        if is_http:
            line += (f" {gw_cpu / busy * 100:>6.0f}% {gw_cpu / sc.runs[0].records * 1e6:>9.2f}"
                     f" {sc.med(lambda r: r.broker_cpu_s) / busy * 100:>9.0f}%"
                     f" {sc.med(lambda r: r.client_cpu_s) / busy * 100:>9.0f}%"
                     f" {sc.med(lambda r: r.client_steady_us):>9.2f}"
                     f" {statistics.median(1e6 / r.client_steady_us / b.steady_rate for r, b in zip(sc.runs, base.runs, strict=True)):>6.2f}x"  # noqa: E501
                     f" {sc.med(lambda r: r.others_cpu_s / r.wall_s) * 100:>6.0f}%"
                     f" {sc.med(lambda r: r.rss_before) / MB:>9.0f}/{sc.med(lambda r: r.rss_after) / MB:.0f}"
                     f"/{max(r.rss_peak for r in sc.runs) / MB:.0f}")
        else:
            line += (f" {'-':>7} {'-':>9} {sc.med(lambda r: r.broker_cpu_s) / busy * 100:>9.0f}%"
                     f" {sc.med(lambda r: r.client_cpu_s) / busy * 100:>9.0f}%"
                     f" {sc.med(lambda r: r.client_cpu_s / r.records) * 1e6:>9.2f} {'-':>7}"
                     f" {sc.med(lambda r: r.others_cpu_s / r.wall_s) * 100:>6.0f}%")
        bad = sum(r.anomalies for r in sc.runs)
        if bad:
            line += f"  !! {bad} offset gaps/duplicates"
        print(line)


# -- scenarios --------------------------------------------------------------------------------------------------
def throughput_scenarios(broker: EmbeddedBroker, gw: GatewayProc, a: argparse.Namespace) -> None:
    n = a.records
    broker_pid = broker.proc.pid  # type: ignore[union-attr]
    topics = {"bench-http-binary": 4, "bench-http-json": 4}
    asyncio.run(create_topics(broker.bootstrap, topics))
    t = time.perf_counter()
    produce_binary(broker.bootstrap, "bench-http-binary", n, 4, "none")
    produce_json(broker.bootstrap, "bench-http-json", n, 4)
    print(f"produced {n:,} binary + {n:,} JSON records in {time.perf_counter() - t:.1f} s", flush=True)
    for fmt, topic in (("binary", "bench-http-binary"), ("json", "bench-http-json")):
        base = Scenario("confluent-kafka direct (tuned)")
        rows = [Scenario(f"HTTP {fmt}, 1 instance (assign)"), Scenario(f"HTTP {fmt}, 1 instance (subscribe)"),
                Scenario(f"HTTP {fmt}, 4 instances (assign)")]
        if fmt == "binary":
            rows.append(Scenario("HTTP binary, 1 inst, 2 GETs in flight"))
            rows.append(Scenario("HTTP binary ndjson stream, 1 inst"))
        wanted = [s for s in rows if a.only is None or any(k in s.name for k in a.only)]
        if not wanted:
            continue
        for _ in range(a.rounds):
            base.runs.append(direct(broker.bootstrap, topic, 4, n, broker_pid))
            for sc in wanted:
                insts = 4 if "4 instances" in sc.name else 1
                mode = "subscribe" if "subscribe" in sc.name else "assign"
                sc.runs.append(http_run(gw, broker_pid, topic, fmt, insts, n, a.max_records, mode, "stream" in sc.name,
                                        2 if "in flight" in sc.name else 1))
            print(f"  {fmt} round done: "
                  + ", ".join(f"{s.name}: {s.runs[-1].steady_rate:,.0f}/s" for s in [base, *wanted]),
                  flush=True)
        report_throughput(f"{n:,} records, 4 partitions, {fmt} format"
                          f" ({'100-byte values' if fmt == 'binary' else '100-byte JSON values'}),"
                          f" median of {a.rounds} rounds, max_records={a.max_records}", base, wanted)
    print("(first rec = from the client's first request (create instance) to the first records received; steady ="
          " records after the first response / time from first to last response; overall = records / time from"
          " start to last response; ratio = steady/overall vs the direct consumer of the same round, median over"
          " rounds; poll = one GET records,"
          " request sent -> body received, the first poll of each instance excluded; CPU = CPU time / the run's"
          " transfer window (the request that got the first records -> the last records), 100% = one core; gw us/rec ="
          " gateway CPU microseconds per record delivered; cl us/rec = the client process's CPU per record after its"
          " first response (for the direct consumer: this process, whole run); cl max = the ratio the HTTP client"
          " alone would allow (records per second"
          " of its own CPU / the direct consumer's steady rate): no gateway can make that row faster; others = CPU"
          " of all other processes of the machine"
          " (e.g. other test runs) over the run's wall time)")


def latency_scenario(broker: EmbeddedBroker, gw: GatewayProc, count: int, warmup: int, interval: float) -> None:
    topic = "bench-http-latency"
    asyncio.run(create_topics(broker.bootstrap, {topic: 4}))
    total = warmup + count
    t0 = time.perf_counter()
    client = subprocess.Popen([sys.executable, CLIENT, "latency", "--url", gw.url, "--group",
                               f"bench-latency-{time.time_ns()}", "--topic", topic, "--count", str(total),
                               "--session-timeout-ms", str(SUBSCRIBE_SESSION_MS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert client.stdout is not None and client.stderr is not None
    ready = client.stdout.readline()  # the instance is a member with an assignment
    if b"ready" not in ready:
        client.kill()
        raise RuntimeError(f"latency client failed: {client.stderr.read().decode()[-3000:]}")
    join_s = time.perf_counter() - t0
    # Direct consumers read the same records at the same time: librdkafka's default fetch.wait.max.ms (500,
    # like the gateway's fetch max wait) and a short one (Tansu does not answer a held Fetch when data
    # arrives, so the fetch wait bounds the latency).
    direct_lat: dict[int, list[float]] = {500: [], 10: []}
    started = threading.Barrier(len(direct_lat) + 1)

    def direct_reader(wait_ms: int) -> None:
        lat = direct_lat[wait_ms]
        c = CKConsumer({"bootstrap.servers": broker.bootstrap, "group.id": f"bench-lat-{time.time_ns()}",
                        **TUNED_DIRECT, "fetch.wait.max.ms": wait_ms})
        c.assign([CKTopicPartition(topic, p, 0) for p in range(4)])
        started.wait()
        deadline = time.monotonic() + total * interval + 60
        while len(lat) < total and time.monotonic() < deadline:
            m = c.poll(1.0)
            now = time.time()
            if m is not None and m.error() is None:
                lat.append(now - float(m.value().split(b" ", 1)[0]))
        c.close()

    readers = [threading.Thread(target=direct_reader, args=(w,)) for w in direct_lat]
    for r in readers:
        r.start()
    started.wait()
    p = CKProducer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    acks: list[float] = []
    start = time.monotonic()
    for i in range(total):
        time.sleep(max(0.0, start + i * interval - time.monotonic()))  # pacing the producer
        t_send = time.time()
        sent = b"%.6f " % t_send
        p.produce(topic, value=sent + b"x" * (100 - len(sent)), partition=i % 4)
        p.flush(10)
        acks.append(time.time() - t_send)
    out, err = client.communicate(timeout=120)
    for r in readers:
        r.join()
    if client.returncode != 0:
        raise RuntimeError(f"latency client failed: {err.decode()[-3000:]}")
    res = orjson.loads(out.splitlines()[-1])
    print(f"\nproduce -> delivery latency: {count} records sent every {interval * 1000:.0f} ms to a 4-partition topic"
          f" (linger.ms=0, flush per record), {warmup} warm-up records not counted; {res['polls']} HTTP long-polls"
          f" (timeout 10 s); the instance (session.timeout.ms={SUBSCRIBE_SESSION_MS}) became a member {join_s:.1f} s"
          f" after the client started")
    print(f"{'':44} {'records':>8} {'p50':>9} {'p90':>9} {'p99':>9} {'max':>9}")
    rows = (("HTTP long-poll (binary, 1 instance)", res["latencies"][warmup:]),
            ("confluent-kafka direct, fetch.wait.max.ms=500", direct_lat[500][warmup:]),
            ("confluent-kafka direct, fetch.wait.max.ms=10", direct_lat[10][warmup:]),
            ("(producer: send -> ack)", acks[warmup:]))
    for name, lat in rows:
        print(f"{name:44} {len(lat):>8} " + " ".join(f"{pct(lat, q) * 1000:>6.1f} ms" for q in (50, 90, 99, 100)))
    print("(receive time - send time, time.time() in both processes; the direct consumers read the same records at"
          " the same time)")


def idle_scenario(broker: EmbeddedBroker, a: argparse.Namespace, tmp: Path, count: int) -> tuple[int, int]:
    """One fresh gateway process with ``count`` idle instances; returns (instances, RSS delta)."""
    per_group = a.idle_per_group
    groups = max(1, count // per_group)
    n = groups * per_group
    topic = f"bench-idle-{n}"
    broker_pid = broker.proc.pid  # type: ignore[union-attr]
    asyncio.run(create_topics(broker.bootstrap, {topic: per_group}))
    env = {"GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": str(a.idle_session_ms),
           "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": str(a.idle_heartbeat_ms),
           "GATEWAY_INSTANCE_IDLE_TIMEOUT_S": "3600",
           # idle means not polled: without this, members would leave their groups after the default
           # 5-minute max poll interval, long before a 10,000-instance build is over
           "GATEWAY_CONSUMER_MAX_POLL_INTERVAL_MS": "3600000",
           # every instance here belongs to the open mode's one tenant: its shipped cap of 1,000 instances off
           "GATEWAY_DEFAULT_MAX_INSTANCES": "0", **a.gateway_env}
    gw = GatewayProc(broker.bootstrap, env, tmp / "gateway-idle.log")
    gw.start()
    try:
        # Warm up: one instance created, subscribed, polled and deleted, so one-time costs (broker connection,
        # metadata, code paths, validators) are in the baseline, not in the per-instance figure.
        # One record per partition: a member's first poll then ends as soon as it owns a partition
        # (instead of waiting out its timeout on an empty topic), so building costs few requests.
        p = CKProducer({"bootstrap.servers": broker.bootstrap})
        for part in range(per_group):
            p.produce(topic, value=b"x" * 100, key=b"warm-up", partition=part)
        p.flush(10)
        run_client(["throughput", "--url", gw.url, "--group", "bench-idle-warmup", "--topic", topic,
                    "--records", "1"])
        rss0 = rss(gw.pid)
        b0, g0, t0 = cpu_seconds(broker_pid), cpu_seconds(gw.pid), time.perf_counter()
        client_log = open(tmp / "idle-client.log", "wb")  # closed once the client ended
        client = subprocess.Popen(
            [sys.executable, CLIENT, "idle", "--url", gw.url, "--topic", topic, "--group-prefix",
             f"idle{time.time_ns() % 10**6}", "--groups", str(groups), "--per-group", str(per_group),
             "--groups-in-flight", str(a.idle_groups_in_flight),
             "--connections", str(a.idle_groups_in_flight * per_group), "--poll-ms", "30000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=client_log, cwd=ROOT)
        assert client.stdout is not None
        line = client.stdout.readline()  # every instance is a member with an assignment
        if not line:
            client.wait()
            client_log.close()
            raise RuntimeError(f"idle client failed; see {tmp / 'idle-client.log'}")
        joined = orjson.loads(line)
        build_s = time.perf_counter() - t0
        build_gw_cpu, build_broker_cpu = cpu_seconds(gw.pid) - g0, cpu_seconds(broker_pid) - b0
        rss_joined, fds_joined = rss(gw.pid), len(os.listdir(f"/proc/{gw.pid}/fd"))
        instances_metric = gw.metric("kcg_consumer_instances")
        # Nobody polls from now on. A fetcher stops 30 s after its instance's last poll (fetch_idle_pause):
        # wait that timer out (nothing to await from outside), then measure the idle state; probe the event
        # loop all along: /healthz round trips, and the lag gauge from /metrics.
        probes: dict[str, list[float]] = {"settle": [], "idle": []}
        lags: list[float] = []
        scrape: list[float] = []
        scrape_cpu = 0.0  # gateway CPU seconds while a /metrics scrape of the idle window was being answered
        stat: subprocess.Popen[bytes] | None = None
        with httpx.Client(base_url=gw.url, timeout=60) as http:
            for phase, seconds in (("settle", a.idle_settle), ("idle", a.idle_measure)):
                if phase == "idle":
                    g1, b1, t1, m1 = (cpu_seconds(gw.pid), cpu_seconds(broker_pid), time.perf_counter(),
                                      machine_busy_seconds())
                    if a.idle_profile:  # py-spy over the idle window (pip install py-spy)
                        spy = str(Path(sys.executable).parent / "py-spy")
                        subprocess.Popen([spy, "record", "-p", str(gw.pid), "-r", "100", "-f", "raw",
                                          *(["--native"] if os.environ.get("BENCH_NATIVE") else ["--nonblocking"]),
                                          "-d", str(int(seconds)), "-o", a.idle_profile],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    if a.idle_perf_stat:  # system calls and context switches of the gateway over the idle window
                        stat = subprocess.Popen(["perf", "stat", "-x", ",", "-e",
                                                 "raw_syscalls:sys_enter,context-switches",
                                                 "-p", str(gw.pid), "--", "sleep", str(int(seconds))],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                    if a.idle_perf:  # native + kernel samples of the gateway over the idle window (perf record)
                        subprocess.Popen(["perf", "record", "-g", "-F", "499", "-p", str(gw.pid), "-o", a.idle_perf,
                                          "--", "sleep", str(int(seconds))],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    s = time.perf_counter()
                    http.get("/healthz")
                    probes[phase].append(time.perf_counter() - s)
                    if phase == "idle" and len(probes[phase]) % a.idle_scrape_every == 0:
                        s, c0 = time.perf_counter(), cpu_seconds(gw.pid)
                        text = http.get("/metrics").text
                        scrape.append(time.perf_counter() - s)
                        scrape_cpu += cpu_seconds(gw.pid) - c0
                        lags += [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                                 if ln.startswith("kcg_event_loop_lag_seconds ")]
                    time.sleep(0.1)  # pacing the probe
        span = time.perf_counter() - t1
        idle_cpu, idle_broker_cpu = (cpu_seconds(gw.pid) - g1) / span, (cpu_seconds(broker_pid) - b1) / span
        stat_line = ""
        if stat is not None:
            _, err = stat.communicate(timeout=60)
            counts = {ln.split(",")[2]: float(ln.split(",")[0]) for ln in err.decode().splitlines()
                      if ln.count(",") >= 2 and ln.split(",")[0].replace(".", "").isdigit()}
            stat_line = ", ".join(f"{k} {v / int(a.idle_measure):,.0f}/s" for k, v in counts.items())
        machine = (machine_busy_seconds() - m1) / span
        rss_idle, fds_idle = rss(gw.pid), len(os.listdir(f"/proc/{gw.pid}/fd"))
        peak = proc_status(gw.pid, "VmHWM")
        out, _ = client.communicate(b"verify\n", timeout=600)
        client_log.close()
        verified = orjson.loads(out.splitlines()[-1])
        per = (rss_idle - rss0) / n
        hz, hs = probes["idle"], probes["settle"]
        print(f"\nidle capacity: {n:,} subscribed instances = {groups} groups x {per_group} members, one {per_group}-"
              f"partition topic shared by the groups (one partition per member); session timeout"
              f" {a.idle_session_ms} ms, heartbeat {a.idle_heartbeat_ms} ms")
        print(f"  built in {build_s:.0f} s ({a.idle_groups_in_flight} groups at a time; per group median"
              f" {statistics.median(joined['group_join_s']):.1f} s, max {max(joined['group_join_s']):.1f} s;"
              f" {joined['polls']:,} polls; transport errors retried: {joined['retried'] or 'none'});"
              f" gateway CPU {build_gw_cpu:.0f} s, broker CPU {build_broker_cpu:.0f} s")
        shown = "absent" if instances_metric is None else f"{instances_metric:.0f}"
        print(f"  kcg_consumer_instances = {shown}; instances with an assignment after the idle"
              f" period: {verified['verified']:,} of {verified['instances']:,}; gateway file descriptors"
              f" {fds_joined:,} when joined, {fds_idle:,} idle")
        print(f"  gateway RSS: {rss0 / MB:.1f} MB with 0 instances (after a warm-up instance), {rss_joined / MB:.1f} MB"
              f" when all had joined, {rss_idle / MB:.1f} MB after {a.idle_settle + a.idle_measure:.0f} s without"
              f" polls (fetchers paused), peak {peak / MB:.1f} MB")
        print(f"  => {per / 1024:.1f} KB RSS per idle instance ((idle RSS - baseline) / {n:,});"
              f" {(rss_joined - rss0) / n / 1024:.1f} KB per instance right after joining")
        print(f"  idle ({a.idle_measure:.0f} s, fetchers paused): gateway CPU {idle_cpu * 100:.1f}% of a core, broker"
              f" {idle_broker_cpu * 100:.0f}%, whole machine {machine * 100:.0f}%; /healthz round trip p50"
              f" {pct(hz, 50) * 1000:.1f} ms, p99 {pct(hz, 99) * 1000:.1f} ms, max {max(hz) * 1000:.1f} ms"
              f" ({len(hz)} probes); kcg_event_loop_lag_seconds max {max(lags, default=float('nan')) * 1000:.1f} ms"
              f" over {len(lags)} scrapes (one /metrics scrape took p50 {pct(scrape, 50) * 1000:.0f} ms)")
        print(f"  of the idle CPU, answering those {len(scrape)} /metrics scrapes took"
              f" {scrape_cpu / span * 100:.1f}% of a"
              f" core ({scrape_cpu / max(1, len(scrape)) * 1000:.0f} ms each); without them"
              f" {(idle_cpu - scrape_cpu / span) * 100:.1f}% (heartbeats, /healthz probes, timers)"
              + (f"; gateway {stat_line}" if stat_line else ""))
        print(f"  first {a.idle_settle:.0f} s after joining (fetchers still active):"
              f" /healthz p50 {pct(hs, 50) * 1000:.1f} ms,"
              f" p99 {pct(hs, 99) * 1000:.1f} ms, max {max(hs) * 1000:.1f} ms ({len(hs)} probes)", flush=True)
        return n, rss_idle - rss0
    finally:
        gw.stop(grace=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-records", type=int, default=10_000, help="max_records per GET records")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--only", default=None, help="';'-separated name fragments of the HTTP throughput"
                    " scenarios to run, e.g. 'binary, 1 instance;json, 1'; latency and idle still run unless skipped")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-idle", action="store_true")
    ap.add_argument("--latency-records", type=int, default=200)
    ap.add_argument("--idle-instances", default="10000",
                    help="comma-separated counts, each in a fresh gateway process; more than one also prints the"
                    " RSS slope between the first and the last")
    ap.add_argument("--idle-per-group", type=int, default=100, help="members per group (= partitions of the topic)")
    ap.add_argument("--idle-groups-in-flight", type=int, default=20)
    ap.add_argument("--idle-session-ms", type=int, default=45000)
    ap.add_argument("--idle-heartbeat-ms", type=int, default=15000)
    ap.add_argument("--idle-settle", type=float, default=50.0,
                    help="seconds after joining before the idle measurement (fetchers pause after 30 s without a"
                    " poll; pooled broker connections close after 30-45 s unused)")
    ap.add_argument("--idle-measure", type=float, default=15.0, help="seconds of idle measurement")
    ap.add_argument("--idle-scrape-every", type=int, default=20, metavar="PROBES",
                    help="scrape /metrics every this many /healthz probes (10/s) during the idle window; a scrape"
                    " at 10,000 instances costs ~0.3 s of gateway CPU, so 20 (every ~2.5 s) adds ~10%% of a core"
                    " that a Prometheus scraping every 15-30 s does not; 150 = every ~15 s")
    ap.add_argument("--idle-profile", default=None, metavar="FILE",
                    help="py-spy collapsed stacks of the gateway over the idle window")
    ap.add_argument("--idle-perf", default=None, metavar="FILE",
                    help="perf record -g of the gateway over the idle window (native and kernel time: syscalls,"
                    " the event loop's C code), to read with perf report -i FILE")
    ap.add_argument("--idle-perf-stat", action="store_true",
                    help="count the gateway's system calls and context switches over the idle window (perf stat)")
    ap.add_argument("--gateway-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for the gateway processes (repeatable)")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.records, a.rounds, a.latency_records = min(a.records, 20_000), 1, 40
        a.idle_instances, a.idle_per_group = "100,200", min(a.idle_per_group, 20)
        a.idle_settle, a.idle_measure = 31.0, 5.0
    a.gateway_env = dict(kv.split("=", 1) for kv in a.gateway_env)
    a.idle_instances = [int(c) for c in str(a.idle_instances).split(",") if c.strip()]
    if a.only is not None:
        a.only = [s.strip() for s in a.only.split(";") if s.strip()]
    print(f"machine: {os.cpu_count()} cores shared by the broker (Tansu), the gateway process, the HTTP client"
          f" process and this process (producer, direct consumer); Python {sys.version.split()[0]}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-http-"))
    t_start = time.perf_counter()
    broker = EmbeddedBroker()
    broker.start()
    try:
        if not (a.skip_throughput and a.skip_latency):
            gw = GatewayProc(broker.bootstrap, a.gateway_env, tmp / "gateway.log")
            gw.start()
            try:
                if not a.skip_throughput:
                    throughput_scenarios(broker, gw, a)
                if not a.skip_latency:
                    latency_scenario(broker, gw, a.latency_records, 10, 0.05)
            finally:
                gw.stop()
        if not a.skip_idle:
            results = [idle_scenario(broker, a, tmp, c) for c in a.idle_instances]
            if len(results) > 1:
                (n1, d1), (n2, d2) = results[0], results[-1]
                print(f"\nidle RSS slope between {n1:,} and {n2:,} instances: {(d2 - d1) / (n2 - n1) / 1024:.1f} KB per"
                      f" instance (target: <= 50 KB per instance at 10,000). Both were built {a.idle_groups_in_flight}"
                      f" groups at a time, and RSS keeps the peak of the building phase (concurrent joins, long-polls,"
                      f" one broker connection per blocking request), which later instances reuse: RSS / N overstates"
                      f" the marginal cost at small N and the slope understates it")
        print(f"\ntotal time {time.perf_counter() - t_start:.0f} s")
    finally:
        broker.stop()
    print(f"\nlogs: {tmp}" if a.keep_logs else "")
    if not a.keep_logs:
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


if __name__ == "__main__":
    main()
