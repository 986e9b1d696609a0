"""Records of the schema'd formats (avro, protobuf, jsonschema) in a poll or a stream: the tenant's view of
the registry and the rendering that fetches schemas first."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from api.v2.render import (
    Rendered,
    chunk_schema_ids,
    render_schema_chunks,
)
from service.consumer.subscription import (
    TopicPartition,
)
from service.instances.registry import (
    ConsumerInstance,
)
from service.schemas.formats import SCHEMA_FORMATS, SchemaResolver, SchemaService
from service.schemas.registry import RegistryUnavailable
from service.schemas.subjects import tenant_view
from service.tenants import Tenant


def schema_service(request: Request) -> SchemaService:
    return request.app.state.schemas


def schema_resolver(request: Request, inst: ConsumerInstance, tenant: Tenant) -> SchemaResolver | None:
    """The registry resolver of a schema'd instance (None for binary/json); raises RegistryNotConfigured or,
    while the embedded registry starts, RegistryUnavailable."""
    fmt = inst.options.format
    if fmt not in SCHEMA_FORMATS:
        return None
    # as the tenant may see it: a schema id none of whose subjects is the tenant's is a per-record error
    return tenant_view(schema_service(request).resolver(tenant.schema_registry, fmt), tenant)


async def render_schema(inst: ConsumerInstance, resolver: SchemaResolver,
                        chunks: list[tuple[TopicPartition, list[Any]]], sep: bytes, metrics: Any) -> Rendered:
    """A poll's records decoded and rendered (avro by the C renderer when it can). Call it under the
    instance's lock: nothing awaits between fetching the schemas and rendering. A registry that cannot answer
    gives the records back (the instance is sought back to each chunk's first offset: nothing is lost or
    skipped) and raises RegistryUnavailable (503/50307)."""
    fmt = inst.options.format
    try:
        await resolver.prepare(chunk_schema_ids(chunks), inst.options.avro_rendering, programs=fmt == "avro",
                               tenant=inst.tenant)
    except RegistryUnavailable:
        for tp, recs in chunks:
            if recs:
                inst.consumer.seek(tp, recs[0].offset)
        metrics.schema_registry_unavailable.labels(inst.tenant).inc()
        raise
    return render_schema_chunks(resolver, fmt, inst.options.avro_rendering, chunks, sep,
                                on_errors=lambda n: metrics.schema_decode_errors.labels(inst.tenant, fmt).inc(n))


