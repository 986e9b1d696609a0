"""Consumer-instance descriptors: what it takes to re-create an HTTP consumer instance on another replica.

A descriptor is written as a keyed record to a compacted topic the gateway owns (``GATEWAY_INSTANCES_TOPIC``,
``__kcg_instances`` by default: under the built-in ``__*`` deny-list, so no tenant reads or writes it through
the API) in the tenant's own cluster. Creating an instance writes one; subscribe / assign / unsubscribe
write the new state; delete and idle expiry write a tombstone (a null value). Every replica reads the topic
at start and follows it, so any replica can re-create any instance from the table (Kafka is the only store).

This module is the sans-io part: the record format (:func:`encode_key`, :meth:`InstanceDescriptor.encode`,
:func:`decode`) and the table a replica builds by applying the topic's records in order
(:class:`DescriptorTable`). Credentials are never part of a descriptor: it holds the tenant id, the group,
the name, the instance's options as the client set them, and its subscription or assignment.

Record format (version 1): key ``b"kcg.i.1\\0" + tenant + "\\0" + group + "\\0" + name`` (UTF-8); value a JSON
object (``"v": 1``), or null for a tombstone. Unknown fields are kept and ignored; a record whose key or value
does not parse is skipped and counted (a newer gateway's format, or garbage), never fatal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

KEY_PREFIX = b"kcg.i.1\0"
VERSION = 1
DEFAULT_TOPIC = "__kcg_instances"


@dataclass
class InstanceDescriptor:
    tenant: str
    group: str
    name: str
    #: the instance's options as api/consumers created it (service.instances.registry.InstanceOptions fields)
    options: dict[str, Any] = field(default_factory=dict)
    #: the static member id the instance joins with (re-created instances join with the same one)
    group_instance_id: str | None = None
    #: {"topics": [...]} | {"pattern": "..."} | {"partitions": [[topic, partition], ...]} | None
    subscription: dict[str, Any] | None = None
    created: float = field(default_factory=time.time)  # wall-clock seconds
    last_used: float = field(default_factory=time.time)
    #: the replica that last held the instance (informational: placement follows the ring)
    replica: str = ""

    @property
    def key(self) -> bytes:
        return encode_key(self.tenant, self.group, self.name)

    def encode(self) -> bytes:
        d = asdict(self)
        d["v"] = VERSION
        return orjson.dumps(d)


def encode_key(tenant: str, group: str, name: str) -> bytes:
    for part in (tenant, group, name):
        if "\0" in part:
            raise ValueError("descriptor key parts may not contain NUL")
    return KEY_PREFIX + "\0".join((tenant, group, name)).encode("utf-8", "surrogatepass")


def decode_key(key: bytes | None) -> tuple[str, str, str] | None:
    if not key or not key.startswith(KEY_PREFIX):
        return None
    try:
        parts = key[len(KEY_PREFIX):].decode("utf-8", "surrogatepass").split("\0")
    except UnicodeDecodeError:
        return None
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


class DescriptorFormatError(ValueError):
    pass


def decode(key: bytes | None, value: bytes | None) -> tuple[tuple[str, str, str], InstanceDescriptor | None]:
    """The key's (tenant, group, name) and its descriptor (None: a tombstone); DescriptorFormatError when the
    record is not a descriptor this gateway understands."""
    k = decode_key(key)
    if k is None:
        raise DescriptorFormatError("not an instance descriptor key")
    if value is None:
        return k, None
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DescriptorFormatError(f"descriptor value is not JSON: {exc}") from None
    if not isinstance(d, dict) or d.get("v") != VERSION:
        raise DescriptorFormatError("descriptor of an unknown version")
    try:
        desc = InstanceDescriptor(
            tenant=str(d["tenant"]), group=str(d["group"]), name=str(d["name"]),
            options=dict(d.get("options") or {}), group_instance_id=d.get("group_instance_id"),
            subscription=d.get("subscription"), created=float(d.get("created", 0.0)),
            last_used=float(d.get("last_used", 0.0)), replica=str(d.get("replica", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise DescriptorFormatError(f"descriptor fields: {exc}") from None
    if (desc.tenant, desc.group, desc.name) != k:
        raise DescriptorFormatError("descriptor key and value disagree")
    return k, desc


class DescriptorTable:
    """The descriptors of the records applied so far, in topic order (the latest record per key wins; a
    tombstone removes). ``position`` is the next offset to apply per partition."""

    def __init__(self) -> None:
        self._table: dict[tuple[str, str, str], InstanceDescriptor] = {}
        self.position: dict[int, int] = {}
        self.skipped = 0  # records that were not descriptors this gateway understands

    def __len__(self) -> int:
        return len(self._table)

    def apply(self, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        if offset < self.position.get(partition, 0):
            return  # seen already (a re-read after a reconnect)
        self.position[partition] = offset + 1
        try:
            k, desc = decode(key, value)
        except DescriptorFormatError:
            self.skipped += 1
            return
        if desc is None:
            self._table.pop(k, None)
        else:
            self._table[k] = desc

    def put(self, desc: InstanceDescriptor) -> None:
        """Record a descriptor this replica wrote (before it is read back from the topic)."""
        self._table[(desc.tenant, desc.group, desc.name)] = desc

    def remove(self, tenant: str, group: str, name: str) -> None:
        self._table.pop((tenant, group, name), None)

    def get(self, tenant: str, group: str, name: str) -> InstanceDescriptor | None:
        return self._table.get((tenant, group, name))

    def of_tenant(self, tenant: str) -> Iterator[InstanceDescriptor]:
        return (d for (t, _, _), d in self._table.items() if t == tenant)
