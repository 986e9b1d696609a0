"""Authentication for the HTTP layer: the ``current_tenant`` dependency and a TenantError handler.

Routes declare ``tenant: Tenant = Depends(current_tenant)``; the registry lives in
``app.state.tenants`` (a :class:`service.tenants.TenantRegistry`). Failures raise
:class:`service.tenants.TenantError` (401/40101, 429/42901), which :func:`tenant_error_handler` turns
into ``{"error_code", "message"}`` JSON with ``WWW-Authenticate`` or ``Retry-After`` as appropriate.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from api.responses import OrjsonResponse
from service.tenants import Tenant, TenantError, TenantRegistry


async def current_tenant(request: Request) -> Tenant:
    """The authenticated tenant of this request, after charging one request to its rate limit."""
    registry: TenantRegistry = request.app.state.tenants
    tenant = registry.authenticate(request.headers)
    tenant.check_rate()
    request.state.tenant = tenant
    return tenant


async def tenant_error_handler(request: Request, exc: Exception) -> Response:
    """``app.add_exception_handler(TenantError, tenant_error_handler)``."""
    assert isinstance(exc, TenantError)
    return OrjsonResponse({"error_code": exc.error_code, "message": exc.message}, status_code=exc.status,
                          headers=exc.headers)
