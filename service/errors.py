"""The base of the gateway's HTTP-facing errors, at the bottom of the layers: any module may raise it and
nothing here imports the rest of the service."""

from __future__ import annotations


class GatewayError(Exception):
    """An error with an HTTP status and a stable 5-digit error code (Confluent REST Proxy style)."""

    status = 500
    error_code = 50001

    def __init__(self, message: str, *, status: int | None = None, error_code: int | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if error_code is not None:
            self.error_code = error_code
        self.headers = headers or {}
