"""The v3 shape checker (:mod:`tests.v3_shapes`) can fail, and the bodies the v3 route helpers build conform.

The integration tests (``test_v3_http``, ``test_v3_groups_*``, ``test_v3_produce``) run the checker on every
answer of a real gateway; here it runs on a conforming body of every kind and on one deliberately wrong body
per kind family, each with the exact differences it must name.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from tests.v3_shapes import LISTS, OBJECTS, RESOURCES, check, fields_of, problems

U = "https://gw.example/kafka/v3/clusters/c"


def rel(path: str = "") -> dict[str, str]:
    return {"related": f"{U}{path}"}


def meta(path: str = "", resource_name: str | None = "crn:///kafka=c") -> dict[str, Any]:
    return {"self": f"{U}{path}", "resource_name": resource_name}


GOOD: dict[str, dict[str, Any]] = {
    "KafkaCluster": {"kind": "KafkaCluster", "metadata": meta(), "cluster_id": "c", "controller": rel("/brokers/1"),
                     "acls": rel("/acls"), "brokers": rel("/brokers"), "broker_configs": rel("/broker-configs"),
                     "consumer_groups": rel("/consumer-groups"), "topics": rel("/topics"),
                     "partition_reassignments": rel("/topics/-/partitions/-/reassignment")},
    "KafkaBroker": {"kind": "KafkaBroker", "metadata": meta("/brokers/1"), "cluster_id": "c", "broker_id": 1,
                    "host": "h", "port": 9092, "rack": None, "configs": rel("/brokers/1/configs"),
                    "partition_replicas": rel("/brokers/1/partition-replicas")},
    "KafkaTopic": {"kind": "KafkaTopic", "metadata": meta("/topics/t", "crn:///kafka=c/topic=t"), "cluster_id": "c",
                   "topic_name": "t", "is_internal": False, "replication_factor": 1, "partitions_count": 3,
                   "partitions": rel("/topics/t/partitions"), "configs": rel("/topics/t/configs"),
                   "partition_reassignments": rel("/topics/t/partitions/-/reassignment")},
    "KafkaPartition": {"kind": "KafkaPartition", "metadata": meta("/topics/t/partitions/0"), "cluster_id": "c",
                       "topic_name": "t", "partition_id": 0, "leader": rel("/topics/t/partitions/0/replicas/1"),
                       "replicas": rel("/topics/t/partitions/0/replicas"),
                       "reassignment": rel("/topics/t/partitions/0/reassignment")},
    "KafkaReplica": {"kind": "KafkaReplica", "metadata": meta("/topics/t/partitions/0/replicas/1"), "cluster_id": "c",
                     "topic_name": "t", "partition_id": 0, "broker_id": 1, "is_leader": True, "is_in_sync": True,
                     "broker": rel("/brokers/1")},
    "KafkaTopicConfig": {"kind": "KafkaTopicConfig", "metadata": meta("/topics/t/configs/retention.ms"),
                         "cluster_id": "c", "topic_name": "t", "name": "retention.ms", "value": "1000",
                         "is_default": False, "is_read_only": False, "is_sensitive": False,
                         "source": "DYNAMIC_TOPIC_CONFIG",
                         "synonyms": [{"name": "retention.ms", "value": "1000", "source": "DYNAMIC_TOPIC_CONFIG"},
                                      {"name": "log.retention.ms", "value": None, "source": "DEFAULT_CONFIG"}]},
    "KafkaConsumerGroup": {"kind": "KafkaConsumerGroup", "metadata": meta("/consumer-groups/g", None),
                           "cluster_id": "c", "consumer_group_id": "g", "is_simple": False,
                           "partition_assignor": "range", "state": "STABLE", "coordinator": rel("/brokers/1"),
                           "consumers": rel("/consumer-groups/g/consumers"),
                           "lag_summary": rel("/consumer-groups/g/lag-summary")},
    "KafkaConsumer": {"kind": "KafkaConsumer", "metadata": meta("/consumer-groups/g/consumers/m"), "cluster_id": "c",
                      "consumer_group_id": "g", "consumer_id": "m", "instance_id": None, "client_id": "cl",
                      "assignments": rel("/consumer-groups/g/consumers/m/assignments")},
    "KafkaConsumerAssignment": {"kind": "KafkaConsumerAssignment",
                                "metadata": meta("/consumer-groups/g/consumers/m/assignments/t/partitions/0"),
                                "cluster_id": "c", "consumer_group_id": "g", "consumer_id": "m", "topic_name": "t",
                                "partition_id": 0, "partition": rel("/topics/t/partitions/0"),
                                "lag": rel("/consumer-groups/g/lags/t/partitions/0")},
    "KafkaConsumerLag": {"kind": "KafkaConsumerLag", "metadata": meta("/consumer-groups/g/lags/t/partitions/0"),
                         "cluster_id": "c", "consumer_group_id": "g", "topic_name": "t", "partition_id": 0,
                         "current_offset": 1, "log_end_offset": 3, "lag": 2, "consumer_id": "", "instance_id": None,
                         "client_id": ""},
    "KafkaConsumerGroupLagSummary": {"kind": "KafkaConsumerGroupLagSummary",
                                     "metadata": meta("/consumer-groups/g/lag-summary"), "cluster_id": "c",
                                     "consumer_group_id": "g", "max_lag_consumer_id": "m",
                                     "max_lag_instance_id": "i", "max_lag_client_id": "cl",
                                     "max_lag_topic_name": "t", "max_lag_partition_id": 0, "max_lag": 2,
                                     "total_lag": 5, "max_lag_consumer": rel("/consumer-groups/g/consumers/m"),
                                     "max_lag_partition": rel("/topics/t/partitions/0")},
    "Error": {"error_code": 40403, "message": "Topic not found."},
    "ProduceResponse": {"error_code": 200, "cluster_id": "c", "topic_name": "t", "partition_id": 0, "offset": 7,
                        "timestamp": "2021-02-05T19:14:42Z", "key": {"type": "BINARY", "size": -1},
                        "value": {"type": "STRING", "size": 3}},
}


def a_list(kind: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"self": f"{U}/x", "next": None}, "data": list(items)}


def test_every_kind_has_a_conforming_body_that_passes() -> None:
    assert set(GOOD) == set(RESOURCES) | {"Error", "ProduceResponse"}
    for kind, body in GOOD.items():
        check(body, kind)
    for list_kind, item in LISTS.items():
        check(a_list(list_kind, GOOD[item], GOOD[item]), list_kind)
        check(a_list(list_kind), list_kind)
    check({"error_code": 500, "message": None}, "Error")  # message: string, nullable
    check({"error_code": 200, "cluster_id": "c", "topic_name": "t", "partition_id": 0, "offset": 0}, "ProduceResponse")
    check({**GOOD["ProduceResponse"], "timestamp": None, "key": None,
           "value": {"size": 3, "type": None, "subject": None, "schema_id": None, "schema_version": None}},
          "ProduceResponse")
    without_optional = {k: v for k, v in GOOD["KafkaBroker"].items() if k not in ("host", "port", "rack")}
    check(without_optional, "KafkaBroker")


def test_the_envelopes_are_part_of_every_kind() -> None:
    assert set(fields_of("KafkaTopicList")) == {"kind", "metadata", "data"}
    assert {"kind", "metadata"} <= set(fields_of("KafkaConsumerLag"))
    assert "kind" not in fields_of("Error") and "Error" in OBJECTS
    with pytest.raises(AssertionError):
        fields_of("KafkaTopics")


def _wrong(kind: str, change: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    body = copy.deepcopy(GOOD[kind])
    body.update(change)
    for name in drop:
        del body[name]
    return body


# one deliberately wrong body per kind family, with exactly the differences the checker must name
WRONG: list[tuple[str, dict[str, Any], list[str]]] = [
    ("KafkaCluster", _wrong("KafkaCluster", {"controller": None}, drop=("topics",)),
     ["KafkaCluster: missing topics", "KafkaCluster.controller: null where the spec does not allow it"]),
    ("KafkaBroker", _wrong("KafkaBroker", {"broker_id": "1", "port": True}),
     ["KafkaBroker.broker_id: '1' is not integer", "KafkaBroker.port: True is not integer"]),
    ("KafkaTopic", _wrong("KafkaTopic", {"partitions_count": "3", "name": "t"}),
     ["KafkaTopic.partitions_count: '3' is not integer", "KafkaTopic: fields the spec does not name: ['name']"]),
    ("KafkaPartition", _wrong("KafkaPartition", {"replicas": {"related": "/relative"}}),
     ["KafkaPartition.replicas.related: '/relative' is not an absolute http(s) URL"]),
    ("KafkaReplica", _wrong("KafkaReplica", {"is_leader": 1, "broker": {"related": f"{U}/brokers/1", "x": 1}}),
     ["KafkaReplica.is_leader: 1 is not boolean", "KafkaReplica.broker: fields the spec does not name: ['x']"]),
    ("KafkaTopicConfig", _wrong("KafkaTopicConfig", {"source": "DYNAMIC", "synonyms": [{"name": "n", "source": "X"}]}),
     ["KafkaTopicConfig.source: 'DYNAMIC' is not ConfigSource",
      "KafkaTopicConfig.synonyms[0].source: 'X' is not ConfigSource"]),
    ("KafkaConsumerGroup", _wrong("KafkaConsumerGroup", {"state": "Stable", "lag_summary": {"href": f"{U}/x"}}),
     ["KafkaConsumerGroup.state: 'Stable' is not ConsumerGroupState",
      "KafkaConsumerGroup.lag_summary: missing related",
      "KafkaConsumerGroup.lag_summary: fields the spec does not name: ['href']"]),
    ("KafkaConsumer", _wrong("KafkaConsumer", {"kind": "KafkaConsumers", "consumer_id": None}),
     ["KafkaConsumer: kind 'KafkaConsumers', expected 'KafkaConsumer'",
      "KafkaConsumer.consumer_id: null where the spec does not allow it"]),
    ("KafkaConsumerAssignment", _wrong("KafkaConsumerAssignment", {"metadata": {"resource_name": 3}}),
     ["KafkaConsumerAssignment.metadata: missing self",
      "KafkaConsumerAssignment.metadata.resource_name: 3 is not string"]),
    ("KafkaConsumerLag",
     _wrong("KafkaConsumerLag", {"lag": "2", "extra": 1, "partition_id": True}, drop=("client_id",)),
     ["KafkaConsumerLag.partition_id: True is not integer", "KafkaConsumerLag.lag: '2' is not integer",
      "KafkaConsumerLag: missing client_id", "KafkaConsumerLag: fields the spec does not name: ['extra']"]),
    ("KafkaConsumerGroupLagSummary", _wrong("KafkaConsumerGroupLagSummary", {"max_lag": 2.5, "metadata": None}),
     ["KafkaConsumerGroupLagSummary.metadata: null where the spec does not allow it",
      "KafkaConsumerGroupLagSummary.max_lag: 2.5 is not integer"]),
    ("KafkaTopicList", {"kind": "KafkaTopicList", "metadata": {"self": f"{U}/topics", "next": 3},
                        "data": [_wrong("KafkaTopic", {"kind": "X"}), "t"]},
     ["KafkaTopicList.metadata.next: 3 is not string", "KafkaTopicList.data[0]: kind 'X', expected 'KafkaTopic'",
      "KafkaTopicList.data[1]: 't' is not an object"]),
    ("KafkaConsumerLagList", {"kind": "KafkaConsumerLagList", "metadata": {"next": None}, "data": {}, "x": 1},
     ["KafkaConsumerLagList.metadata: missing self", "KafkaConsumerLagList.data: {} is not an array",
      "KafkaConsumerLagList: fields the spec does not name: ['x']"]),
    ("Error", {"error_code": "404", "message": "m", "kind": "Error"},
     ["Error.error_code: '404' is not integer", "Error: fields the spec does not name: ['kind']"]),
    ("ProduceResponse", _wrong("ProduceResponse", {"offset": None, "value": {"type": "STRING"}}),
     ["ProduceResponse.offset: null where the spec does not allow it", "ProduceResponse.value: missing size"]),
]


@pytest.mark.parametrize(("kind", "body", "expected"), WRONG, ids=[w[0] for w in WRONG])
def test_the_checker_names_every_difference(kind: str, body: dict[str, Any], expected: list[str]) -> None:
    assert sorted(problems(body, kind)) == sorted(expected)
    with pytest.raises(AssertionError):
        check(body, kind)


def test_every_kind_family_has_a_wrong_body() -> None:
    families = {k for k, _, _ in WRONG}
    assert set(RESOURCES) | {"Error", "ProduceResponse"} <= families
    assert families & set(LISTS)


@pytest.mark.parametrize("change", [
    {"partitions_count": "3"}, {"is_internal": 0}, {"replication_factor": True}, {"partitions": "http://h/p"},
    {"partitions": {"related": "http://h/p", "x": 1}}, {"name": "t"}, {"kind": "KafkaTopics"},
    {"metadata": {"resource_name": "crn"}}, {"authorized_operations": ["READ", 1]}, {"authorized_operations": None},
])
def test_checker_refuses_wrong_topics(change: dict[str, Any]) -> None:
    assert problems({**GOOD["KafkaTopic"], **change}, "KafkaTopic")


def test_checker_refuses_a_missing_field_and_bad_list_items() -> None:
    body = _wrong("KafkaTopic", {}, drop=("configs",))
    assert problems(body, "KafkaTopic") == ["KafkaTopic: missing configs"]
    assert problems(a_list("KafkaTopicList", body), "KafkaTopicList") == ["KafkaTopicList.data[0]: missing configs"]
    assert problems({"kind": "KafkaTopicList", "metadata": {"self": "x"}, "data": {}}, "KafkaTopicList")
    assert problems({"kind": "KafkaTopicList", "metadata": {"next": None}, "data": []}, "KafkaTopicList")
    assert problems({"kind": "KafkaTopicList", "metadata": {"self": "x", "next": 3}, "data": []}, "KafkaTopicList")
    assert problems({"kind": "KafkaTopicList", "metadata": {"self": "x"}}, "KafkaTopicList") == [
        "KafkaTopicList: missing data"]
    assert problems(a_list("KafkaConsumerLagList", _wrong("KafkaConsumerLag", {"kind": "X"})),
                    "KafkaConsumerLagList") == ["KafkaConsumerLagList.data[0]: kind 'X', expected 'KafkaConsumerLag'"]
    assert problems([], "Error") == ["Error: [] is not an object"]


# -- our bodies (the route helpers, no broker) -----------------------------------------------------------------
@pytest.fixture
def request_stub() -> Any:
    settings = SimpleNamespace(public_url="https://gw.example/kafka")
    return SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(settings=settings)))


def test_route_bodies_conform(request_stub: Any) -> None:
    from api.v3 import clusters as v3
    from service.client.metadata import BrokerInfo
    from service.cluster.topic_admin import ConfigEntry, ConfigSynonym
    from service.cluster.topics import PartitionView, TopicView

    cluster = v3.cluster_body(request_stub, "c1", 7)
    check(cluster, "KafkaCluster")
    assert cluster["metadata"] == {"self": "https://gw.example/kafka/v3/clusters/c1",
                                   "resource_name": "crn:///kafka=c1"}
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
