"""What the HTTP routes share: media types, the documented error answers, and the dependencies that find the
process's registry, a tenant's runtime and the public base URL."""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

from api.auth import peer_is_trusted_proxy
from api.errors import documented_errors
from api.hosts import parse_host
from api.responses import OrjsonResponse
from service.errors import GatewayError
from service.instances.registry import (
    Gateway,
    TenantRuntime,
)
from service.tenants import Tenant

V2 = "application/vnd.kafka.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"
JSONFMT = "application/vnd.kafka.json.v2+json"
AVRO = "application/vnd.kafka.avro.v2+json"
PROTOBUF = "application/vnd.kafka.protobuf.v2+json"
JSONSCHEMA = "application/vnd.kafka.jsonschema.v2+json"
#: an instance's format -> the media type its records are answered in
MEDIA_OF_FORMAT = {"binary": BINARY, "json": JSONFMT, "avro": AVRO, "protobuf": PROTOBUF, "jsonschema": JSONSCHEMA}
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"

# -- request/response models (never per record) ---------------------------------------------------------
INT32_MAX = 2**31 - 1  # Kafka partitions, fetch bytes, timeouts are int32 on the wire
# Offsets and timestamps are int64; this bound is the largest double below 2**63, so OpenAPI (FastAPI writes
# bounds as doubles) states it exactly, and a committed offset + 1 still fits.
OFFSET_MAX = 2**63 - 1024

class ErrorBody(BaseModel):
    error_code: int
    message: str


ERRORS = documented_errors(ErrorBody, 400, 401, 403, 404, 409, 410, 413, 415, 422, 429, 500, 503)


# -- helpers -----------------------------------------------------------------------------------------------
def gateway(request: Request) -> Gateway:
    return request.app.state.gateway


def runtime(request: Request, tenant: Tenant) -> TenantRuntime:
    return gateway(request).tenant(tenant.id, tenant.bootstrap, tenant.connection_config)


def acceptable_content_type(ct: str) -> bool:
    """Request bodies are JSON: application/vnd.kafka.v2+json, application/json or any vnd.kafka +json."""
    return ct in (V2, "application/json") or (ct.startswith("application/vnd.kafka") and ct.endswith("+json"))


#: A base_uri path prefix (X-Forwarded-Prefix): path characters only (RFC 3986 pchar and '/')
_PREFIX_RE = re.compile(r"(?:/[A-Za-z0-9._~!$&'()*+,;=:@%-]*)*")


def base_url(request: Request) -> str:
    """The public base URL of this gateway: GATEWAY_PUBLIC_URL when set; else built from the request (the
    Forwarded / X-Forwarded-* headers only from a trusted proxy), and then only if the scheme is http or
    https and the host a host name or address with an optional port (400/40003 otherwise: a header must
    never turn base_uri into javascript:... or an address with a path or credentials in it)."""
    settings = request.app.state.settings
    if settings.public_url:
        return str(settings.public_url).rstrip("/")
    proto: str | None = None
    host: str | None = None
    prefix = ""
    if peer_is_trusted_proxy(request):
        fwd = request.headers.get("forwarded")
        if fwd:
            for part in fwd.split(",")[0].split(";"):
                k, _, v = part.strip().partition("=")
                if k.lower() == "proto":
                    proto = v.strip('"')
                elif k.lower() == "host":
                    host = v.strip('"')
        proto = proto or request.headers.get("x-forwarded-proto", "").split(",")[0].strip() or None
        host = host or request.headers.get("x-forwarded-host", "").split(",")[0].strip() or None
        prefix = request.headers.get("x-forwarded-prefix", "").strip().rstrip("/")
    # Otherwise Forwarded / X-Forwarded-* from anyone but a proxy in GATEWAY_FORWARDED_ALLOW_IPS could be forged
    proto = (proto or request.url.scheme).lower()
    host = host or request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
    if proto not in ("http", "https") or parse_host(host) is None or not _PREFIX_RE.fullmatch(prefix):
        raise GatewayError("cannot build base_uri: the request's Host / Forwarded / X-Forwarded-* headers are not "
                           "an http(s) URL of a host name or address (set GATEWAY_PUBLIC_URL)",
                           status=400, error_code=40003)
    return f"{proto}://{host}{prefix}"


def v2(content: Any = None, status: int = 200) -> Response:
    if content is None:
        return Response(status_code=204)
    resp = OrjsonResponse(content, status_code=status)
    resp.headers["content-type"] = V2
    return resp

