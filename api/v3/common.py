"""v3 building blocks: the cluster id, resource URLs, ``kind``/``metadata`` envelopes and ``related`` links.

Confluent's v3 resources look like ``{"kind": "KafkaTopic", "metadata": {"self": URL, "resource_name":
CRN}, ...fields, "partitions": {"related": URL}}``; lists are ``{"kind": "KafkaTopicList", "metadata":
{"self": URL, "next": null}, "data": [...]}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

V3_JSON = "application/json"


def base_url(request: Request) -> str:
    """The public base URL of this gateway (no trailing slash), as v2's ``base_uri`` is built."""
    return str(request.base_url).rstrip("/")


def resource(kind: str, self_url: str, resource_name: str | None, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"self": self_url, "resource_name": resource_name}, **fields}


def resource_list(kind: str, self_url: str, data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"self": self_url, "next": None}, "data": data}


def related(url: str) -> dict[str, str]:
    return {"related": url}


async def cluster_id(request: Request, tenant: Any) -> str:
    """The id of the tenant's Kafka cluster (Metadata's ``cluster_id``; refreshed once when not known yet).

    A broker that reports none (Metadata below v2) is named by the tenant id, so URLs stay stable."""
    from api.consumers import runtime  # imported here: api.consumers imports the app's routers' helpers

    client = runtime(request, tenant).client
    if client.metadata.cluster_id is None:
        await client.refresh_metadata()
    return client.metadata.cluster_id or f"tenant-{tenant.id}"
