"""Scale-out / scale-in with durable instances: which held instances move (service/durable/moves.py, sans-io)
and how one is handed off between requests (Gateway.move_instance / Gateway.serving), without sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from service.durable.descriptors import InstanceDescriptor
from service.durable.moves import AliveSince, Move, PeerState, instances_to_move
from service.instances.registry import ConsumerInstance, Gateway, InstanceOptions, TenantRuntime
from service.metrics import GatewayCollector
from service.ring import owner, routing_key

AB, ABC = ["a", "b"], ["a", "b", "c"]


def names(group: str, want_abc: str, want_ab: str, n: int, prefix: str = "i") -> list[str]:
    """``n`` names whose owner is ``want_abc`` on {a, b, c} and ``want_ab`` on {a, b}."""
    out = []
    for i in range(100_000):
        name = f"{prefix}{i}"
        if owner(ABC, routing_key(group, name)) == want_abc and owner(AB, routing_key(group, name)) == want_ab:
            out.append(name)
            if len(out) == n:
                return out
    raise AssertionError("no such names")


# -- which instances move ----------------------------------------------------------------------------------
def test_scale_out_moves_only_the_instances_the_new_replica_owns() -> None:
    to_c = names("g", "c", "a", 3, "x")
    stay = names("g", "a", "a", 3, "y")
    held = [("t", "g", n) for n in to_c + stay]
    since = {"b": 0.0, "c": 100.0}
    assert instances_to_move(held, "a", ABC, since, now=110.0, settle_s=10.0) == sorted(
        Move("t", "g", n, "c") for n in to_c)
    # the same ring seen from b, which holds none of them: nothing to do
    assert instances_to_move([], "b", ABC, since, now=110.0, settle_s=10.0) == []
    # before the scale-out (c not in the ring) nothing moves
    assert instances_to_move(held, "a", AB, since, now=110.0, settle_s=10.0) == []


def test_a_new_owner_that_has_not_settled_gets_nothing_yet() -> None:
    to_c = names("g", "c", "a", 2)
    held = [("t", "g", n) for n in to_c]
    since = {"b": 0.0, "c": 100.0}
    assert instances_to_move(held, "a", ABC, since, now=109.9, settle_s=10.0) == []
    # nor to the second best (b) meanwhile: an instance moves once, to its owner
    assert instances_to_move(held, "a", ABC, since, now=110.0, settle_s=10.0) == [Move("t", "g", n, "c")
                                                                                  for n in sorted(to_c)]
    # an owner the tracker has never seen up (the table says alive, no probe yet) is not a target either
    assert instances_to_move(held, "a", ABC, {"b": 0.0}, now=1000.0, settle_s=10.0) == []
    # settle_s = 0: at once
    assert len(instances_to_move(held, "a", ABC, since, now=100.0, settle_s=0.0)) == 2


def test_scale_in_and_draining() -> None:
    # a held c's instance after c left (re-created here); c is back: it moves back once c settled
    back = names("g", "c", "a", 1)
    held = [("t", "g", back[0])]
    assert instances_to_move(held, "a", ABC, {"b": 0.0, "c": 50.0}, now=70.0, settle_s=10.0) == [
        Move("t", "g", back[0], "c")]
    # this replica drains (not in the placement): the shutdown hands everything off, no move
    assert instances_to_move(held, "a", ["b", "c"], {"b": 0.0, "c": 0.0}, now=70.0, settle_s=10.0) == []
    # instances of several tenants and groups, each by its own key (tenant-independent)
    many = [("t1", "g", back[0]), ("t2", "g", back[0]), ("t1", "h", back[0])]
    got = instances_to_move(many, "a", ABC, {"b": 0.0, "c": 0.0}, now=70.0, settle_s=10.0)
    assert [m.tenant for m in got if m.group == "g"] == ["t1", "t2"]
    assert all(m.target == owner(ABC, routing_key(m.group, m.name)) for m in got)


def test_alive_since_restarts_for_a_flapping_or_restarted_peer() -> None:
    seen = AliveSince()
    seen.observe([PeerState("b", True, boot="b1"), PeerState("c", True, boot="c1")], now=0.0)
    seen.observe([PeerState("b", True, boot="b1"), PeerState("c", True, boot="c1")], now=5.0)
    assert seen.since() == {"b": 0.0, "c": 0.0}
    seen.observe([PeerState("b", True, boot="b1"), PeerState("c", False, boot="c1")], now=6.0)  # c down
    assert seen.since() == {"b": 0.0}
    seen.observe([PeerState("b", True, boot="b1"), PeerState("c", True, boot="c1")], now=7.0)  # c up again
    assert seen.since() == {"b": 0.0, "c": 7.0}
    seen.observe([PeerState("b", True, boot="b2"), PeerState("c", True, boot="c1")], now=8.0)  # b restarted
    assert seen.since() == {"b": 8.0, "c": 7.0}
    seen.observe([PeerState("b", True, draining=True, boot="b2")], now=9.0)  # b drains, c is gone
    assert seen.since() == {}
    # a flapping peer never settles, so the instances it owns never move back and forth
    to_c = names("g", "c", "a", 1)
    flaps = AliveSince()
    for t in range(0, 60, 4):
        flaps.observe([PeerState("b", True, boot="b"), PeerState("c", True, boot="c")], now=float(t))
        assert instances_to_move([("t", "g", to_c[0])], "a", ABC, flaps.since(), now=t + 2.0, settle_s=10.0) == []
        flaps.observe([PeerState("b", True, boot="b"), PeerState("c", False, boot="c")], now=t + 2.0)


# -- the hand-off: between requests, never a request that finds nothing --------------------------------------
class FakeStore:
    """The descriptor store of a tenant, in memory (service/durable/store.py's interface used by the gateway)."""

    def __init__(self, fail: bool = False) -> None:
        self.table: dict[tuple[str, str, str], InstanceDescriptor] = {}
        self.fail = fail
        self.lag = 0
        self.caught_up = True

    async def put(self, desc: InstanceDescriptor) -> None:
        if self.fail:
            raise OSError("broker down")
        self.table[(desc.tenant, desc.group, desc.name)] = desc

    async def tombstone(self, tenant: str, group: str, name: str) -> None:
        self.table.pop((tenant, group, name), None)

    def get(self, tenant: str, group: str, name: str) -> InstanceDescriptor | None:
        return self.table.get((tenant, group, name))

    async def wait_caught_up(self, timeout: float) -> bool:
        return True

    async def stop(self) -> None:
        return None


async def durable(store: FakeStore | None = None, **kw: Any) -> tuple[Gateway, TenantRuntime, ConsumerInstance]:
    gw = Gateway(replica_id="a", durable_instances=True, descriptor_timeout=0.5, **kw)
    rt = gw.tenant("t", bootstrap="127.0.0.1:1")
    rt.descriptors = store or FakeStore()
    inst = await gw.create_instance(rt, "g", InstanceOptions(), "c1")
    return gw, rt, inst


async def test_an_idle_instance_is_handed_off_and_counted() -> None:
    gw, rt, inst = await durable()
    assert rt.descriptors.get("t", "g", "c1") is not None
    assert await gw.move_instance("t", "g", "c1", "c")
    assert not gw.holds("g", "c1") and ("g", "c1") not in rt.instances and inst.closed
    assert (gw.handed_off_total, gw.moved_total) == (1, 1)
    assert rt.descriptors.get("t", "g", "c1") is not None  # kept: the new owner re-creates it from it
    assert not await gw.move_instance("t", "g", "c1", "c")  # gone: nothing to do
    await gw.close()
    assert gw.moved_total == 1


async def test_a_request_in_progress_finishes_first_and_new_ones_wait_then_find_it_gone() -> None:
    gw, _rt, inst = await durable()
    inside = asyncio.Event()
    finish = asyncio.Event()
    seen: list[str] = []

    async def request_in_progress() -> None:
        async with gw.serving("g", "c1"):
            assert gw.holds("g", "c1")
            inside.set()
            await finish.wait()
            seen.append("first done, instance open" if not inst.closed else "closed under a request")

    first = asyncio.create_task(request_in_progress())
    await inside.wait()
    move = asyncio.create_task(gw.move_instance("t", "g", "c1", "c"))
    await asyncio.sleep(0)  # the move starts and waits for the request
    assert not move.done() and gw.holds("g", "c1")  # held (a lookup answers held: the forwarder waits here)

    async def request_during_the_move() -> None:
        async with gw.serving("g", "c1"):
            seen.append("second sees " + ("held" if gw.holds("g", "c1") else "gone"))

    second = asyncio.create_task(request_during_the_move())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not second.done() and not inst.closed
    finish.set()
    assert await move
    await asyncio.gather(first, second)
    assert seen == ["first done, instance open", "second sees gone"]
    assert gw.moved_total == 1
    await gw.close()


async def test_an_open_stream_ends_before_its_next_poll() -> None:
    gw, _rt, inst = await durable()
    polls = 0
    started = asyncio.Event()

    async def stream() -> str:
        nonlocal polls
        async with gw.serving("g", "c1"):
            epoch = inst.stream_epoch
            while not inst.closed:
                async with inst.lock:
                    if inst.stream_epoch != epoch:  # as api/v2/streams.py's stream_records
                        return f"ended at a record boundary after {polls} polls"
                    polls += 1
                    started.set()
                    await asyncio.sleep(0.01)  # a poll
                await asyncio.sleep(0)  # writes its chunk
            return "closed under the stream"

    task = asyncio.create_task(stream())
    await started.wait()
    assert await gw.move_instance("t", "g", "c1", "c", wait=5.0)
    assert (await task).startswith("ended at a record boundary")
    assert inst.closed and gw.moved_total == 1
    await gw.close()


async def test_it_stays_when_its_requests_do_not_end_or_its_descriptor_cannot_be_written() -> None:
    gw, _rt, inst = await durable()
    hold = asyncio.Event()

    async def slow_reader() -> None:  # a stream stuck writing to a client that does not read
        async with gw.serving("g", "c1"):
            await hold.wait()

    task = asyncio.create_task(slow_reader())
    await asyncio.sleep(0)
    assert not await gw.move_instance("t", "g", "c1", "c", wait=0.2)
    assert gw.holds("g", "c1") and not inst.closed and gw.moved_total == 0
    async with gw.serving("g", "c1"):  # the gate is open again
        pass
    hold.set()
    await task
    # the descriptor is stale (a subscription change whose write failed) and cannot be rewritten
    store = FakeStore()
    gw2, _rt2, inst2 = await durable(store)
    store.fail = True
    inst2.subscription = {"topics": ["t1"]}
    assert not await gw2.move_instance("t", "g", "c1", "c")
    assert gw2.holds("g", "c1") and gw2.descriptor_failures == 1
    store.fail = False  # written again on the next try, then moved
    assert await gw2.move_instance("t", "g", "c1", "c")
    assert store.get("t", "g", "c1").subscription == {"topics": ["t1"]}  # type: ignore[union-attr]
    # draining: the shutdown hands it off, not a move
    gw.start_draining()
    assert not await gw.move_instance("t", "g", "c1", "c")
    await gw.close()
    await gw2.close()
    assert (gw.handed_off_total, gw.moved_total) == (1, 0)


async def test_not_durable_nothing_moves() -> None:
    gw = Gateway(replica_id="a")
    rt = gw.tenant("t", bootstrap="127.0.0.1:1")
    await gw.create_instance(rt, "g", InstanceOptions(), "c1")
    assert not await gw.move_instance("t", "g", "c1", "c")
    assert gw.holds("g", "c1")
    await gw.close()


@pytest.mark.parametrize("reason", ["moved", "shutdown"])
async def test_the_metric_has_a_reason(reason: str) -> None:
    gw, _rt, _inst = await durable()
    registry = CollectorRegistry()
    registry.register(GatewayCollector(gw))
    if reason == "moved":
        assert await gw.move_instance("t", "g", "c1", "c")
    else:
        await gw.close()
    text = generate_latest(registry).decode()
    assert f'kcg_instances_handed_off_total{{reason="{reason}"}} 1.0' in text
    other = "shutdown" if reason == "moved" else "moved"
    assert f'kcg_instances_handed_off_total{{reason="{other}"}} 0.0' in text
    await gw.close()


# -- the routing layer's part: after each peer refresh (api/replicas/moves.py) -------------------------------
async def test_the_router_moves_what_a_settled_new_replica_owns() -> None:
    from prometheus_client import CollectorRegistry as Registry

    from api.replicas.router import Router
    from service.ring import Identity
    from service.settings import Settings

    settings = Settings(replica_id="a", peers="http://127.0.0.1:1", peer_token="s3cret",
                        kafka_bootstrap="127.0.0.1:1", durable_instances=True, instance_move_after_s=10.0)
    gw, rt, _ = await durable()
    router = Router(settings, gw, Registry())
    await gw.delete_instance(rt, "g", "c1")
    to_c, stay = names("g", "c", "a", 1, "x")[0], names("g", "a", "a", 1, "y")[0]
    for n in (to_c, stay):
        await gw.create_instance(rt, "g", InstanceOptions(), n)
    router.table.record_probe("http://b", Identity("b", "b1"), now=0.0)
    assert router.check_moves(now=0.0) == []  # c is not up: the owners did not change
    router.table.record_probe("http://c", Identity("c", "c1"), now=100.0)
    assert router.check_moves(now=100.0) == []  # c just came up: not settled yet
    assert router.check_moves(now=109.0) == []
    router.table.record_probe("http://c", Identity("c", "c2"), now=109.5)  # c restarted: starts over
    assert router.check_moves(now=115.0) == []
    assert router.check_moves(now=124.0) == []  # seen restarted at 115
    assert router.check_moves(now=125.0) == [Move("t", "g", to_c, "c")]
    assert router._move_task is not None
    await router._move_task
    assert not gw.holds("g", to_c) and gw.holds("g", stay) and gw.moved_total == 1
    assert router.check_moves(now=130.0) == []  # nothing left to move
    settings.move_instances = False
    router.table.peers["c"].alive = False
    router.check_moves(now=131.0)
    router.table.peers["c"].alive = True
    assert router.check_moves(now=200.0) == []  # switched off
    await router.stop_moves()
    await gw.close()
