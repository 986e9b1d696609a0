"""A stable member's heartbeats go over the coordinator's dedicated heartbeat connection, batched per tick
(service/group/heartbeats.py), against the protocol-level test broker."""

from __future__ import annotations

import asyncio

from service.group.coordinator import HEARTBEAT_TICK_S
from service.group.heartbeats import heartbeat_wheel
from service.protocol.messages import ApiKey
from tests.integration.test_coordinator_vs_test_broker import (
    TP,
    answered_ok,
    count_task_sends,
    group_cluster,
    group_consumer,
    member_of,
    since,
    subscribed,
)


async def test_heartbeats_go_over_a_connection_of_their_own_and_commits_do_not() -> None:
    async with group_cluster(topics={"t": 1}) as cluster, group_consumer(cluster) as c:
        await subscribed(c)
        coord = c.coordinator
        assert coord is not None
        mid, gen = member_of(c)
        await cluster.wait_for_requests(ApiKey.HEARTBEAT, where=answered_ok)  # the task's own, after the join
        task_sends = count_task_sends(c)
        mark = cluster.log.mark()
        beats = await cluster.wait_for_requests(ApiKey.HEARTBEAT, since=mark, count=6, where=answered_ok)
        assert task_sends == [] and {(e.request.member_id, e.request.generation_id) for e in beats} == {(mid, gen)}
        hb_conn = coord.client.heartbeat_connection(0).current
        main_conn = coord.client.connection(0).current
        assert hb_conn is not None and main_conn is not None and hb_conn is not main_conn
        assert len({e.connection_id for e in beats}) == 1  # all on the dedicated connection
        # a commit meanwhile goes over the main connection, answered at once (not read once per tick)
        mark = cluster.log.mark()
        await c.commit({TP("t", 0): 0})
        commits = since(cluster, ApiKey.OFFSET_COMMIT, mark)
        assert len(commits) == 1 and commits[0].connection_id != beats[0].connection_id
        wheel = heartbeat_wheel(asyncio.get_running_loop(), HEARTBEAT_TICK_S)
        assert wheel.sent >= 6 and wheel.batches >= 1 and coord.heartbeats >= 6  # the last answer may be unread


async def test_a_dropped_heartbeat_connection_keeps_the_membership() -> None:
    async with group_cluster(topics={"t": 1}) as cluster, group_consumer(cluster) as c:
        await subscribed(c)
        mid, gen = member_of(c)
        await cluster.wait_for_requests(ApiKey.HEARTBEAT, count=3, where=answered_ok)
        mark = cluster.log.mark()
        cluster.drop_connection(ApiKey.HEARTBEAT, node_id=0)
        beats = await cluster.wait_for_requests(ApiKey.HEARTBEAT, since=mark, count=4, where=answered_ok)
        assert since(cluster, ApiKey.HEARTBEAT, mark)[0].outcome == "dropped"
        assert len({e.connection_id for e in beats[-2:]}) == 1  # a new heartbeat connection carries them again
        assert since(cluster, ApiKey.JOIN_GROUP, mark) == [] and member_of(c) == (mid, gen)
        assert c.assignment() == [TP("t", 0)]
