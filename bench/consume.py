"""Consume throughput: our consumer engine vs a tuned direct confluent-kafka (librdkafka) consumer.

Both read the same data from the same embedded Tansu broker in the same run:
- 200,000 x 100-byte records in a 4-partition topic, uncompressed;
- the same in a 6-partition topic compressed with lz4.
The direct consumer is tuned for its best throughput (``fetch.queue.backoff.ms=10``: with defaults
librdkafka pauses fetching for 1 s whenever its queue fills on this broker). Steady-state rate is
measured from the first to the last record; time to first record separately.

Usage: .venv/bin/python bench/consume.py [--records N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from service.consumer.subscription import TopicPartition
from service.embedded.tansu import EmbeddedBroker


@dataclass
class Result:
    name: str
    records: int
    first_record_s: float
    steady_rate: float
    total_s: float


def produce(bootstrap: str, topic: str, n: int, partitions: int, codec: str) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20,
                    "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000})
    value = b"x" * 100
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, key=b"%08d" % i, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def direct(bootstrap: str, topic: str, partitions: int, n: int) -> Result:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"bench-direct-{time.time_ns()}",
                    "enable.auto.commit": False, "fetch.queue.backoff.ms": 10,
                    "queued.max.messages.kbytes": 262144, "fetch.max.bytes": 52428800,
                    "max.partition.fetch.bytes": 4194304})
    c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    t0 = time.perf_counter()
    first = last = 0.0
    while got < n:
        msgs = c.consume(num_messages=10000, timeout=1.0)
        now = time.perf_counter()
        for m in msgs:
            if m.error() is None:
                if got == 0:
                    first = now
                got += 1
        if msgs:
            last = now
        if now - t0 > 120:
            break
    c.close()
    return Result("confluent-kafka (tuned)", got, first - t0, (got - 1) / max(1e-9, last - first), last - t0)


async def ours(bootstrap: str, topic: str, partitions: int, n: int) -> Result:
    client = KafkaClient(bootstrap)
    c = Consumer(client, ConsumerConfig(group_id=None, auto_offset_reset="earliest",
                                        max_partition_fetch_bytes=4 * 1024 * 1024,
                                        prefetch_max_bytes=32 * 1024 * 1024))
    t0 = time.perf_counter()
    await c.assign([TopicPartition(topic, p) for p in range(partitions)])
    got = 0
    first = last = 0.0
    while got < n:
        chunks = await c.poll_batches(max_records=20000, timeout=1.0)
        now = time.perf_counter()
        if chunks:
            if got == 0:
                first = now
            got += sum(len(recs) for _, recs in chunks)
            last = now
        if now - t0 > 120:
            break
    await c.close()
    await client.close()
    return Result("kafka-consumer-gateway engine", got, first - t0, (got - 1) / max(1e-9, last - first), last - t0)


def report(title: str, results: list[list[Result]]) -> None:
    print(f"\n{title}")
    print(f"{'consumer':32} {'records':>9} {'first record':>13} {'steady rec/s':>14} {'overall rec/s':>14}"
          f" {'total s':>8}")
    base = statistics.median(r[0].steady_rate for r in results)
    base_all = statistics.median(r[0].records / r[0].total_s for r in results)
    for i in range(len(results[0])):
        rs = [r[i] for r in results]
        rate = statistics.median(r.steady_rate for r in rs)
        overall = statistics.median(r.records / r.total_s for r in rs)
        ttfr = statistics.median(r.first_record_s for r in rs)
        tot = statistics.median(r.total_s for r in rs)
        print(f"{rs[0].name:32} {rs[0].records:>9,} {ttfr * 1000:>10.1f} ms {rate:>14,.0f} {overall:>14,.0f}"
              f" {tot:>8.2f}" + (f"   ratio steady {rate / base:.2f}x, overall {overall / base_all:.2f}x" if i else ""))
    print("(steady = first to last record; overall = records / time from start to last record)")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    broker = EmbeddedBroker()
    broker.start()
    try:
        setup = KafkaClient(broker.bootstrap)
        for topic, parts, codec in (("bench-plain", 4, "none"), ("bench-lz4", 6, "lz4")):
            await setup.create_topics({topic: parts})
            await asyncio.to_thread(produce, broker.bootstrap, topic, args.records, parts, codec)
            rounds = []
            for _ in range(args.rounds):
                d = await asyncio.to_thread(direct, broker.bootstrap, topic, parts, args.records)
                o = await ours(broker.bootstrap, topic, parts, args.records)
                rounds.append([d, o])
            report(f"{args.records:,} x 100-byte records, {parts} partitions, {codec} "
                   f"(median of {args.rounds} rounds)", rounds)
        await setup.close()
    finally:
        broker.stop()


if __name__ == "__main__":
    asyncio.run(main())
