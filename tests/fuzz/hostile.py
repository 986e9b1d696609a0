"""Runs one hostile-schema corpus case (tests/corpus/hostile/*.json) through the in-process decoding stack and
prints one JSON line: ``{"outcome", "seconds", "rss_growth_mb", "detail"}``. Meant for a child process
(tests/fuzz/test_hostile_corpus.py): a crash, a hang or a memory blow-up then fails one case, not the run.

A case::

    {"description": "...", "format": "avro" | "jsonschema" | "protobuf" | "json",
     "direction": "consume" | "produce",
     "schema": <schema text or JSON> | {"generator": <name>, ...},
     "payload": {"hex": ...} | {"text": ...} | {"json": <value>} | {"generator": <name>, ...},
     "expect": "record_error" | "schema_refused" | "ok" | [several of them]}

consume: the schema is registered as id 1 in an in-memory registry and the framed payload is rendered by
api.v2.render.render_schema_chunks (avro: the C renderer and its Python fallback) or, for ``json``, by
api.v2.render.render_array; outcome ``schema_refused`` when the resolver holds a SchemaError for the id,
``record_error`` when the record carries ``value_error``, ``ok`` when its value decoded, ``invalid_output`` when
the answer is not strict JSON. produce: ``Codecs().encode(format, schema, value)``, as the produce route does
with ``value_schema``: SchemaError -> ``schema_refused`` (422), EncodeError -> ``record_error`` (422), else ``ok``.
Any other exception is ``exception`` (a 500).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson


def _zigzag(n: int) -> bytes:
    u = (n << 1) ^ (n >> 63) if n < 2**63 else n << 1
    out = bytearray()
    while True:
        b = u & 0x7F
        u >>= 7
        if u:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# -- schema generators ---------------------------------------------------------------------------------------
def _wide_avro(spec: dict[str, Any]) -> str:
    fields = [{"name": f"f{i}", "type": spec.get("type", "int")} for i in range(spec["fields"])]
    return json.dumps({"type": "record", "name": "Wide", "fields": fields})


def _huge_avro(spec: dict[str, Any]) -> str:
    """About ``bytes`` of schema text: string fields with long docs."""
    doc = "d" * 200
    n = max(1, spec["bytes"] // (len(doc) + 60))
    fields = [{"name": f"field_{i}", "type": "string", "doc": doc} for i in range(n)]
    return json.dumps({"type": "record", "name": "Huge", "fields": fields})


def _deep_avro(spec: dict[str, Any]) -> str:
    """Records nested ``depth`` deep (each the only field's type of the one above)."""
    n = spec["depth"]
    heads = ['{"type":"record","name":"D' + str(i) + '","fields":[{"name":"x","type":' for i in range(n - 1, -1, -1)]
    return "".join(heads) + '"int"' + "}]}" * n


def _deep_jsonschema(spec: dict[str, Any]) -> str:
    n = spec["depth"]
    return '{"type":"object","properties":{"x":' * n + '{"type":"integer"}' + "}}" * n


SCHEMAS = {"wide_avro": _wide_avro, "huge_avro": _huge_avro, "deep_avro": _deep_avro,
           "deep_jsonschema": _deep_jsonschema}


# -- payload generators (bytes for consume, JSON values for produce) ---------------------------------------------
def _avro_union_chain(spec: dict[str, Any]) -> bytes:
    """A value of {"type":"record","name":"N","fields":[{"name":"n","type":["null","N"]}]} nested ``depth``."""
    return b"\x02" * spec["depth"] + b"\x00"


def _avro_array_block(spec: dict[str, Any]) -> bytes:
    """One array block of ``count`` items of ``item_hex`` each (none for null / empty records), then the end."""
    item = bytes.fromhex(spec.get("item_hex", ""))
    return _zigzag(spec["count"]) + item * spec["count"] + b"\x00"


def _zeros(spec: dict[str, Any]) -> bytes:
    return b"\x00" * spec["count"]


def _json_nested(spec: dict[str, Any]) -> bytes:
    return b"[" * spec["depth"] + b"]" * spec["depth"]


def _proto_nested(spec: dict[str, Any]) -> bytes:
    """``message M { M m = 1; }`` nested ``depth`` deep (field 1, length-delimited)."""
    msg = b""
    for _ in range(spec["depth"]):
        msg = b"\x0a" + _varint(len(msg)) + msg
    return msg


def _text(spec: dict[str, Any]) -> str:
    return spec["repeat"] * spec["times"] + spec.get("suffix", "")


def _nested_list(spec: dict[str, Any]) -> Any:
    v: Any = []
    for _ in range(spec["depth"] - 1):
        v = [v]
    return v


def _nested_avro_value(spec: dict[str, Any]) -> Any:
    """The JSON value (confluent encoding) of the recursive N record, ``depth`` deep."""
    v: Any = {"n": None}
    for _ in range(spec["depth"]):
        v = {"n": {"N": v}}
    return v


PAYLOADS = {"avro_union_chain": _avro_union_chain, "avro_array_block": _avro_array_block, "zeros": _zeros,
            "json_nested": _json_nested, "proto_nested": _proto_nested, "text": _text,
            "nested_list": _nested_list, "nested_avro_value": _nested_avro_value}


def schema_text(case: dict[str, Any]) -> str:
    if "_schema_text" in case:
        return case["_schema_text"]  # type: ignore[no-any-return]
    s = case["schema"]
    if isinstance(s, dict) and "generator" in s:
        return SCHEMAS[s["generator"]](s)
    return s if isinstance(s, str) else json.dumps(s)


def payload(case: dict[str, Any]) -> Any:
    if "_payload" in case:
        return case["_payload"]
    p = case["payload"]
    if "generator" in p:
        return PAYLOADS[p["generator"]](p)
    if "hex" in p:
        return bytes.fromhex(p["hex"])
    if "text" in p:
        return p["text"].encode()
    return p["json"]


# -- the stack -------------------------------------------------------------------------------------------------
SCHEMA_TYPES = {"avro": "AVRO", "jsonschema": "JSON", "protobuf": "PROTOBUF"}


def _registry_transport(schema: str, fmt: str) -> httpx.MockTransport:
    doc: dict[str, Any] = {"schema": schema}
    if fmt != "avro":
        doc["schemaType"] = SCHEMA_TYPES[fmt]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.rstrip("/") == "/schemas/ids/1":
            return httpx.Response(200, json=doc)
        return httpx.Response(404, json={"error_code": 40403, "message": "Schema not found"})
    return httpx.MockTransport(handler)


def _classify(body: bytes) -> tuple[str, str]:
    try:
        (item,) = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return "invalid_output", f"the answer is not strict JSON: {exc}"
    if "value_error" in item:
        return "record_error", str(item["value_error"])[:300]
    return "ok", f"{len(body)} bytes"


async def consume(case: dict[str, Any]) -> tuple[str, str]:
    from api.v2 import render as Rd
    from service.consumer.subscription import TopicPartition
    from service.protocol.records import Record
    from service.schemas.codecs import SchemaError
    from service.schemas.formats import SchemaResolver
    from service.schemas.registry import RegistryClient, RegistryConfig
    from service.schemas.wire import frame

    fmt = case["format"]
    raw = payload(case)
    tp = TopicPartition("hostile", 0)
    if fmt == "json":
        body, _, _ = Rd.render_array([(tp, [Record(0, 0, None, raw, ())])], True)
        return _classify(body)
    client = RegistryClient(RegistryConfig("http://registry.test"),
                            transport=_registry_transport(schema_text(case), fmt))
    resolver = SchemaResolver(client)
    try:
        value = frame(1, raw, [0] if fmt == "protobuf" else None)
        chunks = [(tp, [Record(0, 0, None, value, ())])]
        await resolver.prepare(Rd.chunk_schema_ids(chunks))
        resolved = resolver.cached(1)
        if resolved is not None and isinstance(resolved.codec, SchemaError):
            return "schema_refused", str(resolved.codec)[:300]
        return _classify(Rd.render_schema_chunks(resolver, fmt, None, chunks).array())
    finally:
        await resolver.close()


def produce(case: dict[str, Any]) -> tuple[str, str]:
    from service.schemas.codecs import Codecs, EncodeError, SchemaError

    try:
        out = Codecs().encode(case["format"], schema_text(case), payload(case))
    except SchemaError as exc:
        return "schema_refused", str(exc)[:300]
    except EncodeError as exc:
        return "record_error", str(exc)[:300]
    return "ok", f"{len(out)} bytes"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(case: dict[str, Any]) -> dict[str, Any]:
    import importlib

    for name in ("api.v2.render", "service.schemas.codecs", "service.schemas.formats", "service.schemas.protobuf"):
        importlib.import_module(name)  # before the baseline: only the case's own growth is measured

    if "schema" in case:  # generated before the clock starts
        case["_schema_text"] = schema_text(case)
    case["_payload"] = payload(case)
    base = _rss_mb()
    start = time.perf_counter()
    try:
        if case["direction"] == "consume":
            outcome, detail = asyncio.run(consume(case))
        else:
            outcome, detail = produce(case)
    except BaseException as exc:  # reported, the parent decides
        outcome, detail = "exception", f"{type(exc).__name__}: {str(exc)[:300]}"
    return {"outcome": outcome, "detail": detail, "seconds": round(time.perf_counter() - start, 3),
            "rss_growth_mb": round(_rss_mb() - base, 1)}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))), flush=True)
