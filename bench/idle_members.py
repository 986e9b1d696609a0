"""Idle group members: what N stable members that receive nothing cost, ``classic`` vs ``consumer`` (KIP-848).

Starts an embedded Apache Kafka 4.4 broker (or uses ``--bootstrap``) with a heartbeat interval of
``--heartbeat-ms`` under the consumer protocol; classic members heartbeat at the same interval. Per protocol, one
at a time: ``--members`` consumers (the gateway's Consumer, one shared KafkaClient, as the gateway runs them) in
groups of ``--group-size`` subscribe to a topic of ``--group-size`` partitions that receives nothing; once every
member is stable, the process is measured for ``--seconds``: CPU time of this process (and of the broker, when
it is ours), asyncio tasks alive, heartbeats answered, loop timer handles scheduled.

    .venv/bin/python bench/idle_members.py [--members 1000] [--group-size 10] [--heartbeat-ms 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.client.client import KafkaClient  # noqa: E402
from service.consumer.consumer import Consumer, ConsumerConfig  # noqa: E402
from service.embedded.kafka import EmbeddedKafka  # noqa: E402


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(protocol: str, bootstrap: str, args: argparse.Namespace, broker_pid: int | None) -> dict[str, float]:
    client = KafkaClient(bootstrap)
    topic = f"idle-{protocol}-{uuid.uuid4().hex[:6]}"
    await client.create_topics({topic: args.group_size})
    consumers: list[Consumer] = []
    tasks_before = len(asyncio.all_tasks())
    try:
        for i in range(args.members):
            c = Consumer(client, ConsumerConfig(
                group_id=f"{topic}-g{i // args.group_size}", group_protocol=protocol,
                heartbeat_interval_ms=args.heartbeat_ms, session_timeout_ms=max(10000, 10 * args.heartbeat_ms),
                rebalance_timeout_ms=30000, fetch_idle_pause_ms=1, enable_auto_commit=False,
                group_remote_assignor="uniform" if protocol == "consumer" else None))
            consumers.append(c)
            await c.subscribe([topic])
        coords: list[Any] = [c.coordinator for c in consumers]
        started = time.monotonic()
        while not all(co.stable for co in coords):
            assert time.monotonic() - started < 300, sum(co.stable for co in coords)
            await asyncio.sleep(0.2)
        owned = sum(len(c.assignment()) for c in consumers)
        print(f"{protocol}: {len(consumers)} members stable in {time.monotonic() - started:.1f} s, "
              f"{owned} partitions owned", flush=True)
        # the last hand-overs and the new owners' position lookups settle
        await asyncio.sleep(max(8.0, 3 * args.heartbeat_ms / 1000))
        loop = asyncio.get_running_loop()
        timers = 0
        call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *a: Any, **kw: Any) -> asyncio.TimerHandle:
            nonlocal timers
            timers += 1
            return call_at(when, callback, *a, **kw)

        setattr(loop, "call_at", counting_call_at)  # noqa: B010 (counts the loop timers scheduled)
        hb0 = sum(co.heartbeats for co in coords)
        cpu0, wall0 = time.process_time(), time.monotonic()
        bcpu0 = proc_cpu(broker_pid) if broker_pid else 0.0
        await asyncio.sleep(args.seconds)
        wall = time.monotonic() - wall0
        cpu = time.process_time() - cpu0
        bcpu = (proc_cpu(broker_pid) - bcpu0) if broker_pid else float("nan")
        del loop.call_at  # the class's again
        hb = sum(co.heartbeats for co in coords) - hb0
        tasks = len(asyncio.all_tasks()) - tasks_before
        stable = sum(co.stable for co in coords)
        owned = sum(len(c.assignment()) for c in consumers)
        out = {"members": len(consumers), "stable_after": stable, "owned": owned, "tasks": tasks,
               "cpu_pct": 100 * cpu / wall,
               "cpu_ms_per_hb": 1000 * cpu / max(hb, 1), "heartbeats_per_s": hb / wall,
               "timers_per_s": timers / wall, "broker_cpu_pct": 100 * bcpu / wall}
        print(f"{protocol}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in out.items()), flush=True)
        return out
    finally:
        await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--group-size", type=int, default=10)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--protocols", default="classic,consumer")
    ap.add_argument("--bootstrap", help="an Apache Kafka 4.x broker to use instead of an embedded one")
    args = ap.parse_args()
    broker = None
    if args.bootstrap is None:
        broker = EmbeddedKafka(log_file=Path(tempfile.mkdtemp()) / "kafka.log", overrides={
            "group.consumer.heartbeat.interval.ms": str(args.heartbeat_ms),
            "group.consumer.min.heartbeat.interval.ms": str(min(args.heartbeat_ms, 1000))})
        broker.start()
    try:
        bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
        for protocol in args.protocols.split(","):
            asyncio.run(run(protocol, bootstrap, args, broker.pid if broker else None))
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
