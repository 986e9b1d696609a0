"""Large schemas: bounded by size, compiled off the event loop, never kept when they failed.

Against a running gateway whose registry (:mod:`tests.security.fake_registry`, real HTTP) refuses every schema
posted to it (422, as the registry of the original report did), with the default
``GATEWAY_SCHEMA_MAX_BYTES`` (256 KiB):

- six produces, each with a different ~0.75 MB Avro ``value_schema``, are refused 413/41302 before anything is
  compiled or sent to the registry;
- six produces with different ~200 KB schemas (under the limit) are compiled -- on the worker thread -- and
  answered 422/42205 (the registry refused them), and nothing of them is kept;
- a produce naming by ``value_schema_id`` a schema the registry holds over the limit is 413/41302 too, and an
  avro consumer reading a record framed with that id gets it as a per-record error with its bytes;
- meanwhile ``/healthz`` is answered within 0.5 s every time (each compile used to hold the event loop 0.2-1 s),
  and the gateway's RSS grows by less than ``MARGIN`` (it grew by ~300 MB, never released);
- an avro consumer whose first poll names four ~200 KB schemas the registry holds gets every record decoded
  while ``/healthz`` keeps answering within 0.5 s (the four compiles run on the worker thread).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.security.fake_registry import FakeRegistry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MiB = 1024 * 1024
TOPIC = "schema-size"
BIG_ID = 77
COMPILED_IDS = (201, 202, 203, 204)  # ~200 KB schemas the registry holds (under the limit)
OTHER_TOPIC = "schema-size-consume"
MARGIN = 64 * MiB
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
AVRO_PRODUCE = {"Content-Type": "application/vnd.kafka.avro.v2+json"}
BINARY_PRODUCE = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
AVRO = {"Accept": "application/vnd.kafka.avro.v2+json"}


def big_schema(tag: str, fields: int) -> str:
    """A valid Avro record schema of about 145 bytes a field, every name unique to ``tag``."""
    return json.dumps({"type": "record", "name": f"Big{tag}", "fields": [
        {"name": f"f{i}_{'x' * 20}", "type": ["null", "string", {"type": "record", "name": f"R{tag}_{i}",
                                                                 "fields": [{"name": "a", "type": "int"}]}]}
        for i in range(fields)]})


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _create_topic(bootstrap: str) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics({TOPIC: 1, OTHER_TOPIC: 1})
    finally:
        await client.close()


@pytest.fixture(scope="module")
def registry() -> Iterator[FakeRegistry]:
    with FakeRegistry(register="refuse") as reg:
        reg.schemas[BIG_ID] = big_schema("Stored", 5000)
        for sid in COMPILED_IDS:
            reg.schemas[sid] = big_schema(f"Registered{sid}", 1350)
        yield reg


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, registry: FakeRegistry,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    asyncio.run(_create_topic(tansu.bootstrap))
    log = Path(tmp_path_factory.mktemp("schema-size")) / "gateway.log"
    with GatewayProcess(tansu.bootstrap, log_file=log, env={"GATEWAY_SCHEMA_REGISTRY_URL": registry.url}) as g:
        yield g


class HealthWatch:
    """``/healthz`` asked back to back on a thread of its own; the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                t = time.monotonic()
                assert c.get(f"{self.url}/healthz").status_code == 200
                self.slowest = max(self.slowest, time.monotonic() - t)
                self.answers += 1
                self._stop.wait(0.02)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_large_schemas_are_refused_or_compiled_off_the_loop_with_bounded_memory(gw: GatewayProcess,
                                                                                registry: FakeRegistry) -> None:
    assert gw.proc is not None
    pid = gw.proc.pid
    value = {"f0_" + "x" * 20: None}
    with httpx.Client(timeout=60) as c:
        # warm up the produce path (topic metadata, the registry client) before the baseline
        r = c.post(f"{gw.url}/topics/{TOPIC}", headers=AVRO_PRODUCE,
                   json={"value_schema": big_schema("warm", 10), "records": [{"value": value}]})
        assert r.status_code == 422, r.text[:300]
        # the bodies are built first: this process's own work must not delay its /healthz thread
        over = [big_schema(f"over{i}", 5000) for i in range(6)]
        under = [big_schema(f"under{i}", 1350) for i in range(6)]
        assert all(700_000 < len(t) and len(json.dumps(t)) < 1024 * 1024 for t in over)
        assert all(150_000 < len(t) < 256 * 1024 for t in under)
        over_bodies = [json.dumps({"value_schema": t, "records": [{"value": value}]}).encode() for t in over]
        under_bodies = [json.dumps({"value_schema": t, "records": [{"value": value}]}).encode() for t in under]
        base = _rss(pid)
        with HealthWatch(gw.url) as health:
            for body in over_bodies:
                r = c.post(f"{gw.url}/topics/{TOPIC}", headers=AVRO_PRODUCE, content=body)
                assert r.status_code == 413, r.text[:300]
                body = r.json()
                assert body["error_code"] == 41302 and "GATEWAY_SCHEMA_MAX_BYTES" in body["message"], body
            refused_before = len(registry.registered)
            for body in under_bodies:
                r = c.post(f"{gw.url}/topics/{TOPIC}", headers=AVRO_PRODUCE, content=body)
                assert r.status_code == 422, r.text[:300]
                assert r.json()["error_code"] == 42205 and "refused" in r.json()["message"]
            assert len(registry.registered) == refused_before + 6  # these reached the registry, compiled
            r = c.post(f"{gw.url}/topics/{TOPIC}", headers=AVRO_PRODUCE,
                       json={"value_schema_id": BIG_ID, "records": [{"value": value}]})
            assert r.status_code == 413 and r.json()["error_code"] == 41302, r.text[:300]
        grown = _rss(pid) - base
        assert grown < MARGIN, f"RSS grew by {grown / MiB:.0f} MiB"
        assert health.answers > 10 and health.slowest < 0.5, (health.answers, health.slowest)

        # consume: a record framed with the oversized schema's id is that record's error, with its bytes
        raw = b"\0" + BIG_ID.to_bytes(4, "big") + b"\0"
        r = c.post(f"{gw.url}/topics/{TOPIC}", headers=BINARY_PRODUCE,
                   json={"records": [{"value": base64.b64encode(raw).decode()}]})
        assert r.status_code == 200, r.text[:300]
        group, name = "schema-size", "c1"
        inst = f"{gw.url}/consumers/{group}/instances/{name}"
        r = c.post(f"{gw.url}/consumers/{group}", headers=V2,
                   json={"name": name, "format": "avro", "auto.offset.reset": "earliest"})
        assert r.status_code == 200, r.text
        assert c.post(f"{inst}/subscription", headers=V2, json={"topics": [TOPIC]}).status_code == 204
        got: list[dict] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            r = c.get(f"{inst}/records", params={"timeout": 1000}, headers=AVRO)
            assert r.status_code == 200, r.text[:300]
            got.extend(r.json())
        assert len(got) == 1, got
        assert got[0]["value"] is None and "GATEWAY_SCHEMA_MAX_BYTES" in got[0]["value_error"], got[0]
        assert base64.b64decode(got[0]["value_base64"]) == raw
        assert c.delete(inst, headers=V2).status_code == 204


def _zero_record(fields: int) -> bytes:
    """The Avro encoding of a record of ``fields`` unions whose value is null (branch 0: one zero byte each)."""
    return b"\0" * fields


def test_schemas_compiled_for_a_poll_do_not_stall_the_gateway(gw: GatewayProcess) -> None:
    with httpx.Client(timeout=60) as c:
        raws = [b"\0" + sid.to_bytes(4, "big") + _zero_record(1350) for sid in COMPILED_IDS]
        r = c.post(f"{gw.url}/topics/{OTHER_TOPIC}", headers=BINARY_PRODUCE,
                   json={"records": [{"value": base64.b64encode(raw).decode()} for raw in raws]})
        assert r.status_code == 200, r.text[:300]
        group, name = "schema-size-compile", "c1"
        inst = f"{gw.url}/consumers/{group}/instances/{name}"
        r = c.post(f"{gw.url}/consumers/{group}", headers=V2,
                   json={"name": name, "format": "avro", "auto.offset.reset": "earliest"})
        assert r.status_code == 200, r.text
        assert c.post(f"{inst}/subscription", headers=V2, json={"topics": [OTHER_TOPIC]}).status_code == 204
        got: list[dict] = []
        with HealthWatch(gw.url) as health:
            deadline = time.monotonic() + 60
            while len(got) < len(raws) and time.monotonic() < deadline:
                r = c.get(f"{inst}/records", params={"timeout": 1000}, headers=AVRO)
                assert r.status_code == 200, r.text[:300]
                got.extend(r.json())
        assert [g["offset"] for g in got] == list(range(len(raws)))
        for g in got:
            assert g.get("value_error") is None and g["value"] is not None and len(g["value"]) == 1350, \
                str(g)[:300]
        assert health.answers > 5 and health.slowest < 0.5, (health.answers, health.slowest)
        assert c.delete(inst, headers=V2).status_code == 204
