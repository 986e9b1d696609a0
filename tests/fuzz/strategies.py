"""Hypothesis strategies the fuzz tier shares: records, record sections, JSON-ish bytes, base64-ish text."""

from __future__ import annotations

import base64
from typing import Any

import orjson
from hypothesis import strategies as st

from service.protocol.records import Record

# -- JSON-ish bytes: valid documents in several spellings, near misses, token soup -----------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=10)

TOKENS = [b"{", b"}", b"[", b"]", b",", b":", b" ", b"\n", b"\t", b"\r", b'"a"', b'""', b'"\\u00e9"',
          b'"\\ud83d\\ude00"',
          b'"\\ud800"', b'"\\udc00"', b'"\\x"', b'"\\u12"', b'"\x01"', b'"\xff"', b'"\xc3\xa9"', b'"\xed\xa0\x80"',
          b"0", b"-0", b"01", b"1.", b".5", b"1e5", b"1E+2", b"-1.5e-3", b"1e400", b"-1e400", b"1E309", b"1e-400",
          b"2e308", b"1.7976931348623157e308", b"1.7976931348623159e308", b"123456789012345678901234567890",
          b"true", b"false", b"null", b"tru", b"nul", b"NaN", b"Infinity", b"-", b"+1", b"\xef\xbb\xbf", b"'a'",
          b"\x00", b"/*c*/"]


def _spell(v: Any, indent: int | None, ascii_only: bool) -> bytes:
    import json
    return json.dumps(v, indent=indent, ensure_ascii=ascii_only).encode()


json_docs = st.builds(_spell, json_values, st.sampled_from([None, 1, 2]), st.booleans()) | json_values.map(orjson.dumps)
json_soup = st.lists(st.sampled_from(TOKENS), max_size=14).map(b"".join)
json_bytes = st.one_of(json_docs, json_soup, st.binary(max_size=24),
                       st.builds(lambda a, b: a + b, json_docs, json_soup),
                       st.builds(lambda d, i, t: d[:i] + t + d[i:], json_docs, st.integers(0, 40), json_soup))

# -- records ---------------------------------------------------------------------------------------------------
payloads = st.one_of(st.none(), st.binary(max_size=48), json_bytes)
headers = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=12)), max_size=3).map(tuple)
records = st.builds(Record, st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1), payloads, payloads, headers)
record_lists = st.lists(records, max_size=12)
# (key, value, headers, timestamp delta) rows for build_batch
rows = st.lists(st.tuples(payloads, payloads, headers, st.integers(0, 2**40)), min_size=1, max_size=8)

# byte-level mutations of a section: (kind, position, byte)
mutations = st.lists(st.tuples(st.sampled_from(["flip", "set", "drop", "insert", "cut"]), st.integers(0, 10**6),
                               st.integers(0, 255)), max_size=3)


def mutate(data: bytes, muts: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, pos, byte in muts:
        if not out and kind != "insert":
            continue
        i = pos % (len(out) + (1 if kind == "insert" else 0)) if out or kind == "insert" else 0
        if kind == "flip":
            out[i] ^= 1 << (byte % 8)
        elif kind == "set":
            out[i] = byte
        elif kind == "drop":
            del out[i]
        elif kind == "insert":
            out.insert(i, byte)
        else:
            del out[i:]
    return bytes(out)


# -- base64-ish text: valid encodings and corrupted ones ---------------------------------------------------------
B64_JUNK = ["=", "==", "-", "_", " ", "\n", "\\u0041", "\\/", "é", "*", "\x7f", "A", "AB", "ABC", "\\n", "\\\""]
b64_valid = st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode())
b64_text = st.one_of(
    b64_valid,
    st.builds(lambda s, i, j: s[:i] + j + s[i + 1:], b64_valid, st.integers(0, 60), st.sampled_from(B64_JUNK)),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n", max_size=12))
