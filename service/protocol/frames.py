"""Request/response headers and size-prefixed frames.

Request header v1 (api key, version, correlation id, nullable client id) is used for non-flexible
versions and v2 (v1 plus tagged fields) for flexible ones. Response header v0 is the correlation id,
v1 adds tagged fields; the ApiVersions response header is always v0 so that a client can read it
before it knows which versions the broker speaks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from service.protocol import primitives as P
from service.protocol.dsl import Struct
from service.protocol.errors import ProtocolDecodeError, UnsupportedVersionError
from service.protocol.messages import REQUESTS, RESPONSES, ApiKey, compiled_for

_HDR = struct.Struct(">ihhi")  # size, api key, api version, correlation id
_RESP_HDR = struct.Struct(">ii")  # size, correlation id


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def request_header_version(api_key: int, version: int) -> int:
    cm = REQUESTS.get(api_key)
    if cm is None:
        raise UnsupportedVersionError(f"unknown api key {api_key}")
    return 2 if cm.schema.is_flexible(version) else 1


def response_header_version(api_key: int, version: int) -> int:
    if api_key == ApiKey.API_VERSIONS:
        return 0
    cm = RESPONSES.get(api_key)
    if cm is None:
        raise UnsupportedVersionError(f"unknown api key {api_key}")
    return 1 if cm.schema.is_flexible(version) else 0


def api_key_of(obj: Struct) -> int:
    key = compiled_for(obj).schema.api_key
    if key is None:
        raise TypeError(f"{type(obj).__name__} is not a request or response")
    return key


def encode_request(req: Struct, version: int, correlation_id: int, client_id: str | None) -> bytes:
    """A complete frame (size prefix included) for ``req`` in ``version``."""
    cm = compiled_for(req)
    if cm.schema.kind != "request":
        raise TypeError(f"{cm.schema.name} is not a request")
    api_key = cm.schema.api_key
    out = bytearray(_HDR.pack(0, api_key, version, correlation_id))
    P.write_nullable_string(out, client_id)
    if cm.schema.is_flexible(version):
        out.append(0)  # header tagged fields
    cm.encoder(version)(req, out)
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


def decode_request_header(payload: bytes | memoryview) -> tuple[RequestHeader, int]:
    """Header of a request frame (without its size prefix); returns the header and the body offset."""
    try:
        api_key, api_version, correlation_id = struct.unpack_from(">hhi", payload, 0)
        client_id, pos = P.read_nullable_string(payload, 8)
        cm = REQUESTS.get(api_key)
        if cm is not None and cm.schema.is_flexible(api_version):
            pos = _skip_tagged(payload, pos)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProtocolDecodeError(f"malformed request header: {exc}") from exc
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def decode_request(payload: bytes | memoryview) -> tuple[RequestHeader, Any]:
    hdr, pos = decode_request_header(payload)
    cm = REQUESTS.get(hdr.api_key)
    if cm is None:
        raise UnsupportedVersionError(f"unknown api key {hdr.api_key}")
    return hdr, cm.decode(payload, hdr.api_version, pos)


def encode_response(resp: Struct, version: int, correlation_id: int) -> bytes:
    cm = compiled_for(resp)
    if cm.schema.kind != "response":
        raise TypeError(f"{cm.schema.name} is not a response")
    out = bytearray(_RESP_HDR.pack(0, correlation_id))
    if response_header_version(cm.schema.api_key, version) == 1:  # type: ignore[arg-type]
        out.append(0)
    cm.encoder(version)(resp, out)
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


def response_correlation_id(payload: bytes | memoryview) -> int:
    if len(payload) < 4:
        raise ProtocolDecodeError("response shorter than its correlation id")
    return int.from_bytes(payload[:4], "big", signed=True)


def decode_response(api_key: int, version: int, payload: bytes | memoryview) -> Any:
    """Decode a response frame body (after the size prefix, correlation id included)."""
    cm = RESPONSES.get(api_key)
    if cm is None:
        raise UnsupportedVersionError(f"unknown api key {api_key}")
    pos = 4
    if response_header_version(api_key, version) == 1:
        try:
            pos = _skip_tagged(payload, pos)
        except (IndexError, struct.error) as exc:
            raise ProtocolDecodeError(f"malformed response header: {exc}") from exc
    return cm.decode(payload, version, pos)


def _skip_tagged(b: bytes | memoryview, pos: int) -> int:
    n, pos = P.read_uvarint(b, pos)
    for _ in range(n):
        _tag, pos = P.read_uvarint(b, pos)
        size, pos = P.read_uvarint(b, pos)
        pos += size
    if pos > len(b):
        raise ProtocolDecodeError("tagged fields run past the end of the header")
    return pos
