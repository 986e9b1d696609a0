"""Client-side partition assignors run by the group leader: ``range``, ``roundrobin``, ``cooperative-sticky``.

All assignors are pure and deterministic: the result depends only on the *content* of the input (member
ids, static instance ids, subscriptions, owned partitions, generations and partition counts), never on
dict ordering. Members are ordered like the Java client orders them: static members first, by
``group.instance.id``, then dynamic members by member id, comparing strings by UTF-16 code units as Java's
``String.compareTo`` does.

Every member of the input appears in the output, possibly with ``{}``. Subscribed topics missing from
``partitions_per_topic`` (or with no partitions) are ignored. Output partition lists are sorted.

``cooperative-sticky`` (KIP-429 / KIP-341 semantics):

* *balanced*: the result minimises imbalance for the given subscriptions; members with identical
  subscriptions end up with partition counts that differ by at most one. In the general case the
  assignment is an optimal "semi-matching": no chain of moves can take a partition off a member with
  ``k`` partitions and hand one to a member with ``k - 2`` or fewer, which also means the largest load is
  as small as it can be.
* *sticky*: a member keeps the partitions it owns as long as that does not hurt balance, and only as
  many partitions move as balance requires.
* *generation-aware*: when several members claim a partition, the claim with the highest generation wins
  and older claims are ignored; two claims in the same (highest) generation cancel out.
* *cooperative*: a partition is handed to a member only if that member is its valid current owner or
  if **no** member claims it at all (whatever the claim's generation or validity). A partition that
  has to move is therefore only taken from its old owner this round; the old owner revokes it, rejoins,
  and the follow-up rebalance gives it to its new owner. No partition is ever added to one member while
  another member still reports owning it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from service.group.protocol import OwnedPartitions, Subscription, decode_subscription, group_partitions

__all__ = [
    "COOPERATIVE",
    "EAGER",
    "Assignor",
    "CooperativeStickyAssignor",
    "GroupAssignment",
    "MemberAssignment",
    "MemberSubscription",
    "RangeAssignor",
    "RoundRobinAssignor",
    "cooperative_violations",
    "get_assignor",
    "incremental_changes",
    "member_sort_key",
]

EAGER = "EAGER"
COOPERATIVE = "COOPERATIVE"

#: ``{topic: sorted partitions}`` for one member.
MemberAssignment = dict[str, list[int]]
#: ``{member_id: MemberAssignment}`` for the whole group.
GroupAssignment = dict[str, MemberAssignment]
TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What the leader knows about one member: its JoinGroup identity plus its decoded subscription.

    ``owned_partitions`` accepts ``{topic: [partitions]}`` or ``(topic, partition)`` pairs. Only
    ``cooperative-sticky`` looks at owned partitions and generation; no assignor uses the rack yet
    (rack-aware assignment needs partition replica racks, which the assign() input does not carry).
    Assignors key their output by the key of the ``members`` mapping, not by ``member_id``.
    """

    member_id: str
    topics: Collection[str] = ()
    owned_partitions: OwnedPartitions = field(default_factory=dict)
    generation_id: int = -1
    group_instance_id: str | None = None
    rack_id: str | None = None
    user_data: bytes | None = None

    @classmethod
    def from_subscription(cls, member_id: str, subscription: Subscription,
                          group_instance_id: str | None = None) -> MemberSubscription:
        """From a decoded subscription.

        Before v2 the payload has no generation field; Java's cooperative-sticky assignor then carries the
        generation as a 4-byte int32 in ``user_data`` (see :meth:`CooperativeStickyAssignor.user_data`),
        and that is used when present.
        """
        generation = subscription.generation_id
        ud = subscription.user_data
        if subscription.version < 2 and ud is not None and len(ud) == 4:
            generation = int.from_bytes(ud, "big", signed=True)
        return cls(
            member_id=member_id,
            topics=list(subscription.topics),
            owned_partitions=subscription.owned_partitions,
            generation_id=generation,
            group_instance_id=group_instance_id,
            rack_id=subscription.rack_id,
            user_data=subscription.user_data,
        )

    @classmethod
    def from_metadata(cls, member_id: str, metadata: bytes,
                      group_instance_id: str | None = None) -> MemberSubscription:
        """From a JoinGroup response member; raises ``ProtocolDecodeError`` on bad metadata."""
        return cls.from_subscription(member_id, decode_subscription(metadata), group_instance_id)


@runtime_checkable
class Assignor(Protocol):
    name: str
    rebalance_protocol: str

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> GroupAssignment: ...


def _java_order(s: str) -> bytes:
    # Big-endian UTF-16 bytes compare like Java's String.compareTo (UTF-16 code units).
    return s.encode("utf-16-be", "surrogatepass")


def member_sort_key(member_id: str, group_instance_id: str | None = None) -> tuple[int, bytes, bytes]:
    """Static members first (by instance id), then dynamic members (by member id)."""
    if group_instance_id is not None:
        return (0, _java_order(group_instance_id), _java_order(member_id))
    return (1, _java_order(member_id), b"")


def _sorted_members(members: Mapping[str, MemberSubscription]) -> list[str]:
    return sorted(members, key=lambda m: member_sort_key(m, members[m].group_instance_id))


def _counts(partitions_per_topic: Mapping[str, int]) -> dict[str, int]:
    return {t: n for t, n in partitions_per_topic.items() if n > 0}


# -- range ---------------------------------------------------------------------------------------
class RangeAssignor:
    """Per topic, the subscribed members in order each get a contiguous range; the first ones get one extra."""

    name = "range"
    rebalance_protocol = EAGER

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> GroupAssignment:
        counts = _counts(partitions_per_topic)
        out: GroupAssignment = {m: {} for m in members}
        by_topic: dict[str, list[str]] = {}
        for mid in _sorted_members(members):
            for t in set(members[mid].topics):
                if t in counts:
                    by_topic.setdefault(t, []).append(mid)
        for t in sorted(by_topic):
            subs = by_topic[t]
            quota, extra = divmod(counts[t], len(subs))
            start = 0
            for i, mid in enumerate(subs):
                size = quota + (1 if i < extra else 0)
                if size:
                    out[mid][t] = list(range(start, start + size))
                start += size
        return out


# -- roundrobin ----------------------------------------------------------------------------------
class RoundRobinAssignor:
    """All partitions in (topic, partition) order dealt to the members in a circle, skipping non-subscribers."""

    name = "roundrobin"
    rebalance_protocol = EAGER

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> GroupAssignment:
        counts = _counts(partitions_per_topic)
        out: GroupAssignment = {m: {} for m in members}
        order = _sorted_members(members)
        subs = [frozenset(t for t in members[m].topics if t in counts) for m in order]
        topics = sorted(set().union(*subs)) if subs else []
        n_members = len(order)
        cur = 0
        for t in topics:
            for p in range(counts[t]):
                while t not in subs[cur]:
                    cur = (cur + 1) % n_members
                out[order[cur]].setdefault(t, []).append(p)
                cur = (cur + 1) % n_members
        return out


# -- cooperative-sticky ----------------------------------------------------------------------------
class _StickyPlan:
    """One run of the sticky algorithm. Members are referred to by their index in the sorted order."""

    def __init__(self, partitions_per_topic: Mapping[str, int],
                 members: Mapping[str, MemberSubscription]) -> None:
        self.counts = _counts(partitions_per_topic)
        self.order = _sorted_members(members)
        n = len(self.order)
        self.subs: list[frozenset[str]] = [
            frozenset(t for t in members[m].topics if t in self.counts) for m in self.order
        ]
        self.subscribers: dict[str, list[int]] = {}
        for i, s in enumerate(self.subs):
            for t in sorted(s):
                self.subscribers.setdefault(t, []).append(i)
        # Claims: every partition any member says it owns (``claimed``) and the valid owner per partition.
        self.claimed: set[TP] = set()
        best: dict[TP, tuple[int, int]] = {}  # tp -> (generation, member index, or -1 when contested)
        for i, mid in enumerate(self.order):
            ms = members[mid]
            owned = group_partitions(ms.owned_partitions)
            for t in sorted(owned):
                ok_topic = t in self.subs[i]
                limit = self.counts.get(t, 0)
                for p in sorted(set(owned[t])):
                    tp = (t, p)
                    self.claimed.add(tp)
                    if not ok_topic or not 0 <= p < limit:
                        continue
                    cur = best.get(tp)
                    if cur is None or ms.generation_id > cur[0]:
                        best[tp] = (ms.generation_id, i)
                    elif ms.generation_id == cur[0] and cur[1] != i:
                        best[tp] = (ms.generation_id, -1)
        self.owner: dict[TP, int] = {tp: i for tp, (_, i) in sorted(best.items()) if i >= 0}
        self.hold: list[dict[str, list[int]]] = [{} for _ in range(n)]
        # Per member and topic, how many held partitions it did not own before this round.
        self.fresh: list[dict[str, int]] = [{} for _ in range(n)]
        self.load = [0] * n

    # -- bookkeeping ---------------------------------------------------------------------------
    def _give(self, i: int, t: str, p: int) -> None:
        self.hold[i].setdefault(t, []).append(p)
        self.load[i] += 1
        if self.owner.get((t, p)) != i:
            self.fresh[i][t] = self.fresh[i].get(t, 0) + 1

    def _move(self, src: int, t: str, dst: int) -> None:
        """Move one partition of ``t`` from ``src`` to ``dst``, preferring one that costs no stickiness."""
        lst = self.hold[src][t]
        owner = self.owner
        pick = -1
        for j in range(len(lst) - 1, -1, -1):  # a partition going back to its owner is best
            if owner.get((t, lst[j])) == dst:
                pick = j
                break
        if pick < 0:
            for j in range(len(lst) - 1, -1, -1):  # then one src was only handed this round
                if owner.get((t, lst[j])) != src:
                    pick = j
                    break
        p = lst.pop(pick)
        if not lst:
            del self.hold[src][t]
        self.load[src] -= 1
        if owner.get((t, p)) != src:
            left = self.fresh[src][t] - 1
            if left:
                self.fresh[src][t] = left
            else:
                del self.fresh[src][t]
        self._give(dst, t, p)

    # -- the two strategies ----------------------------------------------------------------------
    def run(self) -> None:
        n = len(self.order)
        if n == 0:
            return
        if all(s == self.subs[0] for s in self.subs):
            self._assign_identical()
        else:
            self._assign_general()

    def _assign_identical(self) -> None:
        """Every member subscribes to the same topics: quotas of ⌊N/M⌋ or ⌈N/M⌉, kept partitions first."""
        n = len(self.order)
        topics = sorted(self.subs[0])
        total = sum(self.counts[t] for t in topics)
        quota, extra = divmod(total, n)
        by_topic: list[dict[str, list[int]]] = [{} for _ in range(n)]
        for (t, p), i in self.owner.items():  # sorted by (topic, partition)
            by_topic[i].setdefault(t, []).append(p)
        # Kept partitions interleave topics (1st of each topic, then 2nd, ...), so a member that must give
        # some up keeps a share of every topic it had.
        owned: list[list[TP]] = [
            [(t, p) for _, t, p in sorted((j, t, p) for t, ps in bt.items() for j, p in enumerate(ps))]
            for bt in by_topic
        ]
        # The members owning the most get the ``extra`` larger quotas: fewest partitions have to move.
        cap = [quota] * n
        for i in sorted(range(n), key=lambda i: (-min(len(owned[i]), quota + 1), i))[:extra]:
            cap[i] = quota + 1
        kept: set[TP] = set()
        for i in range(n):
            for t, p in owned[i][: cap[i]]:
                self._give(i, t, p)
                kept.add((t, p))
        pool = [(t, p) for t in topics for p in range(self.counts[t]) if (t, p) not in kept]
        needy = [i for i in range(n) if self.load[i] < cap[i]]
        k = 0
        while needy:  # deal one at a time so each member's new partitions spread over topics
            still = []
            for i in needy:
                t, p = pool[k]
                k += 1
                self._give(i, t, p)
                if self.load[i] < cap[i]:
                    still.append(i)
            needy = still

    def _assign_general(self) -> None:
        for tp, i in self.owner.items():
            self._give(i, *tp)
        load = self.load
        # Hand out unowned partitions to the least loaded subscriber, most constrained topics first.
        for t in sorted(self.subscribers, key=lambda t: (len(self.subscribers[t]), t)):
            free = [p for p in range(self.counts[t]) if (t, p) not in self.owner]
            if not free:
                continue
            heap = [(load[i], i) for i in self.subscribers[t]]
            heapq.heapify(heap)
            for p in free:
                _, i = heapq.heappop(heap)
                self._give(i, t, p)
                heapq.heappush(heap, (load[i], i))
        # First rebalance only with partitions handed out this round (moving those costs nothing), then
        # with any partition.
        self._balance(self.fresh)
        self._balance(self.hold)

    def _balance(self, movable: Sequence[Collection[str]]) -> None:
        """Apply cost-reducing paths (max-loaded → ... → a member with ≥ 2 fewer) until none is left.

        ``movable[x]`` holds the topics along which member ``x`` may pass a partition on.
        """
        n = len(self.order)
        load = self.load
        while True:
            changed = False
            done = bytearray(n)
            for src in sorted(range(n), key=lambda i: (-load[i], i)):
                while not done[src]:
                    path = self._find_path(src, done, movable)
                    if path is None:
                        break
                    for x, t, y in path:
                        self._move(x, t, y)
                    changed = True
                    done = bytearray(n)
            if not changed:
                return

    def _find_path(self, src: int, done: bytearray,
                   movable: Sequence[Collection[str]]) -> list[tuple[int, str, int]] | None:
        """BFS over "holds a partition of a topic the next member subscribes to" edges.

        Returns the hops to the least-loaded reachable member that has at least two partitions fewer than
        ``src`` (nearest first among equals), or ``None`` after marking every member proven unimprovable.
        """
        load = self.load
        limit = load[src] - 2
        floor = min(load)
        if floor > limit:
            done[src] = 1
            return None
        parent: dict[int, tuple[int, str]] = {src: (-1, "")}
        seen_topics: set[str] = set()
        queue = deque([src])
        best = -1
        while queue and (best < 0 or load[best] > floor):
            x = queue.popleft()
            for t in movable[x]:
                if t in seen_topics:
                    continue
                seen_topics.add(t)
                for y in self.subscribers[t]:
                    if y in parent:
                        continue
                    parent[y] = (x, t)
                    ly = load[y]
                    if ly <= limit and (best < 0 or ly < load[best]):
                        best = y
                        if ly == floor:
                            break
                    queue.append(y)
                if best >= 0 and load[best] == floor:
                    break
        if best < 0:
            # Nothing reachable from src is ≥ 2 below it, so nothing reachable from any visited member
            # with a load ≤ src's is ≥ 2 below that member either.
            top = load[src]
            for y in parent:
                if load[y] <= top:
                    done[y] = 1
            return None
        hops: list[tuple[int, str, int]] = []
        y = best
        while y != src:
            x, t = parent[y]
            hops.append((x, t, y))
            y = x
        return hops

    def result(self, members: Mapping[str, MemberSubscription], cooperative: bool) -> GroupAssignment:
        out: GroupAssignment = {m: {} for m in members}
        owner, claimed = self.owner, self.claimed
        for i, mid in enumerate(self.order):
            mine = out[mid]
            for t in sorted(self.hold[i]):
                ps = sorted(self.hold[i][t])
                if cooperative:
                    ps = [p for p in ps if owner.get((t, p)) == i or (t, p) not in claimed]
                if ps:
                    mine[t] = ps
        return out


class CooperativeStickyAssignor:
    """KIP-429 incremental cooperative rebalancing on top of a balanced, sticky, generation-aware plan."""

    name = "cooperative-sticky"
    rebalance_protocol = COOPERATIVE

    @staticmethod
    def user_data(generation_id: int) -> bytes:
        """Subscription ``user_data`` as Java's cooperative-sticky writes it: the generation as an int32.

        Leaders that read subscriptions older than v2 take the generation from here.
        """
        return generation_id.to_bytes(4, "big", signed=True)

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> GroupAssignment:
        plan = _StickyPlan(partitions_per_topic, members)
        plan.run()
        return plan.result(members, cooperative=self.rebalance_protocol == COOPERATIVE)


# -- helpers ----------------------------------------------------------------------------------------
def incremental_changes(owned: OwnedPartitions,
                        assigned: OwnedPartitions) -> tuple[MemberAssignment, MemberAssignment]:
    """``(revoked, added)`` for a member that owned ``owned`` and was just given ``assigned``.

    Under the cooperative protocol the member revokes ``revoked`` (and rejoins if it is not empty) and
    starts consuming ``added``; partitions in both are kept without interruption.
    """
    old = {(t, p) for t, ps in group_partitions(owned).items() for p in ps}
    new = {(t, p) for t, ps in group_partitions(assigned).items() for p in ps}
    return _grouped_sorted(old - new), _grouped_sorted(new - old)


def _grouped_sorted(tps: set[TP]) -> MemberAssignment:
    out: MemberAssignment = {}
    for t, p in sorted(tps):
        out.setdefault(t, []).append(p)
    return out


def cooperative_violations(members: Mapping[str, MemberSubscription],
                           assignment: Mapping[str, Mapping[str, Collection[int]]]) -> list[tuple[str, int, str, str]]:
    """Partitions added to a member while another member still claims them, as ``(topic, partition, to, owner)``.

    An empty list means the assignment is safe under the cooperative protocol (the check the Java leader
    makes before it sends SyncGroup). Claims are taken as reported, whatever their generation.
    """
    owned = {mid: _owned_set(ms) for mid, ms in members.items()}
    claims: dict[TP, list[str]] = {}
    for mid in sorted(owned):
        for tp in owned[mid]:
            claims.setdefault(tp, []).append(mid)
    bad: list[tuple[str, int, str, str]] = []
    for mid in sorted(assignment):
        mine = owned.get(mid, set())
        for t in sorted(assignment[mid]):
            for p in sorted(assignment[mid][t]):
                if (t, p) in mine:
                    continue
                bad.extend((t, p, mid, other) for other in claims.get((t, p), ()) if other != mid)
    return bad


def _owned_set(ms: MemberSubscription) -> set[TP]:
    return {(t, p) for t, ps in group_partitions(ms.owned_partitions).items() for p in ps}


_ASSIGNORS: dict[str, type[RangeAssignor] | type[RoundRobinAssignor] | type[CooperativeStickyAssignor]] = {
    RangeAssignor.name: RangeAssignor,
    RoundRobinAssignor.name: RoundRobinAssignor,
    CooperativeStickyAssignor.name: CooperativeStickyAssignor,
}


def get_assignor(name: str) -> Assignor:
    """A fresh assignor by its protocol name (``range``, ``roundrobin``, ``cooperative-sticky``)."""
    try:
        return _ASSIGNORS[name]()
    except KeyError:
        raise ValueError(f"unknown assignor {name!r}; known: {', '.join(sorted(_ASSIGNORS))}") from None
