"""SIGTERM drains instead of cutting: black-box, a real gateway process over Tansu, every record counted.

At SIGTERM the gateway stops handing out records at once (long polls return [], streams end with a final
``{"error_code": 50301, ...}`` line or ``event: shutdown``), keeps its listener open for a short drain
window so that clients can commit what they received (new instances: 503 + Retry-After), then closes the
instances and exits. A client that commits after the final line loses nothing and gets no duplicate
after the restart.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.fault]

H = {"Content-Type": "application/vnd.kafka.v2+json"}
NDJSON = {"Accept": "application/x-ndjson"}
RECORDS = 20_000
PARTITIONS = 2
COMMIT_EVERY = 500
SIGTERM_AFTER = 2_250  # not a multiple of COMMIT_EVERY: some records are received but not yet committed
# 1 kB values (20 MB in all): far more than the socket buffers between gateway and client hold, so that
# most of the topic is left for after the restart
PAD = b"x" * 1000
EXIT_BUDGET_S = 3.0


def produce(bootstrap: str, topic: str, n: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=b"%d " % i + PAD, partition=i % PARTITIONS)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


async def create(http: httpx.AsyncClient, group: str, name: str, topic: str, auto_commit: bool = False) -> str:
    r = await http.post(f"/consumers/{group}", headers=H, json={
        "name": name, "auto.offset.reset": "earliest", "auto.commit.enable": str(auto_commit).lower()})
    assert r.status_code == 200, r.text
    base = f"/consumers/{group}/instances/{name}"
    assert (await http.post(f"{base}/subscription", json={"topics": [topic]}, headers=H)).status_code == 204
    return base


async def commit(http: httpx.AsyncClient, base: str, topic: str, last: dict[int, int]) -> int:
    """Commit the last received offset of each partition (the gateway commits offset + 1)."""
    r = await http.post(f"{base}/offsets", headers=H, json={"offsets": [
        {"topic": topic, "partition": p, "offset": o} for p, o in sorted(last.items())]})
    return r.status_code


def value(rec: dict[str, Any]) -> int:
    return int(base64.b64decode(rec["value"]).split(b" ", 1)[0])


@pytest.mark.parametrize("auto_commit", [False, True], ids=["client-commits", "auto-commit"])
async def test_sigterm_ends_streams_cleanly_and_a_committing_client_loses_and_repeats_nothing(
        broker: AnyBroker, topic_name: str, tmp_path: Path, auto_commit: bool) -> None:
    """Without auto-commit the client commits every 500 records and, after the shutdown line, what it
    received; with auto-commit it never commits: the gateway's final commit at close covers everything
    it handed out, which the client reads up to the shutdown line."""
    kc = KafkaClient(broker.bootstrap)
    try:
        await kc.create_topics({topic_name: PARTITIONS, topic_name + "-empty": 1})
    finally:
        await kc.close()
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, RECORDS)
    gw = GatewayProcess(broker.bootstrap, log_file=tmp_path / "gateway.log")
    gw2 = GatewayProcess(broker.bootstrap, log_file=tmp_path / "gateway2.log")
    gw.start()
    seen: list[int] = []
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            base = await create(http, "g-drain", "c1", topic_name, auto_commit)
            # a long poll on an empty topic, in flight at SIGTERM: it must return [] at once
            idle = await create(http, "g-idle", "c1", topic_name + "-empty")
            assert (await http.get(f"{idle}/records", params={"timeout": 500})).status_code == 200  # joined
            long_poll = asyncio.create_task(http.get(f"{idle}/records", params={"timeout": 20_000}))
            long_poll_done: list[float] = []
            long_poll.add_done_callback(lambda _: long_poll_done.append(time.monotonic()))
            last: dict[int, int] = {}
            committed_count = 0
            final: dict[str, Any] | None = None
            sigterm_at = 0.0
            assert gw.proc is not None
            async with http.stream("GET", f"{base}/records", headers=NDJSON) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    rec = json.loads(line)
                    if "error_code" in rec:
                        final = rec
                        continue  # the stream must end right after it
                    assert final is None, "a record after the shutdown line"
                    seen.append(value(rec))
                    last[rec["partition"]] = rec["offset"]
                    if len(seen) % COMMIT_EVERY == 0 and not sigterm_at and not auto_commit:
                        assert await commit(http, base, topic_name, last) == 200
                        committed_count = len(seen)
                    if len(seen) == SIGTERM_AFTER:
                        gw.proc.send_signal(signal.SIGTERM)
                        sigterm_at = time.monotonic()
            ended = time.monotonic() - sigterm_at
            assert sigterm_at, f"the stream ended before {SIGTERM_AFTER} records ({len(seen)})"
            assert final is not None, "no shutdown line at the end of the stream"
            assert final["error_code"] == 50301 and "commit" in final["message"], final
            received_at_sigterm_uncommitted = SIGTERM_AFTER - committed_count
            # during the drain window: new instances are refused, commits are served
            r = await http.post("/consumers/g-drain", headers=H, json={"name": "late"})
            assert r.status_code == 503 and r.json()["error_code"] == 50301 and r.headers["retry-after"], r.text
            if not auto_commit:
                assert await commit(http, base, topic_name, last) == 200
                committed_count = len(seen)
            polled = await asyncio.wait_for(long_poll, 5)
            assert polled.status_code == 200 and polled.json() == [], polled.text
            assert long_poll_done[0] - sigterm_at < 1.0, "the long poll did not return at SIGTERM"
            code = await asyncio.to_thread(gw.proc.wait, 20)
            elapsed = time.monotonic() - sigterm_at
        print(f"stream ended {ended:.2f} s after SIGTERM; exit after {elapsed:.2f} s; "
              f"{len(seen)} records received before the restart ({len(seen) - SIGTERM_AFTER} after SIGTERM), "
              f"{received_at_sigterm_uncommitted} of them uncommitted at SIGTERM")
        assert code == 0
        assert elapsed < EXIT_BUDGET_S, elapsed
        log = (tmp_path / "gateway.log").read_text()
        assert "did not close cleanly" not in log, log

        # restart on the same broker: the rest, from the committed offsets
        before = len(seen)
        gw2.start()
        async with httpx.AsyncClient(base_url=gw2.url, timeout=30) as http:
            base = await create(http, "g-drain", "c2", topic_name)
            deadline = time.monotonic() + 60
            while len(set(seen)) < RECORDS and time.monotonic() < deadline:
                r = await http.get(f"{base}/records", params={"timeout": 1000, "max_records": 5000})
                assert r.status_code == 200, r.text
                seen.extend(value(rec) for rec in r.json())
        duplicates = len(seen) - len(set(seen))
        print(f"after the restart: {len(seen) - before} more records; {duplicates} duplicates in all")
        assert set(seen) == set(range(RECORDS)), f"lost {RECORDS - len(set(seen))} records"
        assert duplicates == 0, duplicates
    finally:
        gw.stop()
        gw2.stop()


async def test_sigterm_ends_an_sse_stream_with_a_shutdown_event(
        broker: AnyBroker, topic_name: str, tmp_path: Path) -> None:
    kc = KafkaClient(broker.bootstrap)
    try:
        await kc.create_topics({topic_name: 1})
    finally:
        await kc.close()
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 10)
    gw = GatewayProcess(broker.bootstrap, log_file=tmp_path / "gateway.log")
    gw.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            base = await create(http, "g-sse", "c1", topic_name)
            events: list[tuple[str, str]] = []
            assert gw.proc is not None
            async with http.stream("GET", f"{base}/records", headers={"Accept": "text/event-stream"}) as resp:
                event = "message"
                async for line in resp.aiter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    elif line.startswith("data:"):
                        events.append((event, line.split(":", 1)[1].strip()))
                        if event == "message" and sum(e == "message" for e, _ in events) == 1:
                            gw.proc.send_signal(signal.SIGTERM)
                        event = "message"
            assert events and events[-1][0] == "shutdown", events
            assert json.loads(events[-1][1])["error_code"] == 50301
            assert await commit(http, base, topic_name, {0: 9}) == 200
            assert await asyncio.to_thread(gw.proc.wait, 20) == 0
    finally:
        gw.stop()
