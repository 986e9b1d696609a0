"""The HTTP side of ``bench/http_consume.py``: an httpx client run as a separate process.

It speaks only HTTP to the gateway (never Kafka) and prints one JSON line with its measurements on
stdout. Sub-commands:

- ``throughput``: create 1..N instances, subscribe (or assign one partition each), GET records until the
  wanted number arrived (or stream them as ndjson); every body is parsed with orjson and every record
  counted and checked (per-partition offsets must be contiguous: no loss, no duplicates).
- ``latency``: one long-polling instance; prints ``ready`` once it is a member with an assignment, then
  records receive time minus the send time the producer wrote into each value.
- ``idle``: create many instances over many groups, subscribe them and wait until each has an assignment;
  prints ``joined``, then on a ``verify`` line from stdin counts the instances that still have one.

Usage: python bench/_http_client.py {throughput,latency,idle} --url URL ...
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

V2 = "application/vnd.kafka.v2+json"
ACCEPT = {"binary": "application/vnd.kafka.binary.v2+json", "json": "application/vnd.kafka.json.v2+json"}
NDJSON = "application/x-ndjson"
H = {"Content-Type": V2}
# uvicorn closes a keep-alive connection after 5 s without a request; drop ours sooner, or a request sent
# on a connection the server is closing at that moment fails with ReadError.
KEEPALIVE_EXPIRY = 2.0


async def request(http: httpx.AsyncClient, method: str, url: str, retries: int = 0, **kw: Any) -> httpx.Response:
    """One request; with ``retries``, a transport error (a connection the server closed, say) is retried
    at once on a new connection. Only for requests that may be repeated."""
    for attempt in range(retries + 1):
        try:
            return await http.request(method, url, **kw)
        except httpx.TransportError as exc:
            if attempt == retries:
                raise
            RETRIED[type(exc).__name__] = RETRIED.get(type(exc).__name__, 0) + 1
    raise AssertionError("unreachable")


RETRIED: dict[str, int] = {}


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


def cpu_self() -> float:
    t = os.times()
    return t.user + t.system


async def create(http: httpx.AsyncClient, group: str, fmt: str, name: str | None = None,
                 reset: str = "earliest", session_timeout_ms: int | None = None, retries: int = 0) -> str:
    body: dict[str, Any] = {"format": fmt, "auto.offset.reset": reset, "auto.commit.enable": "false"}
    if name is not None:
        body["name"] = name
    if session_timeout_ms is not None:
        body["session.timeout.ms"] = str(session_timeout_ms)
    retries = retries if name is not None else 0  # a named instance that exists already: 409 below
    r = await request(http, "POST", f"/consumers/{group}", retries, json=body, headers=H)
    if r.status_code == 409 and retries and name is not None:  # created by an attempt whose answer was lost
        return f"/consumers/{group}/instances/{name}"
    if r.status_code != 200:
        raise RuntimeError(f"create instance: {r.status_code} {r.text}")
    instance_id = orjson.loads(r.content)["instance_id"]
    return f"/consumers/{group}/instances/{instance_id}"


async def subscribe(http: httpx.AsyncClient, base: str, topic: str, retries: int = 0) -> None:
    r = await request(http, "POST", f"{base}/subscription", retries, json={"topics": [topic]}, headers=H)
    if r.status_code != 204:
        raise RuntimeError(f"subscribe: {r.status_code} {r.text}")


async def assign(http: httpx.AsyncClient, base: str, topic: str, partitions: list[int]) -> None:
    r = await http.post(f"{base}/assignments", headers=H,
                        json={"partitions": [{"topic": topic, "partition": p} for p in partitions]})
    if r.status_code != 204:
        raise RuntimeError(f"assign: {r.status_code} {r.text}")


async def assigned(http: httpx.AsyncClient, base: str, retries: int = 0) -> int:
    r = await request(http, "GET", f"{base}/assignments", retries, headers={"Accept": V2})
    if r.status_code != 200:
        raise RuntimeError(f"assignments: {r.status_code} {r.text}")
    return len(orjson.loads(r.content)["partitions"])


async def delete(http: httpx.AsyncClient, base: str) -> None:
    r = await http.delete(base, headers=H)
    if r.status_code != 204:
        raise RuntimeError(f"delete: {r.status_code} {r.text}")


# -- throughput ------------------------------------------------------------------------------------------
@dataclass
class Tally:
    """Shared by the instances of one run."""

    want: int
    got: int = 0
    first: float = 0.0  # perf_counter of the first non-empty response
    first_sent: float = 0.0  # perf_counter when the request that got it was sent
    first_batch: int = 0  # records in that response
    first_cpu: float = 0.0  # this process's CPU time then
    last: float = 0.0
    polls: list[float] = field(default_factory=list)  # seconds per GET (request sent -> body received)
    parse: list[float] = field(default_factory=list)  # seconds to parse + check one body
    batch_sizes: list[int] = field(default_factory=list)
    next_offset: dict[int, int] = field(default_factory=dict)
    anomalies: int = 0  # gaps or duplicates

    def add(self, recs: list[dict[str, Any]], sent: float, received: float) -> None:
        n = len(recs)
        if not n:
            return
        if self.got == 0:
            self.first, self.first_batch, self.first_sent = received, n, sent
            self.first_cpu = cpu_self()
        self.got += n
        self.last = received
        self.batch_sizes.append(n)
        nxt = self.next_offset
        bad = 0
        for r in recs:  # check every record: contiguous offsets per partition from the first one seen
            p = r["partition"]
            o = r["offset"]
            e = nxt.get(p)
            if e is not None and o != e:
                bad += 1
            nxt[p] = o + 1
        self.anomalies += bad


def check_values(recs: list[dict[str, Any]], fmt: str) -> None:
    """Decode the first and last record's value the way a real client would (and fail loudly if wrong)."""
    for r in (recs[0], recs[-1]):
        v = r["value"]
        if fmt == "binary":
            if len(base64.b64decode(v)) != 100:
                raise RuntimeError(f"unexpected value {v!r}")
        elif not isinstance(v, dict):
            raise RuntimeError(f"unexpected JSON value {v!r}")


async def poll_loop(http: httpx.AsyncClient, base: str, fmt: str, tally: Tally, max_records: int,
                    timeout_ms: int, deadline: float, depth: int = 1) -> None:
    """GET records until enough arrived. ``depth`` > 1 keeps that many GETs in flight on as many
    connections (the gateway serialises them per instance, in arrival order), so the gateway serves the
    next one while this client parses the last; depth 1 is the plain request-parse-request loop."""
    url = f"{base}/records"
    params = {"timeout": str(timeout_ms), "max_records": str(max_records)}
    headers = {"Accept": ACCEPT[fmt]}
    pending: deque[tuple[float, asyncio.Task[httpx.Response]]] = deque()

    def issue() -> None:
        pending.append((time.perf_counter(), asyncio.ensure_future(http.get(url, params=params, headers=headers))))

    first_poll = True
    issue()
    try:
        while pending:
            t, task = pending.popleft()
            r = await task
            received = time.perf_counter()
            if r.status_code != 200:
                raise RuntimeError(f"records: {r.status_code} {r.text}")
            recs = orjson.loads(r.content)
            if recs:
                check_values(recs, fmt)
            tally.add(recs, t, received)
            if not first_poll and recs:  # the first poll waits for the assignment: counted in first-record time
                tally.polls.append(received - t)
                tally.parse.append(time.perf_counter() - received)
            if recs:
                first_poll = False
            while len(pending) < depth and tally.got < tally.want and time.perf_counter() < deadline:
                issue()
    finally:
        for _, task in pending:  # polls still waiting once all records arrived
            task.cancel()


async def stream_loop(http: httpx.AsyncClient, base: str, fmt: str, tally: Tally, max_records: int,
                      deadline: float) -> None:
    params = {"max_records": str(max_records)}
    sent = time.perf_counter()
    async with http.stream("GET", f"{base}/records", params=params, headers={"Accept": NDJSON}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream: {r.status_code} {(await r.aread())!r}")
        rest = b""
        async for chunk in r.aiter_raw():
            received = time.perf_counter()
            data = rest + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1:]
            # one parse per chunk, as for a JSON array body (records never contain a raw line break)
            recs = orjson.loads(b"[" + data[:cut].replace(b"\n", b",") + b"]")
            check_values(recs, fmt)
            tally.add(recs, sent, received)
            if tally.got >= tally.want or received > deadline:
                break


async def throughput(a: argparse.Namespace) -> dict[str, Any]:
    cpu0 = cpu_self()
    conns = a.instances * a.depth + 4
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns,
                          keepalive_expiry=KEEPALIVE_EXPIRY)
    tally = Tally(a.records)
    async with httpx.AsyncClient(base_url=a.url, timeout=120, limits=limits) as http:
        t0 = time.perf_counter()
        bases = await asyncio.gather(*(create(http, a.group, a.format, session_timeout_ms=a.session_timeout_ms)
                                       for _ in range(a.instances)))
        if a.mode == "assign":
            await asyncio.gather(*(assign(http, b, a.topic, list(range(i, a.partitions, a.instances)))
                                   for i, b in enumerate(bases)))
        else:
            await asyncio.gather(*(subscribe(http, b, a.topic) for b in bases))
        deadline = t0 + a.deadline
        if a.stream:
            await asyncio.gather(*(stream_loop(http, b, a.format, tally, a.max_records, deadline) for b in bases))
        else:
            await asyncio.gather(*(poll_loop(http, b, a.format, tally, a.max_records, a.timeout_ms, deadline,
                                             a.depth) for b in bases))
        cpu1 = cpu_self()
        await asyncio.gather(*(delete(http, b) for b in bases))
    return {
        "records": tally.got, "first_record_s": tally.first - t0,
        "steady_rate": (tally.got - tally.first_batch) / max(1e-9, tally.last - tally.first),
        "total_s": tally.last - t0, "window_s": tally.last - tally.first_sent, "polls": tally.polls,
        "parse": tally.parse,
        "batch_mean": sum(tally.batch_sizes) / max(1, len(tally.batch_sizes)), "anomalies": tally.anomalies,
        "partitions_seen": len(tally.next_offset), "client_cpu_s": cpu1 - cpu0,
        "client_steady_cpu_s": cpu1 - tally.first_cpu, "steady_records": tally.got - tally.first_batch,
    }


# -- latency -----------------------------------------------------------------------------------------------
async def latency(a: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY)
    async with httpx.AsyncClient(base_url=a.url, timeout=60, limits=limits) as http:
        base = await create(http, a.group, "binary", session_timeout_ms=a.session_timeout_ms)
        await subscribe(http, base, a.topic)
        params = {"timeout": str(a.timeout_ms), "max_records": "1000"}
        headers = {"Accept": ACCEPT["binary"]}
        # Membership: a poll waits (inside the gateway) for the group to become stable; then check.
        while True:
            r = await http.get(f"{base}/records", params={"timeout": "1000"}, headers=headers)
            if r.status_code != 200:
                raise RuntimeError(f"records: {r.status_code} {r.text}")
            if orjson.loads(r.content):
                raise RuntimeError("the latency topic should be empty before the producer starts")
            if await assigned(http, base):
                break
        emit({"ready": True})
        lat: list[float] = []
        polls = 0
        while len(lat) < a.count:
            r = await http.get(f"{base}/records", params=params, headers=headers)
            now = time.time()
            polls += 1
            if r.status_code != 200:
                raise RuntimeError(f"records: {r.status_code} {r.text}")
            for rec in orjson.loads(r.content):
                sent = float(base64.b64decode(rec["value"]).split(b" ", 1)[0])
                lat.append(now - sent)
        await delete(http, base)
    return {"latencies": lat, "polls": polls}


# -- idle instances ----------------------------------------------------------------------------------------
RETRIES = 3  # thousands of connections to a busy server: a closed keep-alive connection is retried
async def idle(a: argparse.Namespace) -> dict[str, Any]:
    conns = min(a.connections, 200)
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns, keepalive_expiry=KEEPALIVE_EXPIRY)
    bases: list[str] = []
    join_s: list[float] = []
    polls = 0
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=a.url, timeout=300, limits=limits) as http:

        async def member(base: str, http: httpx.AsyncClient) -> None:
            nonlocal polls
            await subscribe(http, base, a.topic, RETRIES)
            while True:  # the poll waits inside the gateway for the group to become stable
                r = await request(http, "GET", f"{base}/records", RETRIES, params={"timeout": str(a.poll_ms)},
                                  headers={"Accept": ACCEPT["binary"]})
                polls += 1
                if r.status_code != 200:
                    raise RuntimeError(f"records: {r.status_code} {r.text}")
                if await assigned(http, base, RETRIES):
                    return

        sem = asyncio.Semaphore(a.groups_in_flight)

        async def group(g: int) -> None:
            async with sem:
                started = time.perf_counter()
                name = f"{a.group_prefix}-{g:03d}"
                # one connection pool per group: httpx scans its pool on every request, which costs
                # O(connections) each and made the client, not the gateway, the bottleneck at 2,500
                glimits = httpx.Limits(max_connections=a.per_group + 4, max_keepalive_connections=a.per_group + 4,
                                       keepalive_expiry=KEEPALIVE_EXPIRY)
                async with httpx.AsyncClient(base_url=a.url, timeout=300, limits=glimits) as ghttp:
                    mine = await asyncio.gather(*(create(ghttp, name, "binary", name=f"m{i:03d}", retries=RETRIES)
                                                  for i in range(a.per_group)))
                    bases.extend(mine)
                    await asyncio.gather(*(member(b, ghttp) for b in mine))
                join_s.append(time.perf_counter() - started)
                print(f"group {name}: {len(mine)} members in {join_s[-1]:.1f} s "
                      f"({len(bases)} instances so far, {time.perf_counter() - t0:.0f} s)", file=sys.stderr)

        await asyncio.gather(*(group(g) for g in range(a.groups)))
        emit({"joined": len(bases), "elapsed_s": time.perf_counter() - t0, "polls": polls, "retried": RETRIED,
              "group_join_s": sorted(join_s)})
        line = await asyncio.to_thread(sys.stdin.readline)  # wait for the benchmark to finish measuring
        if line.strip() != "verify":
            return {"verified": None}
        sem2 = asyncio.Semaphore(conns)

        async def check(base: str) -> int:
            async with sem2:
                return await assigned(http, base, RETRIES)

        counts = await asyncio.gather(*(check(b) for b in bases))
    return {"verified": sum(1 for c in counts if c > 0), "instances": len(bases)}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--url", required=True)
    t.add_argument("--group", required=True)
    t.add_argument("--topic", required=True)
    t.add_argument("--format", choices=("binary", "json"), default="binary")
    t.add_argument("--instances", type=int, default=1)
    t.add_argument("--mode", choices=("subscribe", "assign"), default="subscribe")
    t.add_argument("--partitions", type=int, default=4)
    t.add_argument("--records", type=int, required=True)
    t.add_argument("--max-records", type=int, default=10000)
    t.add_argument("--timeout-ms", type=int, default=1000)
    t.add_argument("--stream", action="store_true")
    t.add_argument("--session-timeout-ms", type=int, default=None)
    t.add_argument("--depth", type=int, default=1, help="GET records requests in flight per instance")
    t.add_argument("--deadline", type=float, default=180.0)
    lt = sub.add_parser("latency")
    lt.add_argument("--url", required=True)
    lt.add_argument("--group", required=True)
    lt.add_argument("--topic", required=True)
    lt.add_argument("--count", type=int, required=True)
    lt.add_argument("--timeout-ms", type=int, default=10000)
    lt.add_argument("--session-timeout-ms", type=int, default=None)
    it = sub.add_parser("idle")
    it.add_argument("--url", required=True)
    it.add_argument("--topic", required=True)
    it.add_argument("--group-prefix", required=True)
    it.add_argument("--groups", type=int, required=True)
    it.add_argument("--per-group", type=int, required=True)
    it.add_argument("--groups-in-flight", type=int, default=10)
    it.add_argument("--connections", type=int, default=1000)
    it.add_argument("--poll-ms", type=int, default=5000)
    a = ap.parse_args()
    # Tuned like a high-throughput Python consumer would be (the direct consumer is tuned too): a parsed
    # body is ~10,000 dicts, and with the default thresholds the collector would walk them (and every
    # module-level object) several times per response. Reference counting still frees each body at once.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    fn = {"throughput": throughput, "latency": latency, "idle": idle}[a.cmd]
    emit(asyncio.run(fn(a)))


if __name__ == "__main__":
    main()
