"""Topic administration over v3, attacked on gateway processes (real sockets) with a tenants file and in open
mode: a tenant that may only read a topic can neither delete nor create it (403/40303; before, any tenant
allowed to read a topic could delete it), a tenant with ``admin_topics`` can; a create asking for more than
``GATEWAY_MAX_PARTITIONS_PER_TOPIC`` partitions is 422/42213 also with ``validate_only`` (2^31-1 partitions was
answered 200); a topic config outside the allow-list is 422/42214 naming it, and nothing is created."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from service.protocol import messages as M
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
KEY_OWNER, KEY_READER, KEY_NARROW = "topic-admin-owner-key-1", "topic-admin-reader-key-2", "topic-admin-narrow-3"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: owner
    api_keys: ["{sha(KEY_OWNER)}"]
    topics: ["adm-*"]
    admin_topics: ["adm-*"]
  - id: reader
    api_keys: ["{sha(KEY_READER)}"]
    topics: ["adm-*"]
  - id: narrow
    api_keys: ["{sha(KEY_NARROW)}"]
    topics: ["adm-*"]
    admin_topics: ["adm-*"]
    admin_topic_configs: ["retention.ms"]
"""


@pytest.fixture(scope="module")
def gateways(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    d = tmp_path_factory.mktemp("topic-admin")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    open_gw = GatewayProcess(tansu.bootstrap, log_file=d / "open.log")
    tenant_gw = GatewayProcess(tansu.bootstrap, log_file=d / "tenants.log", env={"GATEWAY_TENANTS_FILE": str(f)})
    for g in (open_gw, tenant_gw):
        g.launch()
    try:
        for g in (open_gw, tenant_gw):
            g.wait_healthy()
        yield {"open": open_gw.url, "tenants": tenant_gw.url}
    finally:
        open_gw.stop()
        tenant_gw.stop()


@pytest.fixture
async def http(gateways: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateways["tenants"], timeout=60) as c:
        yield c


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def refused(r: httpx.Response, status: int, code: int, *fragments: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    body: dict[str, Any] = r.json()
    assert body["error_code"] == code, body
    for f in fragments:
        assert f in body["message"], body
    return str(body["message"])


async def topics_on_broker(kclient: KafkaClient) -> dict[str, int]:
    resp = await kclient.send_any(M.MetadataRequest(topics=None, allow_auto_topic_creation=False))
    return {t.name: len(t.partitions) for t in resp.topics if t.error_code == 0}


async def base_of(http: httpx.AsyncClient, key: str | None) -> str:
    r = await http.get("/v3/clusters", headers=auth(key) if key else None)
    assert r.status_code == 200, r.text
    return f"/v3/clusters/{r.json()['data'][0]['cluster_id']}/topics"


async def test_a_read_only_tenant_can_neither_delete_nor_create(http: httpx.AsyncClient, kclient: KafkaClient,
                                                                topic_name: str) -> None:
    base = await base_of(http, KEY_OWNER)
    victim, new = f"adm-{topic_name}", f"adm-new-{topic_name}"
    r = await http.post(base, json={"topic_name": victim, "partitions_count": 2}, headers=auth(KEY_OWNER))
    assert r.status_code == 201, r.text
    # the reader may see the topic...
    assert (await http.get(f"{base}/{victim}", headers=auth(KEY_READER))).status_code == 200
    # ...but not delete it: before, this answered 204 and the topic was gone
    msg = refused(await http.delete(f"{base}/{victim}", headers=auth(KEY_READER)), 403, 40303, "admin_topics")
    assert "reader" in msg
    assert (await topics_on_broker(kclient))[victim] == 2
    # nor create one, not even as a dry run
    for body in ({"topic_name": new, "partitions_count": 1}, {"topic_name": new, "validate_only": True}):
        refused(await http.post(base, json=body, headers=auth(KEY_READER)), 403, 40303)
    assert new not in await topics_on_broker(kclient)
    # the tenant with admin patterns can
    assert (await http.delete(f"{base}/{victim}", headers=auth(KEY_OWNER))).status_code == 204
    assert victim not in await topics_on_broker(kclient)


@pytest.mark.parametrize("mode", ["tenants", "open"])
async def test_partitions_count_is_capped(gateways: dict[str, str], kclient: KafkaClient, topic_name: str,
                                          mode: str) -> None:
    key = KEY_OWNER if mode == "tenants" else None
    headers = auth(key) if key else None
    name = f"adm-{topic_name}"
    async with httpx.AsyncClient(base_url=gateways[mode], timeout=60) as http:
        base = await base_of(http, key)
        for count in (2**31 - 1, 1001):
            for dry in (True, False):
                refused(await http.post(base, json={"topic_name": name, "partitions_count": count,
                                                    "validate_only": dry}, headers=headers),
                        422, 42213, str(count), "GATEWAY_MAX_PARTITIONS_PER_TOPIC")
        broker = (await http.get(base.replace("/topics", "/brokers"), headers=headers)).json()["data"][0]["broker_id"]
        assignments = [{"partition_id": p, "broker_ids": [broker]} for p in range(1001)]
        refused(await http.post(base, json={"topic_name": name, "replicas_assignments": assignments,
                                            "validate_only": True}, headers=headers), 422, 42213)
        assert name not in await topics_on_broker(kclient)
        r = await http.post(base, json={"topic_name": name, "partitions_count": 1000, "validate_only": True},
                            headers=headers)
        assert r.status_code == 200 and r.json()["partitions_count"] == 1000, r.text
    assert name not in await topics_on_broker(kclient)


async def test_topic_configs_outside_the_allow_list_are_refused(http: httpx.AsyncClient, kclient: KafkaClient,
                                                                topic_name: str) -> None:
    base = await base_of(http, KEY_OWNER)
    name = f"adm-{topic_name}"
    # a segment per record and an fsync per record: what would hurt the broker and every other tenant
    for config, value in (("segment.bytes", "14"), ("flush.messages", "1"), ("unclean.leader.election.enable", "true")):
        for dry in (True, False):
            body = {"topic_name": name, "partitions_count": 1, "validate_only": dry,
                    "configs": [{"name": "retention.ms", "value": "60000"}, {"name": config, "value": value}]}
            refused(await http.post(base, json=body, headers=auth(KEY_OWNER)), 422, 42214, repr(config))
    assert name not in await topics_on_broker(kclient)
    # a tenant's own list replaces the gateway's
    body = {"topic_name": name, "partitions_count": 1, "configs": [{"name": "cleanup.policy", "value": "compact"}]}
    refused(await http.post(base, json=body, headers=auth(KEY_NARROW)), 422, 42214, "'cleanup.policy'")
    assert name not in await topics_on_broker(kclient)
    body = {"topic_name": name, "partitions_count": 1, "configs": [{"name": "retention.ms", "value": "60000"}]}
    r = await http.post(base, json=body, headers=auth(KEY_NARROW))
    assert r.status_code == 201, r.text
    r = await http.post(base, json={**body, "topic_name": f"{name}-2",
                                    "configs": [{"name": "cleanup.policy", "value": "compact"}]},
                                    headers=auth(KEY_OWNER))
    assert r.status_code == 201, r.text
    assert {name, f"{name}-2"} <= set(await topics_on_broker(kclient))


async def test_open_mode_keeps_create_and_delete(gateways: dict[str, str], kclient: KafkaClient,
                                                 topic_name: str) -> None:
    """Without a tenants file everything is one unauthenticated tenant with every right, as before."""
    async with httpx.AsyncClient(base_url=gateways["open"], timeout=60) as http:
        base = await base_of(http, None)
        r = await http.post(base, json={"topic_name": topic_name, "partitions_count": 1})
        assert r.status_code == 201, r.text
        assert (await http.delete(f"{base}/{topic_name}")).status_code == 204
    assert topic_name not in await topics_on_broker(kclient)
