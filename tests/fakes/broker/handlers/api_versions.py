"""ApiVersions (key 18), v0-v4.

The advertised ranges come from :meth:`BrokerServer.advertised_versions`. A request above the supported
ApiVersions version is answered in v0 with UNSUPPORTED_VERSION and only the ApiVersions range, so the
client can retry with a version both sides know. From v3 on, the client software name and version
must be non-empty and made of letters, digits, '-' and '.' starting and ending alphanumerically
(INVALID_REQUEST otherwise).
"""

from __future__ import annotations

import re
from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.fakes.broker.registry import HandlerRegistry, RequestContext

ApiVersion = M.struct("ApiVersionsResponse", "ApiVersion")
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?")


def _api_keys(ctx: RequestContext) -> list[Any]:
    return [ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in ctx.broker.advertised_versions().items()]


async def handle(ctx: RequestContext, req: Any) -> Any:
    if ctx.version >= 3 and not (
        _SOFTWARE.fullmatch(req.client_software_name or "") and _SOFTWARE.fullmatch(req.client_software_version or "")
    ):
        return M.ApiVersionsResponse(error_code=EC.BY_NAME["INVALID_REQUEST"], api_keys=[])
    ctx.connection.sasl.api_versions_answered()
    return M.ApiVersionsResponse(error_code=0, api_keys=_api_keys(ctx), throttle_time_ms=0)


async def error_response(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    return M.ApiVersionsResponse(error_code=code, api_keys=_api_keys(ctx))


def unsupported_version(ctx: RequestContext) -> tuple[Any, int]:
    own = ctx.broker.advertised_versions().get(M.ApiKey.API_VERSIONS)
    keys = [ApiVersion(api_key=M.ApiKey.API_VERSIONS, min_version=own[0], max_version=own[1])] if own else []
    return M.ApiVersionsResponse(error_code=EC.UNSUPPORTED_VERSION, api_keys=keys), 0


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.API_VERSIONS, handle, error_response=error_response,
                      unsupported_version=unsupported_version)
