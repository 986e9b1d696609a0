"""The consumer flow through the client that openapi-generator's ``python`` generator makes from openapi.yaml
(unmodified; run by tests/integration/test_generated_clients.py with the generated package on PYTHONPATH):
produce (binary and json records) -> for a binary and a json instance: create -> subscribe -> poll -> commit ->
committed offsets (query parameters, none) -> delete. Prints one JSON object; exits non-zero on error.

Usage: python flow_ogpy.py <gateway URL> <API key> <topic> <group prefix> <records>
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

from kcg_client import (
    ApiClient,
    CommitOffset,
    CommitOffsets,
    Configuration,
    ConsumerRecord,
    ConsumersApi,
    CreateConsumer,
    JsonProduceRecord,
    JsonProduceRequest,
    ProduceApi,
    Subscription,
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def main() -> None:
    url, api_key, topic, prefix, count = sys.argv[1:]
    n = int(count)
    api = ApiClient(Configuration(host=url, access_token=api_key))
    consumers = ConsumersApi(api)
    # the first half as binary records (base64, the format named by _content_type: this generator lets its default
    # media type win over the Content-Type parameter), the rest as json records (the body's default media type):
    # one body type, JsonProduceRequest, carries both
    half = n // 2
    producer = ProduceApi(api)
    binary = producer.produce_to_topic(topic, JsonProduceRequest(records=[
        JsonProduceRecord(key=b64(json.dumps(f"k{i}")), value=b64(json.dumps({"n": i}))) for i in range(half)]),
        _content_type="application/vnd.kafka.binary.v2+json")
    as_json = producer.produce_to_topic(topic, JsonProduceRequest(records=[
        JsonProduceRecord(key=f"k{i}", value={"n": i}) for i in range(half, n)]))
    out: dict[str, Any] = {"produced": [o.offset for o in binary.offsets + as_json.offsets]}
    for fmt in ("binary", "json"):
        group = f"{prefix}-{fmt}"
        created = consumers.create_consumer(group, CreateConsumer.from_dict({
            "name": f"ogpy-{fmt}", "format": fmt, "auto.offset.reset": "earliest", "auto.commit.enable": "false"}))
        iid = created.instance_id
        consumers.subscribe(group, iid, Subscription(topics=[topic]))
        subscription = consumers.get_subscription(group, iid)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + 60
        while len(records) < n and time.monotonic() < deadline:
            records += consumers.get_records(group, iid, timeout=1000)
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
            commit = consumers.commit_offsets(group, iid, CommitOffsets(offsets=[
                CommitOffset(topic=topic, partition=p, offset=o) for p, o in sorted(last.items())]))
        else:
            commit = consumers.commit_offsets(group, iid)
        parts = sorted(last)
        by_query = consumers.get_committed_offsets(group, iid, topic=[topic] * len(parts), partition=parts)
        assigned = consumers.get_committed_offsets(group, iid)
        consumers.delete_consumer(group, iid)
        out[fmt] = {"instanceId": iid, "subscription": subscription.topics, "values": values, "keys": keys,
                    "last": {str(p): o for p, o in last.items()}, "commitAnswer": commit,
                    "committedByQuery": {str(o.partition): o.offset for o in by_query.offsets},
                    "committedAssigned": {str(o.partition): o.offset for o in assigned.offsets}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
