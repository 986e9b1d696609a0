"""group.protocol per consumer instance: the create properties, the gateway's default, the coordinator a
Consumer builds, the refusal on a broker without the consumer protocol, and what the descriptor records."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from api.v2.consumer_config import ConfigError, parse_properties
from service.client.client import KafkaClient
from service.client.versions import NegotiatedVersions, our_versions
from service.consumer.consumer import Consumer, ConsumerConfig
from service.group.coordinator import GroupCoordinator
from service.group.coordinator_consumer import ConsumerProtocolCoordinator
from service.group.member_consumer import ConsumerGroupMember
from service.instances.registry import Gateway, GroupProtocolUnsupported, InstanceOptions
from service.protocol import messages as M


def test_properties() -> None:
    props = parse_properties({"group.protocol": "Consumer", "group.remote.assignor": "RANGE"})
    assert props.overrides == {"group_protocol": "consumer", "group_remote_assignor": "range"}
    assert parse_properties({"group.protocol": "classic"}).overrides == {"group_protocol": "classic"}
    for bad in ({"group.protocol": "eager"}, {"group.protocol": 1}, {"group.remote.assignor": "sticky"}):
        with pytest.raises(ConfigError) as err:
            parse_properties(bad)
        assert err.value.code == 42206


async def test_the_consumer_builds_the_coordinator_of_its_protocol() -> None:
    client = KafkaClient("127.0.0.1:1")
    classic = Consumer(client, ConsumerConfig(group_id="g"))
    assert type(classic.coordinator) is GroupCoordinator and classic.group_protocol == "classic"
    c = Consumer(client, ConsumerConfig(group_id="g", group_protocol="consumer", group_remote_assignor="uniform",
                                        group_instance_id="pod-1", max_poll_interval_ms=60000))
    assert isinstance(c.coordinator, ConsumerProtocolCoordinator) and c.group_protocol == "consumer"
    assert isinstance(c.member, ConsumerGroupMember)
    assert (c.member.server_assignor, c.member.group_instance_id, c.member.rebalance_timeout_ms) == (
        "uniform", "pod-1", 60000)
    # a pattern subscription is sent to the broker in RE2 syntax (Java spellings rewritten)
    c.subs.subscribe_pattern(r"orders-\p{Digit}+")
    assert c._group_regex() == "orders-[[:digit:]]+"
    c.subs.unsubscribe()
    c.subs.subscribe(["a"])
    assert c._group_regex() is None
    with pytest.raises(ValueError):
        Consumer(client, ConsumerConfig(group_id="g", group_protocol="eager"))
    await client.close()


class _Conn:
    def __init__(self, versions: NegotiatedVersions) -> None:
        self.versions = versions


def _client(with_consumer_protocol: bool) -> Any:
    broker = dict(our_versions())
    if not with_consumer_protocol:
        broker.pop(M.ApiKey.CONSUMER_GROUP_HEARTBEAT)
    client = KafkaClient("127.0.0.1:1")
    conn = _Conn(NegotiatedVersions(broker))

    async def any_connection() -> _Conn:
        return conn

    client.any_connection = any_connection  # type: ignore[method-assign,assignment]
    return client


async def test_create_refuses_consumer_instances_on_a_broker_without_the_protocol() -> None:
    gw = Gateway(consumer_defaults={"group_protocol": "consumer"}, client_factory=lambda t: _client(False))
    rt = gw.tenant("t")
    with pytest.raises(GroupProtocolUnsupported) as err:
        await gw.create_instance(rt, "g", InstanceOptions(), "a")
    assert err.value.error_code == 40913 and "ConsumerGroupHeartbeat" in str(err.value)
    assert not rt.instances
    # classic asked for by the instance: created
    inst = await gw.create_instance(rt, "g", InstanceOptions(overrides={"group_protocol": "classic"}), "b")
    assert type(inst.consumer.coordinator) is GroupCoordinator
    await gw.close()


async def test_the_resolved_protocol_is_kept_in_the_options() -> None:
    gw = Gateway(consumer_defaults={"group_protocol": "consumer"}, client_factory=lambda t: _client(True))
    rt = gw.tenant("t")
    inst = await gw.create_instance(rt, "g", InstanceOptions(), "a")
    assert isinstance(inst.consumer.coordinator, ConsumerProtocolCoordinator)
    # what the descriptor of a durable instance records (dataclasses.asdict of the options)
    assert dataclasses.asdict(inst.options)["overrides"]["group_protocol"] == "consumer"
    gw.consumer_defaults["group_protocol"] = "classic"  # another replica's default: the instance keeps its own
    again = await gw.create_instance(rt, "g", InstanceOptions(**dataclasses.asdict(inst.options)), "b",
                                     recreated=True)
    assert isinstance(again.consumer.coordinator, ConsumerProtocolCoordinator)
    plain = await gw.create_instance(rt, "g", InstanceOptions(), "c")
    assert plain.options.overrides["group_protocol"] == "classic"
    await gw.close()


def test_a_member_refused_later_answers_40913() -> None:
    """A consumer instance created while no broker answered learns at its first poll (the member checks its
    coordinator): that error is answered as the create would have been."""
    import orjson

    from api.errors import kafka_error_response
    from service.group.coordinator_consumer import ConsumerProtocolUnsupportedError

    resp = kafka_error_response(ConsumerProtocolUnsupportedError("group 'g' cannot use the consumer protocol"))
    body = orjson.loads(resp.body)
    assert resp.status_code == 409 and body["error_code"] == 40913 and "classic" in body["message"]
