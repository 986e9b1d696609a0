"""Kafka consumer properties in a create body: honoured, ignored (logged once) or refused; embedded defaults."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from api.v2 import consumer_config as cc
from api.v2.consumer_config import ConfigError, parse_properties
from api.v2.consumers import CreateConsumer
from service.instances.registry import Gateway, InstanceOptions
from service.settings import Settings


def test_honoured_properties_become_consumer_config_fields() -> None:
    got = parse_properties({
        "heartbeat.interval.ms": "500", "max.poll.interval.ms": 60000, "fetch.max.wait.ms": "100",
        "fetch.max.bytes": 1048576, "max.partition.fetch.bytes": "65536", "auto.commit.interval.ms": 1000,
        "topic.metadata.refresh.interval.ms": "30000", "client.rack": "rack-1",
        "partition.assignment.strategy": "org.apache.kafka.clients.consumer.RoundRobinAssignor, range",
    })
    assert got.overrides == {
        "heartbeat_interval_ms": 500, "max_poll_interval_ms": 60000, "fetch_max_wait_ms": 100,
        "fetch_max_bytes": 1048576, "max_partition_fetch_bytes": 65536, "auto_commit_interval_ms": 1000,
        "metadata_max_age_ms": 30000, "client_rack": "rack-1", "assignment_strategies": ("roundrobin", "range"),
    }
    assert got.ignored == []
    assert parse_properties({"fetch.wait.max.ms": 5}).overrides == {"fetch_max_wait_ms": 5}  # librdkafka name
    # numbers are clamped into a sane range rather than refused
    assert parse_properties({"fetch.max.wait.ms": 60000, "heartbeat.interval.ms": 0,
                             "metadata.max.age.ms": "5"}).overrides == {
        "fetch_max_wait_ms": 30000, "heartbeat_interval_ms": 1, "metadata_max_age_ms": 1000}


def test_client_side_properties_are_ignored_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    cc._logged.discard("receive.buffer.bytes")
    with caplog.at_level(logging.INFO, logger="api.v2.consumer_config"):
        a = parse_properties({"receive.buffer.bytes": 65536, "queued.min.messages": "1000",
                              "key.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer"})
        b = parse_properties({"receive.buffer.bytes": 1})
    assert a.overrides == {} and sorted(a.ignored) == ["key.deserializer", "queued.min.messages",
                                                        "receive.buffer.bytes"]
    assert b.ignored == ["receive.buffer.bytes"]
    assert sum("receive.buffer.bytes" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("key", ["auto.ofset.reset", "bogus", "max.poll.record", ""])
def test_unknown_keys_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match="unknown consumer configuration key") as e:
        parse_properties({key: "1"})
    assert e.value.code == 42204


@pytest.mark.parametrize("key", ["bootstrap.servers", "group.id", "security.protocol", "sasl.jaas.config",
                                 "ssl.truststore.location", "sasl.username"])
def test_operator_only_keys_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match="operator") as e:
        parse_properties({key: "x"})
    assert e.value.code == 42204


@pytest.mark.parametrize(("props", "match"), [
    ({"heartbeat.interval.ms": "soon"}, "must be an integer"),
    ({"heartbeat.interval.ms": True}, "must be an integer"),
    ({"max.poll.interval.ms": -1}, "between"),
    ({"max.poll.interval.ms": " 5"}, "must be an integer"),
    ({"partition.assignment.strategy": "org.apache.kafka.clients.consumer.StickyAssignor"}, "not supported"),
    ({"partition.assignment.strategy": ""}, "not supported"),
    ({"partition.assignment.strategy": "range,,range"}, "not supported"),
    ({"partition.assignment.strategy": ["range"]}, "comma-separated"),
    ({"client.id": "has space"}, "client.id"),
])
def test_invalid_values_are_42206(props: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        parse_properties(props)
    assert e.value.code == 42206


async def test_overrides_reach_the_consumer_and_heartbeat_follows_a_short_session() -> None:
    gw = Gateway(consumer_defaults={"session_timeout_ms": 45000, "heartbeat_interval_ms": 3000})
    rt = gw.tenant("t", bootstrap="127.0.0.1:1")
    a = await gw.create_instance(rt, "g", InstanceOptions(overrides={"fetch_max_wait_ms": 50,
                                                                     "client_id": "my-app"}), "a")
    assert a.consumer.config.fetch_max_wait_ms == 50 and a.consumer.config.client_id == "my-app"
    b = await gw.create_instance(rt, "g", InstanceOptions(session_timeout_ms=1500), "b")
    assert (b.consumer.config.session_timeout_ms, b.consumer.config.heartbeat_interval_ms) == (1500, 500)
    c = await gw.create_instance(rt, "g", InstanceOptions(session_timeout_ms=1000,
                                                          overrides={"heartbeat_interval_ms": 1000}), "c")
    assert c.consumer.config.heartbeat_interval_ms == 333  # capped below the session timeout
    await gw.close()


def test_embedded_broker_defaults_give_a_fast_first_join(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("GATEWAY_KAFKA_BOOTSTRAP", "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS",
              "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS"):
        monkeypatch.delenv(k, raising=False)
    embedded = Settings()
    assert (embedded.session_timeout_ms(), embedded.heartbeat_interval_ms()) == (2000, 500)
    # static members: above Tansu's ~3 s holds of their JoinGroup and SyncGroup (docs/groups.md)
    assert Settings(static_membership=True).session_timeout_ms() == 10000
    external = Settings(kafka_bootstrap="broker:9092")
    assert (external.session_timeout_ms(), external.heartbeat_interval_ms()) == (45000, 3000)  # Kafka's
    chosen = Settings(kafka_bootstrap="broker:9092", consumer_session_timeout_ms=10000,
                      consumer_heartbeat_interval_ms=2000)
    assert (chosen.session_timeout_ms(), chosen.heartbeat_interval_ms()) == (10000, 2000)


@pytest.mark.parametrize(("given", "expected"), [(-1, None), ("-1", None), (None, None), (0, 0), ("100", 100),
                                                 (1000, 1000)])
def test_fetch_min_bytes_takes_confluents_disabled_sentinel(given: object, expected: int | None) -> None:
    assert CreateConsumer.model_validate({"fetch.min.bytes": given}).fetch_min_bytes == expected


@pytest.mark.parametrize("given", [-2, "-2", "x", 1.5, True])
def test_fetch_min_bytes_refuses_other_values(given: object) -> None:
    with pytest.raises(ValidationError):
        CreateConsumer.model_validate({"fetch.min.bytes": given})
