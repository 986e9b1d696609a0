"""Partition assignors: range, roundrobin and cooperative-sticky (KIP-429/KIP-341 semantics).

The range/roundrobin expectations are Kafka's documented examples. The cooperative-sticky tests drive
whole rebalances: each round every member reports what it owns (its previous assignment) and the
generation it got it in, the way JoinGroup metadata carries them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.group.assignors import (
    COOPERATIVE,
    EAGER,
    Assignor,
    CooperativeStickyAssignor,
    GroupAssignment,
    MemberSubscription,
    RangeAssignor,
    RoundRobinAssignor,
    _StickyPlan,
    cooperative_violations,
    get_assignor,
    incremental_changes,
    member_sort_key,
)
from service.group.protocol import encode_subscription

MS = MemberSubscription
RANGE = RangeAssignor()
RR = RoundRobinAssignor()
CS = CooperativeStickyAssignor()


def flat(a: Mapping[str, list[int]]) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in a.items() for p in ps}


def loads(result: GroupAssignment) -> dict[str, int]:
    return {m: len(flat(a)) for m, a in result.items()}


def same(topics: list[str], *ids: str) -> dict[str, MemberSubscription]:
    return {m: MS(m, topics) for m in ids}


# -- registry ---------------------------------------------------------------------------------
def test_registry_and_protocols() -> None:
    assert [(a.name, a.rebalance_protocol) for a in (RANGE, RR, CS)] == [
        ("range", EAGER), ("roundrobin", EAGER), ("cooperative-sticky", COOPERATIVE)]
    for name in ("range", "roundrobin", "cooperative-sticky"):
        a = get_assignor(name)
        assert a.name == name
        assert isinstance(a, Assignor)
    with pytest.raises(ValueError, match="unknown assignor"):
        get_assignor("sticky")


def test_member_subscription_from_metadata() -> None:
    meta = encode_subscription(["a", "b"], owned_partitions={"a": [1]}, generation_id=4, rack_id="r")
    ms = MS.from_metadata("m-1", meta, group_instance_id="i-1")
    assert ms == MS("m-1", ["a", "b"], {"a": [1]}, 4, "i-1", "r", None)


def test_generation_from_java_cooperative_user_data_before_v2() -> None:
    ud = CooperativeStickyAssignor.user_data(9)
    assert ud == b"\x00\x00\x00\x09"
    old = encode_subscription(["t"], owned_partitions={"t": [0]}, user_data=ud, version=1)
    assert MS.from_metadata("m", old).generation_id == 9
    # From v2 on the field wins; other user data shapes are not a generation.
    new = encode_subscription(["t"], user_data=ud, generation_id=11, version=2)
    assert MS.from_metadata("m", new).generation_id == 11
    assert MS.from_metadata("m", encode_subscription(["t"], user_data=b"\x00" * 5, version=1)).generation_id == -1
    assert CooperativeStickyAssignor.user_data(-1) == b"\xff\xff\xff\xff"


def test_member_sort_key_is_java_order() -> None:
    ids = ["b", "a", "\uffff", "\U0001f600", "B"]
    # Java compares UTF-16 code units: the surrogate pair of U+1F600 (0xD83D...) sorts before U+FFFF.
    assert sorted(ids, key=member_sort_key) == ["B", "a", "b", "\U0001f600", "\uffff"]
    assert member_sort_key("zzz", "a") < member_sort_key("aaa", None)  # static members first


# -- range ------------------------------------------------------------------------------------
def test_range_kafka_doc_example() -> None:
    # Two consumers, two topics with three partitions each.
    got = RANGE.assign({"t0": 3, "t1": 3}, same(["t0", "t1"], "C1", "C0"))
    assert got == {"C1": {"t0": [2], "t1": [2]}, "C0": {"t0": [0, 1], "t1": [0, 1]}}


def test_range_uneven_split_and_more_members_than_partitions() -> None:
    got = RANGE.assign({"t": 7, "u": 2}, same(["t", "u"], "a", "b", "c"))
    assert got == {"a": {"t": [0, 1, 2], "u": [0]}, "b": {"t": [3, 4], "u": [1]}, "c": {"t": [5, 6]}}


def test_range_static_members_ordered_by_instance_id() -> None:
    members = {
        "m-1": MS("m-1", ["t"], group_instance_id="zeta"),
        "m-2": MS("m-2", ["t"], group_instance_id="alpha"),
        "m-0": MS("m-0", ["t"]),  # dynamic: after every static member
    }
    got = RANGE.assign({"t": 5}, members)
    assert got == {"m-2": {"t": [0, 1]}, "m-1": {"t": [2, 3]}, "m-0": {"t": [4]}}


def test_range_different_subscriptions() -> None:
    members = {"a": MS("a", ["t0"]), "b": MS("b", ["t0", "t1"]), "c": MS("c", ["t1", "missing"])}
    got = RANGE.assign({"t0": 3, "t1": 4, "unused": 9}, members)
    assert got == {"a": {"t0": [0, 1]}, "b": {"t0": [2], "t1": [0, 1]}, "c": {"t1": [2, 3]}}


def test_range_every_member_present_and_missing_topics_ignored() -> None:
    members = {"a": MS("a", ["nope"]), "b": MS("b", []), "c": MS("c", ["t", "empty"])}
    assert RANGE.assign({"t": 2, "empty": 0}, members) == {"a": {}, "b": {}, "c": {"t": [0, 1]}}
    assert RANGE.assign({}, {}) == {}


# -- roundrobin -------------------------------------------------------------------------------
def test_roundrobin_kafka_doc_example() -> None:
    got = RR.assign({"t0": 3, "t1": 3}, same(["t0", "t1"], "C1", "C0"))
    assert got == {"C0": {"t0": [0, 2], "t1": [1]}, "C1": {"t0": [1], "t1": [0, 2]}}


def test_roundrobin_kafka_doc_example_different_subscriptions() -> None:
    # C0 ⊂ t0; C1 ⊂ t0,t1; C2 ⊂ t0,t1,t2; t0/t1/t2 have 1/2/3 partitions.
    members = {"C0": MS("C0", ["t0"]), "C1": MS("C1", ["t0", "t1"]), "C2": MS("C2", ["t0", "t1", "t2"])}
    got = RR.assign({"t0": 1, "t1": 2, "t2": 3}, members)
    assert got == {"C0": {"t0": [0]}, "C1": {"t1": [0]}, "C2": {"t1": [1], "t2": [0, 1, 2]}}


def test_roundrobin_static_members_and_missing_topics() -> None:
    members = {
        "x": MS("x", ["t", "gone"], group_instance_id="b"),
        "y": MS("y", ["t"], group_instance_id="a"),
        "z": MS("z", ["gone"]),
    }
    assert RR.assign({"t": 3}, members) == {"x": {"t": [1]}, "y": {"t": [0, 2]}, "z": {}}


@pytest.mark.parametrize("assignor", [RANGE, RR, CS], ids=lambda a: a.name)
def test_result_independent_of_input_order(assignor: Assignor) -> None:
    rnd = random.Random(5)
    counts = {f"t{i}": rnd.randint(1, 9) for i in range(4)}
    ids = [f"m{i}" for i in range(7)]
    base = {m: MS(m, rnd.sample(sorted(counts), 2), group_instance_id=(f"i{m}" if m < "m3" else None))
            for m in ids}
    expected = assignor.assign(counts, base)
    for _ in range(5):
        rnd.shuffle(ids)
        shuffled = {m: MS(m, list(reversed(list(base[m].topics))), group_instance_id=base[m].group_instance_id)
                    for m in ids}
        got = assignor.assign(dict(reversed(list(counts.items()))), shuffled)
        assert got == expected
        assert list(got) == ids  # members keep the caller's order


# -- cooperative-sticky: hand-checked scenarios -------------------------------------------------
def members_from(result: GroupAssignment, topics: list[str], generation: int) -> dict[str, MemberSubscription]:
    return {m: MS(m, topics, a, generation) for m, a in result.items()}


def test_sticky_initial_assignment_is_balanced_and_spread() -> None:
    got = CS.assign({"t0": 5, "t1": 5}, same(["t0", "t1"], "c", "a", "b"))
    assert got == {
        "a": {"t0": [0, 3], "t1": [1, 4]},
        "b": {"t0": [1, 4], "t1": [2]},
        "c": {"t0": [2], "t1": [0, 3]},
    }


def test_sticky_member_joins_moved_partitions_wait_one_round() -> None:
    topics = ["t"]
    round0 = {"a": {"t": [0, 1, 2]}, "b": {"t": [3, 4, 5]}}
    members = members_from(round0, topics, 4) | {"c": MS("c", topics)}
    round1 = CS.assign({"t": 6}, members)
    # Each old member gives one partition up; the newcomer gets nothing until they are revoked.
    assert round1 == {"a": {"t": [0, 1]}, "b": {"t": [3, 4]}, "c": {}}
    assert incremental_changes(round0["a"], round1["a"]) == ({"t": [2]}, {})
    assert cooperative_violations(members, round1) == []

    members = members_from(round1, topics, 5)
    round2 = CS.assign({"t": 6}, members)
    assert round2 == {"a": {"t": [0, 1]}, "b": {"t": [3, 4]}, "c": {"t": [2, 5]}}
    assert incremental_changes(round1["c"], round2["c"]) == ({}, {"t": [2, 5]})
    # Converged: another round changes nothing.
    assert CS.assign({"t": 6}, members_from(round2, topics, 6)) == round2


def test_sticky_join_gets_unowned_partitions_immediately() -> None:
    # The topic grew from 4 to 6 partitions as c joined: the two new ones are nobody's, so no waiting.
    members = {"a": MS("a", ["t"], {"t": [0, 1]}, 3), "b": MS("b", ["t"], {"t": [2, 3]}, 3), "c": MS("c", ["t"])}
    assert CS.assign({"t": 6}, members) == {"a": {"t": [0, 1]}, "b": {"t": [2, 3]}, "c": {"t": [4, 5]}}


def test_sticky_member_leaves_nothing_else_moves() -> None:
    topics = ["t0", "t1"]
    before = CS.assign({"t0": 6, "t1": 6}, same(topics, "a", "b", "c", "d"))
    assert sorted(loads(before).values()) == [3, 3, 3, 3]
    remaining = {m: MS(m, topics, before[m], 1) for m in ("a", "b", "d")}
    after = CS.assign({"t0": 6, "t1": 6}, remaining)
    assert sorted(loads(after).values()) == [4, 4, 4]
    for m in remaining:
        assert flat(before[m]) <= flat(after[m])  # kept everything it had
    assert set().union(*(flat(after[m]) - flat(before[m]) for m in remaining)) == flat(before["c"])


def test_sticky_generation_conflict_higher_generation_wins() -> None:
    members = {
        "a": MS("a", ["t"], {"t": [0, 1, 2]}, generation_id=3),   # stale claim on 0 and 1
        "b": MS("b", ["t"], {"t": [0, 1]}, generation_id=5),
        "c": MS("c", ["t"], {"t": [3]}, generation_id=5),
    }
    got = CS.assign({"t": 6}, members)
    assert got == {"a": {"t": [2, 4]}, "b": {"t": [0, 1]}, "c": {"t": [3, 5]}}
    assert cooperative_violations(members, got) == []


def test_sticky_generation_conflict_older_claim_cannot_take_it_back() -> None:
    # a's old (gen 2) claim on partition 0 loses to b's gen 3 claim; balance wants a partition moved to a,
    # but b's valid partitions cannot go to a directly while b owns them.
    members = {"a": MS("a", ["t"], {"t": [0]}, 2), "b": MS("b", ["t"], {"t": [0, 1]}, 3)}
    got = CS.assign({"t": 2}, members)
    assert got == {"a": {}, "b": {"t": [0]}}
    nxt = CS.assign({"t": 2}, {"a": MS("a", ["t"], {}, 4), "b": MS("b", ["t"], got["b"], 4)})
    assert nxt == {"a": {"t": [1]}, "b": {"t": [0]}}


def test_sticky_same_generation_conflict_is_withheld_from_everyone() -> None:
    members = {"a": MS("a", ["t"], {"t": [0]}, 5), "b": MS("b", ["t"], {"t": [0]}, 5), "c": MS("c", ["t"])}
    got = CS.assign({"t": 3}, members)
    assert flat(got["a"]) | flat(got["b"]) | flat(got["c"]) == {("t", 1), ("t", 2)}
    assert cooperative_violations(members, got) == []
    # Both claimants revoke it; the follow-up round hands it out.
    nxt = CS.assign({"t": 3}, {m: MS(m, ["t"], got[m], 6) for m in got})
    assert sorted(loads(nxt).values()) == [1, 1, 1]


def test_sticky_claims_on_unsubscribed_topics_block_new_owner_for_a_round() -> None:
    members = {"a": MS("a", ["u"], {"t": [0, 1]}, 2), "b": MS("b", ["t"], {}, 2)}
    got = CS.assign({"t": 2, "u": 1}, members)
    assert got == {"a": {"u": [0]}, "b": {}}
    nxt = CS.assign({"t": 2, "u": 1}, {"a": MS("a", ["u"], got["a"], 3), "b": MS("b", ["t"], {}, 3)})
    assert nxt == {"a": {"u": [0]}, "b": {"t": [0, 1]}}


def test_sticky_claims_on_deleted_topics_and_bad_partitions_are_ignored() -> None:
    members = {"a": MS("a", ["t"], {"t": [0, 7, -1], "gone": [0]}, 2), "b": MS("b", ["t"], {}, 2)}
    assert CS.assign({"t": 2}, members) == {"a": {"t": [0]}, "b": {"t": [1]}}


def test_sticky_general_subscriptions_need_a_chain_of_moves() -> None:
    # a ⊂ t0, b ⊂ t0+t1, c ⊂ t1. Loads 1/2/4 can only become the optimal 2/2/3 through a chain:
    # c passes a t1 partition to b, and b passes a t0 partition to a.
    counts = {"t0": 3, "t1": 4}
    topics = {"a": ["t0"], "b": ["t0", "t1"], "c": ["t1"]}
    owned = {"a": {"t0": [0]}, "b": {"t0": [1, 2]}, "c": {"t1": [0, 1, 2, 3]}}
    round1 = CS.assign(counts, {m: MS(m, topics[m], owned[m], 1) for m in topics})
    # Both moving partitions are only revoked this round.
    assert round1 == {"a": {"t0": [0]}, "b": {"t0": [1]}, "c": {"t1": [0, 1, 2]}}
    round2 = CS.assign(counts, {m: MS(m, topics[m], round1[m], 2) for m in topics})
    assert round2 == {"a": {"t0": [0, 2]}, "b": {"t0": [1], "t1": [3]}, "c": {"t1": [0, 1, 2]}}
    assert CS.assign(counts, {m: MS(m, topics[m], round2[m], 3) for m in topics}) == round2


def test_sticky_unavoidable_imbalance() -> None:
    # Only a subscribes to the big topic: it takes all of it, the others share the rest evenly.
    members = {"a": MS("a", ["big", "small"]), "b": MS("b", ["small"]), "c": MS("c", ["small"])}
    got = CS.assign({"big": 9, "small": 4}, members)
    assert loads(got) == {"a": 9, "b": 2, "c": 2}
    assert got["a"] == {"big": list(range(9))}


def test_incremental_changes() -> None:
    assert incremental_changes({"t": [0, 1, 2], "u": [0]}, [("t", 2), ("t", 3), ("v", 1)]) == (
        {"t": [0, 1], "u": [0]}, {"t": [3], "v": [1]})
    assert incremental_changes({}, {}) == ({}, {})


def test_cooperative_violations_detects_unsafe_assignment() -> None:
    members = {"a": MS("a", ["t"], {"t": [0, 1]}, 1), "b": MS("b", ["t"])}
    assert cooperative_violations(members, {"a": {"t": [0]}, "b": {"t": [1]}}) == [("t", 1, "b", "a")]
    assert cooperative_violations(members, {"a": {"t": [0]}, "b": {}}) == []


# -- cooperative-sticky: properties over many rounds -------------------------------------------
def cost_reducing_path_exists(subs: Mapping[str, set[str]], result: GroupAssignment) -> bool:
    """Brute force: can partitions be passed along subscribers from a member to one with ≥ 2 fewer?"""
    load = loads(result)
    held = {m: set(a) for m, a in result.items()}
    for src in result:
        seen, todo = {src}, [src]
        while todo:
            x = todo.pop()
            for y in result:
                if y not in seen and held[x] & subs[y]:
                    seen.add(y)
                    todo.append(y)
        if any(load[y] <= load[src] - 2 for y in seen):
            return True
    return False


class Group:
    """A simulated consumer group under the cooperative protocol."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.members: dict[str, list[str]] = {}
        self.owned: dict[str, dict[str, list[int]]] = {}
        self.generation = 0
        self.rounds = 0

    def rebalance(self) -> GroupAssignment:
        self.generation += 1
        self.rounds += 1
        subs = {m: MS(m, t, self.owned.get(m, {}), self.generation - 1 if m in self.owned else -1)
                for m, t in self.members.items()}
        result = CS.assign(self.counts, subs)
        assert list(result) == list(subs)
        pairs = [tp for a in result.values() for tp in flat(a)]
        assert len(pairs) == len(set(pairs)), "a partition went to two members in one round"
        assert cooperative_violations(subs, result) == []
        self.last_revoked = 0
        for m, a in result.items():
            revoked, _ = incremental_changes(self.owned.get(m, {}), a)
            self.last_revoked += len(flat(revoked))
            self.owned[m] = a
        return result

    def converge(self, limit: int = 4) -> GroupAssignment:
        for _ in range(limit):
            result = self.rebalance()
            if self.last_revoked == 0:
                return result
        raise AssertionError("no convergence")


def check_converged(group: Group, result: GroupAssignment) -> None:
    subs = {m: {t for t in ts if group.counts.get(t, 0) > 0} for m, ts in group.members.items()}
    wanted = {(t, p) for t, n in group.counts.items() if any(t in s for s in subs.values()) for p in range(n)}
    got = [tp for a in result.values() for tp in flat(a)]
    assert sorted(got) == sorted(wanted), "every subscribed partition assigned exactly once"
    assert not cost_reducing_path_exists(subs, result)
    for s in {frozenset(s) for s in subs.values()}:
        same_subs = [loads(result)[m] for m in subs if subs[m] == s]
        assert max(same_subs) - min(same_subs) <= 1
    # Stable: one more rebalance with nothing changed moves nothing.
    again = group.rebalance()
    assert again == result and group.last_revoked == 0


events = st.lists(
    st.tuples(st.sampled_from(["join", "leave", "resubscribe", "grow"]), st.integers(0, 2**16)),
    min_size=1, max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(events=events, n_topics=st.integers(1, 4), identical=st.booleans(), seed=st.integers(0, 2**16))
def test_sticky_many_random_rounds(events: list[tuple[str, int]], n_topics: int, identical: bool,
                                   seed: int) -> None:
    rnd = random.Random(seed)
    topics = [f"t{i}" for i in range(n_topics)]
    group = Group({t: rnd.randint(0, 10) for t in topics})

    def pick(r: random.Random) -> list[str]:
        return topics if identical else r.sample(topics, r.randint(1, n_topics)) + ["ghost"] * r.randint(0, 1)

    for kind, arg in events:
        r = random.Random(arg)
        if kind == "join" or not group.members:
            group.members[f"m{arg % 12}"] = pick(r)
        elif kind == "leave" and len(group.members) > 1:
            gone = r.choice(sorted(group.members))
            del group.members[gone], group.owned[gone]
        elif kind == "resubscribe" and not identical:
            group.members[r.choice(sorted(group.members))] = pick(r)
        elif kind == "grow":
            group.counts[r.choice(topics)] += r.randint(1, 3)
        before = {m: flat(group.owned.get(m, {})) for m in group.members}
        first = group.rebalance()
        if identical:
            # Sticky: only as many owned partitions move as the quotas force.
            n = len(group.members)
            total = sum(group.counts.values())
            quota, extra = divmod(total, n)
            owned = sorted((len(before[m]) for m in group.members), reverse=True)
            minimum = sum(max(0, o - quota) for o in owned) - sum(1 for o in owned[:extra] if o > quota)
            assert group.last_revoked == minimum
        for m in group.members:
            # Nobody gains a partition that another member owned before this round.
            others = set().union(*(before[o] for o in group.members if o != m))
            assert not (flat(first[m]) - before[m]) & others
        result = first if group.last_revoked == 0 else group.converge(limit=3)
        check_converged(group, result)


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    subs=st.lists(st.sets(st.integers(0, 2), min_size=1), min_size=1, max_size=4),
)
def test_sticky_general_case_matches_brute_force_optimum(counts: list[int], subs: list[set[int]]) -> None:
    topics = {f"t{i}": n for i, n in enumerate(counts)}
    members = {f"m{i}": MS(f"m{i}", [f"t{j}" for j in s]) for i, s in enumerate(subs)}
    result = CS.assign(topics, members)
    partitions = [(t, p) for t, n in topics.items() for p in range(n)
                  if any(t in m.topics for m in members.values())]
    best: tuple[int, ...] | None = None
    for choice in itertools.product(*[[m for m in members if t in members[m].topics] for t, _ in partitions]):
        counts_per = sorted((choice.count(m) for m in members), reverse=True)
        if best is None or tuple(counts_per) < best:
            best = tuple(counts_per)
    assert tuple(sorted(loads(result).values(), reverse=True)) == (best or tuple(0 for _ in members))


# -- cost (operation counts, not wall-clock: timings live in bench/) --------------------------------
class _Work:
    """Operation counts of one sticky run: partitions handed out, moves, and breadth-first-search work (every
    read of a topic's subscriber list, weighted by its length: the edges the path search walks)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gives = self.moves = self.edges = 0
        work = self

        class Subscribers(dict):  # type: ignore[type-arg]
            def __getitem__(self, topic: str) -> list[int]:
                found: list[int] = dict.__getitem__(self, topic)
                work.edges += len(found)
                return found

        init, give, move = _StickyPlan.__init__, _StickyPlan._give, _StickyPlan._move

        def counted_init(plan: _StickyPlan, *args: object, **kwargs: object) -> None:
            init(plan, *args, **kwargs)  # type: ignore[arg-type]
            plan.subscribers = Subscribers(plan.subscribers)

        def counted_give(plan: _StickyPlan, *args: object) -> None:
            work.gives += 1
            give(plan, *args)  # type: ignore[arg-type]

        def counted_move(plan: _StickyPlan, *args: object) -> None:
            work.moves += 1
            move(plan, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(_StickyPlan, "__init__", counted_init)
        monkeypatch.setattr(_StickyPlan, "_give", counted_give)
        monkeypatch.setattr(_StickyPlan, "_move", counted_move)

    def reset(self) -> None:
        self.gives = self.moves = self.edges = 0


def _each_partition_once(result: GroupAssignment, counts: Mapping[str, int], topics: set[str],
                         complete: bool = True) -> None:
    """No partition goes to two members; with ``complete``, every partition of ``topics`` goes to one (a
    cooperative assignment leaves out, for this round, the partitions taken from their old owner)."""
    got = sorted((t, p) for a in result.values() for t, ps in a.items() for p in ps)
    assert len(got) == len(set(got))
    want = sorted((t, p) for t in topics for p in range(counts[t]))
    assert got == want if complete else set(got) <= set(want)


@pytest.mark.parametrize("identical", [True, False], ids=["same-subscriptions", "mixed-subscriptions"])
def test_sticky_1000_partitions_100_members_stays_within_its_operation_budget(
        identical: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(42)
    counts = {f"t{i}": 20 for i in range(50)}
    topics = sorted(counts)

    def subs() -> list[str]:
        return topics if identical else rnd.sample(topics, 25)

    members = {f"m{i:03d}": MS(f"m{i:03d}", subs()) for i in range(100)}
    scenarios: list[dict[str, MemberSubscription]] = [members]
    first = CS.assign(counts, members)
    # Steady state plus a newcomer, one member owning everything, and half the group gone.
    steady = {m: MS(m, members[m].topics, first[m], 1) for m in members}
    scenarios.append(steady | {"new": MS("new", subs())})
    scenarios.append(members | {"m000": MS("m000", topics, {t: list(range(20)) for t in topics}, 1)})
    scenarios.append({m: steady[m] for m in list(steady)[:50]})
    work = _Work(monkeypatch)
    for scenario in scenarios:
        work.reset()
        result = CS.assign(counts, scenario)
        assert set(result) == set(scenario)
        subscribed = {t for ms in scenario.values() for t in ms.topics}
        _each_partition_once(result, counts, subscribed, complete=False)
        n_partitions = sum(counts[t] for t in subscribed)
        # each partition is handed out once, plus once per move; no partition moves more than once on
        # average (measured: at most 999 moves for 1,000 partitions, when one member owned everything)
        assert work.gives == n_partitions + work.moves
        assert work.moves <= n_partitions, work.moves
        if identical:
            assert work.edges == 0  # quotas, no path search
        else:
            # the pruned path search stays within partitions * members edge visits (measured ≤ 67,100 of
            # 100,000 here; ≤ 236,255 of 400,000 at twice the partitions and members: it grows as P·M)
            assert work.edges <= n_partitions * len(scenario), work.edges
    for assignor in (RANGE, RR):
        _each_partition_once(assignor.assign(counts, members), counts,
                             {t for ms in members.values() for t in ms.topics})
