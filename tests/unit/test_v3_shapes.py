"""Our v3 bodies against the shapes of Confluent's published v3 OpenAPI (kafka-rest ``api/v3/openapi.yaml``).

:data:`SHAPES` is written by hand from reading that spec: per ``kind``, the required fields with their JSON
types and the optional ones (``Resource``: kind + metadata {self, resource_name}; ``ResourceCollection``:
kind + metadata {self, next} + data). :func:`check` validates a body against it, with no field the spec does
not name. The integration test (``tests/integration/test_v3_http.py``) runs it on every answer of a real
gateway; here it runs on the bodies the route helpers build, and on wrong bodies (so the checker can fail).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

REL = "relationship"  # {"related": string}
STR, INT, BOOL = "string", "integer", "boolean"
NSTR, NINT = "string|null", "integer|null"
CONFIG_SOURCES = {"DYNAMIC_CLUSTER_LINK_CONFIG", "DYNAMIC_TOPIC_CONFIG", "DYNAMIC_BROKER_LOGGER_CONFIG",
                  "DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG", "STATIC_BROKER_CONFIG",
                  "DEFAULT_CONFIG", "UNKNOWN"}

#: kind → (required fields, optional fields) beside kind and metadata; list kinds map to their item kind.
SHAPES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "KafkaCluster": ({"cluster_id": STR, "acls": REL, "brokers": REL, "broker_configs": REL,
                      "consumer_groups": REL, "topics": REL, "partition_reassignments": REL},
                     {"controller": REL}),
    "KafkaBroker": ({"cluster_id": STR, "broker_id": INT, "configs": REL, "partition_replicas": REL},
                    {"host": NSTR, "port": NINT, "rack": NSTR}),
    "KafkaTopic": ({"cluster_id": STR, "topic_name": STR, "is_internal": BOOL, "replication_factor": INT,
                    "partitions_count": INT, "partitions": REL, "configs": REL, "partition_reassignments": REL},
                   {"authorized_operations": "array:string"}),
    "KafkaPartition": ({"cluster_id": STR, "topic_name": STR, "partition_id": INT, "replicas": REL,
                        "reassignment": REL},
                       {"leader": REL}),
    "KafkaReplica": ({"cluster_id": STR, "topic_name": STR, "partition_id": INT, "broker_id": INT,
                      "is_leader": BOOL, "is_in_sync": BOOL, "broker": REL}, {}),
    "KafkaTopicConfig": ({"cluster_id": STR, "topic_name": STR, "name": STR, "is_default": BOOL,
                          "is_read_only": BOOL, "is_sensitive": BOOL, "source": "config_source",
                          "synonyms": "array:synonym"},
                         {"value": NSTR}),
}
LISTS = {"KafkaClusterList": "KafkaCluster", "KafkaBrokerList": "KafkaBroker", "KafkaTopicList": "KafkaTopic",
         "KafkaPartitionList": "KafkaPartition", "KafkaReplicaList": "KafkaReplica",
         "KafkaTopicConfigList": "KafkaTopicConfig"}


def _type_ok(value: Any, typ: str) -> bool:
    if typ.endswith("|null") and value is None:
        return True
    base = typ.removesuffix("|null")
    if base == STR:
        return isinstance(value, str)
    if base == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if base == BOOL:
        return isinstance(value, bool)
    if base == REL:
        return isinstance(value, dict) and set(value) == {"related"} and isinstance(value["related"], str) \
            and value["related"].startswith(("http://", "https://"))
    if base == "config_source":
        return value in CONFIG_SOURCES
    if base == "array:string":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if base == "array:synonym":
        return isinstance(value, list) and all(
            isinstance(s, dict) and set(s) <= {"name", "value", "source"} and {"name", "source"} <= set(s)
            and isinstance(s["name"], str) and (s.get("value") is None or isinstance(s["value"], str))
            and s["source"] in CONFIG_SOURCES for s in value)
    raise AssertionError(f"unknown type {typ}")


def problems(body: Any, expected_kind: str | None = None) -> list[str]:
    """What is wrong with ``body`` against :data:`SHAPES` (empty: it conforms)."""
    if not isinstance(body, dict):
        return ["not an object"]
    kind = body.get("kind")
    if expected_kind is not None and kind != expected_kind:
        return [f"kind {kind!r}, expected {expected_kind!r}"]
    meta = body.get("metadata")
    if kind in LISTS:
        out = []
        if not (isinstance(meta, dict) and set(meta) <= {"self", "next"} and isinstance(meta.get("self"), str)
                and (meta.get("next") is None or isinstance(meta.get("next"), str))):
            out.append(f"{kind}: bad collection metadata {meta!r}")
        if set(body) != {"kind", "metadata", "data"} or not isinstance(body.get("data"), list):
            out.append(f"{kind}: fields {sorted(body)}")
            return out
        for i, item in enumerate(body["data"]):
            out += [f"{kind}.data[{i}]: {p}" for p in problems(item, LISTS[kind])]
        return out
    if kind not in SHAPES:
        return [f"unknown kind {kind!r}"]
    out = []
    if not (isinstance(meta, dict) and set(meta) <= {"self", "resource_name"} and isinstance(meta.get("self"), str)
            and (meta.get("resource_name") is None or isinstance(meta["resource_name"], str))):
        out.append(f"{kind}: bad resource metadata {meta!r}")
    required, optional = SHAPES[kind]
    for name, typ in required.items():
        if name not in body:
            out.append(f"{kind}: missing {name}")
        elif not _type_ok(body[name], typ):
            out.append(f"{kind}.{name}: {body[name]!r} is not {typ}")
    for name, typ in optional.items():
        if name in body and not _type_ok(body[name], typ):
            out.append(f"{kind}.{name}: {body[name]!r} is not {typ}")
    extra = set(body) - set(required) - set(optional) - {"kind", "metadata"}
    if extra:
        out.append(f"{kind}: fields the spec does not name: {sorted(extra)}")
    return out


def check(body: Any, kind: str) -> None:
    assert problems(body, kind) == [], (problems(body, kind), body)


# -- the checker itself ---------------------------------------------------------------------------------------
GOOD_TOPIC = {
    "kind": "KafkaTopic", "metadata": {"self": "http://h/v3/clusters/c/topics/t", "resource_name": "crn:///kafka=c/topic=t"},
    "cluster_id": "c", "topic_name": "t", "is_internal": False, "replication_factor": 1, "partitions_count": 3,
    "partitions": {"related": "http://h/p"}, "configs": {"related": "http://h/c"},
    "partition_reassignments": {"related": "http://h/r"},
}


def test_checker_accepts_a_conforming_topic_and_list() -> None:
    check(GOOD_TOPIC, "KafkaTopic")
    check({"kind": "KafkaTopicList", "metadata": {"self": "http://h/x", "next": None}, "data": [GOOD_TOPIC]},
          "KafkaTopicList")


@pytest.mark.parametrize("change", [
    {"partitions_count": "3"}, {"is_internal": 0}, {"replication_factor": True}, {"partitions": "http://h/p"},
    {"partitions": {"related": "http://h/p", "x": 1}}, {"name": "t"}, {"kind": "KafkaTopics"},
    {"metadata": {"resource_name": "crn"}},
])
def test_checker_refuses_wrong_topics(change: dict[str, Any]) -> None:
    assert problems({**GOOD_TOPIC, **change}, "KafkaTopic")


def test_checker_refuses_a_missing_field_and_bad_list_items() -> None:
    body = dict(GOOD_TOPIC)
    del body["configs"]
    assert problems(body, "KafkaTopic") == ["KafkaTopic: missing configs"]
    bad_list = {"kind": "KafkaTopicList", "metadata": {"self": "http://h/x", "next": None}, "data": [body]}
    assert problems(bad_list, "KafkaTopicList")
    assert problems({"kind": "KafkaTopicList", "metadata": {"self": "x"}, "data": {}}, "KafkaTopicList")
    assert problems({"kind": "KafkaTopicList", "metadata": {"next": None}, "data": []}, "KafkaTopicList")
    assert problems({"kind": "KafkaTopicList", "metadata": {"self": "x", "next": 3}, "data": []}, "KafkaTopicList")


# -- our bodies (the route helpers, no broker) -----------------------------------------------------------------
@pytest.fixture
def request_stub() -> Any:
    settings = SimpleNamespace(public_url="https://gw.example/kafka")
    return SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(settings=settings)))


def test_route_bodies_conform(request_stub: Any) -> None:
    from api.v3 import clusters as v3
    from service.admin import ConfigEntry, ConfigSynonym
    from service.client.metadata import BrokerInfo
    from service.topics import PartitionView, TopicView

    cluster = v3.cluster_body(request_stub, "c1", 7)
    check(cluster, "KafkaCluster")
    assert cluster["metadata"] == {"self": "https://gw.example/kafka/v3/clusters/c1", "resource_name": "crn:///kafka=c1"}
    assert cluster["controller"] == {"related": "https://gw.example/kafka/v3/clusters/c1/brokers/7"}
    assert "controller" not in v3.cluster_body(request_stub, "c1", -1)
    check(v3.broker_body(request_stub, "c1", BrokerInfo(7, "h", 9092)), "KafkaBroker")
    p0 = PartitionView(0, 7, (7, 8, 7), (7,))
    t = TopicView("a.b-c_d", False, (p0, PartitionView(1, -1, (8,), ())))
    topic = v3.topic_view_body(request_stub, "c1", t)
    check(topic, "KafkaTopic")
    assert (topic["partitions_count"], topic["replication_factor"]) == (2, 3)
    assert topic["metadata"]["resource_name"] == "crn:///kafka=c1/topic=a.b-c_d"
    part = v3.partition_body(request_stub, "c1", t.name, p0)
    check(part, "KafkaPartition")
    assert part["leader"]["related"].endswith("/topics/a.b-c_d/partitions/0/replicas/7")
    assert "leader" not in v3.partition_body(request_stub, "c1", t.name, t.partitions[1])
    assert v3._replica_ids(p0) == [7, 8]
    replica = v3.replica_body(request_stub, "c1", t.name, p0, 8)
    check(replica, "KafkaReplica")
    assert (replica["is_leader"], replica["is_in_sync"]) == (False, False)
    entry = ConfigEntry("retention.ms", "1000", False, False, False, "DYNAMIC_TOPIC_CONFIG",
                        (ConfigSynonym("retention.ms", "1000", "DYNAMIC_TOPIC_CONFIG"),
                         ConfigSynonym("log.retention.ms", None, "DEFAULT_CONFIG")))
    config = v3.config_body(request_stub, "c1", t.name, entry)
    check(config, "KafkaTopicConfig")
    assert config["metadata"]["self"].endswith("/topics/a.b-c_d/configs/retention.ms")
