"""Property-based contract tests: schemathesis drives a real gateway process (over the real Tansu broker)
with requests generated from ``openapi.yaml`` and checks every response against the contract.

Two runs: every operation on its own (random parameters and bodies, positive and negative), and stateful
sequences that follow the contract's links (create an instance, then subscribe, assign, seek, poll,
commit, delete it). Checks: no server error except a documented 503 (Kafka unavailable, codes 50003/50302),
status code, content type, headers and body schema conformance, schema-valid data accepted and invalid data
rejected, authentication enforced (schemathesis retries each authenticated operation without and with wrong
credentials), deleted instances gone.

Bounded: few examples, derandomized (the same cases every run), long-polls capped at 300 ms by the gateway
(``GATEWAY_MAX_POLL_TIMEOUT_MS``), a 10 s timeout per request. Schemathesis sends ``Accept: */*``, so
``/records`` answers a JSON array and never opens an NDJSON/SSE stream.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import yaml
from confluent_kafka import Producer as CKProducer
from hypothesis import HealthCheck, Phase, settings
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance, unsupported_method

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.fakes.registry.server import TestRegistry
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

OPENAPI = Path(__file__).resolve().parents[2] / "openapi.yaml"
API_KEY = "schemathesis-test-key-7Qx2"  # the test tenant's key; its sha256 goes in the tenants file
AUTH = {"Authorization": f"Bearer {API_KEY}"}
DOCUMENTED_503 = {50003, 50302}


def _without_ignored_headers(contract: dict[str, Any]) -> dict[str, Any]:
    """The contract as OpenAPI 3.0 tells tools to read it: header parameters named Content-Type (produce lists one,
    for generated clients) are ignored. Schemathesis would send that header and then no body at all."""
    for item in contract["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and "parameters" in op:
                op["parameters"] = [p for p in op["parameters"]
                                    if not (p.get("in") == "header" and p["name"].lower() == "content-type")]
    return contract


# Credentials for the Bearer scheme (an API key): schemathesis sends them, and also probes each operation
# without / with invalid ones (ignored_auth).
schema = schemathesis.openapi.from_dict(_without_ignored_headers(yaml.safe_load(OPENAPI.read_text())),
                                        config=SchemathesisConfig.from_dict(
    {"auth": {"openapi": {"BearerAuth": {"bearer": API_KEY}}}, "request-timeout": 10,
     # invalid data may also be refused by the server before any route: a request head over the header cap
     # (e.g. hundreds of generated query parameters) is 431 / 43101 (api/server/http.py)
     "checks": {"negative_data_rejection": {"expected-statuses": [
         "400", "401", "403", "404", "405", "406", "409", "415", "422", "428", "429", "431", "5xx"]}}}))

# `unsupported_method` (an undeclared method must get 405 *with an Allow header*) is replaced by the
# focused test_405_lists_allowed_methods below, which fails for a known reason (see there).
EXCLUDED = [not_a_server_error, unsupported_method]
SETTINGS = settings(max_examples=25, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.generate])

NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
unique = itertools.count()
statuses: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)


def server_errors_are_documented(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """No 5xx, except the contract's 503 (Kafka unavailable) with one of its error codes."""
    statuses[case.operation.label][response.status_code] += 1
    if response.status_code < 500:
        return None
    if response.status_code == 503:
        body = response.json()
        if isinstance(body, dict) and body.get("error_code") in DOCUMENTED_503:
            return None
    raise AssertionError(f"server error {response.status_code} on {case.operation.label}: {response.text[:500]}")


CHECKS = [server_errors_are_documented]


@pytest.fixture(scope="module")
def registry() -> Iterator[TestRegistry]:
    """A schema registry, so that the avro/protobuf/jsonschema formats are available as the contract says
    (without one they answer 42211); the protocol-level test registry: no Karapace start for this module."""
    with TestRegistry() as reg:
        yield reg


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, registry: TestRegistry,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("schemathesis")
    tenants = d / "tenants.yaml"
    tenants.write_text(yaml.safe_dump({"tenants": [
        {"id": "st", "api_keys": ["sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()]}]}))
    g = GatewayProcess(tansu.bootstrap, env={"GATEWAY_TENANTS_FILE": str(tenants),
                                             "GATEWAY_MAX_POLL_TIMEOUT_MS": "300",
                                             "GATEWAY_SCHEMA_REGISTRY_URL": registry.url,
                                             # schemathesis sends wrong credentials by the hundred: the
                                             # failure limiter (tests/security) would answer them 429
                                             "GATEWAY_AUTH_FAILURES_PER_MINUTE": "0"},
                       log_file=d / "gateway.log")
    g.start()
    try:
        yield g
    finally:
        g.stop()
    log = (d / "gateway.log").read_text(errors="replace")
    assert "Traceback" not in log, f"the gateway logged an unexpected exception:\n{log[-4000:]}"


RANGE_READ = "GET /topics/{topic}/partitions/{partition}/records"
_DEPENDENT = re.compile(r"^(value_schema_id|key_format|key_schema_id) needs (format|key_format)")


def typed_parameters_depend_on_each_other(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """The range read's positive-data check, but for one rule OpenAPI cannot state for query parameters:
    value_schema_id and key_format need format, key_schema_id needs key_format (422 / 42206 naming it)."""
    if response.status_code == 422:
        body = response.json()
        if body.get("error_code") == 42206 and _DEPENDENT.match(body.get("message", "")):
            return None
    return positive_data_acceptance(ctx, response, case)


@schema.parametrize()
@SETTINGS
def test_operation(case: Case, gw: GatewayProcess) -> None:
    if case.operation.label == RANGE_READ:
        case.call_and_validate(base_url=gw.url, excluded_checks=[*EXCLUDED, positive_data_acceptance],
                               additional_checks=[*CHECKS, typed_parameters_depend_on_each_other])
        return
    case.call_and_validate(base_url=gw.url, excluded_checks=EXCLUDED, additional_checks=CHECKS)


def test_stateful_links(gw: GatewayProcess) -> None:
    """Sequences along the links from ``createConsumer`` to the instance's operations."""
    # The links start at createConsumer: the state machine walks the consumer operations only (the topic
    # and produce operations are covered one by one in test_operation).
    base = schema.include(path_regex="^/consumers/").as_state_machine()

    class Workflow(base):  # type: ignore[valid-type,misc]
        def before_call(self, case: Case) -> None:
            # Hypothesis replays prefixes of earlier scenarios and needs the same responses (the bundle of
            # created instances) to draw the same way: a name taken by an earlier scenario would now be 409.
            body = case.body
            for key in ("name", "id"):  # the legacy 'id' names the instance too
                if isinstance(body, dict) and isinstance(body.get(key), str) and NAME.fullmatch(body[key]):
                    body[key] = f"{body[key][:180]}-{next(unique)}"

        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"base_url": gw.url}

        def validate_response(self, response: Response, case: Case,
                              additional_checks: list[Any] | None = None, **kwargs: Any) -> None:
            case.validate_response(response, excluded_checks=EXCLUDED, additional_checks=CHECKS,
                                   transport_kwargs=kwargs)

    before = {label: collections.Counter(c) for label, c in statuses.items()}
    Workflow.run(settings=settings(max_examples=12, stateful_step_count=6, derandomize=True, deadline=None,
                                   database=None, suppress_health_check=list(HealthCheck),
                                   phases=[Phase.generate]))
    reached = {label for label, c in statuses.items()
               if any(200 <= s < 300 for s in c - before.get(label, collections.Counter()))}
    # the links are followed with a real instance: operations on it succeed, not just 404 on random ids
    assert "POST /consumers/{group}" in reached, dict(statuses)
    assert len([r for r in reached if "/instances/{instance_id}" in r]) >= 5, dict(statuses)


def test_served_contract_is_the_committed_one(gw: GatewayProcess) -> None:
    served = httpx.get(f"{gw.url}/openapi.json", timeout=10).json()
    assert served == yaml.safe_load(OPENAPI.read_text()), (
        "the running gateway serves another contract than openapi.yaml; regenerate with "
        "`.venv/bin/python tools/export_openapi.py > openapi.yaml`")


def test_405_lists_allowed_methods(gw: GatewayProcess) -> None:
    r = httpx.request("PATCH", f"{gw.url}/consumers/g/instances/i/subscription", headers=AUTH, timeout=10)
    assert r.status_code == 405 and r.json()["error_code"] == 40501
    assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST", "DELETE"}


def _json_schema(node: Any) -> Any:
    """OpenAPI 3.0 schemas as JSON Schema: ``nullable: true`` beside a type becomes a type list."""
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True and isinstance(node.get("type"), str):
        out["type"] = [node["type"], "null"]
    return out


def _validator(doc: dict[str, Any], name: str) -> Draft202012Validator:
    registry: Registry[Any] = Registry().with_resource(
        "urn:kcg:openapi", Resource.from_contents(_json_schema(doc), default_specification=DRAFT202012))
    return Draft202012Validator({"type": "array", "items": {"$ref": f"urn:kcg:openapi#/components/schemas/{name}"}},
                                registry=registry)


async def test_real_records_conform_to_the_contract(gw: GatewayProcess, tansu: EmbeddedBroker,
                                                    kclient: KafkaClient, topic_name: str) -> None:
    """What generated requests rarely reach: records with null keys, headers (one null) and non-JSON values,
    in both formats, as an array and as NDJSON lines, checked against ConsumerRecord (one schema for both
    formats; the keys and values as each format gives them are checked here)."""
    doc = yaml.safe_load(OPENAPI.read_text())
    await kclient.create_topics({topic_name: 1})

    def produce() -> None:
        p = CKProducer({"bootstrap.servers": tansu.bootstrap})
        p.produce(topic_name, key=None, value=b'{"n": 1}', headers=[("h", b"x"), ("empty", None)])
        p.produce(topic_name, key=b'"k"', value=b"not json")
        p.produce(topic_name, key=b"k3", value=None)
        assert p.flush(30) == 0

    await asyncio.to_thread(produce)
    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=30) as http:
        validator = _validator(doc, "ConsumerRecord")
        for fmt, media in (("binary", "application/vnd.kafka.binary.v2+json"),
                           ("json", "application/vnd.kafka.json.v2+json")):
            group = f"g-{fmt}-{topic_name}"  # not shared: the first instance commits on delete
            r = await http.post(f"/consumers/{group}", json={"format": fmt, "auto.offset.reset": "earliest"})
            assert r.status_code == 200, r.text
            base = f"/consumers/{group}/instances/{r.json()['instance_id']}"
            r = await http.post(f"{base}/assignments", json={"partitions": [{"topic": topic_name, "partition": 0}]})
            assert r.status_code == 204, r.text
            got: list[Any] = []
            for _ in range(20):
                r = await http.get(f"{base}/records", headers={"Accept": media})
                assert r.status_code == 200 and r.headers["content-type"] == media, r.text
                got += r.json()
                if len(got) >= 3:
                    break
            assert len(got) == 3
            validator.validate(got)
            by_offset = sorted(got, key=lambda r: r["offset"])
            if fmt == "binary":  # base64 strings (null for a null key or value)
                assert [r["key"] for r in by_offset] == [None, "Imsi", "azM="]
                assert [r["value"] for r in by_offset] == ["eyJuIjogMX0=", "bm90IGpzb24=", None]
            else:  # embedded JSON; not-JSON bytes as null with an error and the raw bytes
                assert [r["key"] for r in by_offset] == [None, "k", None] and by_offset[2]["key_error"]
                assert [r["value"] for r in by_offset] == [{"n": 1}, None, None]
                assert (by_offset[1]["value_error"] == "not valid JSON"
                        and by_offset[1]["value_base64"] == "bm90IGpzb24=")
            r = await http.post(f"{base}/positions/beginning", json={"partitions": [
                {"topic": topic_name, "partition": 0}]})
            assert r.status_code == 204
            lines: list[Any] = []
            async with http.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as resp:
                async for line in resp.aiter_lines():
                    if line:
                        lines.append(json.loads(line))
                    if len(lines) == 3:
                        break
            validator.validate(lines)
            # the same records; the last of the write carries its resume token (docs/streams.md)
            assert "resume" in lines[-1]
            assert [{k: v for k, v in x.items() if k != "resume"} for x in lines] == got
            assert (await http.delete(base)).status_code == 204
