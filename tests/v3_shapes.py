"""The shapes of Confluent's published v3 OpenAPI (kafka-rest ``api/v3/openapi.yaml``), and one checker.

The tables are written by hand from reading that spec. Every v3 body the gateway answers is one of:

- a resource (``Resource``: ``kind`` + ``metadata`` = ``ResourceMetadata``, then the fields of
  :data:`RESOURCES` [kind]): ``KafkaCluster``, ``KafkaTopic``, ``KafkaConsumerGroup``, …;
- a collection of resources (``ResourceCollection``: ``kind`` = ``<item kind>List``, ``metadata`` =
  ``ResourceCollectionMetadata``, ``data`` = array of the item kind), see :data:`LISTS`;
- a plain object without kind and metadata (:data:`OBJECTS`): the ``Error`` body, the produce result
  ``ProduceResponse``; the nested ``ProduceResponseData``, ``ConfigSynonymData``, ``Relationship`` and the
  two metadata objects are there too.

Each field is ``(type, required, nullable)``; a type is ``string``/``integer``/``boolean``, the name of an
enum in :data:`ENUMS`, the name of another shape (a nested object, resource or collection) or
``array:<type>``. :func:`problems` names every difference (missing required field, wrong type, null where
the spec does not allow it, fields the spec does not name, wrong kind, bad metadata); :func:`check` asserts
there is none.

One rule goes beyond the spec: a ``Relationship``'s ``related`` is ``type: string`` there, and we also
require an absolute http(s) URL (Confluent's examples and the gateway's links always are).
"""

from __future__ import annotations

from typing import Any

STR, INT, BOOL = "string", "integer", "boolean"
REL = "Relationship"
CONFIG_SOURCE, GROUP_STATE = "ConfigSource", "ConsumerGroupState"
Field = tuple[str, bool, bool]  # (type, required, nullable)

#: the spec's (extensible) enums: the values it names
ENUMS: dict[str, frozenset[str]] = {
    CONFIG_SOURCE: frozenset({"DYNAMIC_CLUSTER_LINK_CONFIG", "DYNAMIC_TOPIC_CONFIG", "DYNAMIC_BROKER_LOGGER_CONFIG",
                              "DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG", "STATIC_BROKER_CONFIG",
                              "DEFAULT_CONFIG", "UNKNOWN"}),
    GROUP_STATE: frozenset({"UNKNOWN", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "STABLE", "DEAD", "EMPTY"}),
}


def _req(typ: str) -> Field:
    return (typ, True, False)


def _opt(typ: str, nullable: bool = True) -> Field:
    return (typ, False, nullable)


#: resource kind → its fields beside ``kind`` and ``metadata``
RESOURCES: dict[str, dict[str, Field]] = {
    "KafkaCluster": {
        "cluster_id": _req(STR), "controller": _opt(REL, nullable=False), "acls": _req(REL), "brokers": _req(REL),
        "broker_configs": _req(REL), "consumer_groups": _req(REL), "topics": _req(REL),
        "partition_reassignments": _req(REL)},
    "KafkaBroker": {
        "cluster_id": _req(STR), "broker_id": _req(INT), "host": _opt(STR), "port": _opt(INT), "rack": _opt(STR),
        "configs": _req(REL), "partition_replicas": _req(REL)},
    "KafkaTopic": {
        "cluster_id": _req(STR), "topic_name": _req(STR), "is_internal": _req(BOOL), "replication_factor": _req(INT),
        "partitions_count": _req(INT), "partitions": _req(REL), "configs": _req(REL),
        "partition_reassignments": _req(REL), "authorized_operations": _opt(f"array:{STR}", nullable=False)},
    "KafkaPartition": {
        "cluster_id": _req(STR), "topic_name": _req(STR), "partition_id": _req(INT),
        "leader": _opt(REL, nullable=False), "replicas": _req(REL), "reassignment": _req(REL)},
    "KafkaReplica": {
        "cluster_id": _req(STR), "topic_name": _req(STR), "partition_id": _req(INT), "broker_id": _req(INT),
        "is_leader": _req(BOOL), "is_in_sync": _req(BOOL), "broker": _req(REL)},
    "KafkaTopicConfig": {
        "cluster_id": _req(STR), "topic_name": _req(STR), "name": _req(STR), "value": _opt(STR),
        "is_default": _req(BOOL), "is_read_only": _req(BOOL), "is_sensitive": _req(BOOL),
        "source": _req(CONFIG_SOURCE), "synonyms": _req("array:ConfigSynonymData")},
    "KafkaConsumerGroup": {
        "cluster_id": _req(STR), "consumer_group_id": _req(STR), "is_simple": _req(BOOL),
        "partition_assignor": _req(STR), "state": _req(GROUP_STATE), "coordinator": _req(REL),
        "consumers": _req(REL), "lag_summary": _req(REL),
        "group_type": _opt(STR, nullable=False)},  # our extension: the group protocol (classic | consumer)
    "KafkaConsumer": {
        "cluster_id": _req(STR), "consumer_group_id": _req(STR), "consumer_id": _req(STR), "instance_id": _opt(STR),
        "client_id": _req(STR), "assignments": _req(REL)},
    "KafkaConsumerAssignment": {
        "cluster_id": _req(STR), "consumer_group_id": _req(STR), "consumer_id": _req(STR), "topic_name": _req(STR),
        "partition_id": _req(INT), "partition": _req(REL), "lag": _req(REL)},
    "KafkaConsumerLag": {
        "cluster_id": _req(STR), "consumer_group_id": _req(STR), "topic_name": _req(STR), "partition_id": _req(INT),
        "current_offset": _req(INT), "log_end_offset": _req(INT), "lag": _req(INT), "consumer_id": _req(STR),
        "instance_id": _opt(STR), "client_id": _req(STR)},
    "KafkaConsumerGroupLagSummary": {
        "cluster_id": _req(STR), "consumer_group_id": _req(STR), "max_lag_consumer_id": _req(STR),
        "max_lag_instance_id": _opt(STR), "max_lag_client_id": _req(STR), "max_lag_topic_name": _req(STR),
        "max_lag_partition_id": _req(INT), "max_lag": _req(INT), "total_lag": _req(INT),
        "max_lag_consumer": _req(REL), "max_lag_partition": _req(REL)},
}
#: collection kind → item kind
LISTS: dict[str, str] = {f"{kind}List": kind for kind in RESOURCES}
#: objects without kind and metadata
OBJECTS: dict[str, dict[str, Field]] = {
    "Error": {"error_code": _req(INT), "message": (STR, True, True)},
    "ProduceResponse": {
        "error_code": _req(INT), "cluster_id": _req(STR), "topic_name": _req(STR), "partition_id": _req(INT),
        "offset": _req(INT), "timestamp": _opt(STR), "key": _opt("ProduceResponseData"),
        "value": _opt("ProduceResponseData")},
    "ProduceResponseData": {
        "size": _req(INT), "type": _opt(STR), "subject": _opt(STR), "schema_id": _opt(INT),
        "schema_version": _opt(INT)},
    "ConfigSynonymData": {"name": _req(STR), "value": _opt(STR), "source": _req(CONFIG_SOURCE)},
    REL: {"related": _req(STR)},
    "ResourceMetadata": {"self": _req(STR), "resource_name": _opt(STR)},
    "ResourceCollectionMetadata": {"self": _req(STR), "next": _opt(STR)},
}


def fields_of(kind: str) -> dict[str, Field]:
    """Every field of ``kind``, the envelope's (``kind``, ``metadata``, ``data``) included."""
    if kind in LISTS:
        return {"kind": _req(STR), "metadata": _req("ResourceCollectionMetadata"),
                "data": _req(f"array:{LISTS[kind]}")}
    if kind in RESOURCES:
        return {"kind": _req(STR), "metadata": _req("ResourceMetadata"), **RESOURCES[kind]}
    if kind in OBJECTS:
        return OBJECTS[kind]
    raise AssertionError(f"no shape for {kind!r}")


def _value(value: Any, typ: str, where: str) -> list[str]:
    if typ.startswith("array:"):
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not an array"]
        return [p for i, item in enumerate(value) for p in _value(item, typ.removeprefix("array:"), f"{where}[{i}]")]
    if typ == STR:
        ok = isinstance(value, str)
    elif typ == INT:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ == BOOL:
        ok = isinstance(value, bool)
    elif typ in ENUMS:
        ok = isinstance(value, str) and value in ENUMS[typ]
    else:
        return problems(value, typ, where)
    return [] if ok else [f"{where}: {value!r} is not {typ}"]


def problems(body: Any, kind: str, where: str | None = None) -> list[str]:
    """Every difference between ``body`` and the spec's shape of ``kind`` (empty: it conforms)."""
    where = where or kind
    spec = fields_of(kind)
    if not isinstance(body, dict):
        return [f"{where}: {body!r} is not an object"]
    out = []
    if (kind in LISTS or kind in RESOURCES) and "kind" in body and body["kind"] != kind:
        out.append(f"{where}: kind {body['kind']!r}, expected {kind!r}")
    for name, (typ, required, nullable) in spec.items():
        if name not in body:
            if required:
                out.append(f"{where}: missing {name}")
        elif body[name] is None:
            if not nullable:
                out.append(f"{where}.{name}: null where the spec does not allow it")
        else:
            out += _value(body[name], typ, f"{where}.{name}")
    extra = sorted(set(body) - set(spec))
    if extra:
        out.append(f"{where}: fields the spec does not name: {extra}")
    related = body.get("related") if kind == REL else None
    if isinstance(related, str) and not related.startswith(("http://", "https://")):
        out.append(f"{where}.related: {related!r} is not an absolute http(s) URL")
    return out


def check(body: Any, kind: str) -> None:
    """Assert that ``body`` is exactly Confluent's ``kind``."""
    found = problems(body, kind)
    assert found == [], (found, body)
