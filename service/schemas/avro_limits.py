"""Limits on one decoded Avro value, and the scan that checks them before a decoder runs. Sans-io.

A record in a topic is written by anyone allowed to produce, with any schema registered for it (a recursive
record schema, an array of ``null``): a few bytes can describe a value nested twenty thousand levels deep
(fastavro's compiled reader recurses once per level and overflows the C stack) or an array of 2**62 empty
items (a loop that never ends, or a poll answer a hundred thousand times the payload). So every Avro value
is held to limits that depend on its payload (``n`` bytes after the wire-format header):

* **depth**: records, arrays and maps inside each other, at most ``max_depth`` levels
  (``GATEWAY_SCHEMA_MAX_DEPTH``; shared by every schema'd decoder);
* **items**: the values it holds (the value itself, every record field, every array item and map value,
  whatever their type), at most ``items_base + items_per_byte * n``;
* **bytes**: the JSON it renders to, at most ``min(cap, max(floor, expansion * n))``
  (``GATEWAY_SCHEMA_MAX_DECODED_BYTES`` is the cap, ``GATEWAY_SCHEMA_MAX_EXPANSION`` the expansion).

A value over a limit is refused: that record's key or value is a per-record error (``"value": null``,
``"value_error"``, ``"value_base64"``; an error row in typed Arrow pages), never handed to another decoder.

:func:`scan` walks a payload against the flat node list of its schema (:func:`avro_fast.program_nodes`),
in C (``_cavro.scan``) when the extension is built, else in :func:`scan_py`, its Python twin (the tests check
they agree). It does not render, so its byte count is that of the fixed JSON pieces every rendering writes
(``null``, brackets, field names, enum symbols, ...): a lower bound of the output. The C renderer counts
its real output; the Python path checks the length of what it rendered.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

# refusal codes (those of _cavro.c)
R_NONE, R_DEPTH, R_ITEMS, R_BYTES, R_MALFORMED = 0, 1, 2, 3, 4

# node kinds (those of _cavro.c / avro_fast.py)
_K_NULL, _K_BOOLEAN, _K_LONG, _K_FLOAT, _K_DOUBLE, _K_STRING = 0, 1, 2, 3, 4, 5
_K_BYTES_LATIN1, _K_BYTES_B64, _K_FIXED_LATIN1, _K_FIXED_B64 = 6, 7, 8, 9
_K_ENUM, _K_ARRAY, _K_MAP, _K_RECORD, _K_UNION = 10, 11, 12, 13, 14

HARD_MAX_DEPTH = 1000  # the C code clamps the depth limit to this
FLOOR = 65536  # a value may always render to this many bytes (unless the cap is lower)


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """The limits of one decoded value (see the module docstring)."""

    max_depth: int = 64
    items_per_byte: int = 8
    items_base: int = 4096
    expansion: int = 64
    floor: int = FLOOR
    cap: int = 16 << 20

    def max_items(self, n: int) -> int:
        return self.items_base + self.items_per_byte * n

    def max_out(self, n: int) -> int:
        return min(self.cap, max(self.floor, self.expansion * n))

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        return astuple(self)


#: the gateway's limits (service/settings.py through :func:`configure`)
LIMITS = DecodeLimits()
_TUPLE = LIMITS.as_tuple()


def limits_tuple() -> tuple[int, int, int, int, int, int]:
    """:data:`LIMITS` as the C functions take them."""
    return _TUPLE


def configure(*, max_depth: int, max_decoded_bytes: int, max_expansion: int) -> None:
    """Set the process-wide limits from the settings (called when the app is built)."""
    global LIMITS, _TUPLE
    LIMITS = DecodeLimits(max_depth=min(max_depth, HARD_MAX_DEPTH), cap=max_decoded_bytes,
                          expansion=max_expansion, floor=min(FLOOR, max_decoded_bytes))
    _TUPLE = LIMITS.as_tuple()


def refusal_message(code: int, n: int, limits: DecodeLimits | None = None) -> str:
    """The per-record error text of a refusal of a value of ``n`` payload bytes."""
    lim = limits or LIMITS
    if code == R_DEPTH:
        return f"refused: nested deeper than {lim.max_depth} levels (GATEWAY_SCHEMA_MAX_DEPTH)"
    if code == R_ITEMS:
        return f"refused: more than {lim.max_items(n)} items for a {n}-byte payload"
    if code == R_BYTES:
        return f"refused: renders to more than {lim.max_out(n)} bytes for a {n}-byte payload"
    return "payload ends early or is not Avro for this schema"


class _Refused(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _State:
    __slots__ = ("buf", "cdepth", "end", "est", "items", "max_depth", "max_items", "max_out", "pos")

    def __init__(self, buf: bytes, limits: DecodeLimits) -> None:
        n = len(buf)
        self.buf = buf
        self.pos = 0
        self.end = n
        self.cdepth = 0
        self.max_depth = min(limits.max_depth, HARD_MAX_DEPTH)
        self.items = 1  # the value itself; then every record field and every array / map item
        self.max_items = limits.max_items(n)
        self.max_out = limits.max_out(n)
        self.est = 0

    def long(self) -> int:
        """A zigzag varint of at most 10 bytes fitting 64 bits (as the C reader)."""
        result = shift = 0
        buf, pos, end = self.buf, self.pos, self.end
        for i in range(10):
            if pos >= end:
                raise _Refused(R_MALFORMED)
            b = buf[pos]
            pos += 1
            if i == 9 and b > 1:
                raise _Refused(R_MALFORMED)
            result |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return (result >> 1) ^ -(result & 1)
            shift += 7
        raise _Refused(R_MALFORMED)  # pragma: no cover - the loop returns or raises

    def enter(self) -> None:
        self.cdepth += 1
        if self.cdepth > self.max_depth:
            raise _Refused(R_DEPTH)
        if self.items > self.max_items:
            raise _Refused(R_ITEMS)
        if self.est > self.max_out:
            raise _Refused(R_BYTES)


_INT64_MIN = -(2**63)


def _scan_node(nodes: list[Any], idx: int, st: _State) -> None:
    kind, size, child, kids, frags = nodes[idx]
    if kind == _K_NULL:
        st.est += 4
    elif kind == _K_BOOLEAN:
        if st.pos >= st.end:
            raise _Refused(R_MALFORMED)
        st.pos += 1
        st.est += 4
    elif kind == _K_LONG:
        st.long()
        st.est += 1
    elif kind in (_K_FLOAT, _K_DOUBLE):
        width = 4 if kind == _K_FLOAT else 8
        if st.end - st.pos < width:
            raise _Refused(R_MALFORMED)
        st.pos += width
        st.est += 1
    elif kind in (_K_STRING, _K_BYTES_LATIN1, _K_BYTES_B64):
        v = st.long()
        if v < 0 or v > st.end - st.pos:
            raise _Refused(R_MALFORMED)
        st.pos += v
        st.est += 2
    elif kind in (_K_FIXED_LATIN1, _K_FIXED_B64):
        if size > st.end - st.pos:
            raise _Refused(R_MALFORMED)
        st.pos += size
        st.est += 2
    elif kind == _K_ENUM:
        v = st.long()
        if v < 0 or v >= len(frags):
            raise _Refused(R_MALFORMED)
        st.est += len(frags[v])
    elif kind in (_K_ARRAY, _K_MAP):
        is_map = kind == _K_MAP
        st.enter()
        st.est += 2
        while True:
            count = st.long()
            if count == 0:
                break
            if count < 0:
                if count == _INT64_MIN or st.long() < 0:
                    raise _Refused(R_MALFORMED)
                count = -count
            if count > st.max_items - st.items:
                raise _Refused(R_ITEMS)
            st.items += count
            if not size and count > st.end - st.pos:
                raise _Refused(R_MALFORMED)
            for _ in range(count):
                if is_map:
                    klen = st.long()
                    if klen < 0 or klen > st.end - st.pos:
                        raise _Refused(R_MALFORMED)
                    st.pos += klen
                    st.est += 3
                _scan_node(nodes, child, st)
                if st.est > st.max_out:
                    raise _Refused(R_BYTES)
        st.cdepth -= 1
    elif kind == _K_RECORD:
        st.enter()
        st.items += len(kids)
        st.est += 2
        for kid, frag in zip(kids, frags, strict=True):
            st.est += len(frag)
            _scan_node(nodes, kid, st)
        st.cdepth -= 1
    elif kind == _K_UNION:
        v = st.long()
        if v < 0 or v >= len(kids):
            raise _Refused(R_MALFORMED)
        _scan_node(nodes, kids[v], st)
    else:
        raise _Refused(R_MALFORMED)


def scan_py(nodes: list[Any], payload: bytes | memoryview, limits: DecodeLimits | None = None) -> int:
    """The refusal code of an unframed payload (:data:`R_NONE`: within the limits): the Python twin of
    ``_cavro.scan``. Recursion is bounded by the depth limit (at most :data:`HARD_MAX_DEPTH`)."""
    st = _State(bytes(payload), limits or LIMITS)
    try:
        _scan_node(nodes, 0, st)
    except _Refused as exc:
        return exc.code
    if st.items > st.max_items:
        return R_ITEMS
    if st.est > st.max_out:
        return R_BYTES
    return R_NONE
