"""SaslHandshake (key 17, v0-v1) and SaslAuthenticate (key 36, v0-v2).

On a broker with SASL enabled a connection must authenticate first (see
:class:`tests.fakes.broker.sasl_server.SaslSession` for what may come when). Handshake with a mechanism the
broker does not enable → UNSUPPORTED_SASL_MECHANISM with the enabled list, then the connection is
closed. A failed SaslAuthenticate → SASL_AUTHENTICATION_FAILED with a message, then closed. On a broker
without SASL, or after authentication, both APIs answer ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.fakes.broker.registry import HandlerRegistry, RequestContext
from tests.fakes.broker.sasl_server import SaslPhase, SaslServerError


def _enabled(ctx: RequestContext) -> list[str]:
    return list(ctx.broker.sasl_mechanisms or [])


async def handshake(ctx: RequestContext, req: Any) -> Any:
    session = ctx.connection.sasl
    if not session.enabled or session.phase not in (SaslPhase.START, SaslPhase.HANDSHAKE):
        return M.SaslHandshakeResponse(error_code=EC.ILLEGAL_SASL_STATE, mechanisms=_enabled(ctx))
    enabled = _enabled(ctx)
    if req.mechanism not in enabled:
        ctx.close_after_response()
        return M.SaslHandshakeResponse(error_code=EC.UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled)
    session.begin(ctx.cluster.credentials.new_mechanism(req.mechanism), ctx.version)
    return M.SaslHandshakeResponse(error_code=0, mechanisms=enabled)


async def handshake_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    if ctx.connection.sasl.enabled and not ctx.connection.sasl.authenticated:
        ctx.close_after_response()  # the exchange cannot go on
    return M.SaslHandshakeResponse(error_code=code, mechanisms=_enabled(ctx))


async def authenticate(ctx: RequestContext, req: Any) -> Any:
    session = ctx.connection.sasl
    if session.phase is not SaslPhase.AUTHENTICATE:
        return M.SaslAuthenticateResponse(error_code=EC.ILLEGAL_SASL_STATE,
                                          error_message="no SASL authentication in progress", auth_bytes=b"")
    try:
        reply = session.step(req.auth_bytes)
    except SaslServerError as exc:
        ctx.close_after_response()
        return M.SaslAuthenticateResponse(error_code=EC.SASL_AUTHENTICATION_FAILED, error_message=str(exc),
                                          auth_bytes=b"")
    return M.SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=reply, session_lifetime_ms=0)


async def authenticate_error(ctx: RequestContext, req: Any, code: int, depth: int | None) -> Any:
    if ctx.connection.sasl.enabled and not ctx.connection.sasl.authenticated:
        ctx.close_after_response()
    return M.SaslAuthenticateResponse(error_code=code, error_message=f"injected error {code}", auth_bytes=b"")


def register(registry: HandlerRegistry) -> None:
    registry.register(M.ApiKey.SASL_HANDSHAKE, handshake, error_response=handshake_error)
    registry.register(M.ApiKey.SASL_AUTHENTICATE, authenticate, error_response=authenticate_error)
