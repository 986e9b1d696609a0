"""Registry fan-out: one poll of records naming many distinct schema ids.

A topic holds 800 Avro records, each framed with a schema id of its own: half of the ids are registered, half
are not. The gateway's registry (:mod:`tests.security.fake_registry`, real HTTP) answers each request after
``DELAY`` and records how many of the gateway's requests were in flight at once. Against a running gateway
with ``GATEWAY_SCHEMA_REGISTRY_MAX_CONCURRENT_REQUESTS=CAP`` and ``GATEWAY_SCHEMA_REGISTRY_MAX_IDS_PER_POLL``
lowered to ``PER_POLL``, an avro consumer polls the topic to its end:

- every poll is answered 200 (no 503/50307 flapping while the registry is flooded), and every record is
  delivered once, in order, each partition's offsets without a gap;
- a registered id's record is its decoded value or, when its poll had more new ids than ``PER_POLL``, a
  per-record error "not resolved yet" with the record's bytes in ``value_base64`` (nothing is lost); an
  unregistered id's record is a "not found" (or "not resolved yet") per-record error, with its bytes;
- the registry never had more than ``CAP`` of the gateway's requests in flight, and each id was asked once
  (the not-found ones are remembered, one LRU entry each, not wiped in bulk);
- seeking back, later polls resolve the rest: every registered id's record comes decoded, every other one
  "not found".
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.security.fake_registry import FakeRegistry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "registry-fanout"
RECORDS = 800
CAP = 4
PER_POLL = 50
DELAY = 0.01
KNOWN_BASE, UNKNOWN_BASE = 10_000, 50_000
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY_PRODUCE = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
AVRO = {"Accept": "application/vnd.kafka.avro.v2+json"}


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _record(i: int) -> tuple[int, bytes]:
    """Record i's schema id and framed value: even records name a registered id, odd ones an unknown id."""
    sid = KNOWN_BASE + i if i % 2 == 0 else UNKNOWN_BASE + i
    return sid, b"\0" + sid.to_bytes(4, "big") + _zigzag(i)


@pytest.fixture(scope="module")
def registry() -> Iterator[FakeRegistry]:
    with FakeRegistry(delay=DELAY) as reg:
        for i in range(0, RECORDS, 2):
            reg.schemas[KNOWN_BASE + i] = json.dumps(
                {"type": "record", "name": f"R{i}", "fields": [{"name": "n", "type": "long"}]})
        yield reg


async def _create_topic(bootstrap: str) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics({TOPIC: 1})
    finally:
        await client.close()


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, registry: FakeRegistry,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    asyncio.run(_create_topic(tansu.bootstrap))
    log = Path(tmp_path_factory.mktemp("fanout")) / "gateway.log"
    g = GatewayProcess(tansu.bootstrap, log_file=log, env={
        "GATEWAY_SCHEMA_REGISTRY_URL": registry.url,
        "GATEWAY_SCHEMA_REGISTRY_MAX_CONCURRENT_REQUESTS": str(CAP),
        "GATEWAY_SCHEMA_REGISTRY_MAX_IDS_PER_POLL": str(PER_POLL),
        "GATEWAY_SCHEMA_REGISTRY_TIMEOUT_S": "5"})
    with g:
        with httpx.Client(timeout=60) as c:
            records = [{"partition": 0, "value": base64.b64encode(_record(i)[1]).decode()} for i in range(RECORDS)]
            r = c.post(f"{g.url}/topics/{TOPIC}", headers=BINARY_PRODUCE, json={"records": records})
            assert r.status_code == 200, r.text[:300]
            assert all(o["error_code"] is None for o in r.json()["offsets"])
        yield g


def test_many_schema_ids_in_one_topic_progress_steadily_within_the_caps(gw: GatewayProcess,
                                                                      registry: FakeRegistry) -> None:
    group, name = "fanout-group", "c1"
    base = f"{gw.url}/consumers/{group}/instances/{name}"
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{gw.url}/consumers/{group}", headers=V2,
                   json={"name": name, "format": "avro", "auto.offset.reset": "earliest"})
        assert r.status_code == 200, r.text
        assert c.post(f"{base}/subscription", headers=V2, json={"topics": [TOPIC]}).status_code == 204
        got: list[dict] = []
        polls = 0
        deadline = time.monotonic() + 120
        while len(got) < RECORDS and time.monotonic() < deadline:
            r = c.get(f"{base}/records", params={"timeout": 1000}, headers=AVRO)
            polls += 1
            assert r.status_code == 200, f"poll {polls}: {r.status_code} {r.text[:300]}"
            got.extend(r.json())
        assert [rec["offset"] for rec in got] == list(range(RECORDS)), "records missing, repeated or out of order"
        decoded = deferred = unknown = 0
        for rec in got:
            i = rec["offset"]
            sid, raw = _record(i)
            if i % 2:
                assert rec["value"] is None, rec
                assert f"schema id {sid} not found" in rec["value_error"] or "not resolved yet" in rec["value_error"]
                assert base64.b64decode(rec["value_base64"]) == raw
                unknown += "not found" in rec["value_error"]
            elif rec.get("value_error"):
                assert "not resolved yet" in rec["value_error"] and "retry" in rec["value_error"], rec
                assert base64.b64decode(rec["value_base64"]) == raw  # delivered with its bytes: nothing lost
                deferred += 1
            else:
                assert rec["value"] == {"n": i}, rec
                decoded += 1
        assert deferred and decoded, (decoded, deferred, unknown)
        assert registry.max_in_flight <= CAP, f"{registry.max_in_flight} registry requests in flight at once"
        asked = registry.requests
        assert asked <= RECORDS, f"{asked} registry requests for {RECORDS} ids"

        # later polls resolve the rest: seeking back, a bounded number of polls decodes every known record
        r = c.post(f"{base}/positions", headers=V2, json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}]})
        assert r.status_code == 204, r.text
        final: dict[int, object] = {}  # offset -> its value, or "not found"
        for _ in range(2 * RECORDS // PER_POLL + 10):
            r = c.get(f"{base}/records", params={"timeout": 1000, "max_bytes": 4000}, headers=AVRO)
            assert r.status_code == 200, r.text[:300]
            for rec in r.json():
                if rec.get("value") is not None:
                    final[rec["offset"]] = rec["value"]
                elif f"schema id {_record(rec['offset'])[0]} not found" in rec["value_error"]:
                    final[rec["offset"]] = "not found"
            if len(final) == RECORDS:
                break
            if r.json() and r.json()[-1]["offset"] == RECORDS - 1:
                r = c.post(f"{base}/positions", headers=V2,
                           json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}]})
                assert r.status_code == 204
        assert final == {i: {"n": i} if i % 2 == 0 else "not found" for i in range(RECORDS)}
        assert registry.requests <= RECORDS, f"{registry.requests} registry requests for {RECORDS} ids"
        assert registry.max_in_flight <= CAP
        assert c.delete(base, headers=V2).status_code == 204
