"""Avro payloads straight to JSON bytes in C, for the avro consume hot path.

:class:`~service.schemas.avro.AvroCodec` stays the reference: ``orjson.dumps(codec.decode(payload),
option=OPT_NON_STR_KEYS)``. This module compiles a codec's parsed schema (its ``_Node`` tree) into a flat
node list that ``service.schemas._cavro`` (built by ``hatch_build.py``) renders without a Python object per
value; the tests check both produce the same bytes. Where the C code is not sure (a payload that does not
decode, invalid UTF-8, a map with a repeated key, ...) it hands the key or value to a Python fallback, so
the reference decides every case the fast path does not cover. A value over the limits of
:mod:`service.schemas.avro_limits` (too deep, too many items, too many bytes) is refused instead: it becomes
that record's error, never the fallback's. :func:`scan_nodes` / :func:`compile_scan` build the program those
limits are checked with before the Python decoders read a payload.

``compile_program(codec)`` returns ``None`` (use the Python path for that schema) when the C module is not
available, or when the Python rendering has a shape this compiler does not reproduce: the karapace rendering
of a union with two object-like branches (record, map) where one renders bytes -- the Python renderer guesses
the branch from the value there.
"""

from __future__ import annotations

from typing import Any

import orjson

from service.lib.native import load
from service.schemas.avro import RENDER_CONFLUENT, AvroCodec, _Node, _type_tag

_cavro, C_IMPORT_ERROR = load("service.schemas._cavro")
C_EXTENSION_AVAILABLE = _cavro is not None

# node kinds: the K_* codes of _cavro.c
K_NULL, K_BOOLEAN, K_LONG, K_FLOAT, K_DOUBLE, K_STRING = 0, 1, 2, 3, 4, 5
K_BYTES_LATIN1, K_BYTES_B64, K_FIXED_LATIN1, K_FIXED_B64 = 6, 7, 8, 9
K_ENUM, K_ARRAY, K_MAP, K_RECORD, K_UNION = 10, 11, 12, 13, 14

_SIMPLE = {"null": K_NULL, "boolean": K_BOOLEAN, "int": K_LONG, "long": K_LONG, "float": K_FLOAT,
           "double": K_DOUBLE, "string": K_STRING}

Node = tuple[int, int, int, tuple[int, ...], tuple[bytes, ...]]


class Unsupported(Exception):
    """The schema has a shape whose Python rendering the C program does not reproduce."""


def _json_str(text: str) -> bytes:
    return orjson.dumps(text)


def _bytes_renderers(root: _Node) -> dict[int, bool]:
    """Per node (by id): whether its karapace rendering changes fastavro's value (it holds bytes/fixed).
    Recursive types count as changing, as the Python renderer treats them."""
    memo: dict[int, bool] = {}

    def needs(node: _Node, stack: frozenset[int]) -> bool:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in stack:
            return True
        stack = stack | {key}
        kind = node.kind
        if kind in ("bytes", "fixed"):
            result = True
        elif kind == "union":
            result = any([needs(b, stack) for b in node.items])  # every branch memoised
        elif kind == "record":
            result = any([needs(f, stack) for _, f, _, _ in node.fields])
        elif kind in ("array", "map"):
            result = needs(node.items[0], stack)
        else:
            result = False
        memo[key] = result
        return result

    needs(root, frozenset())
    return memo


def _guesses_wrong(union: _Node, needs: dict[int, bool]) -> bool:
    """Whether the untagged (karapace) Python renderer may render a union value with another branch's
    renderer: it picks the first record branch whose fields the dict has, or a map branch, among the
    branches that change their value. Safe when no such mix-up can involve a branch that changes values."""
    records = [b for b in union.items if b.kind == "record"]
    maps = [b for b in union.items if b.kind == "map"]
    if maps and records and (any(needs.get(id(b), True) for b in maps + records)):
        return True
    for a in records:
        if not needs.get(id(a), True):
            continue
        fields_a = {name for name, _, _, _ in a.fields}
        if any(b is not a and fields_a <= {name for name, _, _, _ in b.fields} for b in records):
            return True
    return False


def _zero_size(node: _Node, seen: set[int]) -> bool:
    """Whether a value of the type may be encoded in zero bytes."""
    if node.kind == "null" or (node.kind == "fixed" and node.size == 0):
        return True
    if node.kind != "record" or id(node) in seen:
        return False
    seen.add(id(node))
    return all(_zero_size(f, seen) for _, f, _, _ in node.fields)


def program_nodes(root: _Node, rendering: str, strict: bool = True) -> list[Node]:
    """The flat node list of a schema for a rendering (index 0 is the root). Raises :class:`Unsupported`
    (not when ``strict`` is false: the list of :func:`scan_nodes`, which only walks payloads)."""
    tagged = rendering == RENDER_CONFLUENT
    needs = {} if tagged or not strict else _bytes_renderers(root)
    nodes: list[Node | None] = []
    index: dict[int, int] = {}

    def add(node: _Node) -> int:
        key = id(node)
        if key in index:
            return index[key]
        i = len(nodes)
        index[key] = i
        nodes.append(None)  # reserved: recursive references point here
        kind = node.kind
        if kind in _SIMPLE:
            entry: Node = (_SIMPLE[kind], 0, -1, (), ())
        elif kind == "bytes":
            entry = (K_BYTES_LATIN1 if tagged else K_BYTES_B64, 0, -1, (), ())
        elif kind == "fixed":
            entry = (K_FIXED_LATIN1 if tagged else K_FIXED_B64, node.size, -1, (), ())
        elif kind == "enum":
            entry = (K_ENUM, 0, -1, (), tuple(_json_str(s) for s in node.symbols))
        elif kind == "array":  # size 1: the items may take no bytes at all (null, empty records)
            entry = (K_ARRAY, int(_zero_size(node.items[0], set())), add(node.items[0]), (), ())
        elif kind == "map":
            entry = (K_MAP, 0, add(node.items[0]), (), ())
        elif kind == "record":
            names = [name for name, _, _, _ in node.fields]
            if strict and len(set(names)) != len(names):
                raise Unsupported(f"record {node.fullname} repeats a field name")
            kids = tuple(add(ftype) for _, ftype, _, _ in node.fields)
            frags = tuple((b"," if n else b"") + _json_str(name) + b":" for n, name in enumerate(names))
            entry = (K_RECORD, 0, -1, kids, frags)
        elif kind == "union":
            if strict and not tagged and _guesses_wrong(node, needs):
                raise Unsupported("karapace rendering of a union whose object branches look alike")
            if strict and tagged and not any(b.kind != "null" for b in node.items):
                raise Unsupported("a union of null alone")
            kids = tuple(add(b) for b in node.items)
            frags = tuple(b"" if (not tagged or b.kind == "null") else b"{" + _json_str(_type_tag(b)) + b":"
                          for b in node.items)
            entry = (K_UNION, 0, -1, kids, frags)
        else:  # not produced by the parser
            raise Unsupported(f"unknown kind {kind!r}")
        nodes[i] = entry
        return i

    add(root)
    assert all(n is not None for n in nodes)
    return nodes  # type: ignore[return-value]


def compile_program(codec: Any) -> Any:
    """The C program of an :class:`AvroCodec` in its rendering, or ``None`` (use the Python path)."""
    if _cavro is None or not isinstance(codec, AvroCodec):
        return None
    try:
        nodes = program_nodes(codec._root, codec.rendering)
    except Unsupported:
        return None
    return _cavro.compile(nodes)


def render_value(program: Any, payload: bytes, limits: tuple[int, ...] | None = None) -> bytes | int | None:
    """One unframed payload as JSON bytes; ``None`` where the C code leaves it to the Python path; an int
    (the refusal code of :mod:`service.schemas.avro_limits`) for a value over the limits (default: the C
    module's defaults, those of ``DecodeLimits()``)."""
    assert _cavro is not None
    return _cavro.render_value(program, payload, limits)


def scan_nodes(root: _Node) -> list[Node]:
    """The node list :mod:`service.schemas.avro_limits` scans payloads with (any schema the parser takes)."""
    return program_nodes(root, RENDER_CONFLUENT, strict=False)


def compile_scan(nodes: list[Node]) -> Any:
    """The C program of :func:`scan_nodes`' list, or ``None`` (no C module, or a list it refuses: an empty
    union)."""
    if _cavro is None:
        return None
    try:
        return _cavro.compile(nodes)
    except (TypeError, ValueError):
        return None
