"""The client against a real Tansu broker: negotiation, CreateTopics, Metadata, reconnect."""

from __future__ import annotations

import pytest

from service.client.client import KafkaClient
from service.client.errors import KafkaConnectionError
from service.embedded.tansu import EmbeddedBroker
from service.protocol import messages as M
from service.protocol.primitives import ZERO_UUID

pytestmark = pytest.mark.integration
MetaTopic = M.struct("MetadataRequest", "MetadataRequestTopic")


async def test_api_versions_negotiation(kclient: KafkaClient) -> None:
    conn = await kclient.any_connection()
    nv = conn.versions
    assert nv is not None
    # Tansu 0.6 advertises Fetch 0-17 and Metadata 0-12: we pick the top of our ranges.
    assert nv.version(M.ApiKey.FETCH) == min(17, nv.broker[M.ApiKey.FETCH][1])
    assert nv.version(M.ApiKey.METADATA) == min(12, nv.broker[M.ApiKey.METADATA][1])
    assert nv.version(M.ApiKey.API_VERSIONS) >= 3
    assert nv.supports(M.ApiKey.FETCH, 13)  # topic ids in fetch


async def test_create_topics_and_metadata_with_topic_ids(kclient: KafkaClient, topic_name: str) -> None:
    await kclient.create_topics({topic_name: 3})
    md = kclient.metadata
    info = md.topics[topic_name]
    assert sorted(info.partitions) == [0, 1, 2]
    assert info.topic_id != ZERO_UUID
    assert md.topic_names[info.topic_id] == topic_name
    assert all(md.leader(topic_name, p) in md.brokers for p in range(3))
    conn = await kclient.any_connection()
    # Older versions (no topic ids) still work and agree on partitions.
    resp9 = await conn.send(M.MetadataRequest(topics=[MetaTopic(name=topic_name)]), version=9)
    (t9,) = resp9.topics
    assert t9.name == topic_name and t9.topic_id == ZERO_UUID and len(t9.partitions) == 3
    resp1 = await conn.send(M.MetadataRequest(topics=[MetaTopic(name=topic_name)]), version=1)
    assert [len(t.partitions) for t in resp1.topics] == [3]


async def test_creating_an_existing_topic_is_idempotent(kclient: KafkaClient, topic_name: str) -> None:
    await kclient.create_topics({topic_name: 2})
    await kclient.create_topics({topic_name: 2})
    assert kclient.metadata.partitions(topic_name) == [0, 1]


async def test_unknown_topic_metadata(kclient: KafkaClient, topic_name: str) -> None:
    await kclient.refresh_metadata([topic_name])
    assert kclient.metadata.topic_error(topic_name) == 3
    assert kclient.metadata.leader(topic_name, 0) is None


async def test_broker_restart_reconnects() -> None:
    broker = EmbeddedBroker()
    broker.start()
    client = KafkaClient(broker.bootstrap)
    try:
        await client.create_topics({"restart-topic": 1})
        node = client.metadata.leader("restart-topic", 0)
        assert node is not None
        mc = client.connection(node)
        first = await mc.get()
        broker.kill()
        await first.wait_closed()  # the reader sees EOF: an event, not a sleep
        with pytest.raises(KafkaConnectionError) as info:
            await mc.send(M.MetadataRequest(topics=[]))
        assert info.value.retriable
        broker.start()  # same port
        resp = await mc.send(M.MetadataRequest(topics=[]))
        assert resp.brokers and mc.reconnects == 1
        await client.refresh_metadata(["restart-topic"])
        # memory:// storage forgets topics on restart: the metadata reflects what the new broker has.
        assert client.metadata.topic_error("restart-topic") in (0, 3)
    finally:
        await client.close()
        broker.stop()
