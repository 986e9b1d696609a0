"""KIP-227 incremental fetch sessions against Apache Kafka (Tansu creates no sessions: every fetch is full there,
docs/brokers.md). The engine-level tests record every fetch request our fetcher builds and every response it
handles (session id, epoch, the partitions on the wire) by wrapping ``FetchSessionHandler``; the restart test also
reads the gateway's /metrics (``kcg_fetch_requests_total``, ``kcg_fetch_session_errors_total``,
``kcg_fetch_session_resets_total``) and counts every record produced, delivered and committed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer
from prometheus_client.parser import text_string_to_metric_families

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from service.consumer.subscription import TopicPartition
from service.embedded.kafka import EmbeddedKafka
from service.fetch.oneshot import probe_fetch
from service.fetch.session import FetchSessionHandler
from service.protocol import error_codes as EC
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
H = {"Content-Type": V2}


@dataclass
class Resp:
    session_id: int
    error: int
    # partition -> (records bytes, high watermark, last stable offset, log start offset, error)
    parts: dict[TopicPartition, tuple[int, int, int, int, int]]


@dataclass
class Req:
    session_id: int
    epoch: int
    offsets: dict[TopicPartition, int]  # the session's partitions and fetch offsets once this request is sent
    sent: set[TopicPartition]  # partitions on the wire
    forgotten: set[TopicPartition]
    resets: bool
    resp: Resp | None = None  # None: no answer (yet, or the send failed)


@dataclass
class Exchanges:
    reqs: list[Req] = field(default_factory=list)

    @property
    def resps(self) -> list[Resp]:
        return [r.resp for r in self.reqs if r.resp is not None]


class Recorder:
    """Every fetch request built and every response handled, per FetchSessionHandler (one per consumer and
    broker), read off the wire messages themselves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_handler: dict[int, Exchanges] = {}
        orig_request = FetchSessionHandler.request
        orig_handle = FetchSessionHandler.handle_response
        rec = self

        @contextlib.contextmanager
        def request(self: FetchSessionHandler, builder: Any, **kw: Any) -> Iterator[Any]:
            with orig_request(self, builder, **kw) as fx:
                m, data = fx.message, fx.data
                ids = {d.topic_id: d.topic for d in data.to_send.values()}
                ids |= {t.topic_id: t.topic for t in (*data.to_forget, *data.to_replace)}

                def name(t: Any) -> str:  # v13+ names topics by id only
                    return str(t.topic if fx.version < 13 else ids[t.topic_id])

                sent = {TopicPartition(name(t), p.partition) for t in m.topics for p in t.partitions}
                forgotten = {TopicPartition(name(t), p) for t in m.forgotten_topics_data for p in t.partitions}
                rec.of(self).reqs.append(Req(
                    m.session_id, m.session_epoch,
                    {tp: d.fetch_offset for tp, d in fx.data.session_partitions.items()},
                    sent, forgotten, fx.data.resets_session))
                yield fx

        def handle_response(self: FetchSessionHandler, response: Any, version: int) -> bool:
            parts = {TopicPartition(*tp): (len(p.records or b""), p.high_watermark, p.last_stable_offset,
                                           p.log_start_offset, p.error_code)
                     for tp, p in self.response_partitions(response, version).items()}
            rec.of(self).reqs[-1].resp = Resp(response.session_id, response.error_code, parts)
            return orig_handle(self, response, version)

        monkeypatch.setattr(FetchSessionHandler, "request", request)
        monkeypatch.setattr(FetchSessionHandler, "handle_response", handle_response)

    def of(self, handler: FetchSessionHandler) -> Exchanges:
        return self.by_handler.setdefault(id(handler), Exchanges())

    def for_consumer(self, consumer: Consumer) -> Exchanges:
        handlers = list(consumer.fetcher.sessions.values())
        assert len(handlers) == 1, handlers  # a single-node cluster: one session per consumer
        return self.of(handlers[0])


def produce(bootstrap: str, topic: str, start: int, n: int, partitions: list[int]) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i in range(start, start + n):
        p.produce(topic, value=b"v%d" % i, partition=partitions[i % len(partitions)])
    assert p.flush(30) == 0


async def poll_until(consumers: list[Consumer], got: list[bytes], want: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        for c in consumers:
            got += [r.value for r in await c.poll(max_records=500, timeout=0.2)]  # type: ignore[misc]
    assert len(got) >= want, f"{len(got)} of {want} records"


async def wait_for(cond: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def check_session(ex: Exchanges) -> int:
    """The exchanges of one handler follow KIP-227 as Kafka runs it; returns the session id.

    The first request is full, (0, 0), and its response creates a session; every later request carries that
    id and the next epoch (1, 2, ...), sends only the partitions whose fetch offset changed or that joined the
    session, and forgets those that left it; every incremental response leaves out the partitions with nothing
    new (no records, same high watermark, last stable offset and log start offset, no error)."""
    assert ex.reqs and ex.resps
    first = ex.reqs[0]
    assert (first.session_id, first.epoch) == (0, 0)
    assert first.sent == set(first.offsets) and not first.forgotten
    sid = ex.resps[0].session_id
    assert sid != 0 and ex.resps[0].error == 0
    assert set(ex.resps[0].parts) == first.sent  # a full response answers for every partition
    marks = {tp: p[1:] for tp, p in ex.resps[0].parts.items()}
    for i in range(1, len(ex.reqs)):
        prev, req = ex.reqs[i - 1], ex.reqs[i]
        assert (req.session_id, req.epoch) == (sid, i), f"request {i}: {req}"
        changed = {tp for tp, off in req.offsets.items() if prev.offsets.get(tp) != off}
        assert req.sent == changed, f"request {i} sent {req.sent}, changed {changed}"
        assert req.forgotten == set(prev.offsets) - set(req.offsets)
    for i, resp in enumerate(ex.resps[1:], 1):
        assert (resp.session_id, resp.error) == (sid, 0)
        for tp, (size, *now) in resp.parts.items():
            assert size or tuple(now) != marks.get(tp), f"response {i}: {tp} unchanged yet sent"
            marks[tp] = tuple(now)
    return sid


async def test_fetches_are_incremental_after_the_first(kafka: EmbeddedKafka, topic_name: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    client = KafkaClient(kafka.bootstrap)
    consumer = Consumer(client, ConsumerConfig(auto_offset_reset="earliest", fetch_max_wait_ms=100))
    tps = [TopicPartition(topic_name, p) for p in range(4)]
    try:
        await client.create_topics({topic_name: 4})
        await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 0, 40, [0, 1, 2, 3])
        await consumer.assign(tps)
        got: list[bytes] = []
        await poll_until([consumer], got, 40)
        ex = rec.for_consumer(consumer)
        # caught up: the fetches that follow send nothing (no fetch offset moves any more)
        await wait_for(lambda: not ex.reqs[-1].sent and len(ex.reqs) > 1, "an empty incremental fetch")
        caught_up = len(ex.reqs)
        # only partition 2 gets new records: only it comes back, and only it is sent again (its offset moved)
        await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 40, 6, [2])
        await poll_until([consumer], got, 46)
        settled = len(ex.reqs)
        # a few more rounds with nothing new: empty requests, empty responses
        await wait_for(lambda: len(ex.resps) >= settled + 3, "three more fetches")
        await poll_until([consumer], got, 46)
        assert sorted(got) == sorted(b"v%d" % i for i in range(46))

        check_session(ex)
        p2 = TopicPartition(topic_name, 2)
        later = [r.resp for r in ex.reqs[caught_up - 1:] if r.resp]
        assert any(set(r.parts) == {p2} and r.parts[p2][0] for r in later), "no response with p2's new records"
        assert all(set(r.parts) <= {p2} for r in later), [set(r.parts) for r in later]
        assert all(r.sent <= {p2} for r in ex.reqs[caught_up:])
        assert any(r.sent == {p2} for r in ex.reqs[caught_up:])
        empty = [r for r in ex.reqs[settled:] if not r.sent and not r.forgotten]
        assert len(empty) >= 2  # the steady state: nothing on the wire but the session id and epoch
        assert any(not r.parts for r in ex.resps[settled:])
        # the fetcher's counters, which /metrics exports per tenant
        fs = consumer.fetcher.stats
        assert fs.full_fetches == 1
        assert fs.incremental_fetches == len(ex.resps) - 1 > 3
        assert fs.session_errors == fs.session_resets == 0
    finally:
        await consumer.close()
        await client.close()


async def test_one_off_fetches_take_no_session_slot(kafka: EmbeddedKafka, topic_name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-off fetches (end offsets, topic offsets, the first fetch of a range read) are sessionless, (0, -1):
    Kafka answers session id 0. At (0, 0) each one took a slot of the broker's fetch-session cache (1,000 by default)
    for two minutes, and a burst of them evicted the sessions of consumers, ours and other clients'."""
    rec = Recorder(monkeypatch)
    client = KafkaClient(kafka.bootstrap)
    try:
        await client.create_topics({topic_name: 1})
        await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 0, 5, [0])
        node = client.metadata.leader(topic_name, 0)
        assert node is not None
        tp = TopicPartition(topic_name, 0)
        for offset in range(3):
            parts = await probe_fetch(client, node, {tp: offset}, max_bytes=1, isolation=0)
            assert parts[tp].high_watermark == 5
        reqs = [r for ex in rec.by_handler.values() for r in ex.reqs]
        assert [(r.session_id, r.epoch, r.resp and r.resp.session_id) for r in reqs] == [(0, -1, 0)] * 3
    finally:
        await client.close()


async def test_rebalance_moves_partitions_in_and_out_of_the_session(kafka: EmbeddedKafka, topic_name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A second member joins (the first one's session forgets the partitions it loses, incrementally) and leaves
    (they are added back to the same session); every record is delivered once (offsets committed before each
    rebalance)."""
    rec = Recorder(monkeypatch)
    cfg = ConsumerConfig(group_id=f"g-{topic_name}", enable_auto_commit=False, auto_offset_reset="earliest",
                         fetch_max_wait_ms=100, session_timeout_ms=6000, heartbeat_interval_ms=200)
    client_a, client_b = KafkaClient(kafka.bootstrap), KafkaClient(kafka.bootstrap)
    a, b = Consumer(client_a, cfg), Consumer(client_b, cfg)
    tps = {TopicPartition(topic_name, p) for p in range(4)}
    got_a: list[bytes] = []
    got_b: list[bytes] = []

    async def poll_both(cond: Callable[[], bool], what: str, members: tuple[Consumer, ...] = (a, b)) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            for c, got in ((a, got_a), (b, got_b)):
                if c in members:
                    got += [r.value for r in await c.poll(max_records=500, timeout=0.1)]  # type: ignore[misc]

    try:
        await client_a.create_topics({topic_name: 4})
        await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 0, 40, [0, 1, 2, 3])
        await a.subscribe([topic_name])
        await poll_both(lambda: len(got_a) >= 40, "40 records on the first member", (a,))
        await a.commit()
        ex_a = rec.for_consumer(a)
        joined_at = len(ex_a.reqs)

        await b.subscribe([topic_name])
        await poll_both(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, "the split")
        kept, moved = set(a.assignment()), set(b.assignment())
        assert kept | moved == tps
        await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 40, 40, [0, 1, 2, 3])
        await poll_both(lambda: len(got_a) + len(got_b) >= 80, "40 more records on both members")
        # the first member's session dropped the moved partitions and kept the others as they were
        await wait_for(lambda: any(r.forgotten for r in ex_a.reqs[joined_at:]), "a request forgetting partitions")
        forgetting = [r for r in ex_a.reqs[joined_at:] if r.forgotten]
        assert len(forgetting) == 1 and forgetting[0].forgotten == moved, forgetting
        assert set(forgetting[0].offsets) == kept and forgetting[0].epoch > 0
        await a.commit()
        await b.commit()
        ex_b = rec.for_consumer(b)

        left_at = len(ex_a.reqs)
        await b.close()  # leaves the group: the moved partitions come back to the first member
        await poll_both(lambda: len(a.assignment()) == 4, "the first member owning every partition again", (a,))
        await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 80, 40, [0, 1, 2, 3])
        await poll_both(lambda: len(got_a) + len(got_b) >= 120, "40 more records after the leave", (a,))
        adding = [r for r in ex_a.reqs[left_at:] if set(r.offsets) == tps and r.sent & moved]
        # they join the session in an incremental request (with any kept partition whose offset moved meanwhile:
        # check_session below checks that only those are sent)
        assert adding and adding[0].sent >= moved and adding[0].epoch > forgetting[0].epoch, adding[:1]
        assert not adding[0].forgotten

        everything = got_a + got_b
        assert sorted(everything) == sorted(b"v%d" % i for i in range(120)), "records lost or repeated"
        assert len(got_b) == 20  # its two partitions' share of the middle batch
        # one session each, incremental throughout: the first member's never had to start over
        check_session(ex_a)
        check_session(ex_b)
        assert set(ex_b.reqs[0].sent) == moved
        for c in (a, b):
            assert c.fetcher.stats.full_fetches == 1
            assert c.fetcher.stats.session_errors == c.fetcher.stats.session_resets == 0
    finally:
        await a.close()
        await b.close()
        await client_a.close()
        await client_b.close()


def scrape(url: str) -> dict[str, float]:
    """The default tenant's fetch-session counters on the gateway's /metrics."""
    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name.startswith("kcg_fetch_") and s.labels.get("tenant") == "default":
                out[s.name + (f"[{s.labels['kind']}]" if "kind" in s.labels else "")] = s.value
    return out


async def http_poll(http: httpx.AsyncClient, base: str, got: list[tuple[int, int, bytes]], want: int) -> None:
    deadline = time.monotonic() + 40
    while len(got) < want:
        assert time.monotonic() < deadline, f"{len(got)} of {want} records over HTTP"
        r = await http.get(f"{base}/records", params={"timeout": 500}, headers={"Accept": BIN})
        assert r.status_code == 200, r.text
        got += [(int(x["partition"]), int(x["offset"]), base64.b64decode(x["value"])) for x in r.json()]


async def test_broker_restart_resets_the_session_with_one_full_fetch(tmp_path: Any, topic_name: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A dedicated broker stopped and started on its data forgets every fetch session. The gateway's HTTP consumer,
    fetching when the broker went away, and an engine consumer that was idle then (its next fetch names the old
    session: FETCH_SESSION_ID_NOT_FOUND) each re-create their session with one full fetch; every record produced
    before and after the restart is delivered once and committed."""
    rec = Recorder(monkeypatch)
    n, m = 60, 60
    broker = EmbeddedKafka(log_file=tmp_path / "kafka.log")  # its port is chosen here
    gw = GatewayProcess(broker.bootstrap, env={"GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "10000"},
                        log_file=tmp_path / "gateway.log")
    gw.launch()  # boots while the broker starts
    client = KafkaClient(broker.bootstrap)
    idle = Consumer(client, ConsumerConfig(group_id=f"idle-{topic_name}", enable_auto_commit=False,
                                           auto_offset_reset="earliest", fetch_max_wait_ms=100,
                                           fetch_idle_pause_ms=200))
    tps = [TopicPartition(topic_name, p) for p in range(3)]
    try:
        await asyncio.to_thread(broker.start)
        await client.create_topics({topic_name: 3})
        await asyncio.to_thread(produce, broker.bootstrap, topic_name, 0, n, [0, 1, 2])
        await asyncio.to_thread(gw.wait_healthy)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            group = f"g-{topic_name}"
            r = await http.post(f"/consumers/{group}", headers=H,
                                json={"auto.offset.reset": "earliest", "auto.commit.enable": "false"})
            assert r.status_code == 200, r.text
            base = f"/consumers/{group}/instances/{r.json()['instance_id']}"
            r = await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers=H)
            assert r.status_code == 204, r.text
            got: list[tuple[int, int, bytes]] = []
            await http_poll(http, base, got, n)
            assert (await http.post(f"{base}/offsets", headers=H)).status_code == 200  # commit all consumed

            await idle.assign(tps)
            idle_got: list[bytes] = []
            await poll_until([idle], idle_got, n)
            await idle.commit()
            await wait_for(lambda: idle.fetcher.idle, "the engine consumer's fetcher to pause")
            handler = next(iter(idle.fetcher.sessions.values()))
            old = (handler.session_id, handler.epoch)
            assert old[0] != 0 and old[1] > 0  # its next fetch is an incremental one in that session
            ex = rec.for_consumer(idle)
            before_restart = len(ex.reqs)

            # the fetches after the first one are incremental (counted when answered: Kafka parks an empty fetch
            # for the fetch wait, 500 ms)
            deadline = time.monotonic() + 10
            while (before := scrape(gw.url))["kcg_fetch_requests_total[incremental]"] == 0:
                assert time.monotonic() < deadline, before
                await asyncio.sleep(0.05)
            assert before["kcg_fetch_requests_total[full]"] == 1
            assert before["kcg_fetch_requests_total[incremental]"] > 0
            assert before["kcg_fetch_session_errors_total"] == before["kcg_fetch_session_resets_total"] == 0

            await asyncio.to_thread(broker.stop, keep_data=True)
            await asyncio.to_thread(broker.start)
            await asyncio.to_thread(produce, broker.bootstrap, topic_name, n, m, [0, 1, 2])

            await http_poll(http, base, got, n + m)
            assert (await http.post(f"{base}/offsets", headers=H)).status_code == 200
            await poll_until([idle], idle_got, n + m)
            await idle.commit()

            # every record once, in both consumers
            assert sorted(v for _, _, v in got) == sorted(b"v%d" % i for i in range(n + m)), "lost or repeated"
            assert len({(p, o) for p, o, _ in got}) == n + m
            assert sorted(idle_got) == sorted(b"v%d" % i for i in range(n + m))
            r = await http.request("GET", f"{base}/offsets", json={"partitions": [
                {"topic": topic_name, "partition": p} for p in range(3)]})
            assert r.status_code == 200, r.text
            assert sum(o["offset"] for o in r.json()["offsets"]) == n + m  # committed: everything
            committed = await idle.committed(tps)
            assert sum(om.offset for om in committed.values() if om) == n + m

            # the HTTP consumer: one more full fetch, which re-created the session; incremental ever since
            after = scrape(gw.url)
            assert after["kcg_fetch_requests_total[full]"] == 2
            assert after["kcg_fetch_session_resets_total"] == 1
            assert after["kcg_fetch_session_errors_total"] <= 1  # 1 if its fetch named the lost session
            assert after["kcg_fetch_requests_total[incremental]"] > before["kcg_fetch_requests_total[incremental]"]

        # the idle consumer: its first fetch named the old session and was refused; one full fetch made a new one
        after_restart = [r for r in ex.reqs[before_restart:] if r.resp is not None]
        first, full, *rest = after_restart
        assert (first.session_id, first.epoch) == old and first.resp is not None
        assert first.resp.error == EC.FETCH_SESSION_ID_NOT_FOUND and not first.resp.parts
        assert (full.session_id, full.epoch) == (0, 0) and full.resets and full.sent == set(tps)
        assert full.resp is not None and full.resp.session_id not in (0, old[0])
        assert [(r.session_id, r.epoch) for r in rest] == [(full.resp.session_id, e) for e in range(1, len(rest) + 1)]
        assert handler.stats.session_errors == {EC.FETCH_SESSION_ID_NOT_FOUND: 1}
        fs = idle.fetcher.stats
        assert (fs.full_fetches, fs.session_errors, fs.session_resets) == (2, 1, 1)
    finally:
        await idle.close()
        await client.close()
        gw.stop()
        broker.stop()
