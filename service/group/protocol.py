"""Codecs for the consumer protocol's embedded payloads (KIP-429 era ``ConsumerProtocol``).

Two payloads travel opaquely through the group coordinator:

* the *subscription*: each member's JoinGroup protocol metadata (topics, user data, owned partitions,
  generation, rack), and
* the *assignment*: what the leader hands each member in SyncGroup.

On the wire both are an int16 version followed by the struct of that version. Like the Java client, a
payload whose version is newer than ours is read with our newest layout (newer versions may only append
fields), any trailing bytes are ignored, and a negative version or a truncated/garbled payload raises
:class:`~service.protocol.errors.ProtocolDecodeError`. Everything here is pure: bytes in, values out.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.protocol import messages as M
from service.protocol.errors import ProtocolDecodeError

__all__ = [
    "ASSIGNMENT_VERSIONS",
    "SUBSCRIPTION_VERSIONS",
    "Assignment",
    "OwnedPartitions",
    "Subscription",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
    "group_partitions",
]

_SUB = M.DATA["ConsumerProtocolSubscription"]
_ASN = M.DATA["ConsumerProtocolAssignment"]
_SubTP = M.struct("ConsumerProtocolSubscription", "TopicPartition")
_AsnTP = M.struct("ConsumerProtocolAssignment", "TopicPartition")
_INT16 = struct.Struct(">h")

SUBSCRIPTION_VERSIONS: tuple[int, int] = _SUB.schema.versions
ASSIGNMENT_VERSIONS: tuple[int, int] = _ASN.schema.versions

#: Partitions grouped by topic (``{"orders": [0, 3]}``) or flat ``(topic, partition)`` pairs;
#: ``service.consumer.subscription.TopicPartition`` named tuples are pairs too.
OwnedPartitions = Mapping[str, Iterable[int]] | Iterable[tuple[str, int]]


def group_partitions(partitions: OwnedPartitions | None) -> dict[str, list[int]]:
    """Normalise either partition shape to ``{topic: [partition, ...]}``.

    Topics keep their first-seen order, partitions their given order; duplicates are dropped.
    """
    out: dict[str, list[int]] = {}
    if not partitions:
        return out
    if isinstance(partitions, Mapping):
        pairs: Iterable[tuple[str, int]] = ((t, p) for t, ps in partitions.items() for p in ps)
    else:
        pairs = partitions
    seen: set[tuple[str, int]] = set()
    for t, p in pairs:
        if (t, p) not in seen:
            seen.add((t, p))
            out.setdefault(t, []).append(p)
    return out


def _merge(entries: Iterable[Any]) -> dict[str, list[int]]:
    """Decoded ``TopicPartition`` entries → ``{topic: partitions}``; repeated topics merge, duplicates drop."""
    return group_partitions((e.topic, p) for e in entries for p in e.partitions)


def _pairs(grouped: Mapping[str, list[int]]) -> Iterator[tuple[str, int]]:
    for t, ps in grouped.items():
        for p in ps:
            yield t, p


# -- subscription ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Subscription:
    """A decoded JoinGroup member metadata payload.

    ``version`` is the version found on the wire (it may be newer than :data:`SUBSCRIPTION_VERSIONS`);
    fields the payload's version does not carry hold Kafka's defaults (no owned partitions, generation -1,
    no rack). An empty rack id is reported as ``None``, as the Java client does.
    """

    version: int
    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: dict[str, list[int]] = field(default_factory=dict)
    generation_id: int = -1
    rack_id: str | None = None

    def owned_pairs(self) -> list[tuple[str, int]]:
        """Owned partitions as flat ``(topic, partition)`` pairs."""
        return list(_pairs(self.owned_partitions))


def encode_subscription(
    topics: Iterable[str],
    *,
    owned_partitions: OwnedPartitions | None = None,
    user_data: bytes | None = None,
    generation_id: int = -1,
    rack_id: str | None = None,
    version: int = 3,
) -> bytes:
    """JoinGroup protocol metadata: int16 ``version`` + ``ConsumerProtocolSubscription``.

    Fields that ``version`` lacks (owned partitions before v1, generation before v2, rack before v3) are
    left out silently: they are all *ignorable* in Kafka's schema. An unknown version raises
    :class:`~service.protocol.errors.UnsupportedVersionError`.
    """
    owned = group_partitions(owned_partitions)
    obj = _SUB.cls(
        topics=list(topics),
        user_data=user_data,
        owned_partitions=[_SubTP(topic=t, partitions=list(ps)) for t, ps in owned.items()],
        generation_id=generation_id,
        rack_id=rack_id,
    )
    body = _SUB.encode(obj, version)  # validates the version first
    return _INT16.pack(version) + body


def _read_version(data: bytes | bytearray | memoryview, what: str) -> int:
    if len(data) < 2:
        raise ProtocolDecodeError(f"{what}: {len(data)} byte(s) cannot hold the int16 version")
    (version,) = _INT16.unpack_from(data, 0)
    if version < 0:
        raise ProtocolDecodeError(f"{what}: unsupported version {version}")
    return version


def _decode_body(cm: Any, data: bytes | bytearray | memoryview, version: int, what: str) -> Any:
    lo, hi = cm.schema.versions
    read_as = min(version, hi)
    if read_as < lo:  # pragma: no cover - every payload schema starts at v0
        raise ProtocolDecodeError(f"{what}: unsupported version {version}")
    try:
        # Trailing bytes (fields of a newer version) are ignored, as in Kafka.
        return cm.decode(data, read_as, 2)
    except ProtocolDecodeError:
        raise
    except (OverflowError, MemoryError, TypeError, ValueError, IndexError, struct.error) as exc:
        raise ProtocolDecodeError(f"malformed {what} v{version}: {exc}") from exc


def decode_subscription(data: bytes | bytearray | memoryview) -> Subscription:
    """Decode JoinGroup protocol metadata written by any consumer-protocol client (v0 and newer)."""
    version = _read_version(data, "consumer subscription")
    obj = _decode_body(_SUB, data, version, "consumer subscription")
    return Subscription(
        version=version,
        topics=list(obj.topics),
        user_data=obj.user_data,
        owned_partitions=_merge(obj.owned_partitions),
        generation_id=obj.generation_id,
        rack_id=obj.rack_id or None,
    )


# -- assignment --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Assignment:
    """A decoded SyncGroup member assignment. ``version`` is the wire version (0 for an empty payload)."""

    version: int
    partitions: dict[str, list[int]] = field(default_factory=dict)
    user_data: bytes | None = None

    def pairs(self) -> list[tuple[str, int]]:
        """Assigned partitions as flat ``(topic, partition)`` pairs."""
        return list(_pairs(self.partitions))


def encode_assignment(
    partitions: OwnedPartitions,
    user_data: bytes | None = None,
    version: int = 3,
) -> bytes:
    """SyncGroup member assignment: int16 ``version`` + ``ConsumerProtocolAssignment``.

    v0-v3 share one layout; v3 is what current Java clients write (clients read newer versions with their
    own layout).
    Topics with no partitions are left out.
    """
    grouped = group_partitions(partitions)
    obj = _ASN.cls(
        assigned_partitions=[_AsnTP(topic=t, partitions=list(ps)) for t, ps in grouped.items()],
        user_data=user_data,
    )
    body = _ASN.encode(obj, version)
    return _INT16.pack(version) + body


def decode_assignment(data: bytes | bytearray | memoryview | None) -> Assignment:
    """Decode a SyncGroup assignment; empty bytes (what brokers send a member the leader skipped) → empty."""
    if not data:
        return Assignment(version=0)
    version = _read_version(data, "consumer assignment")
    obj = _decode_body(_ASN, data, version, "consumer assignment")
    return Assignment(
        version=version,
        partitions=_merge(obj.assigned_partitions),
        user_data=obj.user_data,
    )
