"""Share groups (KIP-932): records/s through HTTP share consumers with explicit acknowledgement beside the Java
share consumer (``KafkaShareConsumer``, kafka-clients 4.4.0), on the same Apache Kafka broker, in one run.

One embedded Apache Kafka 4.4 broker (or ``--bootstrap``), one ``--partitions``-partition topic filled with N x
100-byte records (8-byte keys) by a confluent-kafka producer, then, one after the other, each in its own share
group (``share.auto.offset.reset=earliest``) reading all N records:

- **gateway**: one real gateway process (``python -m gateway``, per-tenant rate and poll limits off), ``--workers``
  binary share consumer instances (explicit acknowledgement), each driven by its own loop in this process (one
  httpx client): ``GET .../records?max_records=M&timeout=200``, then ``POST .../acknowledgements`` accepting what
  it got as offset ranges with ``"wait": false`` (the acknowledgements ride on the next ShareFetch, as the Java
  client's do), the last one of each worker with ``"wait": true``; each worker reads its outcomes
  (``GET .../acknowledgements``) whenever 5,000 are unread, and at the end until every acknowledgement it sent
  has one.
- **Java KafkaShareConsumer**: tools/peers/ShareConsumeN.java, compiled with javac (a JDK 17+ from /usr/lib/jvm)
  into ~/.cache/kcg-peers/<hash>/ (outside the repository), ``--workers`` consumers on their own threads in one
  JVM, ``share.acknowledgement.mode=explicit``: poll, ``acknowledge`` each record, poll again; at the end
  ``commitSync`` on each.

Timed, for both: from before the consumers (instances) are created and subscribed to when every worker is done
(the N-th distinct record acknowledged and the acknowledgements answered by the broker). records/s = N / that
time; "after the first record" = N / (end - first record), which leaves out joining the group (the JVM's start-up
is not counted; the whole process time is printed beside it). Every record is counted: N distinct records, each
acknowledgement applied (gateway: its outcomes), deliveries beyond N printed (a lock ran out: redelivered).

Everything shares this machine's cores: compare within one run.

    .venv/bin/python bench/share.py [--records 200000] [--partitions 4] [--workers 4] [--max-records 1000]
                                    [--bootstrap HOST:PORT] [--no-java] [--baseline DIR] [--rounds 1]

``--baseline DIR``: a second gateway process started from another checkout (e.g. ``git worktree`` of an older
commit) reads the same topic in its own share groups, its rows interleaved with this checkout's (``--rounds``
each): before/after CPU per record on one machine state.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402

from bench.consume import produce  # noqa: E402
from bench.http_consume import GatewayProc, cpu_seconds, create_topics  # noqa: E402
from bench.peers import java_home, jdk_version  # noqa: E402
from service.embedded.kafka import EmbeddedKafka, find_kafka_lib  # noqa: E402

SHARE_JAVA = ROOT / "tools" / "peers" / "ShareConsumeN.java"
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = {"Accept": "application/vnd.kafka.binary.v2+json"}
#: outcomes of acknowledgements sent with wait false are read (GET .../acknowledgements) once this many are unread
OUTCOMES_EVERY = 5000


@dataclass
class Row:
    name: str
    records: int
    distinct: int
    first_s: float
    total_s: float
    note: str = ""


@dataclass
class Worker:
    path: str
    sent: int = 0  # acknowledgements sent
    answered: int = 0  # outcomes known (applied or not)
    applied: int = 0
    polls: int = 0
    outcomes_failed: list[dict[str, object]] = field(default_factory=list)

    def take(self, outcomes: list[dict[str, object]]) -> None:
        self.answered += len(outcomes)
        for o in outcomes:
            if o["applied"]:
                self.applied += 1
            else:
                self.outcomes_failed.append(o)


def ranges(recs: list[dict[str, object]], topic: str) -> list[dict[str, object]]:
    """Accept acknowledgements for ``recs`` as offset ranges per partition."""
    by_part: dict[int, list[int]] = {}
    for r in recs:
        by_part.setdefault(int(r["partition"]), []).append(int(r["offset"]))  # type: ignore[call-overload]
    out: list[dict[str, object]] = []
    for part, offsets in sorted(by_part.items()):
        offsets.sort()
        start = prev = offsets[0]
        for o in [*offsets[1:], -1]:
            if o != prev + 1:
                out.append({"topic": topic, "partition": part, "first_offset": start, "last_offset": prev})
                start = o
            prev = o
    return out


async def http_row(url: str, topic: str, n: int, workers: int, max_records: int, pid: int) -> Row:
    group = f"bench-share-http-{time.time_ns()}"
    seen: set[tuple[int, int]] = set()
    deliveries = 0
    first = 0.0
    limits = httpx.Limits(max_connections=workers * 2, max_keepalive_connections=workers * 2)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

        async def make(i: int) -> Worker:
            r = await http.post(f"/share-groups/{group}", headers=V2, json={
                "name": f"w{i}", "format": "binary", "configs": {"share.auto.offset.reset": "earliest"}})
            r.raise_for_status()
            path = f"/share-groups/{group}/instances/w{i}"
            (await http.post(f"{path}/subscription", headers=V2, json={"topics": [topic]})).raise_for_status()
            return Worker(path)

        async def run(w: Worker) -> float:
            nonlocal deliveries, first
            while len(seen) < n:
                r = await http.get(f"{w.path}/records", params={"max_records": max_records, "timeout": 200},
                                   headers=BIN)
                r.raise_for_status()
                w.polls += 1
                recs = orjson.loads(r.content)
                if not recs:
                    continue
                if not first:
                    first = time.perf_counter()
                deliveries += len(recs)
                seen.update((x["partition"], x["offset"]) for x in recs)
                last = len(seen) >= n
                a = await http.post(f"{w.path}/acknowledgements", headers=V2,
                                    json={"acknowledgements": ranges(recs, topic), "wait": last})
                a.raise_for_status()
                w.sent += len(recs)
                w.take(a.json()["acknowledgements"])
                if w.sent - w.answered > OUTCOMES_EVERY:  # the gateway keeps 10,000 outcomes per instance
                    o = await http.get(f"{w.path}/acknowledgements")
                    o.raise_for_status()
                    w.take(o.json()["acknowledgements"])
            while w.answered < w.sent:  # acknowledgements sent with wait false: their outcomes
                o = await http.get(f"{w.path}/acknowledgements")
                o.raise_for_status()
                w.take(o.json()["acknowledgements"])
                if w.answered < w.sent:
                    await asyncio.sleep(0.01)
            return time.perf_counter()

        cpu0 = cpu_seconds(pid)
        t0 = time.perf_counter()
        ws = await asyncio.gather(*(make(i) for i in range(workers)))
        ends = await asyncio.wait_for(asyncio.gather(*(run(w) for w in ws)), 300)
        end = max(ends)
        cpu = cpu_seconds(pid) - cpu0
        for w in ws:
            await http.delete(w.path, headers=V2)
    applied = sum(w.applied for w in ws)
    failed = [o for w in ws for o in w.outcomes_failed]
    if applied < n or len(seen) < n:
        raise RuntimeError(f"gateway: {len(seen)} distinct records, {applied} acknowledgements applied of {n}; "
                           f"not applied: {failed[:5]}")
    return Row("gateway, HTTP share consumers", deliveries, len(seen), first - t0, end - t0,
               f"{sum(w.polls for w in ws):,} GETs, max_records={max_records}; {applied:,} acknowledgements "
               f"applied, {len(failed)} not; gateway CPU {cpu * 1e6 / n:.1f} µs per record")


def compile_java(home: Path, kafka_lib: Path) -> Path:
    """tools/peers/ShareConsumeN.java compiled into a cache directory keyed by the source's and the jar's hash."""
    jar = next(kafka_lib.glob("kafka-clients-*.jar"))
    key = hashlib.sha256(SHARE_JAVA.read_bytes() + jar.name.encode() + str(home).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kcg-peers" / key
    if (cache / "ShareConsumeN.class").exists():
        return cache
    partial = cache.with_name(f"{key}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    out = subprocess.run([str(home / "bin" / "javac"), "-cp", f"{kafka_lib}/*", "-d", str(partial), str(SHARE_JAVA)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"javac failed: {out.stderr[-1500:]}")
    shutil.rmtree(cache, ignore_errors=True)
    try:
        partial.rename(cache)
    except OSError:  # another run compiled it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return cache


def java_row(home: Path, kafka_lib: Path, bootstrap: str, topic: str, n: int, workers: int) -> Row:
    classes = compile_java(home, kafka_lib)
    group = f"bench-share-java-{time.time_ns()}"
    t0 = time.perf_counter()
    out = subprocess.run([str(home / "bin" / "java"), "-cp", f"{classes}:{kafka_lib}/*", "ShareConsumeN", bootstrap,
                          topic, group, str(n), str(workers)], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"ShareConsumeN failed ({out.returncode}): {out.stderr[-2000:]}")
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    if res["distinct"] < n:
        raise RuntimeError(f"ShareConsumeN: only {res['distinct']} of {n} records")
    return Row("Java KafkaShareConsumer 4.4.0", res["records"], res["distinct"], res["first_s"], res["total_s"],
               f"{res['polls']:,} polls; JVM process {wall:.1f} s in all; {res['settings']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-records", type=int, default=1000, help="max_records of each GET")
    ap.add_argument("--bootstrap", help="an Apache Kafka 4.2+ broker to use instead of an embedded one")
    ap.add_argument("--no-java", action="store_true", help="leave the Java row out (ratios to the last row)")
    ap.add_argument("--baseline", type=Path, help="also run a gateway from this checkout, rows interleaved")
    ap.add_argument("--rounds", type=int, default=1, help="gateway rows per checkout")
    args = ap.parse_args()
    n = args.records
    home = java_home(17)
    kafka_lib = find_kafka_lib()
    tmp = Path(tempfile.mkdtemp(prefix="bench-share-"))
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        broker = EmbeddedKafka(heap="1g", log_file=tmp / "kafka.log")
        broker.start()
        bootstrap = broker.bootstrap
    gw = GatewayProc(bootstrap, {}, tmp / "gateway.log")
    other = None
    if args.baseline is not None:
        other = GatewayProc(bootstrap, {}, tmp / "baseline.log")
        other.cwd = args.baseline.resolve()
    try:
        gw.start()
        if other is not None:
            other.start()
        topic = f"bench-share-{time.time_ns()}"
        asyncio.run(create_topics(bootstrap, {topic: args.partitions}))
        produce(bootstrap, topic, n, args.partitions, "none")
        print(f"{n:,} x 100-byte records, {args.partitions} partitions, {args.workers} workers each; "
              f"{jdk_version(home)}")
        rows: list[Row] = []
        for _ in range(args.rounds):
            if other is not None:
                row = asyncio.run(http_row(other.url, topic, n, args.workers, args.max_records, other.pid))
                row.name += f" ({args.baseline})"
                rows.append(row)
            rows.append(asyncio.run(http_row(gw.url, topic, n, args.workers, args.max_records, gw.pid)))
        if not args.no_java:
            rows.append(java_row(home, kafka_lib, bootstrap, topic, n, args.workers))
        base = rows[-1]
        print("| client | records/s | after the first record | ratio to Java | first record | deliveries | note |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            steady = r.distinct / (r.total_s - r.first_s) if r.total_s > r.first_s else float("nan")
            print(f"| {r.name} | {r.distinct / r.total_s:,.0f} | {steady:,.0f} | "
                  f"{(base.total_s / r.total_s):.2f} | {r.first_s:.2f} s | {r.records:,} | {r.note} |")
    finally:
        gw.stop()
        if other is not None:
            other.stop()
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
