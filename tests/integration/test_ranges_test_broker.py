"""Offset-range reads against the protocol-level test broker, which (unlike Tansu) has an aborted-transaction
index: interleaved aborted and committed transactions read page by page with transactions spanning pages,
through service.fetch.ranges and through a real gateway process (JSON and Arrow)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pyarrow as pa
import pytest

from service.client.client import KafkaClient
from service.consumer.subscription import TopicPartition
from service.fetch.oneshot import probe_fetch
from service.fetch.ranges import OffsetOutOfRange, RangeSessions, range_sessions, read_page
from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED
from service.fetch.session import ZERO_UUID
from service.protocol import error_codes as EC
from service.protocol.messages import ApiKey
from tests.fakes.broker import TestCluster
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_consumer_vs_test_broker import (
    COMMITTED,
    EVERYTHING,
    write_interleaved_transactions,
)

pytestmark = pytest.mark.integration
TP = TopicPartition("t", 0)


async def read_loop(client: KafkaClient, isolation: int, max_bytes: int, end: int | None = None
                    ) -> tuple[list[bytes | None], list[tuple[int, int, int]]]:
    pos, values, pages = 0, [], []
    while True:
        page = await read_page(client, TP, pos, end, isolation_level=isolation, max_bytes=max_bytes)
        values += [r.value for r in page.records]
        pages.append((pos, page.next_offset, len(page.records)))
        assert page.next_offset > pos or page.done
        pos = page.next_offset
        if page.done:
            return values, pages


@pytest.mark.parametrize("max_bytes", [1, 200, 1 << 20])
async def test_aborted_transactions_are_left_out_page_by_page(max_bytes: int) -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        write_interleaved_transactions(cluster)
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            values, pages = await read_loop(client, READ_COMMITTED, max_bytes)
            assert values == COMMITTED
            assert pages[-1][1] == 18  # past the trailing COMMIT marker
            if max_bytes == 1:  # transaction A (0-7) is read over several fetches
                fetches = cluster.requests(ApiKey.FETCH)
                assert len([e for e in fetches if e.request.topics[0].partitions[0].fetch_offset <= 7]) >= 3
            values, _ = await read_loop(client, READ_UNCOMMITTED, max_bytes)
            assert values == EVERYTHING
            # an end inside transaction C (14-15): cut there, next_offset = end
            values, pages = await read_loop(client, READ_COMMITTED, max_bytes, end=15)
            assert values == [b"n0", b"y0", b"y1", b"c0"] and pages[-1][1] == 15
        finally:
            await client.close()


async def test_open_transaction_bounds_reads_at_the_lso() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        cluster.append("t", 0, [b"before"])
        cluster.append_txn("t", 0, [b"open"], producer_id=7)  # 1: the LSO stays at 1
        cluster.append("t", 0, [b"after"])  # 2
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            page = await read_page(client, TP, 0, 3)
            assert [r.value for r in page.records] == [b"before"] and page.next_offset == page.end_offset == 1
            page = await read_page(client, TP, 1, 3)  # at the LSO: nothing, and done
            assert page.records == [] and page.done and page.last_stable_offset == 1
            cluster.end_txn("t", 0, 7, commit=False)  # 3
            values, _ = await read_loop(client, READ_COMMITTED, 1 << 20)
            assert values == [b"before", b"after"]
        finally:
            await client.close()


async def test_http_json_and_arrow_against_the_test_broker() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        write_interleaved_transactions(cluster)
        gw = GatewayProcess(cluster.bootstrap_servers)
        await asyncio.to_thread(gw.start)  # the broker runs on this loop: never block it
        try:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                pos, values, n = 0, [], 0
                while True:
                    r = await http.get("/topics/t/partitions/0/records", params={"offset": pos, "max_bytes": 1})
                    assert r.status_code == 200, r.text
                    body = r.json()
                    values += [r["value"] for r in body["records"]]
                    pos, n = body["next_offset"], n + 1
                    if pos >= body["end_offset"]:
                        break
                assert [base64.b64decode(v) for v in values] == COMMITTED and pos == 18 and n > 3
                tables, pos = [], 0
                while True:
                    r = await http.get("/topics/t/partitions/0/records", params={"offset": pos, "max_bytes": 100},
                                       headers={"Accept": "application/vnd.apache.arrow.stream"})
                    reader = pa.ipc.open_stream(r.content)
                    tables.append(reader.read_all())
                    pos = int(r.headers["X-Next-Offset"])
                    if pos >= int(reader.schema.metadata[b"end_offset"]):
                        break
                assert pa.concat_tables(tables).column("value").to_pylist() == COMMITTED
        finally:
            await asyncio.to_thread(gw.stop)


def fetch_versions(cluster: TestCluster, since: int = 0) -> list[int]:
    return [e.api_version for e in cluster.requests(ApiKey.FETCH, since=since)]


async def test_topic_without_id_in_metadata_is_read_with_fetch_v12_by_name() -> None:
    """A broker whose metadata has no topic ids (Metadata capped at v9: the client knows the all-zero id) but
    Fetch up to v17: the probe (partition offsets) and the range reads fetch at v12 by name, as the main
    fetcher does, not at v13+ by a zero id."""
    async with TestCluster(topics={"t": 1}, api_versions={ApiKey.METADATA: (0, 9)}) as cluster:
        cluster.append("t", 0, [b"n0", b"n1"])
        cluster.append_txn("t", 0, [b"open"], producer_id=9)  # the LSO stays at 2
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            node = await client.leader_id("t", 0)
            assert client.metadata.topic_id("t") == ZERO_UUID
            parts = await probe_fetch(client, node, {TP: 0}, max_bytes=1, isolation=READ_COMMITTED)
            assert parts[TP].error_code == 0 and parts[TP].last_stable_offset == 2 and parts[TP].high_watermark == 3
            values, _ = await read_loop(client, READ_COMMITTED, 1 << 20)
            assert values == [b"n0", b"n1"]
            assert set(fetch_versions(cluster)) == {12}
        finally:
            await client.close()


async def test_zero_topic_ids_in_v13_answers_fall_back_to_fetch_v12() -> None:
    """A broker that answers v13+ Fetches with zero topic ids (the ids in its metadata are fine): the first
    probe is asked again by name at v12, and later probes and range reads of the same client start at v12."""
    async with TestCluster(topics={"t": 1}) as cluster:
        cluster.fetch_zero_topic_ids = True
        cluster.append("t", 0, [b"n0", b"n1", b"n2"])
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            node = await client.leader_id("t", 0)
            assert client.metadata.topic_id("t") != ZERO_UUID
            parts = await probe_fetch(client, node, {TP: 1}, max_bytes=1, isolation=READ_COMMITTED)
            assert parts[TP].error_code == 0 and parts[TP].high_watermark == 3
            assert fetch_versions(cluster) == [17, 12]
            seq = cluster.requests(ApiKey.FETCH)[-1].seq
            values, _ = await read_loop(client, READ_COMMITTED, 1)
            assert values == [b"n0", b"n1", b"n2"]
            assert set(fetch_versions(cluster, since=seq + 1)) == {12}
        finally:
            await client.close()


async def test_sequential_pages_go_through_one_incremental_fetch_session() -> None:
    """A reader's pages share one KIP-227 session: one full request, then incremental ones; an answer that
    leaves the partition out (at the end, nothing new) still gives the page its end; a session the broker
    evicted mid-read is replaced by a full request and the read stays exact; concurrent readers of one
    partition use sessions of their own."""
    async with TestCluster(topics={"t": 1}) as cluster:
        write_interleaved_transactions(cluster)
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            values, pages = await read_loop(client, READ_COMMITTED, 1)
            assert values == COMMITTED and len(pages) > 5
            st = cluster.fetch_session_stats()
            assert st.created == 1 and st.full == 1 and st.incremental >= len(pages) - 1 and st.sessionless == 0
            assert len(range_sessions(client)) == 1

            # at the end nothing is new: the incremental answer leaves the partition out
            page = await read_page(client, TP, 18, None)
            assert page.records == [] and page.done and page.end_offset == 18 and page.high_watermark == 18
            assert cluster.fetch_session_stats().created == 1

            # evicted between pages: the next page is full again (one FETCH_SESSION_ID_NOT_FOUND), still exact
            pos, got = 0, []
            for i in range(100):
                if i == 2:
                    assert cluster.expire_fetch_sessions() == 1
                p = await read_page(client, TP, pos, None, max_bytes=1)
                got += [r.value for r in p.records]
                pos = p.next_offset
                if p.done:
                    break
            assert got == COMMITTED
            st = cluster.fetch_session_stats()
            assert st.created == 2 and st.errors[EC.FETCH_SESSION_ID_NOT_FOUND] == 1

            # two concurrent readers of one partition: two sessions, both exact
            a, b = await asyncio.gather(read_loop(client, READ_COMMITTED, 1), read_loop(client, READ_UNCOMMITTED, 1))
            assert a[0] == COMMITTED and b[0] == EVERYTHING
            assert len(range_sessions(client)) == 2
        finally:
            await client.close()


async def test_brokers_without_fetch_sessions_get_full_requests() -> None:
    async with TestCluster(topics={"t": 1}, fetch_sessions=False) as cluster:
        write_interleaved_transactions(cluster)
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            values, _ = await read_loop(client, READ_COMMITTED, 1)
            assert values == COMMITTED
            st = cluster.fetch_session_stats()
            assert st.created == 0 and st.incremental == 0
        finally:
            await client.close()


def test_idle_range_sessions_are_bounded_and_expire() -> None:
    sessions = RangeSessions(max_idle=3, idle_s=10.0)
    tps = [TopicPartition("t", p) for p in range(5)]
    taken = [sessions.take(1, tp, 0.0) for tp in tps]
    assert len({id(s) for s in taken}) == 5 and len(sessions) == 0
    for i, (tp, s) in enumerate(zip(tps, taken, strict=True)):
        sessions.give(1, tp, s, float(i))
    assert len(sessions) == 3  # the two least recently used were dropped
    assert sessions.take(1, tps[0], 5.0) is not taken[0]  # dropped: a new one
    assert sessions.take(1, tps[4], 5.0) is taken[4]  # kept: the same session again
    assert sessions.take(1, tps[2], 20.0) is not taken[2]  # idle too long: a new one
    s = sessions.take(1, tps[1], 0.0)
    s.handler.builder().build()  # a request went out and never ended (a cancelled page)
    sessions.give(1, tps[1], s, 1.0)
    assert sessions.take(1, tps[1], 1.0) is not s


async def test_an_offset_outside_the_log_names_the_bounds_though_the_broker_answers_minus_one() -> None:
    """Like Apache Kafka, the test broker answers OFFSET_OUT_OF_RANGE with log start offset and high watermark -1:
    the 422 still names the log's bounds (X-Log-Start-Offset / X-High-Watermark), which read_page asks for."""
    async with TestCluster(topics={"t": 1}) as cluster:
        for v in (b"a", b"b", b"c"):
            cluster.append("t", 0, [v])
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            with pytest.raises(OffsetOutOfRange) as info:
                await read_page(client, TP, 4)
            assert info.value.headers == {"X-Log-Start-Offset": "0", "X-High-Watermark": "3"}
            assert "(the log holds offsets 0 to 3)" in str(info.value)
            fetched = [e.response.responses[0].partitions[0] for e in cluster.requests(ApiKey.FETCH)
                       if e.request.topics[0].partitions[0].fetch_offset == 4]
            assert fetched and (fetched[0].error_code, fetched[0].high_watermark) == (EC.OFFSET_OUT_OF_RANGE, -1)
        finally:
            await client.close()


async def test_a_partition_whose_leader_does_not_know_its_epoch_yet_is_asked_again() -> None:
    """Apache Kafka answers a fetch of a partition it created a moment ago with UNKNOWN_LEADER_EPOCH (75) for a
    while (seen right after CreateTopics): read_page and read_offsets ask again with fresh metadata, after short
    pauses, instead of failing the range read with a 503."""
    from service.fetch.offsets import read_offsets

    async with TestCluster(topics={"t": 1}) as cluster:
        for v in (b"a", b"b", b"c"):
            cluster.append("t", 0, [v])
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            since = len(cluster.requests(ApiKey.FETCH))
            cluster.error(ApiKey.FETCH, EC.UNKNOWN_LEADER_EPOCH, count=3, depth=2)
            page = await read_page(client, TP, 0)
            assert [r.value for r in page.records] == [b"a", b"b", b"c"]
            fetches = cluster.requests(ApiKey.FETCH)[since:]
            assert [e.response.responses[0].partitions[0].error_code for e in fetches][:4] == [75, 75, 75, 0]
            fault = cluster.error(ApiKey.LIST_OFFSETS, EC.UNKNOWN_LEADER_EPOCH, count=2, depth=2)
            bounds = await read_offsets(client, TP)
            assert (bounds.beginning_offset, bounds.end_offset) == (0, 3) and fault.applied == 2
        finally:
            await client.close()
