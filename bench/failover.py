"""Failover: time from kill -9 of the replica holding a consumer instance to the next record its client gets,
with durable instances and, as the baseline in the same run, without them.

Starts an embedded Tansu broker and, per mode, three gateway replicas (``a``, ``b``, ``c``; GATEWAY_PEERS naming
all three, static membership on as in the Helm chart, except for one baseline). A producer thread writes a record every
``--interval-ms`` (5 ms) to a 3-partition topic; one consumer instance is subscribed to it. The client sends each
request to the next replica in turn (a refused connection to a dead replica: on to the next one), long-polls with a
short ``timeout`` and commits the batch it got after every non-empty poll. Each repetition: steady consumption, then
kill -9 of the replica holding the instance right after a poll and before its commit (that batch is the
uncommitted window: the only records that may come twice), then the time until a poll returns a record again;
the killed replica is restarted before the next repetition (the instance stays where it now is, so the next
repetition kills its new holder).

- ``durable``: GATEWAY_DURABLE_INSTANCES=true. The client needs no recovery code: the new ring owner re-creates
  the instance from its descriptor (same static member id, positions from the committed offsets).
- ``baseline``: durable instances off, as every other HTTP consumer gateway: the client gets ``404`` and must
  re-create the instance and subscribe again (the new member waits for the group to expire the dead one).
  Static membership on (the chart's default; the re-created instance lives on another replica, so it joins
  with another ``group.instance.id``), and once more with dynamic members (other gateways' default; not with
  ``--quick``).

The same client code runs in both modes (its 404 recovery path counts every use). Prints, per mode, kill → next
record (min / median / max and each repetition) beside the session timeout in use, and the counts: records
lost (produced but never received; must be 0), client-visible 404s, duplicates next to the size of the
uncommitted windows, refused connections and other non-2xx answers.

    .venv/bin/python bench/failover.py [--reps 5] [--session-timeout-ms 45000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Producer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.client.client import KafkaClient  # noqa: E402
from service.embedded.tansu import EmbeddedBroker, free_port  # noqa: E402
from service.ring import SERVED_BY_HEADER  # noqa: E402

V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = {"Accept": "application/vnd.kafka.binary.v2+json"}
TOKEN = "bench-failover-peer-token"
IDS = ["a", "b", "c"]
PARTITIONS = 3
CHART_SESSION_TIMEOUT_MS = 45000  # the chart's consumerSessionTimeoutMs: null = Kafka's default, the gateway's too
CHART_PEER_REFRESH_S = 2.0  # the chart's peerRefreshS


class Replicas:
    """Three gateway processes that know each other as peers; any one can be killed and restarted."""

    def __init__(self, bootstrap: str, env: dict[str, str], logdir: Path, label: str) -> None:
        self.ports = {rid: free_port() for rid in IDS}
        self.urls = {rid: f"http://127.0.0.1:{p}" for rid, p in self.ports.items()}
        base = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        self.env = {rid: {**base, **env, "GATEWAY_KAFKA_BOOTSTRAP": bootstrap, "GATEWAY_PORT": str(self.ports[rid]),
                          "GATEWAY_REPLICA_ID": rid, "GATEWAY_PEERS": ",".join(self.urls.values()),
                          "GATEWAY_PEER_TOKEN": TOKEN, "GATEWAY_LOG_LEVEL": "info",
                          # one tenant: the shipped per-tenant rate and poll limits off
                          "GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0", "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"}
                    for rid in IDS}
        self.logs = {rid: logdir / f"{label}-gw-{rid}.log" for rid in IDS}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def launch(self, rid: str) -> None:
        with open(self.logs[rid], "ab") as out:
            self.procs[rid] = subprocess.Popen([sys.executable, "-m", "gateway"], env=self.env[rid], cwd=REPO,
                                               stdout=out, stderr=subprocess.STDOUT)

    def converged(self) -> bool:
        """Every replica places new instances on all three (each sees the others alive)."""
        for rid, url in self.urls.items():
            if self.procs[rid].poll() is not None:
                raise SystemExit(f"replica {rid} exited; see {self.logs[rid]}")
            try:
                view = httpx.get(f"{url}/internal/peers", timeout=1, headers={"x-kcg-peer-token": TOKEN})
            except httpx.TransportError:
                return False
            if view.status_code != 200 or sorted(view.json()["placement"]) != IDS:
                return False
        return True

    def start_all(self) -> None:
        for rid in IDS:
            self.launch(rid)
        self.wait_converged()

    def wait_converged(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.converged():
            if time.monotonic() > deadline:
                raise SystemExit(f"replicas did not see each other within {timeout} s; see {self.logs}")
            time.sleep(0.1)  # waiting for other processes to start and probe each other

    def kill(self, rid: str) -> None:
        self.procs[rid].kill()
        self.procs[rid].wait()

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Trickle(threading.Thread):
    """A record every ``interval`` seconds, values 0, 1, 2, ... round robin over the partitions; ``acked`` holds
    the values the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log.connection.close": False})
        self.topic, self.interval = topic, interval
        self.acked: set[bytes] = set()
        self.failed = 0
        self.halt = threading.Event()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.add(msg.value())
        else:
            self.failed += 1

    def run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self.halt.is_set():
            self.producer.produce(self.topic, value=b"%d" % i, partition=i % PARTITIONS, on_delivery=self._delivered)
            self.producer.poll(0)
            i += 1
            next_at += self.interval
            self.halt.wait(max(0.0, next_at - time.monotonic()))
        self.producer.flush(30)


@dataclass
class ModeResult:
    label: str
    times: list[float] = field(default_factory=list)  # kill -> next record, seconds, per repetition
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    not_found: int = 0  # client-visible 404s (each one ran the client's recovery path)
    refused: int = 0  # requests that reached no replica (the dead one): the client went on to the next
    produced: int = 0
    lost: int = 0
    deliveries: int = 0
    duplicates: int = 0
    uncommitted_at_kill: int = 0
    holders: list[str] = field(default_factory=list)


class Client:
    """One consumer instance used the way a Confluent v2 client behind a load balancer uses it: every request
    to the next replica, a short long-poll, a commit after every non-empty batch; on 404 (instance gone) it
    re-creates the instance and subscribes again — the recovery code of clients of other gateways."""

    def __init__(self, replicas: Replicas, group: str, name: str, topic: str, http_timeout: float,
                 result: ModeResult) -> None:
        self.replicas, self.group, self.name, self.topic, self.result = replicas, group, name, topic, result
        self.base = f"/consumers/{group}/instances/{name}"
        self.http = httpx.Client(timeout=httpx.Timeout(http_timeout, connect=1.0))
        self.turn = 0
        self.seen: collections.Counter[bytes] = collections.Counter()
        self.holder: str | None = None

    def request(self, method: str, path: str, **kw: Any) -> tuple[str, httpx.Response]:
        """Send to the next replica in turn; a replica that refuses the connection (dead): the next one."""
        for _ in range(len(IDS) * 50):
            rid = IDS[self.turn % len(IDS)]
            self.turn += 1
            try:
                r = self.http.request(method, self.replicas.urls[rid] + path, **kw)
            except httpx.TransportError:
                self.result.refused += 1
                continue
            self.result.statuses[r.status_code] += 1
            return rid, r
        raise SystemExit(f"no replica answered {method} {path}")

    def create(self) -> None:
        while True:
            _, r = self.request("POST", f"/consumers/{self.group}", headers=V2, json={
                "name": self.name, "format": "binary", "auto.offset.reset": "earliest",
                "auto.commit.enable": "false"})
            if r.status_code == 200:
                break
            if r.status_code != 409:  # 409: the old instance's name is still taken somewhere: try again
                raise SystemExit(f"create: {r.status_code} {r.text}")
            time.sleep(0.1)  # the client's retry back-off
        while True:
            _, r = self.request("POST", f"{self.base}/subscription", headers=V2, json={"topics": [self.topic]})
            if r.status_code == 204:
                return
            if r.status_code != 404:
                raise SystemExit(f"subscribe: {r.status_code} {r.text}")
            self.result.not_found += 1
            time.sleep(0.1)

    def poll(self) -> list[tuple[int, int]]:
        """One poll; returns the (partition, offset) of the records it got (empty on a non-200)."""
        rid, r = self.request("GET", f"{self.base}/records", params={"timeout": 500, "max_records": 1000},
                              headers=BIN)
        if r.status_code == 404:
            self.result.not_found += 1
            self.create()
            return []
        if r.status_code != 200:
            return []
        recs = r.json()
        if recs:
            self.holder = r.headers.get(SERVED_BY_HEADER, rid)
        for rec in recs:
            self.seen[base64.b64decode(rec["value"])] += 1
        return [(int(rec["partition"]), int(rec["offset"])) for rec in recs]

    def commit(self, batch: list[tuple[int, int]]) -> None:
        last: dict[int, int] = {}
        for p, o in batch:
            last[p] = max(last.get(p, -1), o)
        _, r = self.request("POST", f"{self.base}/offsets", headers=V2, json={"offsets": [
            {"topic": self.topic, "partition": p, "offset": o} for p, o in last.items()]})
        if r.status_code == 404:
            self.result.not_found += 1
            self.create()
        # 409 while the group rebalances: the batch stays uncommitted (redelivered, counted as duplicates)

    def step(self) -> int:
        batch = self.poll()
        if batch:
            self.commit(batch)
        return len(batch)

    def run_for(self, seconds: float) -> int:
        got = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got += self.step()
        return got


def run_mode(broker: EmbeddedBroker, label: str, durable: bool, static: bool, session_ms: int,
             args: argparse.Namespace, logdir: Path) -> ModeResult:
    result = ModeResult(label)
    heartbeat_ms = min(3000, session_ms // 3)
    env = {"GATEWAY_DURABLE_INSTANCES": "true" if durable else "false",
           "GATEWAY_STATIC_MEMBERSHIP": "true" if static else "false",
           "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": str(session_ms),
           "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": str(heartbeat_ms),
           "GATEWAY_PEER_REFRESH_S": str(args.peer_refresh_s)}
    tag = f"{'durable' if durable else 'baseline'}-{'static' if static else 'dynamic'}-{session_ms}"
    topic, group = f"failover-{tag}", f"bench-failover-{tag}"

    async def create_topic() -> None:
        c = KafkaClient(broker.bootstrap)
        try:
            await c.create_topics({topic: PARTITIONS})
        finally:
            await c.close()

    asyncio.run(create_topic())
    replicas = Replicas(broker.bootstrap, env, logdir, tag)
    trickle = Trickle(broker.bootstrap, topic, args.interval_ms / 1000)
    client = Client(replicas, group, "c1", topic, session_ms / 1000 + 30, result)
    try:
        replicas.start_all()
        trickle.start()
        client.create()
        deadline = time.monotonic() + session_ms / 1000 + 60
        while not client.step():  # the first assignment
            if time.monotonic() > deadline:
                raise SystemExit(f"{label}: no record after subscribing; see {logdir}")
        for rep in range(args.reps):
            client.run_for(args.steady_s)
            while not (batch := client.poll()):  # kill right after a batch, before its commit
                pass
            victim = client.holder
            assert victim is not None
            result.holders.append(victim)
            result.uncommitted_at_kill += len(batch)
            started = time.monotonic()
            replicas.kill(victim)
            while not client.step():
                if time.monotonic() - started > session_ms / 1000 * 3 + 120:
                    raise SystemExit(f"{label}: no record {time.monotonic() - started:.0f} s after the kill; "
                                     f"see {logdir}")
            result.times.append(time.monotonic() - started)
            print(f"  {label} rep {rep + 1}: killed {victim}, next record after {result.times[-1]:.2f} s "
                  f"(now served by {client.holder})", flush=True)
            client.run_for(1.0)
            replicas.launch(victim)  # the instance stays on its new holder; the client keeps consuming meanwhile
            while not replicas.converged():
                client.step()
        trickle.halt.set()
        trickle.join()
        result.produced = len(trickle.acked)
        deadline = time.monotonic() + 60
        while not trickle.acked <= set(client.seen) and time.monotonic() < deadline:
            client.step()
        result.lost = len(trickle.acked - set(client.seen)) + trickle.failed
        result.deliveries = sum(client.seen.values())
        result.duplicates = result.deliveries - len(client.seen)
    finally:
        trickle.halt.set()
        client.http.close()
        replicas.stop_all()
    return result


def report(results: list[ModeResult], session_ms: int, args: argparse.Namespace) -> None:
    print(f"\nkill -9 of the instance's replica -> next record served; session timeout {session_ms} ms "
          f"(heartbeat {min(3000, session_ms // 3)} ms), peer refresh {args.peer_refresh_s:g} s, "
          f"{args.reps} repetitions, a record every {args.interval_ms:g} ms")
    width = max(18, *(len(" ".join(f"{t:.2f}" for t in r.times)) for r in results))
    print(f"{'mode':<30} {'session':>9}  {'min':>6} {'median':>6} {'max':>6}  {'per repetition (s)':<{width}} "
          f"{'lost':>4} {'404s':>4} {'dups':>5} {'uncommitted':>11} {'refused':>7}  other non-2xx")
    for r in results:
        per = " ".join(f"{t:.2f}" for t in r.times)
        others = {s: n for s, n in sorted(r.statuses.items()) if s >= 300 and s != 404}
        print(f"{r.label:<30} {session_ms:>6} ms  {min(r.times):6.2f} {statistics.median(r.times):6.2f} "
              f"{max(r.times):6.2f}  {per:<{width}} {r.lost:>4} {r.not_found:>4} {r.duplicates:>5} "
              f"{r.uncommitted_at_kill:>11} {r.refused:>7}  {others or '-'}")
    print(f"(records produced: {', '.join(f'{r.label} {r.produced}' for r in results)}; 'uncommitted' = records "
          f"received but not committed when the replica died, the only ones that may come twice)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="kills per mode")
    ap.add_argument("--session-timeout-ms", type=int, nargs="+", default=[CHART_SESSION_TIMEOUT_MS],
                    help="group session timeout(s); several values: one run of both modes per value "
                    "(default: 45000, the chart's and the gateway's with an external broker)")
    ap.add_argument("--peer-refresh-s", type=float, default=CHART_PEER_REFRESH_S,
                    help="GATEWAY_PEER_REFRESH_S (default: the chart's 2 s)")
    ap.add_argument("--interval-ms", type=float, default=5.0, help="one produced record every this many ms")
    ap.add_argument("--steady-s", type=float, default=3.0, help="consumption before each kill")
    ap.add_argument("--skip-baseline", action="store_true", help="durable instances only")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, 6 s session timeout")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.session_timeout_ms, args.steady_s = 1, [6000], 1.0
    logdir = Path(tempfile.mkdtemp(prefix="kcg-bench-failover-"))
    print(f"logs: {logdir}", flush=True)
    broker = EmbeddedBroker(log_file=logdir / "tansu.log")
    broker.start()
    try:
        for session_ms in args.session_timeout_ms:
            modes = [("durable instances", True, True)]
            if not args.skip_baseline:
                modes.append(("baseline: 404, re-create", False, True))
                if not args.quick:
                    modes.append(("baseline, dynamic members", False, False))
            results = [run_mode(broker, label, durable, static, session_ms, args, logdir)
                       for label, durable, static in modes]
            report(results, session_ms, args)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
