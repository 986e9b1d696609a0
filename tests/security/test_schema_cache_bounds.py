"""Two schema caches a tenant could grow without bound, attacked on a running gateway (real sockets, a tenants
file, a shared registry: :mod:`tests.security.fake_registry`, which refuses every schema posted to it):

- **the subjects of schema ids.** A produce naming a ``value_schema_id`` asks the registry which subjects the id
  is registered under (``GET /schemas/ids/{id}/versions``) and caches the answer per registry, 1,000 ids of any
  size. Here each id lists 3,000 subjects of ~280 characters (~1 MB); 90 produces with distinct ids (all
  403/40304: none is the tenant's) grew RSS by 88 MiB. Now the answers are charged to the registry's byte
  budget (``GATEWAY_SCHEMA_CACHE_MAX_BYTES``, 4 MiB here) and the least recently used go (RSS +3 MiB): the
  first id is asked of the registry again, the last one is not.
- **compiled JSON Schema patterns.** Every ``pattern`` of a posted schema is compiled with RE2 when the schema
  is checked, and the programs were kept: 256 of any size by the gateway (``\\p{L}{55}x`` is ~0.63 MiB), and
  the last 128 again by google-re2's own ``re2.compile`` cache. Sixteen produces, each with a schema of 10
  distinct such patterns (422: the registry refuses them), grew RSS by 83 MiB. Now the cache is bounded by
  bytes (32 MiB charged, ~10 MiB real) and RE2 programs are built past google-re2's cache: RSS +10 MiB.

Now the growth stays under ``MARGIN`` and ``kcg_schema_cache_bytes`` within the bounds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
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
CACHE_MAX_BYTES = 4 * MiB
PATTERNS_MAX_BYTES = 32 * MiB
MARGIN = 40 * MiB
TOPIC = "cb-cache-bounds"
API_KEY = "schema-cache-bounds-key-8kQ"
ADMIN_TOKEN = "schema-cache-bounds-admin-3Zp"
SUBJECTS_PER_ID = 3000
IDS = range(1000, 1090)


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: cb
    api_keys: ["{sha(API_KEY)}"]
    topics: ["cb-*"]
"""


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _create_topic(bootstrap: str) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics({TOPIC: 1})
    finally:
        await client.close()


@pytest.fixture(scope="module")
def registry() -> Iterator[FakeRegistry]:
    with FakeRegistry(register="refuse") as reg:
        # another tenant's subjects (the same list for every id: the gateway parses each answer anew)
        subjects = [f"other.{i:05d}.{'s' * 270}" for i in range(SUBJECTS_PER_ID)]
        for sid in IDS:
            reg.id_subjects[sid] = subjects
        yield reg


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, registry: FakeRegistry,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    asyncio.run(_create_topic(tansu.bootstrap))
    d = Path(tmp_path_factory.mktemp("schema-cache-bounds"))
    (d / "tenants.yaml").write_text(TENANTS)
    env = {"GATEWAY_TENANTS_FILE": str(d / "tenants.yaml"), "GATEWAY_SCHEMA_REGISTRY_URL": registry.url,
           "GATEWAY_SCHEMA_CACHE_MAX_BYTES": str(CACHE_MAX_BYTES), "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
    with GatewayProcess(tansu.bootstrap, log_file=d / "gateway.log", env=env) as g:
        yield g


def cache_bytes(g: GatewayProcess, cache: str) -> float:
    text = httpx.get(f"{g.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'kcg_schema_cache_bytes{{cache="{cache}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"kcg_schema_cache_bytes{{cache={cache!r}}} not exported")


def headers(fmt: str) -> dict[str, str]:
    return {"Content-Type": f"application/vnd.kafka.{fmt}.v2+json", "Authorization": f"Bearer {API_KEY}"}


def test_subjects_of_schema_ids_stay_within_the_registry_budget(gw: GatewayProcess, registry: FakeRegistry) -> None:
    assert gw.proc is not None
    pid = gw.proc.pid
    with httpx.Client(timeout=60) as c:
        def produce(sid: int) -> None:
            r = c.post(f"{gw.url}/topics/{TOPIC}", headers=headers("avro"),
                       json={"value_schema_id": sid, "records": [{"value": {"a": 1}}]})
            assert r.status_code == 403 and r.json()["error_code"] == 40304, r.text[:300]
            assert "other." not in r.text  # no foreign subject named

        for sid in IDS[:3]:  # warm up (the registry client, the tenant's subject check) before the baseline
            produce(sid)
        base = _rss(pid)
        for sid in IDS:
            produce(sid)
        grown = _rss(pid) - base
        # the least recently used id was evicted (asked again), the most recent one is still cached (a refusal
        # is trusted for 5 s)
        first, last = f"/schemas/ids/{IDS[3]}/versions", f"/schemas/ids/{IDS[-1]}/versions"
        asked_first, asked_last = registry.asked[first], registry.asked[last]
        produce(IDS[-1])
        produce(IDS[3])
        assert registry.asked[last] == asked_last and registry.asked[first] == asked_first + 1
        assert all(registry.asked[f"/schemas/ids/{sid}/versions"] >= 1 for sid in IDS)
        assert grown < MARGIN, f"RSS grew by {grown / MiB:.0f} MiB"
        assert 1 * MiB < cache_bytes(gw, "registries") <= CACHE_MAX_BYTES


def pattern_schema(tag: int, n: int) -> str:
    """A JSON Schema with ``n`` string properties, each with a pattern RE2 compiles into ~0.63 MiB."""
    return json.dumps({"type": "object", "properties": {
        f"p{i}": {"type": "string", "pattern": "\\p{L}{55}x" + "y" * (tag * n + i)} for i in range(n)}})


def test_compiled_patterns_stay_within_their_bound(gw: GatewayProcess, registry: FakeRegistry) -> None:
    assert gw.proc is not None
    pid = gw.proc.pid
    with httpx.Client(timeout=120) as c:
        def produce(schema: str) -> None:
            r = c.post(f"{gw.url}/topics/{TOPIC}", headers=headers("jsonschema"),
                       json={"value_schema": schema, "records": [{"value": {"p0": "x"}}]})
            assert r.status_code == 422 and r.json()["error_code"] == 42205, r.text[:300]

        produce(pattern_schema(0, 2))  # warm up the jsonschema path (validator classes, metaschemas)
        schemas = [pattern_schema(tag, 10) for tag in range(1, 17)]
        posted = len(registry.registered)
        base = _rss(pid)
        for schema in schemas:
            produce(schema)
        grown = _rss(pid) - base
        assert len(registry.registered) == posted + 16  # each was checked, compiled and sent to the registry
        assert grown < MARGIN, f"RSS grew by {grown / MiB:.0f} MiB"
        assert 8 * MiB < cache_bytes(gw, "patterns") <= PATTERNS_MAX_BYTES
