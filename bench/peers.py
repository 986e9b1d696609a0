"""Peers side by side on one Apache Kafka 4.4 broker: direct clients, our gateway and the Strimzi Kafka Bridge.

One embedded Apache Kafka broker (service/embedded/kafka.py; jars from tools/install-kafka.sh; 1 GB heap, full
JIT), one 4-partition topic filled with N x 100-byte records (8-byte keys) by a confluent-kafka producer. In one run:

Consume, time to read the N records from the beginning (all 4 partitions assigned, no group), records/s = N / time
from the client's start to the N-th record, ratio to the librdkafka consumer:

- **librdkafka consumer**: bench/http_consume.py ``direct()`` (confluent-kafka, ``TUNED_DIRECT``), in this process.
- **Java KafkaConsumer** (kafka-clients 4.4.0, the jar of the broker's lib directory): tools/peers/ConsumeN.java,
  compiled with javac into ~/.cache/kcg-peers/<hash>/ (outside the repository), run in its own JVM with
  fetch.max.bytes=50 MiB, max.partition.fetch.bytes=4 MiB, max.poll.records=10000, receive.buffer.bytes=1 MiB.
  Its time starts in ``main`` (JVM start-up not counted; the whole process time is printed beside it).
- **gateway**: one real gateway process (``python -m gateway``, per-tenant rate and poll limits off), one
  binary consumer instance, partitions assigned and positioned at the beginning, then ``wrk`` (one connection,
  one request at a time) GETs records: the default request and ``max_records=5000`` (bench/http_capacity.py).
- **Strimzi Kafka Bridge** (tools/install-strimzi.sh; Java 21+, the Temurin JDK in /usr/lib/jvm): started on free
  ports against the same broker with a properties file (bridge.id, kafka.bootstrap.servers, http.host/http.port,
  http.management.port; its log at WARN, as the gateway's), then its own consume flow: POST /consumers/{group}
  (format binary), POST assignments, POST positions/beginning, GET records with
  ``Accept: application/vnd.kafka.binary.v2+json`` by the same wrk script (one connection). A bridge GET returns
  what one ``KafkaConsumer.poll`` returns, so its size is the bridge's ``kafka.consumer.max.poll.records``: two
  rows, the default (500) and 5000 (next to max_records=5000), each in a fresh bridge process (fetch sizes as the
  Java consumer's in the second).

The HTTP rows' time starts when wrk starts, after the instance was created and positioned (the direct rows'
time includes creating the consumer); before each HTTP row another instance reads ``--warm-up-records``
untimed, so the bridge's JIT has compiled the GET path (the gateway gets the same).

Produce, N' x 100-byte records (no keys) into a fresh 4-partition topic per row, records/s, ratio to the direct
producer:

- **confluent-kafka idempotent producer** (bench/produce.py ``direct()``: acks=all, enable.idempotence=true).
- **gateway** and **bridge** POST /topics/{topic} (binary, 100 records per request), ``wrk`` with 8 connections for
  ``--produce-seconds``; a record counts when its request answered 200 with that record's offset (gateway:
  ``"error_code":null``; bridge: ``"offset":``). The bridge makes one Java producer per HTTP connection (its
  4.x defaults: acks=all, idempotence, linger.ms=5); the gateway's producer is acks=all idempotent. Before each
  timed run an untimed one (``--warm-up-seconds``, into another topic) warms the server up: the bridge's POST
  rate rose 4x over its first 25 s on a loaded 2-core machine (JIT). The direct producer writes as many records
  as the gateway's wrk run did. Each topic's end offsets are checked against the acknowledged count.

Everything shares this machine's cores (broker, gateway or bridge, clients): numbers from a loaded machine are
comparable within one run, not across runs; the server's CPU per record (from /proc) depends less on the load.

Usage: .venv/bin/python bench/peers.py [--records N] [--produce-seconds S] [--warm-up-seconds S]
       [--warm-up-records R] [--no-bridge] [--keep-logs]
       (KCG_STRIMZI_SRC=<bridge source tree>: see tools/install-strimzi.sh, when Maven Central lacks the bridge)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402
from confluent_kafka import Consumer as CKConsumer  # noqa: E402
from confluent_kafka import TopicPartition as CKTopicPartition  # noqa: E402

from bench.consume import produce as produce_binary  # noqa: E402
from bench.http_capacity import V2, make_instance, via_wrk  # noqa: E402
from bench.http_consume import TUNED_DIRECT, GatewayProc, cpu_seconds, create_topics, direct  # noqa: E402
from bench.produce import body as produce_body  # noqa: E402
from bench.produce import direct as direct_produce  # noqa: E402
from service.embedded.kafka import EmbeddedKafka, find_kafka_lib  # noqa: E402

PARTITIONS = 4
CONSUME_JAVA = ROOT / "tools" / "peers" / "ConsumeN.java"
BRIDGE_MAIN = "io.strimzi.kafka.bridge.Application"
BRIDGE_FETCH = {"max.partition.fetch.bytes": "4194304", "fetch.max.bytes": "52428800"}
BATCH, CONNECTIONS = 100, 8
BRIDGE_LOG4J = """appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d %-5p [%t] %c{1}:%L - %m%n
rootLogger.level = WARN
rootLogger.appenderRef.console.ref = STDOUT
"""

PRODUCE_LUA = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/vnd.kafka.binary.v2+json"
local f = io.open(os.getenv("BENCH_BODY"), "rb"); wrk.body = f:read("*a"); f:close()
local needle = os.getenv("BENCH_NEEDLE")
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad = 0 end
function response(status, headers, body)
  if status == 200 then
    local pos = 1
    while true do
      local s = string.find(body, needle, pos, true)
      if not s then break end
      ok = ok + 1
      pos = s + #needle
    end
  else
    bad = bad + 1
  end
end
function done(summary, latency, requests)
  local total_ok, total_bad = 0, 0
  for _, t in ipairs(threads) do total_ok = total_ok + t:get("ok"); total_bad = total_bad + t:get("bad") end
  io.write(string.format("RESULT ok=%d bad=%d duration_us=%d p50_us=%d p99_us=%d\n", total_ok, total_bad,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass
class Row:
    name: str
    rate: float | None  # None: unavailable
    note: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def java_home(minimum: int) -> Path:
    """A JDK of at least ``minimum`` from /usr/lib/jvm (newest first), else JAVA_HOME."""
    env = os.environ.get("KCG_PEERS_JAVA_HOME")
    if env:
        return Path(env)
    found = []
    for d in Path("/usr/lib/jvm").glob("*"):
        digits = "".join(c if c.isdigit() else " " for c in d.name).split()
        major = next((int(x) for x in digits if int(x) >= 8), 0)
        if major >= minimum and (d / "bin" / "javac").exists():
            found.append((major, d))
    if found:
        return max(found)[1]
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    raise RuntimeError(f"no JDK {minimum}+ in /usr/lib/jvm (set KCG_PEERS_JAVA_HOME)")


def jdk_version(home: Path) -> str:
    out = subprocess.run([str(home / "bin" / "java"), "-version"], capture_output=True, text=True).stderr
    return out.splitlines()[0] if out else str(home)


# -- the Java KafkaConsumer ----------------------------------------------------------------------------------
def compile_consumer(home: Path, kafka_lib: Path) -> Path:
    """tools/peers/ConsumeN.java compiled into a cache directory keyed by the source's and the jar's hash."""
    jar = next(kafka_lib.glob("kafka-clients-*.jar"))
    key = hashlib.sha256(CONSUME_JAVA.read_bytes() + jar.name.encode() + str(home).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kcg-peers" / key
    if (cache / "ConsumeN.class").exists():
        return cache
    partial = cache.with_name(key + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    out = subprocess.run([str(home / "bin" / "javac"), "-cp", f"{kafka_lib}/*", "-d", str(partial), str(CONSUME_JAVA)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"javac failed: {out.stderr[-1500:]}")
    shutil.rmtree(cache, ignore_errors=True)
    partial.rename(cache)
    return cache


def java_consumer(home: Path, kafka_lib: Path, bootstrap: str, topic: str, n: int) -> Row:
    classes = compile_consumer(home, kafka_lib)
    t0 = time.perf_counter()
    out = subprocess.run([str(home / "bin" / "java"), "-cp", f"{classes}:{kafka_lib}/*", "ConsumeN", bootstrap, topic,
                          str(PARTITIONS), str(n)], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"ConsumeN failed ({out.returncode}): {out.stderr[-2000:]}")
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    if res["records"] < n:
        raise RuntimeError(f"ConsumeN: only {res['records']} of {n} records")
    return Row("Java KafkaConsumer 4.4.0", n / res["total_s"],
               f"first record {res['first_s'] * 1000:.0f} ms, then {res['steady_rate']:,.0f}/s; {res['polls']:,} polls;"
               f" JVM process {wall:.1f} s"
               f" in all; {res['settings']}")


# -- the Strimzi bridge --------------------------------------------------------------------------------------
def install_bridge() -> tuple[Path | None, str]:
    """(lib dir, origin) from tools/install-strimzi.sh, or (None, why not)."""
    out = subprocess.run(["sh", str(ROOT / "tools" / "install-strimzi.sh")], capture_output=True, text=True)
    if out.returncode != 0:
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("install-strimzi:") or "Could not" in ln]
        return None, " / ".join(lines[-3:]) or out.stderr[-500:]
    lib = Path(out.stdout.strip().splitlines()[-1])
    origin = (lib.parent / "origin").read_text().strip() if (lib.parent / "origin").exists() else "?"
    return lib, origin


class BridgeProc:
    """The Strimzi Kafka Bridge in its own JVM on free loopback ports, stopped by its PID."""

    def __init__(self, home: Path, lib: Path, bootstrap: str, workdir: Path, consumer: dict[str, str]) -> None:
        self.port, self.mgmt_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        props = {"bridge.id": "kcg-bench", "kafka.bootstrap.servers": bootstrap, "http.host": "127.0.0.1",
                 "http.port": str(self.port), "http.management.port": str(self.mgmt_port),
                 "http.consumer.enabled": "true", "http.producer.enabled": "true",
                 **{f"kafka.consumer.{k}": v for k, v in consumer.items()}}
        self.config = workdir / f"bridge-{self.port}.properties"
        self.config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.log_path = workdir / f"bridge-{self.port}.log"
        # WARN, as the gateway of these rows (GATEWAY_LOG_LEVEL=warning): the log4j2 configuration inside the bridge's
        # jar logs two INFO lines per produce request
        log4j = workdir / "bridge-log4j2.properties"
        log4j.write_text(BRIDGE_LOG4J)
        self.cmd = [str(home / "bin" / "java"), f"-Dlog4j2.configurationFile=file:{log4j}", "-cp", f"{lib}/*",
                    BRIDGE_MAIN, "--config-file", str(self.config)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> BridgeProc:
        log = open(self.log_path, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the bridge exited ({self.proc.returncode}): "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.mgmt_port}/ready", timeout=2).status_code == 200:
                    self.startup_s = time.perf_counter() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling the readiness endpoint
        self.__exit__()
        raise RuntimeError("the bridge was not ready within 120 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def bridge_instance(bridge: BridgeProc, group: str, topic: str) -> str:
    """The bridge's consume flow up to the first GET: a binary consumer, all partitions assigned, at the beginning."""
    with httpx.Client(base_url=bridge.url, headers={"Content-Type": V2}, timeout=30) as http:
        r = http.post(f"/consumers/{group}", json={"name": "bench", "format": "binary",
                                                   "auto.offset.reset": "earliest", "enable.auto.commit": False})
        r.raise_for_status()
        base = f"/consumers/{group}/instances/bench"
        parts = [{"topic": topic, "partition": p} for p in range(PARTITIONS)]
        http.post(f"{base}/assignments", json={"partitions": parts}).raise_for_status()
        http.post(f"{base}/positions/beginning", json={"partitions": parts}).raise_for_status()
    return base


# -- produce ---------------------------------------------------------------------------------------------------
def warm_up(url: str, bootstrap: str, seconds: float, needle: str, tmp: Path, pid: int) -> None:
    """An untimed wrk produce run into a topic of its own: the bridge's JIT (and the gateway's pools) warm."""
    if seconds > 0:
        wrk_produce(url, new_topic(bootstrap, "peers-warm-up"), seconds, needle, tmp, pid)


def wrk_produce(url: str, topic: str, seconds: float, needle: str, tmp: Path, pid: int) -> tuple[float, int, str]:
    (tmp / "body.json").write_bytes(produce_body(BATCH))
    (tmp / "produce.lua").write_text(PRODUCE_LUA)
    env = {**os.environ, "BENCH_BODY": str(tmp / "body.json"), "BENCH_NEEDLE": needle}
    cpu0 = cpu_seconds(pid)
    out = subprocess.run(["wrk", "-t", "2", "-c", str(CONNECTIONS), "-d", f"{seconds:g}s", "--timeout", "60s", "-s",
                          str(tmp / "produce.lua"), f"{url}/topics/{topic}"],
                         env=env, capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    cpu = cpu_seconds(pid) - cpu0
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    f = dict(kv.split("=") for kv in line.split()[1:])
    ok, bad, secs = int(f["ok"]), int(f["bad"]), int(f["duration_us"]) / 1e6
    note = (f"{ok:,} records in {secs:.1f} s; request p50 {int(f['p50_us']) / 1000:.1f} ms, p99"
            f" {int(f['p99_us']) / 1000:.1f} ms; server {cpu / max(1, ok) * 1e6:.1f} µs CPU/record")
    if bad:
        note += f"; {bad} non-200 answers"
    return ok / secs, ok, note


def stored(bootstrap: str, topic: str) -> int:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": "bench-peers-check"})
    try:
        return sum(c.get_watermark_offsets(CKTopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS))
    finally:
        c.close()


def check_stored(bootstrap: str, topic: str, ok: int, slack: int) -> str:
    got = stored(bootstrap, topic)
    return f"stored {got:,} (ok)" if ok <= got <= ok + slack else f"STORED {got:,} for {ok:,} acknowledged"


def new_topic(bootstrap: str, name: str) -> str:
    topic = f"{name}-{time.time_ns()}"
    asyncio.run(create_topics(bootstrap, {topic: PARTITIONS}))
    return topic


# -- the run -----------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records to consume (N)")
    ap.add_argument("--produce-seconds", type=float, default=10.0, help="duration of each wrk produce run")
    ap.add_argument("--warm-up-seconds", type=float, default=20.0,
                    help="an untimed wrk produce run before each timed one (the bridge's JIT warms up: on a loaded"
                    " 2-core machine its POST rate rose 4x over its first 25 s)")
    ap.add_argument("--warm-up-records", type=int, default=300_000,
                    help="an untimed read of this many records by another consumer instance before each timed HTTP"
                    " consume row (0: none)")
    ap.add_argument("--max-records", type=int, default=5000, help="max_records of the second gateway GET row")
    ap.add_argument("--bridge", action=argparse.BooleanOptionalAction, default=True,
                    help="the Strimzi bridge rows (--no-bridge: skip them)")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    for tool in ("wrk",):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (apt-get install {tool}; tools/install-system-deps.sh)")
    n = a.records
    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    consume: list[Row] = []
    produce: list[Row] = []
    kafka_lib = find_kafka_lib()
    home = java_home(21)
    bridge_lib, bridge_origin = install_bridge() if a.bridge else (None, "skipped (--no-bridge)")
    broker = EmbeddedKafka(heap="1g", fast_start=False, log_file=tmp / "kafka.log")
    broker.start()
    t_start = time.perf_counter()
    try:
        bootstrap = broker.bootstrap
        topic = new_topic(bootstrap, "peers-binary")
        t = time.perf_counter()
        produce_binary(bootstrap, topic, n, PARTITIONS, "none")
        print(f"machine: {os.cpu_count()} cores shared by the broker, the gateway or bridge, the clients and whatever"
              f" else runs here; Apache Kafka {kafka_lib.parent.name} started in {broker.startup_s:.1f} s; produced"
              f" {n:,} x 100-byte records into 4 partitions in {time.perf_counter() - t:.1f} s; Java peers on"
              f" {jdk_version(home)}; bridge: {bridge_origin}", flush=True)

        d = direct(bootstrap, topic, PARTITIONS, n, broker.proc.pid)  # type: ignore[union-attr]
        base_rate = d.records / max(1e-9, d.total_s)
        tuned = ", ".join(f"{k}={v}" for k, v in TUNED_DIRECT.items())
        consume.append(Row("librdkafka consumer (confluent-kafka)", base_rate,
                           f"first record {d.first_record_s * 1000:.0f} ms, then {d.steady_rate:,.0f}/s; {tuned}"))
        print(f"  {consume[-1].name}: {base_rate:,.0f}/s", flush=True)
        try:
            consume.append(java_consumer(home, kafka_lib, bootstrap, topic, n))
        except (RuntimeError, StopIteration, subprocess.TimeoutExpired) as exc:
            consume.append(Row("Java KafkaConsumer 4.4.0", None, f"unavailable: {exc}"))
        print(f"  {consume[-1].name}: {consume[-1].rate or 0:,.0f}/s", flush=True)

        with GatewayProc(bootstrap, {}, tmp / "gateway.log") as gw:
            for label, query in (("default request", ""), (f"max_records={a.max_records}",
                                                           f"?max_records={a.max_records}")):
                name = f"gateway binary GET, {label}"
                if a.warm_up_records:  # an untimed read by another instance first, as for the bridge
                    warm = make_instance(gw.url, f"peers-gw-warm-{time.time_ns()}", "binary", topic)
                    via_wrk(gw, "warm-up", warm, "binary", min(n, a.warm_up_records), query, tmp)  # type: ignore[arg-type]
                    httpx.delete(f"{gw.url}{warm}", headers={"Content-Type": V2}, timeout=30)
                base = make_instance(gw.url, f"peers-gw-{time.time_ns()}", "binary", topic)
                r = via_wrk(gw, name, base, "binary", n, query, tmp)  # type: ignore[arg-type]
                httpx.delete(f"{gw.url}{base}", headers={"Content-Type": V2}, timeout=30)
                consume.append(Row(name, r.rate, f"{r.requests:,} GETs, p50 {r.p50_ms} ms, p99 {r.p99_ms} ms;"
                                   f" gateway {r.gw_us_per_rec:.2f} µs CPU/record"))
                print(f"  {name}: {r.rate:,.0f}/s", flush=True)
            gw_produce(gw, bootstrap, a, tmp, produce)

        bridge_rows(a, home, bridge_lib, bridge_origin, bootstrap, topic, n, tmp, consume, produce)

        # the direct producer writes as many records as the gateway's wrk run did
        volume = max(200_000, next((int(r.note.split()[0].replace(",", "")) for r in produce
                                    if r.rate and r.name.startswith("gateway")), n))
        ptopic = new_topic(bootstrap, "peers-produce-direct")
        rate, acked, note = direct_produce(bootstrap, ptopic, volume)
        produce.insert(0, Row("confluent-kafka idempotent producer", rate,
                              f"{volume:,} records; {note}; {check_stored(bootstrap, ptopic, acked, 0)}"))
        report(n, consume, produce, time.perf_counter() - t_start)
    finally:
        broker.stop()
        if a.keep_logs:
            print(f"logs: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def gw_produce(gw: GatewayProc, bootstrap: str, a: argparse.Namespace, tmp: Path, produce: list[Row]) -> None:
    warm_up(gw.url, bootstrap, a.warm_up_seconds, '"error_code":null', tmp, gw.pid)
    ptopic = new_topic(bootstrap, "peers-produce-gw")
    rate, ok, note = wrk_produce(gw.url, ptopic, a.produce_seconds, '"error_code":null', tmp, gw.pid)
    produce.append(Row("gateway POST", rate, f"{note}; {check_stored(bootstrap, ptopic, ok, BATCH * CONNECTIONS)}"))
    print(f"  gateway POST: {rate:,.0f}/s", flush=True)


def bridge_rows(a: argparse.Namespace, home: Path, lib: Path | None, origin: str, bootstrap: str, topic: str, n: int,
                tmp: Path, consume: list[Row], produce: list[Row]) -> None:
    variants = (("Strimzi bridge binary GET, max.poll.records=500 (default)", {}),
                ("Strimzi bridge binary GET, max.poll.records=5000", {"max.poll.records": "5000", **BRIDGE_FETCH}))
    if lib is None:
        for name, _ in variants:
            consume.append(Row(name, None, f"unavailable: {origin}"))
        produce.append(Row("Strimzi bridge POST", None, f"unavailable: {origin}"))
        return
    for i, (name, settings) in enumerate(variants):
        try:
            with BridgeProc(home, lib, bootstrap, tmp, settings) as bridge:
                if a.warm_up_records:  # an untimed read by another consumer first: the JIT compiles the GET path
                    warm = bridge_instance(bridge, f"peers-bridge-warm-{time.time_ns()}", topic)
                    via_wrk(bridge, "warm-up", warm, "binary", min(n, a.warm_up_records), "", tmp)  # type: ignore[arg-type]
                    httpx.delete(f"{bridge.url}{warm}", headers={"Content-Type": V2}, timeout=30)
                base = bridge_instance(bridge, f"peers-bridge-{time.time_ns()}", topic)
                r = via_wrk(bridge, name, base, "binary", n, "", tmp)  # type: ignore[arg-type]
                httpx.delete(f"{bridge.url}{base}", headers={"Content-Type": V2}, timeout=30)
                consume.append(Row(name, r.rate, f"{r.requests:,} GETs, p50 {r.p50_ms} ms, p99 {r.p99_ms} ms;"
                                   f" bridge {r.gw_us_per_rec:.2f} µs CPU/record; started in"
                                   f" {bridge.startup_s:.1f} s"))
                print(f"  {name}: {r.rate:,.0f}/s", flush=True)
                if i == len(variants) - 1:
                    warm_up(bridge.url, bootstrap, a.warm_up_seconds, '"offset":', tmp, bridge.pid)
                    ptopic = new_topic(bootstrap, "peers-produce-bridge")
                    rate, ok, note = wrk_produce(bridge.url, ptopic, a.produce_seconds, '"offset":', tmp, bridge.pid)
                    produce.append(Row("Strimzi bridge POST", rate,
                                       f"{note}; {check_stored(bootstrap, ptopic, ok, BATCH * CONNECTIONS)}"))
                    print(f"  Strimzi bridge POST: {rate:,.0f}/s", flush=True)
        except (RuntimeError, httpx.HTTPError, subprocess.SubprocessError) as exc:
            consume.append(Row(name, None, f"failed: {exc}"))


def report(n: int, consume: list[Row], produce: list[Row], total_s: float) -> None:
    print(f"\nconsume {n:,} x 100-byte records, 4 partitions, from the beginning (records/s = N / time to the N-th"
          " record; ratio to the librdkafka consumer)")
    print(f"{'row':58} {'records/s':>11} {'ratio':>6}  notes")
    for rows in (consume, produce):
        base = rows[0].rate or float("nan")
        if rows is produce:
            print(f"\nproduce 100-byte records, {BATCH} per POST, {CONNECTIONS} connections (ratio to the direct"
                  " producer)")
            print(f"{'row':58} {'records/s':>11} {'ratio':>6}  notes")
        for r in rows:
            if r.rate is None:
                print(f"{r.name:58} {'-':>11} {'-':>6}  {r.note}")
            else:
                print(f"{r.name:58} {r.rate:>11,.0f} {r.rate / base:>6.2f}  {r.note}")
    print(f"\ntotal {total_s:.0f} s (one run on a shared machine)")


if __name__ == "__main__":
    main()
