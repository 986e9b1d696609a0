"""Gateway.close() against the protocol-level test broker: a clean shutdown leaves every group, and a
broker that stops answering cannot hold the shutdown past GATEWAY_SHUTDOWN_TIMEOUT_S."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator

import pytest

from service.instances.registry import HARD_CLOSE_GRACE_S, ConsumerInstance, Gateway, InstanceOptions
from service.protocol.messages import ApiKey
from tests.fakes.broker import TestCluster, default_registry
from tests.fakes.broker.group_coordinator import group_coordinator

GROUPS = 4
PER_GROUP = 5
PARTITIONS = 8
FAST = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 100, "fetch_max_wait_ms": 50,
        "retry_backoff_ms": 20}


@contextlib.asynccontextmanager
async def gateway_with_instances(cluster: TestCluster, shutdown_timeout: float
                                 ) -> AsyncIterator[tuple[Gateway, list[ConsumerInstance]]]:
    """GROUPS groups of PER_GROUP auto-committing instances, each holding partitions and having consumed
    records (so a clean close commits, then leaves)."""
    group_coordinator(cluster).group_join_delay_ms = 0
    for p in range(PARTITIONS):
        cluster.append("t", p, [b"%d-%d" % (p, i) for i in range(3)])
    gw = Gateway(shutdown_timeout=shutdown_timeout, consumer_defaults=FAST)
    try:
        rt = gw.tenant("default", bootstrap=cluster.bootstrap_servers)
        opts = InstanceOptions(auto_offset_reset="earliest", auto_commit=True)
        insts = [await gw.create_instance(rt, f"g{g}", opts, f"c{i}") for g in range(GROUPS)
                 for i in range(PER_GROUP)]
        for inst in insts:
            await inst.consumer.subscribe(["t"])
        await asyncio.gather(*(consumed(inst) for inst in insts))
        yield gw, insts
    finally:
        await asyncio.wait_for(gw.close(), shutdown_timeout + 10)  # idempotent; never hang the suite


async def consumed(inst: ConsumerInstance) -> None:
    deadline = time.monotonic() + 15
    while True:
        c = inst.consumer
        stable = await c.wait_for_assignment(max(0.0, deadline - time.monotonic()))
        if stable and c.assignment():
            # this member's records, then a second poll once no rebalance is pending
            if await c.poll_batches(timeout=max(0.0, deadline - time.monotonic())):
                return
        assert time.monotonic() < deadline, f"{inst.instance_id} consumed nothing"


def members(cluster: TestCluster) -> int:
    gc = group_coordinator(cluster)
    return sum(len(gc.group(f"g{g}").members) for g in range(GROUPS))


def stop_answering(cluster: TestCluster) -> None:
    """The broker keeps its connections open and reads requests but never answers any."""
    for name, key in vars(ApiKey).items():
        if name.isupper():
            cluster.delay(key, math.inf, count=1_000_000)


async def test_clean_close_commits_and_leaves_every_group(caplog: pytest.LogCaptureFixture) -> None:
    async with TestCluster(1, topics={"t": PARTITIONS}, registry=default_registry(groups=True)) as cluster:
        async with gateway_with_instances(cluster, shutdown_timeout=10.0) as (gw, insts):
            assert members(cluster) == GROUPS * PER_GROUP
            mark = cluster.log.mark()
            with caplog.at_level(logging.WARNING, logger="service.instances.registry"):
                assert await gw.close() == 0
            assert not [r for r in caplog.records if r.name == "service.instances.registry"]
            assert gw.instance_count == 0 and all(i.closed for i in insts)
            assert len(cluster.requests(ApiKey.LEAVE_GROUP, since=mark)) == GROUPS * PER_GROUP
            assert members(cluster) == 0  # every group is empty: nobody waits for a session to expire
            assert cluster.requests(ApiKey.OFFSET_COMMIT, since=mark)  # the final auto-commits


async def test_close_returns_within_the_deadline_when_the_broker_stops_answering(
        caplog: pytest.LogCaptureFixture) -> None:
    timeout = 1.0
    n = GROUPS * PER_GROUP
    async with TestCluster(1, topics={"t": PARTITIONS}, registry=default_registry(groups=True)) as cluster:
        async with gateway_with_instances(cluster, shutdown_timeout=timeout) as (gw, insts):
            stop_answering(cluster)
            mark = cluster.log.mark()
            # the instances' own traffic (heartbeats, fetches) is already hanging before shutdown starts
            await cluster.wait_for_requests(ApiKey.HEARTBEAT, since=mark)
            started = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="service.instances.registry"):
                unclean = await asyncio.wait_for(gw.close(), timeout + 15)
            elapsed = time.monotonic() - started
            assert elapsed < timeout + HARD_CLOSE_GRACE_S, elapsed
            assert elapsed >= timeout * 0.9  # it did try to close cleanly until the deadline
            assert unclean == n
            warnings = [r.getMessage() for r in caplog.records if r.name == "service.instances.registry"]
            # one warning with the count; none about shutdown tasks surviving the hard close
            assert len(warnings) == 1, warnings
            assert warnings[0].startswith(f"{n} of {n} consumer instances did not close cleanly within the "
                                          f"{timeout:.1f} s shutdown timeout"), warnings
            assert gw.instance_count == 0 and all(i.closed for i in insts)
            assert all(e.outcome != "answered" for e in cluster.requests(since=mark))  # it really answered none
