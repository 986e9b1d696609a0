"""Group protocols: time for a group to converge after members join, ``classic`` vs ``consumer`` (KIP-848), on
the same Apache Kafka broker in one run.

Starts an embedded Apache Kafka 4.4 broker (its group configs as given: Kafka's defaults unless
``--consumer-heartbeat-ms`` / ``--classic-heartbeat-ms`` say otherwise) and one gateway process. Per protocol, one
at a time: ``--members`` instances of a group consume a ``--partitions``-partition topic fed continuously (one
record per partition every 50 ms); once they are steady, ``--join`` more instances are created and subscribed.
Measured: the time from the first join request until the group converged (every partition assigned once, balanced,
and every member received records since), the longest time a member that was there before went without records
during it, and how many partitions the members that were there before gave up
(kcg_group_partitions_revoked_total).

    .venv/bin/python bench/group_join.py [--members 6] [--join 2] [--partitions 12] [--consumer-heartbeat-ms 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from confluent_kafka import Producer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.client.client import KafkaClient  # noqa: E402
from service.embedded.kafka import EmbeddedKafka  # noqa: E402
from service.embedded.tansu import free_port  # noqa: E402

V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = {"Accept": "application/vnd.kafka.binary.v2+json"}


class Member:
    def __init__(self, base: str) -> None:
        self.base = base
        self.times: list[float] = []
        self.running = True
        self.task: asyncio.Task[None] | None = None


async def poll(http: httpx.AsyncClient, m: Member) -> None:
    while m.running:
        r = await http.get(f"{m.base}/records", params={"timeout": 200}, headers=BIN)
        r.raise_for_status()
        if r.json():
            m.times.append(time.monotonic())
            await asyncio.sleep(0.05)


async def add(http: httpx.AsyncClient, url: str, group: str, topic: str, protocol: str, n: int,
              first: int) -> list[Member]:
    out = []
    for i in range(first, first + n):
        r = await http.post(f"{url}/consumers/{group}", headers=V2, json={
            "name": f"m{i}", "format": "binary", "auto.offset.reset": "latest", "group.protocol": protocol})
        r.raise_for_status()
        m = Member(r.json()["base_uri"])
        (await http.post(f"{m.base}/subscription", headers=V2, json={"topics": [topic]})).raise_for_status()
        m.task = asyncio.create_task(poll(http, m))
        out.append(m)
    return out


async def converged(http: httpx.AsyncClient, members: list[Member], partitions: int, since: float) -> bool:
    owned = []
    for m in members:
        r = await http.get(f"{m.base}/assignments")
        owned.append({p["partition"] for p in r.json()["partitions"]})
    return (sum(map(len, owned)) == partitions and len(set().union(*owned)) == partitions
            and max(map(len, owned)) - min(map(len, owned)) <= 1 and all(any(t > since for t in m.times)
                                                                         for m in members))


async def revoked(http: httpx.AsyncClient, url: str, protocol: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    m = re.search(rf'^kcg_group_partitions_revoked_total{{protocol="{protocol}",tenant="default"}} (\S+)$', text,
                  re.MULTILINE)
    return float(m.group(1)) if m else 0.0


async def run(protocol: str, url: str, topic: str, args: argparse.Namespace) -> dict[str, float]:
    group = f"bench-join-{protocol}-{os.getpid()}"
    async with httpx.AsyncClient(timeout=60) as http:
        members = await add(http, url, group, topic, protocol, args.members, 0)
        deadline = time.monotonic() + 120
        while not await converged(http, members, args.partitions, time.monotonic() - 0.5):
            assert time.monotonic() < deadline, "the first members did not converge"
            await asyncio.sleep(0.1)
        before = await revoked(http, url, protocol)
        start = time.monotonic()
        members += await add(http, url, group, topic, protocol, args.join, args.members)
        while not await converged(http, members, args.partitions, start):
            assert time.monotonic() < deadline, "the group did not converge after the join"
            await asyncio.sleep(0.05)
        took = time.monotonic() - start
        gave_up = await revoked(http, url, protocol) - before
        silence = 0.0
        for m in members[:args.members]:
            times = [start, *(t for t in m.times if start < t < start + took), start + took]
            silence = max(silence, max(b - a for a, b in itertools.pairwise(times)))
        for m in members:
            m.running = False
        await asyncio.gather(*(m.task for m in members if m.task is not None), return_exceptions=True)
        for m in members:
            await http.delete(m.base, headers=V2)
    return {"converge_s": took, "silence_s": silence, "revoked": gave_up}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=6)
    ap.add_argument("--join", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--consumer-heartbeat-ms", type=int, default=5000, help="group.consumer.heartbeat.interval.ms")
    ap.add_argument("--classic-heartbeat-ms", type=int, default=3000, help="GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-join-"))
    overrides = {"group.consumer.heartbeat.interval.ms": str(args.consumer_heartbeat_ms),
                 "group.consumer.min.heartbeat.interval.ms": str(min(args.consumer_heartbeat_ms, 5000))}
    broker = EmbeddedKafka(log_file=tmp / "kafka.log", overrides=overrides)
    broker.start()
    port = free_port()
    env = {**os.environ, "GATEWAY_KAFKA_BOOTSTRAP": broker.bootstrap, "GATEWAY_PORT": str(port),
           "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": str(args.classic_heartbeat_ms), "GATEWAY_LOG_LEVEL": "warning"}
    gw = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the gateway did not start")
            time.sleep(0.1)
        topic = f"bench-join-{os.getpid()}"

        async def create() -> None:
            client = KafkaClient(broker.bootstrap)
            try:
                await client.create_topics({topic: args.partitions})
            finally:
                await client.close()
        asyncio.run(create())

        def feed() -> None:
            p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2})
            while not stop.is_set():
                for part in range(args.partitions):
                    p.produce(topic, value=b"x", partition=part)
                p.poll(0)
                stop.wait(0.05)
            p.flush(10)
        threading.Thread(target=feed, daemon=True).start()
        print(f"{args.members} members + {args.join} joining, {args.partitions} partitions; heartbeat: consumer "
              f"{args.consumer_heartbeat_ms} ms (broker), classic {args.classic_heartbeat_ms} ms (gateway)")
        print("| protocol | join → converged | longest silence of a member already there | partitions they gave up |")
        print("| --- | --- | --- | --- |")
        for protocol in ("classic", "consumer"):
            r = asyncio.run(run(protocol, url, topic, args))
            print(f"| {protocol} | {r['converge_s']:.1f} s | {r['silence_s']:.2f} s | {r['revoked']:.0f} |")
    finally:
        stop.set()
        gw.terminate()
        gw.wait(20)
        broker.stop()


if __name__ == "__main__":
    main()
