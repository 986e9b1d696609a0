"""The consumer flow through the client that openapi-python-client generates from openapi.yaml (unmodified;
run by tests/integration/test_generated_clients.py with the generated package on PYTHONPATH): produce (binary and
json records) -> for a binary and a json instance: create -> subscribe -> poll -> commit -> committed
offsets (body in the GET, query parameters, none) -> delete. Prints one JSON object; exits non-zero on error.

Usage: python flow_opc.py <gateway URL> <API key> <topic> <group prefix> <records>
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

from kafka_consumer_gateway_client import AuthenticatedClient
from kafka_consumer_gateway_client.api.consumers import (
    commit_offsets,
    create_consumer,
    delete_consumer,
    get_committed_offsets,
    get_records,
    get_subscription,
    subscribe,
)
from kafka_consumer_gateway_client.api.produce import produce_to_topic
from kafka_consumer_gateway_client.models import (
    BinaryProduceRecord,
    BinaryProduceRequest,
    CommitOffset,
    CommitOffsets,
    CommittedOffsets,
    ConsumerRecord,
    CreateConsumer,
    CreateConsumerFormat,
    CreateConsumerResponse,
    JsonProduceRecord,
    JsonProduceRequest,
    PartitionRef,
    Partitions,
    ProduceResponse,
    Subscription,
    SubscriptionTopics,
)


def ok(response: Any, status: int = 200) -> Any:
    if response.status_code != status:
        raise AssertionError(f"HTTP {response.status_code}: {response.content!r}")
    return response.parsed


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def main() -> None:
    url, api_key, topic, prefix, count = sys.argv[1:]
    n = int(count)
    client = AuthenticatedClient(base_url=url, token=api_key, timeout=30.0)  # type: ignore[arg-type]
    # the first half as binary records, the rest as json records: the body's class picks the media type
    half = n // 2
    binary = ok(produce_to_topic.sync_detailed(topic, client=client, body=BinaryProduceRequest(records=[
        BinaryProduceRecord(key=b64(json.dumps(f"k{i}")), value=b64(json.dumps({"n": i}))) for i in range(half)])))
    as_json = ok(produce_to_topic.sync_detailed(topic, client=client, body=JsonProduceRequest(records=[
        JsonProduceRecord(key=f"k{i}", value={"n": i}) for i in range(half, n)])))
    assert isinstance(binary, ProduceResponse) and isinstance(as_json, ProduceResponse)
    out: dict[str, Any] = {"produced": [o.offset for o in binary.offsets + as_json.offsets]}
    for fmt in ("binary", "json"):
        group = f"{prefix}-{fmt}"
        created = ok(create_consumer.sync_detailed(group, client=client, body=CreateConsumer.from_dict({
            "name": f"opc-{fmt}", "format": fmt, "auto.offset.reset": "earliest", "auto.commit.enable": False})))
        assert isinstance(created, CreateConsumerResponse)
        assert CreateConsumerFormat(fmt)
        iid = created.instance_id
        ok(subscribe.sync_detailed(group, iid, client=client, body=Subscription(topics=[topic])), 204)
        subscription = ok(get_subscription.sync_detailed(group, iid, client=client))
        assert isinstance(subscription, SubscriptionTopics)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + 60
        while len(records) < n and time.monotonic() < deadline:
            records += ok(get_records.sync_detailed(group, iid, client=client, timeout=1000))
        if fmt == "binary":
            values = [json.loads(base64.b64decode(r.value)) for r in records]
            keys = [json.loads(base64.b64decode(r.key)) for r in records]
        else:
            values = [r.value for r in records]
            keys = [r.key for r in records]
        last: dict[int, int] = {}
        for r in records:
            last[r.partition] = max(last.get(r.partition, -1), r.offset)
        if fmt == "binary":
            answer = ok(commit_offsets.sync_detailed(group, iid, client=client, body=CommitOffsets(offsets=[
                CommitOffset(topic=topic, partition=p, offset=o) for p, o in sorted(last.items())])))
        else:
            answer = ok(commit_offsets.sync_detailed(group, iid, client=client))
        parts = sorted(last)
        forms = {
            "committedByBody": {"body": Partitions(partitions=[PartitionRef(topic=topic, partition=p) for p in parts])},
            "committedByQuery": {"topic": [topic] * len(parts), "partition": parts},
            "committedAssigned": {},
        }
        out[fmt] = {"instanceId": iid, "subscription": subscription.topics, "values": values, "keys": keys,
                    "last": {str(p): o for p, o in last.items()}, "commitAnswer": answer}
        for name, kwargs in forms.items():
            committed = ok(get_committed_offsets.sync_detailed(group, iid, client=client, **kwargs))
            assert isinstance(committed, CommittedOffsets)
            out[fmt][name] = {str(o.partition): o.offset for o in committed.offsets}
        ok(delete_consumer.sync_detailed(group, iid, client=client), 204)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
