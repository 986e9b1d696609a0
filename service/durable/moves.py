"""Which held instances move when the replica set changes (durable instances; scale-out and scale-in): the
sans-io core. The I/O (watching the peer table, handing instances off one at a time between requests) is
:mod:`api.replicas.moves` and :meth:`service.instances.registry.Gateway.move_instance`.

An instance is held by the replica that created (or last re-created) it. When the ring changes so that a live,
settled replica other than the holder becomes the rendezvous owner of its name, the holder hands it off (closes
it with a LeaveGroup, keeps its descriptor) and the new owner re-creates it at its next request. Instances
whose owner did not change stay where they are; a replica that drains (SIGTERM) hands everything off anyway.

Debounce: a peer counts as a move target only once it has been seen alive and not draining, in the same
process (its ``boot`` identity), for ``settle_s`` seconds, so a peer that flaps or restarts in a loop does not
pull instances back and forth. While the owner of an instance is a peer that has not settled the instance
waits (it does not move to a second-best replica first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.ring import owner, routing_key


@dataclass(frozen=True, order=True)
class Move:
    """Hand the instance (tenant, group, name) off: ``target`` is its new ring owner."""

    tenant: str
    group: str
    name: str
    target: str


@dataclass(frozen=True)
class PeerState:
    """What a probe said about a peer: its id, whether it answered, whether it drains, its process identity."""

    replica_id: str
    alive: bool
    draining: bool = False
    boot: str = ""


class AliveSince:
    """Since when each peer has been alive and not draining without interruption, in its current process.

    Fed with the peer table after every refresh (:meth:`observe`); a peer seen down or draining, missing from
    the table, or answering with another ``boot`` (it restarted between two probes) starts over."""

    def __init__(self) -> None:
        self._since: dict[str, tuple[str, float]] = {}

    def observe(self, peers: Iterable[PeerState], now: float) -> None:
        seen: dict[str, tuple[str, float]] = {}
        for p in peers:
            if not p.alive or p.draining:
                continue
            prev = self._since.get(p.replica_id)
            seen[p.replica_id] = prev if prev is not None and prev[0] == p.boot else (p.boot, now)
        self._since = seen

    def since(self) -> dict[str, float]:
        return {rid: t for rid, (_, t) in self._since.items()}


def instances_to_move(held: Iterable[tuple[str, str, str]], self_id: str, placement: Iterable[str],
                      alive_since: Mapping[str, float], now: float, settle_s: float) -> list[Move]:
    """The held instances ``(tenant, group, name)`` this replica should hand off, in a stable order.

    ``placement``: the live, not draining replica ids the ring is made of (this one included unless it drains);
    ``alive_since``: when each peer was last seen coming up (:class:`AliveSince`). An instance moves when its
    owner on ``placement`` is another replica that has been up for at least ``settle_s`` seconds. Nothing
    moves while this replica is not in ``placement`` (it drains: the shutdown hands everything off)."""
    ring = sorted(set(placement))
    if self_id not in ring:
        return []
    out: list[Move] = []
    for tenant, group, name in held:
        target = owner(ring, routing_key(group, name))
        if target is None or target == self_id:
            continue
        since = alive_since.get(target)
        if since is None or now - since < settle_s:
            continue  # the new owner has not settled yet: wait, do not move twice
        out.append(Move(tenant, group, name, target))
    return sorted(out)
