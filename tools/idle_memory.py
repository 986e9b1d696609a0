"""Where the memory of idle subscribed consumer instances goes (the idle row of the bench), in-process.

Starts an embedded Tansu broker and a :class:`service.instances.registry.Gateway` in this process, creates
``--instances`` instances in groups of ``--per-group`` (one ``--per-group``-partition topic, so every member
owns one partition), subscribes them and polls each until it owns a partition, waits until the fetchers
paused (``--idle-pause-ms``), and then compares a tracemalloc snapshot with one taken after a warm-up
instance (created, subscribed, polled, deleted). Prints the top allocation sites per instance grouped by
line and by traceback, the growth in live objects by type, and asyncio tasks per instance.

This drives the service layer, not HTTP: what the HTTP routes add per instance (a bound ``topic_filter``)
is applied as they do. RSS also counts allocator overhead and fragmentation: compare with
``bench/http_consume.py --idle-instances N`` for the headline number.

Usage: .venv/bin/python tools/idle_memory.py [--instances 1000] [--per-group 20] [--top 30] [--frames 6]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import logging
import os
import sys
import time
import tracemalloc
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from service.client.client import KafkaClient
from service.consumer.subscription import TopicPartition
from service.embedded.tansu import EmbeddedBroker
from service.instances.registry import ConsumerInstance, Gateway, InstanceOptions, TenantRuntime


def allows_topic(topic: str) -> bool:  # the open tenant's filter (api sets tenant.allows_topic per instance)
    return True


async def member(gw: Gateway, rt: TenantRuntime, group: str, name: str, topic: str) -> ConsumerInstance:
    inst = await gw.create_instance(rt, group, InstanceOptions(), name)
    inst.consumer.subs.topic_filter = allows_topic
    await inst.consumer.subscribe(topics=[topic])
    while True:
        await gw.poll(inst, 500, None, 5.0)
        inst.touch()
        if inst.consumer.assignment():
            return inst


def type_counts() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


async def run(a: argparse.Namespace, bootstrap: str) -> None:
    topic = f"idle-mem-{time.time_ns() % 10**6}"
    admin = KafkaClient(bootstrap)
    await admin.create_topics({topic: a.per_group})
    await admin.close()
    gw = Gateway(consumer_defaults={
        "session_timeout_ms": a.session_ms, "heartbeat_interval_ms": a.heartbeat_ms,
        "max_poll_interval_ms": 3_600_000, "fetch_idle_pause_ms": a.idle_pause_ms, "client_rack": ""},
        idle_timeout=3600)
    rt = gw.tenant("default", bootstrap)
    # warm-up: one instance through its whole life, so one-time costs are in the baseline
    warm = await member(gw, rt, "warm-up", "w", topic)
    await gw.delete_instance(rt, "warm-up", warm.instance_id)
    del warm
    await asyncio.sleep(a.idle_pause_ms / 1000 + 1)
    gc.collect()
    tracemalloc.start(a.frames)  # only now: what the warm-up and imports allocated is not traced
    tasks0 = len(asyncio.all_tasks())
    types0 = type_counts()
    snap0 = tracemalloc.take_snapshot()
    groups = max(1, a.instances // a.per_group)
    n = groups * a.per_group
    sem = asyncio.Semaphore(a.groups_in_flight)
    started = time.perf_counter()

    async def group(g: int) -> list[ConsumerInstance]:
        async with sem:
            return await asyncio.gather(*(member(gw, rt, f"g{g:03d}", f"m{i:03d}", topic)
                                          for i in range(a.per_group)))

    made = await asyncio.gather(*(group(g) for g in range(groups)))
    print(f"{n} instances joined in {time.perf_counter() - started:.0f} s; idle for {a.settle:.0f} s", flush=True)
    await asyncio.sleep(a.settle)
    gc.collect()
    assigned = sum(1 for insts in made for i in insts if i.consumer.assignment())
    snap1 = tracemalloc.take_snapshot()
    types1 = type_counts()
    tasks1 = len(asyncio.all_tasks())
    filters = [tracemalloc.Filter(False, tracemalloc.__file__),
               tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    snap0, snap1 = snap0.filter_traces(filters), snap1.filter_traces(filters)
    total = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    print(f"{assigned} of {n} still assigned; traced growth {total / n:,.0f} B per instance;"
          f" asyncio tasks {(tasks1 - tasks0) / n:.2f} per instance")
    print("\n== top lines (bytes per instance, objects per instance) ==")
    for s in snap1.compare_to(snap0, "lineno")[:a.top]:
        fr = s.traceback[0]
        print(f"{s.size_diff / n:8.0f} B {s.count_diff / n:6.2f}"
              f"  {fr.filename.replace(os.getcwd() + '/', '')}:{fr.lineno}")
    print(f"\n== top tracebacks ({a.frames} frames) ==")
    stats = snap1.compare_to(snap0, "traceback")
    for s in stats[:a.top]:
        print(f"{s.size_diff / n:8.0f} B {s.count_diff / n:6.2f}")
        for fr in list(s.traceback)[-a.frames:][::-1]:
            print(f"      {fr.filename.replace(os.getcwd() + '/', '')}:{fr.lineno}")
    print("\n== live objects by type (per instance) ==")
    diff = {k: types1[k] - types0.get(k, 0) for k in types1}
    for k, v in sorted(diff.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"{v / n:8.2f}  {k}")
    sample: Any = made[0][0]
    print("\n== one instance ==")
    for label, obj in (("ConsumerInstance", sample), ("Consumer", sample.consumer),
                       ("GroupMember", sample.consumer.member), ("GroupCoordinator", sample.consumer.coordinator),
                       ("Fetcher", sample.consumer.fetcher), ("SubscriptionState", sample.consumer.subs)):
        d = getattr(obj, "__dict__", None)
        print(f"{label}: {sys.getsizeof(obj)} B + __dict__ {sys.getsizeof(d) if d is not None else 0} B"
              f" ({len(d) if d is not None else 0} attributes)")
    tp = TopicPartition(topic, 0)
    print(f"TopicPartition {sys.getsizeof(tp)} B")
    await gw.close()
    await rt.client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--per-group", type=int, default=20)
    ap.add_argument("--groups-in-flight", type=int, default=50)
    ap.add_argument("--session-ms", type=int, default=20000)
    ap.add_argument("--heartbeat-ms", type=int, default=5000)
    ap.add_argument("--idle-pause-ms", type=int, default=3000)
    ap.add_argument("--settle", type=float, default=8.0, help="seconds idle after all joined")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--frames", type=int, default=6)
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # stall recoveries of a slowed-down build log at WARNING
    with EmbeddedBroker() as broker:
        asyncio.run(run(a, broker.bootstrap))


if __name__ == "__main__":
    main()
