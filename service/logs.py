"""Structured logs: every record carries the tenant, group and consumer instance it concerns.

The HTTP layer sets the context variables; asyncio tasks inherit them when created, so a consumer's
background tasks (membership, fetcher) log with their instance too. ``GATEWAY_LOG_FORMAT=json`` emits
one JSON object per line.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar

import orjson

tenant_var: ContextVar[str | None] = ContextVar("tenant", default=None)
group_var: ContextVar[str | None] = ContextVar("group", default=None)
instance_var: ContextVar[str | None] = ContextVar("instance", default=None)


def bind(tenant: str | None = None, group: str | None = None, instance: str | None = None) -> None:
    if tenant is not None:
        tenant_var.set(tenant)
    if group is not None:
        group_var.set(group)
    if instance is not None:
        instance_var.set(instance)


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.tenant = tenant_var.get()
        record.group = group_var.get()
        record.instance = instance_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k in ("tenant", "group", "instance"):
            v = getattr(record, k, None)
            if v is not None:
                out[k] = v
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        ctx = " ".join(f"{k}={getattr(record, k)}" for k in ("tenant", "group", "instance")
                       if getattr(record, k, None) is not None)
        return f"{base} [{ctx}]" if ctx else base


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
