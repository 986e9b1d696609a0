"""Decompression bombs.

100 MiB of zeros compressed with gzip (~100 KB) and with zstd (a streaming frame that does not declare its
size, ~3 KB) are written straight to the broker. Against a real gateway whose batch bound is lowered to
``LIMIT`` (``GATEWAY_MAX_BATCH_INFLATED_BYTES``):

- range reads of either bomb with ``max_bytes=1``, two at a time, are refused with 422/42209 naming topic,
  partition and offset, while another topic's range reads keep being answered, and the gateway's peak RSS
  (``VmHWM``) grows by no more than the two concurrent bounded buffers plus ``MARGIN``;
- the sink (which reads through the range endpoint) fails with that error instead of loading the bomb;
- a consumer instance subscribed to the topic gets one clear 422 for the bomb partition, keeps receiving the
  healthy partition's records meanwhile, and after seeking past the bombs receives the records behind them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cramjam
import httpx
import pytest

from service.client.client import KafkaClient
from service.protocol import compression as Z
from service.protocol import records as R
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.security.raw_kafka import produce_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MiB = 1024 * 1024
LIMIT = 16 * MiB  # the gateway's bound in this test (default 64 MiB)
BOMB = 100 * MiB  # zeros per bomb
MARGIN = 48 * MiB  # allocator slack, response buffers, the healthy reads running meanwhile
# partition 0: gzip bomb @0, zstd bomb @1, healthy records @2..; partition 1: healthy
TOPIC = f"bombs-{uuid.uuid4().hex[:8]}"
OTHER = f"healthy-neighbour-{uuid.uuid4().hex[:8]}"
HEALTHY = 20
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY = {"Accept": "application/vnd.kafka.binary.v2+json"}


def _zstd_streaming_bomb() -> bytes:
    """A zstd bomb batch whose frame does not declare its content size (the bound's hard case)."""
    body = R.build_batch([(None, b"\0" * BOMB)])[R.BATCH_HEADER_SIZE:]
    c = cramjam.zstd.Compressor()
    c.compress(body)
    frame = bytes(c.finish())
    assert Z._zstd_content_size(memoryview(frame)) is None
    orig = R.compress
    R.compress = lambda _c, _d: frame  # build_batch compresses through the module function
    try:
        return R.build_batch([(None, b"\0" * BOMB)], compression=R.Compression.ZSTD)
    finally:
        R.compress = orig


async def _setup(bootstrap: str) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics({TOPIC: 2, OTHER: 1})
        await client.refresh_metadata({TOPIC, OTHER})
        batches = [
            (TOPIC, 0, R.build_batch([(None, b"\0" * BOMB)], compression=R.Compression.GZIP)),
            (TOPIC, 0, _zstd_streaming_bomb()),
            (TOPIC, 0, R.build_batch([(None, b"p0-%d" % i) for i in range(HEALTHY)], compression=R.Compression.GZIP)),
            (TOPIC, 1, R.build_batch([(None, b"p1-%d" % i) for i in range(HEALTHY)], compression=R.Compression.ZSTD)),
            (OTHER, 0, R.build_batch([(None, b"o-%d" % i) for i in range(HEALTHY)], compression=R.Compression.GZIP)),
        ]
        assert len(batches[0][2]) < 200_000 and len(batches[1][2]) < 10_000  # small on the wire
        for topic, partition, batch in batches:
            node = client.metadata.leader(topic, partition)
            assert node is not None
            conn = await client.connection(node).get()
            resp = await conn.send(produce_request(topic, partition, batch), 9)
            assert resp.responses[0].partition_responses[0].error_code == 0
    finally:
        await client.close()


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    asyncio.run(_setup(broker.bootstrap))
    log = Path(tmp_path_factory.mktemp("bomb")) / "gateway.log"
    g = GatewayProcess(broker.bootstrap, env={"GATEWAY_MAX_BATCH_INFLATED_BYTES": str(LIMIT)}, log_file=log)
    with g:
        yield g


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _records_url(g: GatewayProcess, topic: str, partition: int) -> str:
    return f"{g.url}/topics/{topic}/partitions/{partition}/records"


def _assert_bomb_refusal(r: httpx.Response, offset: int) -> None:
    assert r.status_code == 422, r.text[:300]
    body = r.json()
    assert body["error_code"] == 42209
    msg = body["message"]
    assert f"topic={TOPIC}" in msg and "partition=0" in msg and f"offset={offset}" in msg, msg
    assert str(LIMIT) in msg and f"seek to offset {offset + 1}" in msg, msg
    assert (r.headers["x-error-topic"], r.headers["x-error-partition"], r.headers["x-error-offset"]) == (
        TOPIC, "0", str(offset))


def test_range_reads_of_bombs_are_refused_with_bounded_memory(gw: GatewayProcess) -> None:
    assert gw.proc is not None
    pid = gw.proc.pid
    with httpx.Client(timeout=60) as c:
        # warm up the paths the attack and the neighbour use (imports, connections, metadata)
        r = c.get(_records_url(gw, OTHER, 0), params={"offset": 0}, headers=BINARY)
        assert r.status_code == 200 and len(r.json()["records"]) == HEALTHY
        r = c.get(_records_url(gw, TOPIC, 0), params={"offset": 2}, headers=BINARY)
        assert r.status_code == 200 and r.json()["records"][0]["offset"] == 2
    base_hwm = _status_kib(pid, "VmHWM") * 1024

    def attack(offset: int) -> httpx.Response:
        with httpx.Client(timeout=60) as c:
            return c.get(_records_url(gw, TOPIC, 0), params={"offset": offset, "max_bytes": 1}, headers=BINARY)

    def neighbour() -> list[int]:
        out = []
        with httpx.Client(timeout=60) as c:
            for _ in range(10):
                r = c.get(_records_url(gw, OTHER, 0), params={"offset": 0, "max_bytes": 1}, headers=BINARY)
                out.append(r.status_code)
        return out

    with ThreadPoolExecutor(6) as pool:
        for offset in (0, 1, 0, 1):  # gzip, zstd, again: two concurrent readers each time
            side = pool.submit(neighbour)
            got = list(pool.map(attack, [offset, offset]))
            for r in got:
                _assert_bomb_refusal(r, offset)
            assert side.result() == [200] * 10  # another topic's reads were answered during the attack
    peak = _status_kib(pid, "VmHWM") * 1024
    assert peak - base_hwm <= 2 * LIMIT + MARGIN, (
        f"peak RSS grew by {(peak - base_hwm) / MiB:.0f} MiB (bound {LIMIT / MiB:.0f} MiB x 2 concurrent reads "
        f"+ {MARGIN / MiB:.0f} MiB margin)")
    # the healthy records behind the bombs are still readable, and the gateway still answers everything else
    with httpx.Client(timeout=60) as c:
        r = c.get(_records_url(gw, TOPIC, 0), params={"offset": 2}, headers=BINARY)
        assert r.status_code == 200 and len(r.json()["records"]) == HEALTHY
        assert c.get(f"{gw.url}/healthz").status_code == 200


def test_sink_read_of_a_bomb_fails_with_the_gateways_error(gw: GatewayProcess) -> None:
    from sink.http import GatewayHTTPError
    from sink.source import RangePartition, read_range

    with pytest.raises(GatewayHTTPError) as ei:
        list(read_range(RangePartition(gw.url, None, TOPIC, 0, 0, 2 + HEALTHY)))
    e = ei.value
    assert (e.status, e.error_code) == (422, 42209)
    assert f"topic={TOPIC}" in str(e) and "partition=0" in str(e) and "offset=0" in str(e)
    # the same sink reads the range behind the bombs
    rows = sum(b.num_rows for b in read_range(RangePartition(gw.url, None, TOPIC, 0, 2, 2 + HEALTHY)))
    assert rows == HEALTHY


def test_consumer_gets_a_clear_error_and_other_partitions_keep_flowing(gw: GatewayProcess) -> None:
    group, name = "bomb-group", "c1"
    base = f"{gw.url}/consumers/{group}/instances/{name}"
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{gw.url}/consumers/{group}", headers=V2,
                   json={"name": name, "format": "binary", "auto.offset.reset": "earliest"})
        assert r.status_code == 200, r.text
        assert c.post(f"{base}/subscription", headers=V2, json={"topics": [TOPIC]}).status_code == 204
        got: dict[int, list[int]] = {0: [], 1: []}
        errors: list[httpx.Response] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (len(got[1]) == HEALTHY and errors):
            r = c.get(f"{base}/records", params={"timeout": 500}, headers=BINARY)
            if r.status_code == 422:
                errors.append(r)
                continue
            assert r.status_code == 200, r.text[:300]
            for rec in r.json():
                got[rec["partition"]].append(rec["offset"])
        assert errors, "the bomb partition was never reported"
        for r in errors:
            _assert_bomb_refusal(r, 0)
        assert got[1] == list(range(HEALTHY))  # the healthy partition kept flowing
        assert got[0] == []  # the bomb partition does not advance by itself
        # reported once: the partition is held back, the healthy one's later polls carry no error
        for _ in range(3):
            r = c.get(f"{base}/records", params={"timeout": 200}, headers=BINARY)
            assert r.status_code == 200 and r.json() == []
        # the client skips the bombs by seeking past them (the error said where)
        r = c.post(f"{base}/positions", headers=V2, json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": 2}]})
        assert r.status_code == 204, r.text
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(got[0]) < HEALTHY:
            r = c.get(f"{base}/records", params={"timeout": 500}, headers=BINARY)
            assert r.status_code == 200, r.text[:300]
            for rec in r.json():
                got[rec["partition"]].append(rec["offset"])
        assert got[0] == list(range(2, 2 + HEALTHY))
        assert c.delete(base, headers=V2).status_code == 204


def test_stream_ends_with_the_bomb_error_code(gw: GatewayProcess) -> None:
    group, name = "bomb-stream-group", "s1"
    base = f"{gw.url}/consumers/{group}/instances/{name}"
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{gw.url}/consumers/{group}", headers=V2,
                   json={"name": name, "format": "binary", "auto.offset.reset": "earliest"})
        assert r.status_code == 200, r.text
        r = c.post(f"{base}/assignments", headers=V2, json={"partitions": [{"topic": TOPIC, "partition": 0}]})
        assert r.status_code == 204, r.text
        lines: list[dict[str, Any]] = []
        with c.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if line:
                    lines.append(json.loads(line))
                    if "error_code" in lines[-1]:
                        break
        assert lines and lines[-1]["error_code"] == 42209, lines[-1:]  # the poll's code, not a generic 50002
        assert f"topic={TOPIC}, partition=0, offset=0" in lines[-1]["message"]
        assert c.delete(base, headers=V2).status_code == 204
