"""Tenant errors: the request-level refusals (401/403/429 with Confluent-style error codes) and the
startup error for a bad tenants file. No imports from the rest of the package."""

from __future__ import annotations

# Error codes (HTTP status * 100 + n), Confluent REST Proxy style.
UNAUTHENTICATED = 40101
FORBIDDEN = 40301
#: creating, deleting or altering a topic outside the tenant's ``admin_topics`` patterns
ADMIN_FORBIDDEN = 40303
#: a schema subject (or a schema id registered only under subjects) outside the tenant's subjects
SUBJECT_FORBIDDEN = 40304
RATE_LIMITED = 42901


class TenantError(Exception):
    """A request-level refusal: 401/40101 unauthenticated, 403/40301 forbidden (40303: topic administration,
    40304: a schema subject or id), 429/42901 rate limited.

    ``message`` is safe to return to the client: it never contains a credential. ``retry_after`` (whole
    seconds) is set for 429s and belongs in a ``Retry-After`` header; :attr:`headers` has the headers
    the response should carry.
    """

    def __init__(self, status: int, error_code: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        if self.status == 401:
            return {"WWW-Authenticate": 'Bearer realm="kafka-consumer-gateway"'}
        if self.retry_after is not None or self.status == 429:
            # a 429 always says when to come back: whole seconds, at least 1
            return {"Retry-After": str(max(1, self.retry_after or 1))}
        return {}

    def __repr__(self) -> str:
        return f"TenantError({self.status}, {self.error_code}, {self.message!r})"


class TenantConfigError(ValueError):
    """The tenants file is missing, unreadable or invalid (raised at startup)."""

