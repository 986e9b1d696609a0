"""Hostile Avro records against a running gateway and a real registry (poison records: deep values and
amplification).

Any tenant may register a recursive record schema and write a value nested 20,000 levels deep in a few bytes,
or an array of ``null`` / empty records whose block counts claim 2**62 items in a kilobyte. Such a record
stays in its topic, so a gateway that crashes (fastavro's compiled reader recursing on the C stack), loops
(fastavro walking 2**62 empty items) or renders a hundred megabytes for it is down for good. Here each is
written straight to the broker with the Confluent wire framing, then read through every Avro path of the
gateway: a consumer instance's poll (confluent rendering), an ndjson stream of a karapace-rendering instance,
and a typed Arrow range read. Each must answer that record with its per-record error (``"value": null``,
``"value_error"``, ``"value_base64"``; an error row in Arrow) and go on serving: the healthy record behind it
arrives, ``/healthz`` answers, the answer stays small and the process's peak RSS does not jump.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from service.schemas.wire import frame
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
AVRO = "application/vnd.kafka.avro.v2+json"
ARROW = "application/vnd.apache.arrow.stream"
MiB = 1024 * 1024

RECURSIVE = {"type": "record", "name": "N", "fields": [{"name": "n", "type": ["null", "N"]}]}
NULLS = {"type": "array", "items": "null"}
EMPTIES = {"type": "array", "items": {"type": "record", "name": "E", "fields": []}}
DEEP_LEVELS = 20_000


def _long(n: int) -> bytes:
    """An Avro long (zigzag varint)."""
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _deep(levels: int) -> bytes:
    """A value of RECURSIVE nested ``levels`` records deep: union branch 1 (N) each level, then null."""
    return b"\x02" * (levels - 1) + b"\x00"


def _blocks(count: int, n: int) -> bytes:
    """An array of ``n`` blocks of ``count`` zero-byte items each."""
    return _long(count) * n + b"\x00"


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, schema_registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": schema_registry},
                        log_file=tmp_path_factory.mktemp("gw") / "gateway.log") as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c


def _topic(bootstrap: str) -> str:
    name = f"hostile-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, 1, 1)]).values():
        f.result(30)
    return name


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "message.max.bytes": 4 * MiB})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0


def _register(registry: str, subject: str, schema: dict[str, Any]) -> int:
    return SchemaRegistryClient({"url": registry}).register_schema(subject, Schema(json.dumps(schema), "AVRO"))


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("VmHWM not in /proc/status")


async def _instance(http: httpx.AsyncClient, topic: str, rendering: str = "confluent") -> str:
    r = await http.post(f"/consumers/g-{uuid.uuid4().hex[:8]}", headers=V2, json={
        "format": "avro", "auto.offset.reset": "earliest", "avro.json.rendering": rendering})
    assert r.status_code == 200, r.text
    base: str = r.json()["base_uri"]
    r = await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic]})
    assert r.status_code == 204, r.text
    return base


async def _poll(http: httpx.AsyncClient, topic: str, n: int) -> tuple[list[dict[str, Any]], int]:
    """n records through a confluent-rendering instance; also the largest answer's size."""
    base = await _instance(http, topic)
    got: list[dict[str, Any]] = []
    biggest = 0
    try:
        for _ in range(60):
            r = await http.get(f"{base}/records", headers={"Accept": AVRO}, params={"timeout": 1000})
            assert r.status_code == 200, r.text
            biggest = max(biggest, len(r.content))
            got += r.json()
            if len(got) >= n:
                return got, biggest
        raise AssertionError(f"{len(got)} of {n} records")
    finally:
        await http.delete(base, headers=V2)


async def _stream(http: httpx.AsyncClient, topic: str, n: int) -> list[dict[str, Any]]:
    """n records of an ndjson stream of a karapace-rendering instance."""
    base = await _instance(http, topic, "karapace")
    got: list[dict[str, Any]] = []
    try:
        async with http.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as s:
            assert s.status_code == 200
            async for line in s.aiter_lines():
                if line:
                    got.append(json.loads(line))
                if len(got) == n:
                    break
    finally:
        await http.delete(base, headers=V2)
    return got


async def _typed(http: httpx.AsyncClient, topic: str) -> list[dict[str, Any]]:
    r = await http.get(f"/topics/{topic}/partitions/0/records", headers={"Accept": ARROW},
                       params={"offset": 0, "format": "avro"})
    assert r.status_code == 200, r.text
    return pa.ipc.open_stream(r.content).read_all().to_pylist()  # type: ignore[no-any-return]


def _refused(rec: dict[str, Any], raw: bytes, why: str) -> None:
    assert rec["value"] is None, str(rec)[:300]
    assert why in rec["value_error"], rec["value_error"]
    assert base64.b64decode(rec["value_base64"]) == raw


async def test_a_value_nested_20000_levels_is_that_records_error(
        http: httpx.AsyncClient, gw: GatewayProcess, broker: AnyBroker, schema_registry: str) -> None:
    topic = _topic(broker.bootstrap)
    sid = _register(schema_registry, f"{topic}-value", RECURSIVE)
    deep = frame(sid, _deep(DEEP_LEVELS))
    healthy = frame(sid, _deep(3))
    _produce(broker.bootstrap, topic, [deep, healthy])

    got, _ = await _poll(http, topic, 2)  # on a gateway without the limits the process dies here (SIGSEGV)
    _refused(got[0], deep, "nested deeper than 64 levels")
    assert got[1]["value"] == {"n": {"N": {"n": {"N": {"n": None}}}}}
    assert (await http.get("/healthz")).status_code == 200

    streamed = await _stream(http, topic, 2)
    _refused(streamed[0], deep, "nested deeper than 64 levels")
    assert streamed[1]["value"] == {"n": {"n": {"n": None}}}  # karapace: unions untagged

    rows = await _typed(http, topic)
    assert len(rows) == 2
    assert rows[0]["value"] is None and "nested deeper than 64 levels" in rows[0]["error"]
    assert rows[0]["value_raw"] == deep
    assert rows[1]["error"] is None and rows[1]["value"] is not None
    assert gw.proc is not None and gw.proc.poll() is None
    assert (await http.get("/healthz")).status_code == 200


async def test_amplifying_block_counts_are_refused_small_and_fast(
        http: httpx.AsyncClient, gw: GatewayProcess, broker: AnyBroker, schema_registry: str) -> None:
    topic = _topic(broker.bootstrap)
    nulls = _register(schema_registry, f"{topic}-value", NULLS)
    empties = _register(schema_registry, f"{topic}-empties", EMPTIES)
    # ~900 bytes claiming 300 blocks of 65,536 nulls (98 MB of JSON), then single blocks of 2**62 and 65,537
    attacks = [frame(nulls, _blocks(65_536, 300)), frame(nulls, _blocks(2**62, 1)),
               frame(empties, _blocks(2**62, 1)), frame(empties, _blocks(65_537, 1))]
    assert all(len(a) < 1024 for a in attacks)
    healthy = frame(nulls, _blocks(3, 1))
    _produce(broker.bootstrap, topic, [*attacks, healthy])
    assert gw.proc is not None
    # warm the avro path (schemas, programs) so that the peak measured below is the attack's
    warm = _topic(broker.bootstrap)
    _produce(broker.bootstrap, warm, [healthy])
    await _poll(http, warm, 1)
    before = _peak_rss(gw.proc.pid)

    got, biggest = await _poll(http, topic, len(attacks) + 1)
    for rec, raw in zip(got, attacks, strict=False):
        _refused(rec, raw, "items for a")
    assert got[-1]["value"] == [None, None, None]
    assert biggest < 64 * 1024, biggest  # the answer stays small (98 MB without the bound)

    streamed = await _stream(http, topic, len(attacks) + 1)
    for rec, raw in zip(streamed, attacks, strict=False):
        _refused(rec, raw, "items for a")
    assert streamed[-1]["value"] == [None, None, None]

    rows = await _typed(http, topic)
    assert [r["error"] is not None for r in rows] == [True, True, True, True, False]
    assert all("items for a" in r["error"] for r in rows[:4])
    assert (await http.get("/healthz")).status_code == 200
    assert _peak_rss(gw.proc.pid) - before < 48 * MiB
