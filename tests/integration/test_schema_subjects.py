"""Schema subjects per tenant, attacked on a gateway process (real sockets) with a tenants file and the real
Karapace registry shared by the tenants: with RecordNameStrategy tenant B registered versions under tenant A's
record name, produced with A's ``value_schema_id``, and its 42203 errors named A's fields. Now the subject of a
schema text and the subjects of a schema id must be the tenant's (403/40304), and no answer to B names A's
fields; each tenant keeps using its own subjects (its namespace ``<id>.*``, ``<topic>-key`` of its topics)."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
KEY_A, KEY_B = "schema-subjects-key-a-1", "schema-subjects-key-b-2"
SECRET_FIELD = "a_secret_field_name_xq7"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: ta
    api_keys: ["{sha(KEY_A)}"]
    topics: ["sa-*"]
  - id: tb
    api_keys: ["{sha(KEY_B)}"]
    topics: ["sb-*"]
"""


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, schema_registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("schema-subjects")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    env = {"GATEWAY_TENANTS_FILE": str(f), "GATEWAY_SCHEMA_REGISTRY_URL": schema_registry,
           # values by record name (the attack), keys by topic name (<topic>-key)
           "GATEWAY_SCHEMA_VALUE_SUBJECT_NAME_STRATEGY": "RecordNameStrategy"}
    with GatewayProcess(broker.bootstrap, env=env, log_file=d / "gw.log") as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c


def avro(key: str) -> dict[str, str]:
    return {"Content-Type": "application/vnd.kafka.avro.v2+json", "Accept": V2, "Authorization": f"Bearer {key}"}


def record(name: str, *fields: tuple[str, Any]) -> str:
    return json.dumps({"type": "record", "name": name,
                       "fields": [{"name": n, "type": t} if d is None else {"name": n, "type": t, "default": d}
                                  for n, t, d in ((f[0], f[1], f[2] if len(f) > 2 else None) for f in fields)]})


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert all(o["error_code"] is None for o in body["offsets"]), body
    return body


def refused(r: httpx.Response, status: int, code: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.json()["error_code"] == code, r.text
    assert SECRET_FIELD not in r.text  # never another tenant's field names
    return str(r.json()["message"])


@pytest.fixture
async def setup(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> dict[str, Any]:
    """Tenant A's record ``ta.<ns>.Secret`` registered by A's produce; a topic of each tenant."""
    ta_topic, tb_topic = f"sa-{topic_name}", f"sb-{topic_name}"
    await bclient.create_topics({ta_topic: 1, tb_topic: 1})
    name = f"ta.n{uuid.uuid4().hex[:8]}.Secret"
    schema = record(name, (SECRET_FIELD, "string"))
    out = ok(await http.post(f"/topics/{ta_topic}", headers=avro(KEY_A), json={
        "value_schema": schema, "records": [{"value": {SECRET_FIELD: "s"}}]}))
    return {"ta_topic": ta_topic, "tb_topic": tb_topic, "subject": name, "id": out["value_schema_id"]}


async def test_b_cannot_register_under_a_record_name_of_a(http: httpx.AsyncClient, schema_registry: str,
                                                          setup: dict[str, Any]) -> None:
    # a compatible next version of A's record (a field with a default): main registered it as version 2
    evolved = record(setup["subject"], (SECRET_FIELD, "string"), ("evil", "string", "x"))
    msg = refused(await http.post(f"/topics/{setup['tb_topic']}", headers=avro(KEY_B), json={
        "value_schema": evolved, "records": [{"value": {SECRET_FIELD: "s", "evil": "y"}}]}), 403, 40304)
    assert setup["subject"] in msg  # the subject B's own text makes, nothing more
    assert SchemaRegistryClient({"url": schema_registry}).get_versions(setup["subject"]) == [1]
    # another namespace than B's own is refused too
    refused(await http.post(f"/topics/{setup['tb_topic']}", headers=avro(KEY_B), json={
        "value_schema": record("com.acme.Thing", ("x", "int")), "records": [{"value": {"x": 1}}]}), 403, 40304)


async def test_b_cannot_produce_with_a_schema_id_of_a(http: httpx.AsyncClient, setup: dict[str, Any]) -> None:
    sid = setup["id"]
    # a record that does not match: main answered 42203 naming A's field; a matching one was written
    for value in ({"wrong": 1}, {SECRET_FIELD: "s"}):
        msg = refused(await http.post(f"/topics/{setup['tb_topic']}", headers=avro(KEY_B), json={
            "value_schema_id": sid, "records": [{"value": value}]}), 403, 40304)
        assert f"value_schema_id {sid}" in msg and setup["subject"] not in msg
    # the same as a key id (keys by topic name here: the id is under A's record-name subject only)
    refused(await http.post(f"/topics/{setup['tb_topic']}", headers=avro(KEY_B), json={
        "key_schema_id": sid, "value_schema_id": sid, "records": [{"key": {SECRET_FIELD: "k"}}]}), 403, 40304)
    r = await http.get(f"/topics/{setup['tb_topic']}/partitions/0/offsets",
                       headers={"Accept": V2, "Authorization": f"Bearer {KEY_B}"})
    assert r.status_code == 200 and r.json()["end_offset"] == 0, r.text  # nothing was written


async def test_each_tenant_keeps_its_own_subjects(http: httpx.AsyncClient, setup: dict[str, Any]) -> None:
    # A by its own id, and with a 42203 that names its own field (its schema: the paths stay)
    ok(await http.post(f"/topics/{setup['ta_topic']}", headers=avro(KEY_A), json={
        "value_schema_id": setup["id"], "records": [{"value": {SECRET_FIELD: "t"}}]}))
    r = await http.post(f"/topics/{setup['ta_topic']}", headers=avro(KEY_A), json={
        "value_schema_id": setup["id"], "records": [{"value": {SECRET_FIELD: 5}}]})
    assert r.status_code == 422 and r.json()["error_code"] == 42203 and SECRET_FIELD in r.text, r.text
    # B: its namespace and a key under <its topic>-key
    b_value = record(f"tb.n{uuid.uuid4().hex[:8]}.Thing", ("x", "int"))
    out = ok(await http.post(f"/topics/{setup['tb_topic']}", headers=avro(KEY_B), json={
        "key_schema": '"string"', "value_schema": b_value, "records": [{"key": "k", "value": {"x": 1}}]}))
    # and A may not use B's key id (registered under sb-...-key only)
    refused(await http.post(f"/topics/{setup['ta_topic']}", headers=avro(KEY_A), json={
        "key_schema_id": out["key_schema_id"], "value_schema_id": setup["id"],
        "records": [{"key": "k", "value": {SECRET_FIELD: "t"}}]}), 403, 40304)
    # an id the registry does not know stays 42210
    r = await http.post(f"/topics/{setup['tb_topic']}", headers=avro(KEY_B), json={
        "value_schema_id": 987654, "records": [{"value": {"x": 1}}]})
    assert r.status_code == 422 and r.json()["error_code"] == 42210, r.text


async def consume_avro(url: str, key: str, topic: str, n: int) -> tuple[list[dict[str, Any]], str]:
    """n records of ``topic`` consumed as avro (assign partition 0, from the beginning), and the answers' text."""
    accept = "application/vnd.kafka.avro.v2+json"
    async with httpx.AsyncClient(base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        group = f"g-{uuid.uuid4().hex[:8]}"
        r = await http.post(f"/consumers/{group}", headers={"Content-Type": V2},
                            json={"format": "avro", "auto.offset.reset": "earliest"})
        assert r.status_code == 200, r.text
        base = r.json()["base_uri"]
        r = await http.post(f"{base}/assignments", headers={"Content-Type": V2},
                            json={"partitions": [{"topic": topic, "partition": 0}]})
        assert r.status_code == 204, r.text
        got: list[dict[str, Any]] = []
        text = ""
        try:
            for _ in range(60):
                r = await http.get(f"{base}/records", headers={"Accept": accept}, params={"timeout": 1000})
                assert r.status_code == 200, r.text
                text += r.text
                got += r.json()
                if len(got) >= n:
                    return got, text
            raise AssertionError(f"{len(got)} of {n} records")
        finally:
            await http.delete(base, headers={"Content-Type": V2})


async def test_b_cannot_read_a_schema_of_a_through_its_own_records(
        http: httpx.AsyncClient, gw: GatewayProcess, setup: dict[str, Any]) -> None:
    """B writes bytes framed with A's schema id into its own topic (a binary produce may write any bytes) and
    consumes them as avro: main rendered them with A's field names. Now that value is a per-record error;
    B's own records in the same answer decode."""
    own = ok(await http.post(f"/topics/{setup['tb_topic']}", headers=avro(KEY_B), json={
        "value_schema": record(f"tb.n{uuid.uuid4().hex[:8]}.Mine", ("x", "int")), "records": [{"value": {"x": 7}}]}))
    forged = b"\x00" + setup["id"].to_bytes(4, "big") + b"\x02s"  # A's record with the string "s"
    r = await http.post(f"/topics/{setup['tb_topic']}", headers={
        "Content-Type": "application/vnd.kafka.binary.v2+json", "Accept": V2, "Authorization": f"Bearer {KEY_B}"},
        json={"records": [{"value": base64.b64encode(forged).decode()}]})
    assert r.status_code == 200, r.text
    got, text = await consume_avro(gw.url, KEY_B, setup["tb_topic"], 2)
    assert SECRET_FIELD not in text
    assert got[0]["value"] == {"x": 7} and own["value_schema_id"] != setup["id"]
    assert got[1]["value"] is None
    assert got[1]["value_error"] == f"schema id {setup['id']} is not readable by this tenant"
    assert base64.b64decode(got[1]["value_base64"]) == forged
    # A reads its own records with its schema
    got, text = await consume_avro(gw.url, KEY_A, setup["ta_topic"], 1)
    assert got[0]["value"] == {SECRET_FIELD: "s"}
    # a typed range read pinned to A's id: its columns would be A's field names
    r = await http.get(f"/topics/{setup['tb_topic']}/partitions/0/records", params={
        "offset": 0, "format": "avro", "value_schema_id": str(setup["id"])},
        headers={"Accept": "application/vnd.apache.arrow.stream", "Authorization": f"Bearer {KEY_B}"})
    assert r.status_code == 422 and r.json()["error_code"] == 42210, r.text
    assert SECRET_FIELD.encode() not in r.content
