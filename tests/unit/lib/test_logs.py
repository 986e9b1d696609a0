"""Structured logs carry tenant, group and instance, also from tasks started in that context."""

from __future__ import annotations

import asyncio
import logging

import orjson

from service.lib.logs import ContextFilter, JsonFormatter, TextFormatter, bind


def _record(msg: str) -> logging.LogRecord:
    rec = logging.LogRecord("t", logging.INFO, __file__, 1, msg, None, None)
    ContextFilter().filter(rec)
    return rec


async def test_context_reaches_tasks_and_json_lines() -> None:
    async def in_request() -> tuple[logging.LogRecord, logging.LogRecord]:
        bind("tenant-a", "g1", "r0~c1")
        task_rec: list[logging.LogRecord] = []

        async def background() -> None:
            task_rec.append(_record("from a background task"))

        await asyncio.create_task(background())
        return _record("in request"), task_rec[0]

    req, bg = await asyncio.create_task(in_request())
    for rec in (req, bg):
        out = orjson.loads(JsonFormatter().format(rec))
        assert (out["tenant"], out["group"], out["instance"]) == ("tenant-a", "g1", "r0~c1")
        assert out["level"] == "INFO" and out["logger"] == "t"
    assert TextFormatter("%(message)s").format(bg).endswith("[tenant=tenant-a group=g1 instance=r0~c1]")
    outside = _record("outside")  # another context: nothing leaks
    assert "tenant" not in orjson.loads(JsonFormatter().format(outside))


def test_text_format_escapes_control_characters() -> None:
    """One record is one line (no forged log lines); a traceback's lines start with '  | '."""
    import logging as _logging

    from service.lib.logs import TextFormatter, escape

    assert escape("a\nb\r\t\x1b[2K\x00\x7f\u2028\u0085") == "a\\nb\\r\\t\\x1b[2K\\x00\\x7f\\u2028\\x85"
    fmt = TextFormatter("%(levelname)s %(message)s")
    record = _logging.LogRecord("t", _logging.WARNING, __file__, 1, "path %s", ("/g\nERROR forged",), None)
    record.group = "g\r\nx"
    assert fmt.format(record) == "WARNING path /g\\nERROR forged [group=g\\r\\nx]"
    try:
        raise ValueError("boom\nERROR forged")
    except ValueError:
        import sys

        record = _logging.LogRecord("t", _logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = fmt.format(record).split("\n")
    assert out[0] == "ERROR failed" and all(line.startswith("  | ") for line in out[1:]) and len(out) > 2
