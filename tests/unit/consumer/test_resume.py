"""Resume tokens (service/consumer/resume.py) and their framing in ndjson / SSE streams (api/v2/streams.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from api.v2.render import NDJSON_SEP, render_binary, render_json
from api.v2.streams import ndjson_with_token, sse_with_ids, token_prefix
from service.consumer.resume import MAX_TOKEN_CHARS, Binding, ResumeCodec, ResumeTokenError, derive_key
from service.consumer.subscription import TopicPartition as TP
from service.protocol.records import Record

B = Binding("tenant-a", "group-1", "inst-1")


def codec(secret: str | None = "s3cret") -> ResumeCodec:
    return ResumeCodec(derive_key(secret))


def test_round_trip_plain_positions() -> None:
    c = codec()
    pos: dict[TP, int | None] = {TP("a", 0): 0, TP("a", 3): 17, TP("b.x", 1): 2**62, TP("c", 2): None}
    tok = c.encode(B, pos)
    assert tok is not None
    assert c.decode(tok, B) == pos


def test_chunks_apply_in_order_up_to_the_token() -> None:
    c = codec()
    start: dict[TP, int | None] = {TP("t", 0): 10, TP("t", 1): 20, TP("u", 0): 5}
    chunks = [(TP("t", 0), 10, 13), (TP("t", 1), 20, 25), (TP("t", 0), 13, 16)]
    p = c.prefix(B, start, chunks)
    assert p is not None
    # mid first chunk: only its record counts
    assert c.decode(p.token(0, 12).decode(), B) == {TP("t", 0): 12, TP("t", 1): 20, TP("u", 0): 5}
    # in the second chunk: the first is whole
    assert c.decode(p.token(1, 21).decode(), B) == {TP("t", 0): 13, TP("t", 1): 21, TP("u", 0): 5}
    # the same partition again later in the poll
    assert c.decode(p.token(2, 14).decode(), B) == {TP("t", 0): 14, TP("t", 1): 25, TP("u", 0): 5}


def test_keys_from_the_same_secret_agree_random_keys_do_not() -> None:
    tok = codec("shared").encode(B, {TP("t", 0): 1})
    assert tok is not None
    assert codec("shared").decode(tok, B) == {TP("t", 0): 1}  # another replica / a restart
    with pytest.raises(ResumeTokenError):
        codec("other").decode(tok, B)
    with pytest.raises(ResumeTokenError):
        codec(None).decode(tok, B)  # open mode without secrets: a random key per process
    assert derive_key(None) != derive_key(None)


@pytest.mark.parametrize("other", [Binding("tenant-b", "group-1", "inst-1"), Binding("tenant-a", "group-2", "inst-1"),
                                   Binding("tenant-a", "group-1", "inst-2"),
                                   Binding("tenant-a", "group-1inst", "-1")])  # no ambiguity by concatenation
def test_token_of_another_instance_group_or_tenant_is_refused(other: Binding) -> None:
    c = codec()
    tok = c.encode(B, {TP("t", 0): 1})
    assert tok is not None
    with pytest.raises(ResumeTokenError, match="does not belong"):
        c.decode(tok, other)


def test_every_altered_character_is_refused() -> None:
    c = codec()
    p = c.prefix(B, {TP("t", 0): 100, TP("t", 1): 7}, [(TP("t", 0), 100, 105)])
    assert p is not None
    tok = p.token(0, 103).decode()
    signed = tok.rsplit(".", 1)[0]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    refused = 0
    for i, ch in enumerate(tok):
        if ch == ".":
            continue
        for repl in (alphabet[(alphabet.index(ch) + 1) % 64], alphabet[(alphabet.index(ch) + 17) % 64]):
            bad = tok[:i] + repl + tok[i + 1:]
            try:
                got = c.decode(bad, B)
            except ResumeTokenError:
                refused += 1
                continue
            if i < len(signed):  # base64 of a last group may ignore low bits: only the same decoding passes
                assert got == c.decode(tok, B)
            else:  # the unsigned place: at most another point of the same poll, as an honest token of it
                assert got[TP("t", 1)] == 7 and 100 <= got[TP("t", 0)] <= 105  # type: ignore[operator]
    assert refused >= 2 * (len(signed) - 1) - 4
    # a place outside the poll's chunk is refused
    for k, off in ((0, 99), (0, 106), (1, 101)):
        with pytest.raises(ResumeTokenError, match="outside"):
            c.decode(p.token(k, off).decode(), B)


@pytest.mark.parametrize("garbage",
                         ["", ".", "abc", "a.b", "a.b.c", "é.é", "AAAA." + "A" * 32, "!!!!.????.????", "a.b.c.d",
                                     "x" * (MAX_TOKEN_CHARS + 1)])
def test_garbage_is_refused_cleanly(garbage: str) -> None:
    with pytest.raises(ResumeTokenError):
        codec().decode(garbage, B)


def test_unknown_version_is_named() -> None:
    c = codec()
    tok = c.encode(B, {TP("t", 0): 1})
    assert tok is not None
    import base64

    head, mac, place = tok.split(".")
    raw = bytearray(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    raw[0] = 9
    bad = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode() + "." + mac + "." + place
    with pytest.raises(ResumeTokenError, match="version 9"):
        c.decode(bad, B)


def test_size_is_bounded_and_compressed_for_many_partitions() -> None:
    c = codec()
    rnd = random.Random(7)
    # 200 partitions with nearby offsets (a group's usual picture): compressed well below a header's room
    pos: dict[TP, int | None] = {TP("orders", i): 1_000_000 + rnd.randrange(1000) for i in range(200)}
    tok = c.encode(B, pos)
    assert tok is not None and len(tok) < 1200
    assert c.decode(tok, B) == pos
    # 500 partitions with unrelated large offsets (incompressible) still fit
    pos = {TP(f"t{i % 7}", i): rnd.randrange(2**40) for i in range(500)}
    tok = c.encode(B, pos)
    assert tok is not None and len(tok) <= MAX_TOKEN_CHARS
    assert c.decode(tok, B) == pos
    # beyond the cap: no token at all (a stream then sends records without one) rather than a huge header
    pos = {TP(f"t{i % 7}", i): rnd.randrange(2**60) for i in range(5000)}
    assert c.prefix(B, pos, []) is None


def test_decompression_is_bounded() -> None:
    # a validly signed token cannot be forged without the key; still, the decoder bounds what it inflates
    c = codec()
    pos: dict[TP, int | None] = {TP("t" * 200, i): 0 for i in range(5000)}  # very compressible
    p = c.prefix(B, pos, [])
    assert p is not None
    assert len(c.decode(p.token(0, 0).decode(), B)) == 5000
    with pytest.raises(ResumeTokenError):
        c.decode(p.token(0, 1).decode(), B)  # no chunks: the place must be (0, 0)


# -- framing in streams --------------------------------------------------------------------------------
def _rec(off: int, value: bytes = b'{"v":1}') -> Record:
    return Record(off, 1_700_000_000_000, None, value, ())


class _Subs:
    def __init__(self, pos: dict[TP, int | None]) -> None:
        self.pos = pos

    def assigned(self) -> list[TP]:
        return list(self.pos)

    def position(self, tp: TP) -> int | None:
        return self.pos[tp]


def _inst(pos: dict[TP, int | None]) -> Any:
    return SimpleNamespace(consumer=SimpleNamespace(subs=_Subs(pos)))


def _poll() -> tuple[Any, list[tuple[TP, list[Record]]]]:
    # after the poll: t-0 at 103, t-1 at 52, u-0 never delivered here (position 9), v-0 unresolved
    chunks = [(TP("t", 0), [_rec(100), _rec(101), _rec(102)]), (TP("t", 1), [_rec(50), _rec(51)])]
    return _inst({TP("t", 0): 103, TP("t", 1): 52, TP("u", 0): 9, TP("v", 0): None}), chunks


@pytest.mark.parametrize("render", [render_binary, render_json])
def test_sse_every_event_carries_the_positions_after_its_record(render: Any) -> None:
    c = codec()
    inst, chunks = _poll()
    prefix = token_prefix(c, B, inst, chunks)
    body = sse_with_ids(render(chunks, NDJSON_SEP), chunks, prefix)
    events = body.split(b"\n\n")
    assert events[-1] == b""
    events = events[:-1]
    assert len(events) == 5
    seen = []
    for ev in events:
        data, ident = ev.split(b"\n")
        assert data.startswith(b"data: ") and ident.startswith(b"id: ")
        rec = orjson.loads(data[6:])
        seen.append((rec["topic"], rec["partition"], rec["offset"]))
        pos = c.decode(ident[4:].decode(), B)
        assert pos[TP(rec["topic"], rec["partition"])] == rec["offset"] + 1
        assert pos[TP("u", 0)] == 9 and pos[TP("v", 0)] is None
        if rec["partition"] == 0:
            assert pos[TP("t", 1)] == 50  # not delivered yet at that event
        else:
            assert pos[TP("t", 0)] == 103  # delivered whole before it
    assert seen == [("t", 0, 100), ("t", 0, 101), ("t", 0, 102), ("t", 1, 50), ("t", 1, 51)]


@pytest.mark.parametrize("render", [render_binary, render_json])
def test_ndjson_last_record_of_a_write_carries_the_token(render: Any) -> None:
    c = codec()
    inst, chunks = _poll()
    body = ndjson_with_token(render(chunks, NDJSON_SEP), chunks, token_prefix(c, B, inst, chunks))
    assert body.endswith(b"\n")
    lines = [orjson.loads(x) for x in body.splitlines()]
    assert [x["offset"] for x in lines] == [100, 101, 102, 50, 51]
    assert all("resume" not in x for x in lines[:-1])
    last = lines[-1]
    assert set(last) >= {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
    assert c.decode(last["resume"], B) == {TP("t", 0): 103, TP("t", 1): 52, TP("u", 0): 9, TP("v", 0): None}


def test_no_token_when_too_large_the_records_still_flow() -> None:
    chunks = [(TP("t", 0), [_rec(1), _rec(2)])]
    out = render_binary(chunks, NDJSON_SEP)
    assert ndjson_with_token(out, chunks, None).count(b"\n") == 2
    sse = sse_with_ids(out, chunks, None)
    assert sse.count(b"data: ") == 2 and b"id: " not in sse
