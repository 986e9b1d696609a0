"""Resume tokens of ndjson / SSE streams (sans-io): positions of a consumer instance, tamper-checked.

A token says where an instance's stream stands after one record: for every partition the stream knew of
(its assignment then) the next offset to deliver, or "unresolved" for a partition whose position was not
known yet (it starts from the committed offset or the reset policy). Tokens are cheap per record: a stream
signs one :class:`TokenPrefix` per poll holding the positions before the poll (*start*) and the poll's
chunks in delivery order (partition, first offset, next offset after the chunk); the token of a record adds
only its place (chunk index k, the record's next offset), unsigned but checked to lie inside chunk k, so an
edited place can only name a point of the same poll, as an honest token of that poll would. Decoding applies
the first k chunks whole, then the record's own position.

Text form: ``<base64url(prefix)>.<base64url(MAC)>.<base64url(k as 4 bytes, next offset as 8 bytes)>``; the
prefix is ``version | flags | body`` and the body (zlib-compressed when that is shorter: flag bit 0) is::

    varint n_topics, then per topic: varint len, name (UTF-8), varint n_partitions,
        then per partition (ascending): varint (partition - previous partition), varint (offset + 1; 0: unresolved)
    varint n_chunks, then per chunk: varint topic index, varint partition, varint first offset,
        varint (next offset after the chunk - first offset)

The MAC is keyed BLAKE2b (128 bits; a MAC by design) over the binding (tenant, group, instance id) and the
prefix; the binding is not in the token, so a token of another instance, group or tenant, an altered one and
one signed with another key are all refused the same way (:class:`ResumeTokenError`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from service.consumer.subscription import TopicPartition

VERSION = 1
_FLAG_ZLIB = 1
MAC_BYTES = 16
#: the longest token text accepted or issued (an HTTP header or query value must carry it); an assignment
#: whose token would be longer (thousands of partitions with incompressible offsets) gets no tokens
MAX_TOKEN_CHARS = 6000
_MAX_BODY_BYTES = 256 * 1024  # bound on a decompressed body
_MAX_PARTITIONS = 100_000
_COMPRESS_ABOVE = 96  # tables shorter than this are never worth compressing
_DOMAIN = b"kcg-resume-v1"  # BLAKE2b personalisation (at most 16 bytes)
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_OFFSET_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1


class ResumeTokenError(ValueError):
    """A token that is not one this gateway issued for this instance (garbage, altered, foreign, expired key)."""


@dataclass(frozen=True)
class Binding:
    """What a token is valid for: the tenant, the group and the instance id in the URL."""

    tenant: str
    group: str
    instance: str

    def encode(self) -> bytes:
        out = bytearray()
        for s in (self.tenant, self.group, self.instance):
            b = s.encode()
            _varint(out, len(b))
            out += b
        return bytes(out)


def derive_key(secret: str | None) -> bytes:
    """The MAC key: derived from a configured secret (the same on every replica, across restarts), or
    random for this process when there is none (tokens then die with the process)."""
    if not secret:
        return os.urandom(32)
    return hmac.digest(secret.encode(), b"kcg resume-token key v1", hashlib.sha256)


def _varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        n = shift = 0
        while True:
            if self.pos >= len(self.data) or shift > 63:
                raise ResumeTokenError("truncated or malformed resume token")
            b = self.data[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ResumeTokenError("truncated resume token")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b


def _b64(b: bytes) -> bytes:
    return base64.urlsafe_b64encode(b).rstrip(b"=")


def _unb64(s: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    except (binascii.Error, ValueError):
        raise ResumeTokenError("resume token is not base64url") from None


def _body(start: Mapping[TopicPartition, int | None], chunks: Sequence[tuple[TopicPartition, int, int]]) -> bytes:
    by_topic: dict[str, list[tuple[int, int | None]]] = {}
    for tp, off in start.items():
        by_topic.setdefault(tp.topic, []).append((tp.partition, off))
    for tp, _, _ in chunks:
        by_topic.setdefault(tp.topic, [])
    out = bytearray()
    _varint(out, len(by_topic))
    index: dict[str, int] = {}
    for i, (topic, parts) in enumerate(sorted(by_topic.items())):
        index[topic] = i
        name = topic.encode()
        _varint(out, len(name))
        out += name
        _varint(out, len(parts))
        prev = 0
        for partition, off in sorted(parts):
            _varint(out, partition - prev)
            prev = partition
            _varint(out, 0 if off is None else off + 1)
    _varint(out, len(chunks))
    for tp, first, end in chunks:
        _varint(out, index[tp.topic])
        _varint(out, tp.partition)
        _varint(out, first)
        _varint(out, end - first)
    return bytes(out)


class TokenPrefix:
    """Everything of a poll's tokens but the record's place: signed once per poll, then :meth:`token` per
    record is one 16-character base64 (no hashing per record)."""

    __slots__ = ("_text",)

    def __init__(self, text: bytes) -> None:
        self._text = text

    def token(self, chunk: int, next_offset: int) -> bytes:
        """The token after a record of the poll's ``chunk``-th chunk whose next offset is ``next_offset``."""
        # 12 bytes: base64 without padding, url-safe alphabet
        return self._text + binascii.b2a_base64(_TAIL(chunk, next_offset), newline=False).translate(_URLSAFE)


_TAIL = struct.Struct(">IQ").pack


class ResumeCodec:
    def __init__(self, key: bytes) -> None:
        if not 16 <= len(key) <= 64:
            raise ValueError("a resume key has 16 to 64 bytes")
        self._key = key

    def _mac(self, binding: Binding, prefix: bytes) -> hashlib.blake2b:
        m = hashlib.blake2b(key=self._key, digest_size=MAC_BYTES, person=_DOMAIN)
        m.update(binding.encode())
        m.update(prefix)
        return m

    def prefix(self, binding: Binding, start: Mapping[TopicPartition, int | None],
               chunks: Sequence[tuple[TopicPartition, int, int]]) -> TokenPrefix | None:
        """The token builder of one poll: ``start`` = positions before it, ``chunks`` = (partition, first
        offset, next offset after the chunk) in delivery order. None when a token would exceed
        :data:`MAX_TOKEN_CHARS`."""
        body = _body(start, chunks)
        flags = 0
        if len(body) > _COMPRESS_ABOVE:
            packed = zlib.compress(body, 6)
            if len(packed) < len(body):
                body, flags = packed, _FLAG_ZLIB
        raw = bytes((VERSION, flags)) + body
        text = _b64(raw) + b"." + _b64(self._mac(binding, raw).digest()) + b"."
        if len(text) + 16 > MAX_TOKEN_CHARS:
            return None
        return TokenPrefix(text)

    def encode(self, binding: Binding, positions: Mapping[TopicPartition, int | None]) -> str | None:
        """A token of plain positions (no chunk applied)."""
        p = self.prefix(binding, positions, [])
        return None if p is None else p.token(0, 0).decode()

    def decode(self, token: str, binding: Binding) -> dict[TopicPartition, int | None]:
        """The positions a token carries (None: unresolved then), checked against ``binding``."""
        if not token or len(token) > MAX_TOKEN_CHARS or token.count(".") != 2:
            raise ResumeTokenError("not a resume token")
        prefix_text, mac_text, place_text = token.split(".")
        try:
            raw, mac, place = _unb64(prefix_text), _unb64(mac_text), _unb64(place_text)
        except UnicodeEncodeError:
            raise ResumeTokenError("not a resume token") from None
        if len(raw) < 2 or len(mac) != MAC_BYTES or len(place) != 12:
            raise ResumeTokenError("not a resume token")
        if raw[0] != VERSION:
            raise ResumeTokenError(f"resume token version {raw[0]} is not supported (expected {VERSION})")
        if not hmac.compare_digest(self._mac(binding, raw).digest(), mac):
            raise ResumeTokenError("resume token does not belong to this consumer instance (altered, issued "
                                   "for another instance, group or tenant, or by a gateway with another key)")
        chunk, head_next = struct.unpack(">IQ", place)
        body = raw[2:]
        if raw[1] & ~_FLAG_ZLIB:
            raise ResumeTokenError("resume token has unknown flags")
        if raw[1] & _FLAG_ZLIB:
            d = zlib.decompressobj()
            try:
                body = d.decompress(body, _MAX_BODY_BYTES)
            except zlib.error:
                raise ResumeTokenError("resume token body does not decompress") from None
            if d.unconsumed_tail or not d.eof:
                raise ResumeTokenError("resume token body too large")
        return _parse(body, chunk, head_next)


def _parse(body: bytes, chunk: int, head_next: int) -> dict[TopicPartition, int | None]:
    r = _Reader(body)
    out: dict[TopicPartition, int | None] = {}
    topics: list[str] = []
    for _ in range(r.varint()):
        try:
            topic = r.take(r.varint()).decode()
        except UnicodeDecodeError:
            raise ResumeTokenError("resume token topic is not UTF-8") from None
        topics.append(topic)
        partition = 0
        for _ in range(r.varint()):
            partition += r.varint()
            off = r.varint()
            if partition > _INT32_MAX or off > _OFFSET_MAX + 1 or len(out) >= _MAX_PARTITIONS:
                raise ResumeTokenError("resume token out of range")
            out[TopicPartition(topic, partition)] = None if off == 0 else off - 1
    n = r.varint()
    if n > _MAX_PARTITIONS:
        raise ResumeTokenError("resume token out of range")
    chunks = []
    for _ in range(n):
        index, partition, first = r.varint(), r.varint(), r.varint()
        end = first + r.varint()
        if index >= len(topics) or partition > _INT32_MAX or end > _OFFSET_MAX:
            raise ResumeTokenError("resume token out of range")
        chunks.append((TopicPartition(topics[index], partition), first, end))
    if r.pos != len(body):
        raise ResumeTokenError("malformed resume token")
    # the unsigned place: inside its chunk (an edited one names at most another point of the same poll)
    if (chunks and (chunk >= len(chunks) or not chunks[chunk][1] <= head_next <= chunks[chunk][2])) or (
            not chunks and (chunk or head_next)):
        raise ResumeTokenError("resume token place outside its poll")
    for tp, _, end in chunks[:chunk]:
        out[tp] = end
    if chunks:
        out[chunks[chunk][0]] = head_next
    return out
