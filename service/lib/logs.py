"""Structured logs: every record carries the tenant, group and consumer instance it concerns.

The HTTP layer sets the context variables; asyncio tasks inherit them when created, so a consumer's
background tasks (membership, fetcher) log with their instance too. ``GATEWAY_LOG_FORMAT=json`` emits
one JSON object per line.
"""

from __future__ import annotations

import logging
import re
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


#: What may not appear raw in a text log line: C0 and C1 control characters (newline, carriage return,
#: escape...), DEL and the Unicode line / paragraph separators. A request path, group or header value
#: logged with such a character could otherwise end the line and forge the next one.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return _ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape(text: str) -> str:
    """``text`` with every control character written as a Python-style escape (``\\n``, ``\\x1b``,
    ``\\u2028``): one log record is one line whatever it quotes."""
    return _UNSAFE.sub(_escape_char, text)


class TextFormatter(logging.Formatter):
    """``<time> <level> <logger> <message> [tenant=... group=... instance=...]`` on one line, the message
    and the context escaped (:func:`escape`); a traceback follows on lines that each start with ``  | ``,
    so no line of it can pass for a record of its own."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        base = self.formatMessage(record)
        ctx = " ".join(f"{k}={escape(str(getattr(record, k)))}" for k in ("tenant", "group", "instance")
                       if getattr(record, k, None) is not None)
        line = f"{base} [{ctx}]" if ctx else base
        extra = []
        if record.exc_info:
            extra.append(self.formatException(record.exc_info))
        elif record.exc_text:
            extra.append(record.exc_text)
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for block in extra:
            line += "".join("\n  | " + escape(part) for part in block.splitlines())
        return line


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
