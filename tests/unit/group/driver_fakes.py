"""The consumer protocol's driver (service.group.coordinator_consumer) as its unit tests set it up: a fake client
(topic ``t`` and the coordinator's connections), hooks recording what they were given, and the driver with a known
coordinator whose requests a test answers itself."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from service.consumer.subscription import TopicPartition
from service.group.coordinator_consumer import ConsumerProtocolCoordinator
from service.group.member_consumer import ConsumerGroupMember

T1 = uuid.UUID(int=7)  # the id of topic "t"


class Handle:
    """A node's connection handle as the client gives it: ``current`` (None: not connected) and ``get()``."""

    def __init__(self, current: Any, conn: Any = None) -> None:
        self.current = current
        self.conn = current if conn is None else conn

    async def get(self) -> Any:
        return self.conn


def fake_client(main: Any, heartbeat: Any = None, *, connected: bool = True) -> Any:
    """The client the driver sees: the coordinator's connection ``main`` (current unless not ``connected``, got
    anyway) and its heartbeat connection ``heartbeat`` (None: none is current)."""
    return SimpleNamespace(metadata=SimpleNamespace(topic_names={T1: "t"}, mark_stale=lambda *a: None),
                           connection=lambda node: Handle(main if connected else None, main),
                           heartbeat_connection=lambda node: Handle(heartbeat))


def recording_hooks(events: list[str], added: bool = False) -> dict[str, Callable[..., Awaitable[None]]]:
    """``on_revoke``, ``on_assign`` and ``on_lost`` appending ``revoke [0, 1]``, ``assign [0, 1]`` (with
    ``added``: ``assign [0, 1] added [1]``) and ``lost [0, 1]`` to ``events``."""

    async def revoke(parts: list[TopicPartition]) -> None:
        events.append(f"revoke {[p.partition for p in parts]}")

    async def assign(assigned: list[TopicPartition], new: list[TopicPartition]) -> None:
        tail = f" added {[p.partition for p in new]}" if added else ""
        events.append(f"assign {[p.partition for p in assigned]}{tail}")

    async def lost(parts: list[TopicPartition]) -> None:
        events.append(f"lost {[p.partition for p in parts]}")

    return {"on_revoke": revoke, "on_assign": assign, "on_lost": lost}


def scripted_driver(client: Any, member: ConsumerGroupMember, send: Callable[..., Awaitable[Any]],
                    **hooks: Any) -> ConsumerProtocolCoordinator:
    """The driver of ``member`` for topic ``t``, its coordinator known (node 1), every request it sends itself
    going to ``send`` (the test's script) instead of a broker."""
    coord = ConsumerProtocolCoordinator(client, member, topics=lambda: ["t"], retry_backoff_ms=10, **hooks)
    coord.coordinator_id = 1
    coord._send = send  # type: ignore[method-assign]
    return coord
