"""A slow streaming reader pauses fetching, not heartbeats: black-box, a real gateway process over Tansu.

The reader of an ``application/x-ndjson`` stream stops reading for twice the instance's session timeout.
Meanwhile the gateway must (a) keep the instance in its group — checked on the broker's side: a second
member joining at the end of the stall gets only part of the partitions, whereas it gets all of them
from a member that missed its heartbeats (Tansu expires a silent member when the group rebalances);
(b) not read ahead unboundedly — the prefetch buffer stays within GATEWAY_PREFETCH_BYTES_PER_INSTANCE
plus one fetch response and the stream stops well before the end of the data; and (c) after the reader
resumes, deliver every record exactly once, in order per partition.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from prometheus_client.parser import text_string_to_metric_families

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

V2 = "application/vnd.kafka.v2+json"
H = {"Content-Type": V2}
PARTITIONS = 2
RECORDS = 32_000  # 1,000-byte values: 32 MB, far more than the prefetch bound plus the sockets' buffers
VALUE_SIZE = 1000
PREFETCH = 64 * 1024
SESSION_MS = 6000
STALL_S = 2 * SESSION_MS / 1000  # the wall-clock stall is what this test is about
# Tansu 0.6.0 answers a Fetch with up to ~6 MB (measured: 5,940 records of 1 kB, 1,494 of 4 kB), whatever
# partition_max_bytes (1 MiB) says; the fetcher sends a fetch only while less than the prefetch bound is
# buffered, with one in flight per broker, so the buffer peaks below the bound plus one response.
FETCH_RESPONSE_MAX = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    g = GatewayProcess(broker.bootstrap, env={"GATEWAY_PREFETCH_BYTES_PER_INSTANCE": str(PREFETCH)},
                       log_file=tmp_path_factory.mktemp("gw-backpressure") / "gateway.log")
    g.start()
    try:
        yield g
    finally:
        g.stop()


def value_of(i: int) -> bytes:
    return (b"%08d" % i) * (VALUE_SIZE // 8)


def produce(bootstrap: str, topic: str) -> None:
    """Record i goes to partition i % PARTITIONS, so it has offset i // PARTITIONS there."""
    # small batches: a fetch response overshoots the broker's size cap by at most one batch
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 64 * 1024})
    for i in range(RECORDS):
        p.produce(topic, key=b"k%d" % i, value=value_of(i), partition=i % PARTITIONS)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def second_member_assignment(bootstrap: str, group: str, topic: str) -> list[int]:
    """Join the group with a plain Kafka consumer, return the partitions it is given, then leave
    (without committing: the gateway's instance gets its partitions back at its committed offsets)."""
    assigned = threading.Event()
    got: list[int] = []

    def on_assign(_: CKConsumer, parts: list[object]) -> None:
        got.extend(sorted(p.partition for p in parts))  # type: ignore[attr-defined]
        assigned.set()

    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                    "session.timeout.ms": SESSION_MS, "auto.offset.reset": "latest"})
    try:
        c.subscribe([topic], on_assign=on_assign)
        deadline = time.monotonic() + 20
        while not assigned.is_set() and time.monotonic() < deadline:
            c.poll(0.1)  # drives the group protocol; on_assign runs inside poll
        assert assigned.is_set(), "the second member was never assigned"
        return got
    finally:
        c.close()


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    """Sums over the tenant labels (this gateway process serves only this test's instance)."""
    r = await http.get("/metrics")
    assert r.status_code == 200, r.text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def test_slow_stream_reader_pauses_fetching_not_heartbeats(
        broker: AnyBroker, bclient: KafkaClient, gw: GatewayProcess, topic_name: str) -> None:
    await bclient.create_topics({topic_name: PARTITIONS})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name)
    group = f"g-{topic_name}"
    # the streaming connection has a small receive buffer (no autotuning), so that what the kernel absorbs
    # of a stalled stream (this buffer plus the gateway's send buffer) is a fraction of the data
    small_rcvbuf = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)])
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http, \
            httpx.AsyncClient(base_url=gw.url, timeout=60, transport=small_rcvbuf) as streaming:
        r = await http.post(f"/consumers/{group}", headers=H, json={
            "name": "slow", "auto.offset.reset": "earliest", "session.timeout.ms": str(SESSION_MS)})
        assert r.status_code == 200, r.text
        base = f"/consumers/{group}/instances/{r.json()['instance_id']}"
        assert (await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)).status_code == 204

        got: list[dict[str, object]] = []
        async with streaming.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            async for line in lines:  # read a little ...
                if line:
                    got.append(json.loads(line))
                if len(got) == 100:
                    break
            before = await scrape(http)
            assigned = (await http.get(f"{base}/assignments")).json()["partitions"]
            assert sorted(p["partition"] for p in assigned) == list(range(PARTITIONS))

            # ... then stop reading for twice the session timeout, watching the gateway meanwhile
            samples: list[dict[str, float]] = []
            stall_end = time.monotonic() + STALL_S
            while time.monotonic() < stall_end:
                samples.append(await scrape(http))
                await asyncio.sleep(0.5)  # sampling interval during the deliberate stall
            # (a) still stalled: a second member joins. The instance is still a member (it kept
            # heartbeating), so the rebalance splits the partitions instead of handing over all of them.
            second = await asyncio.to_thread(second_member_assignment, broker.bootstrap, group, topic_name)
            assert second and len(second) < PARTITIONS, f"the second member got {second}: the instance was expired"
            samples.append(await scrape(http))
            stalled = samples[-1]

            # (b) bounded read-ahead while stalled
            peak = max(s.get("kcg_prefetch_buffer_bytes", 0.0) for s in samples)
            print(f"stalled reader: prefetch buffer peak {peak / 1e6:.2f} MB, "
                  f"{stalled['kcg_records_delivered_total']:.0f} of {RECORDS} records written to the stream, "
                  f"second member got partitions {second}")
            assert peak <= PREFETCH + FETCH_RESPONSE_MAX, f"prefetch buffer reached {peak:.0f} bytes"
            delivered = stalled["kcg_records_delivered_total"]
            assert delivered < RECORDS / 2, f"{delivered:.0f} records were pushed to a reader that reads nothing"
            # the stream stood still for the second half of the stall: nothing more was written
            assert samples[len(samples) // 2]["kcg_records_delivered_total"] == delivered
            # heartbeats went on: no rebalance until the second member came
            assert samples[-2]["kcg_rebalances_total"] == before["kcg_rebalances_total"]

            # The second member has left: still without reading, wait until the instance owns every
            # partition again (its second rebalance). Resuming during that rebalance would test another
            # thing: records drained while the revocation commit is in flight are not covered by it.
            deadline = time.monotonic() + 30
            while True:
                owned = (await http.get(f"{base}/assignments")).json()["partitions"]
                rebalances = (await scrape(http))["kcg_rebalances_total"]
                if ((len(owned) == PARTITIONS and rebalances >= before["kcg_rebalances_total"] + 2)
                        or time.monotonic() > deadline):
                    break
                await asyncio.sleep(0.1)  # nothing to await from outside the gateway process
            assert sorted(p["partition"] for p in owned) == list(range(PARTITIONS))

            # (c) read everything now: each record exactly once, in order per partition
            async for line in lines:
                if line:
                    got.append(json.loads(line))
                if len(got) == RECORDS:
                    break
        by_partition: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        for rec in got:
            p, off = int(str(rec["partition"])), int(str(rec["offset"]))
            assert base64.b64decode(str(rec["value"])) == value_of(off * PARTITIONS + p), (p, off)
            by_partition[p].append(off)
        for p, offsets in by_partition.items():
            assert offsets == list(range(RECORDS // PARTITIONS)), f"partition {p}: not each offset once, in order"
        after = await scrape(http)
        # nothing was delivered twice (e.g. pushed into the socket before a rebalance and again after it)
        assert after["kcg_records_delivered_total"] == RECORDS
        assert (await http.delete(base)).status_code == 204
