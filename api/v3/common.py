"""v3 building blocks: the cluster id, resource URLs and CRNs, ``kind``/``metadata`` envelopes, ``related``
links, the JSON response and the documentation models of the envelopes.

Confluent's v3 resources look like ``{"kind": "KafkaTopic", "metadata": {"self": URL, "resource_name":
CRN}, ...fields, "partitions": {"related": URL}}``; lists are ``{"kind": "KafkaTopicList", "metadata":
{"self": URL, "next": null}, "data": [...]}``. URLs are ``{base}/v3/clusters/{cluster_id}/...`` with the public
base URL v2's ``base_uri`` uses; CRNs are ``crn:///kafka={cluster_id}/topic={topic}/...``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from api.deps import base_url as public_base_url
from api.deps import runtime
from api.responses import OrjsonResponse
from service.cluster.topic_admin import ResourceNotFound

V3_JSON = "application/json"

__all__ = ["V3_JSON", "ResourceNotFound", "base_url", "cluster_id", "crn", "related", "require_cluster",
           "resource", "resource_list", "v3_json", "v3_url"]


def base_url(request: Request) -> str:
    """The public base URL of this gateway (no trailing slash), as v2's ``base_uri`` is built
    (``GATEWAY_PUBLIC_URL``, else the request, believing forwarded headers only from trusted proxies)."""
    return public_base_url(request)


def v3_url(request: Request, *segments: str | int) -> str:
    """``{base}/v3/{segments...}``, each segment percent-encoded (``/`` included)."""
    return base_url(request) + "/v3/" + "/".join(quote(str(s), safe="") for s in segments)


def crn(cluster: str, *pairs: tuple[str, str | int]) -> str:
    """Confluent's resource name: ``crn:///kafka=<cluster>/<type>=<id>/...``."""
    return "crn:///kafka=" + cluster + "".join(f"/{kind}={value}" for kind, value in pairs)


def resource(kind: str, self_url: str, resource_name: str | None, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"self": self_url, "resource_name": resource_name}, **fields}


def resource_list(kind: str, self_url: str, data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"self": self_url, "next": None}, "data": data}


def related(url: str) -> dict[str, str]:
    return {"related": url}


def v3_json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> OrjsonResponse:
    """A v3 answer: ``application/json`` rendered with orjson."""
    return OrjsonResponse(body, status_code=status, headers=headers)


async def cluster_id(request: Request, tenant: Any) -> str:
    """The id of the tenant's Kafka cluster (Metadata's ``cluster_id``; refreshed once when not known yet).

    A broker that reports none (Metadata below v2) is named by the tenant id, so URLs stay stable."""
    client = runtime(request, tenant).client
    if client.metadata.cluster_id is None:
        await client.refresh_metadata()
    return client.metadata.cluster_id or f"tenant-{tenant.id}"


async def require_cluster(request: Request, tenant: Any, requested: str) -> str:
    """The tenant's cluster id if ``requested`` names it, else 404 (error code 404, as Confluent answers)."""
    cid = await cluster_id(request, tenant)
    if requested != cid:
        raise ResourceNotFound(f"Cluster {requested} cannot be found.")
    return cid


# -- documentation models of the envelopes (the routes build dicts; these only describe them) ---------------
class Relationship(BaseModel):
    related: str


class ResourceMetadata(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    self_: str = Field(alias="self")
    resource_name: str | None = None


class CollectionMetadata(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    self_: str = Field(alias="self")
    next: str | None = None


class Resource(BaseModel):
    kind: str
    metadata: ResourceMetadata


class ResourceCollection(BaseModel):
    kind: str
    metadata: CollectionMetadata
