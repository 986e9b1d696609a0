"""Client TLS contexts for broker connections, below both the process settings (service/settings.py) and the
per-tenant connection config (service/tenants/config.py), which build them the same way."""

from __future__ import annotations

import ssl


def build_ssl_context(cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None,
                      key_password: str | None = None, check_hostname: bool = True) -> ssl.SSLContext:
    """A client TLS context: system CAs or ``cafile``; a client certificate for mutual TLS when given."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    ctx.check_hostname = check_hostname
    if certfile:
        ctx.load_cert_chain(certfile, keyfile, key_password)
    return ctx
