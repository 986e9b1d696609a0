"""read_committed through the gateway on Apache Kafka 4.4, which has what Tansu lacks: the aborted-transaction index,
control batches and a last stable offset held by open transactions. confluent-kafka's transactional producers write
committed and aborted transactions interleaved over three partitions; HTTP polls, the NDJSON stream and offset-range
reads (JSON and Arrow) at read_committed show every committed record exactly once (at the offset the producer was
told) and no aborted one, at read_uncommitted every record. A consumer waits at the LSO while a transaction is open
and goes on when it ends (commit or abort). A transaction left open by a producer killed with SIGKILL is aborted by
the broker's transaction timeout (a dedicated broker with a short abort-check interval) and never shown; later
records flow.

Every record is counted: values are unique, compared as sets and as counts."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from confluent_kafka import Producer as CKProducer
from confluent_kafka.admin import AdminClient, NewTopic

from service.embedded.kafka import EmbeddedKafka
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
NDJSON = "application/x-ndjson"
ARROW = "application/vnd.apache.arrow.stream"
H = {"Content-Type": V2}
Rec = tuple[int, int, bytes]  # partition, offset, value


@pytest.fixture(scope="module")
def gw(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(kafka.bootstrap, log_file=tmp_path_factory.mktemp("gw-txn") / "gateway.log") as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c


def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"txn-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the futures are done
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(30)
    return name


class Written:
    """What the producers were told: (partition, offset, value) of each record, by outcome."""

    def __init__(self) -> None:
        self.committed: set[Rec] = set()
        self.aborted: set[Rec] = set()
        self.pending: dict[str, list[Rec]] = {}

    def report(self, owner: str) -> Any:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            self.pending.setdefault(owner, []).append((msg.partition(), msg.offset(), msg.value()))
        return done

    def end(self, owner: str, committed: bool) -> None:
        recs = self.pending.pop(owner, [])
        (self.committed if committed else self.aborted).update(recs)


def txn_producer(bootstrap: str, txn_id: str, **conf: Any) -> CKProducer:
    p = CKProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 2, **conf})
    p.init_transactions(30)
    return p


def write_interleaved(bootstrap: str, topic: str, partitions: int = 3, rounds: int = 4, per_txn: int = 6) -> Written:
    """Two transactional producers, open at the same time on every partition, one committing and the other aborting
    (alternating by round), with plain records written while both are open; then a plain tail record on each
    partition, after every data record (the broker writes markers after answering EndTxn: the last ones may come
    after it, but read_committed shows the tail only once they are written). Aborted transactions are flushed before
    they end: their batches are in the log."""
    w = Written()
    a = txn_producer(bootstrap, f"{topic}-A")
    b = txn_producer(bootstrap, f"{topic}-B")
    plain = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for r in range(rounds):
        a.begin_transaction()
        b.begin_transaction()
        commit_a = r % 2 == 0
        for i in range(per_txn):
            for name, p, ok in (("A", a, commit_a), ("B", b, not commit_a)):
                tag = b"c" if ok else b"x"
                p.produce(topic, value=b"%s-r%d-%s-%d" % (tag, r, name.encode(), i), partition=i % partitions,
                          on_delivery=w.report(name))
                p.poll(0)
        assert a.flush(30) == 0 and b.flush(30) == 0
        for i in range(partitions):  # inside the open transactions: past the LSO until both end
            plain.produce(topic, value=b"p-r%d-%d" % (r, i), partition=i, on_delivery=w.report("plain"))
        assert plain.flush(30) == 0
        w.end("plain", True)
        for name, p, ok in (("A", a, commit_a), ("B", b, not commit_a)):
            if ok:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
            w.end(name, ok)
    for i in range(partitions):
        plain.produce(topic, value=b"tail-%d" % i, partition=i, on_delivery=w.report("plain"))
    assert plain.flush(30) == 0
    w.end("plain", True)
    return w


async def create(http: httpx.AsyncClient, group: str, level: str) -> str:
    r = await http.post(f"/consumers/{group}", headers=H, json={
        "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false", "isolation.level": level})
    assert r.status_code == 200, r.text
    return str(r.json()["base_uri"]).split("/consumers/", 1)[1].join(["/consumers/", ""])


async def subscribe(http: httpx.AsyncClient, base: str, topic: str) -> None:
    r = await http.post(f"{base}/subscription", json={"topics": [topic]}, headers=H)
    assert r.status_code == 204, r.text


def decode(recs: list[dict[str, Any]]) -> list[Rec]:
    return [(int(x["partition"]), int(x["offset"]), base64.b64decode(x["value"])) for x in recs]


async def poll(http: httpx.AsyncClient, base: str, timeout_ms: int = 500) -> list[Rec]:
    r = await http.get(f"{base}/records", params={"timeout": timeout_ms}, headers={"Accept": BIN})
    assert r.status_code == 200, r.text
    return decode(r.json())


async def poll_until(http: httpx.AsyncClient, base: str, done: Any, timeout: float = 30.0) -> list[Rec]:
    """Poll until ``done(records so far)``; the records (failing at ``timeout``)."""
    got: list[Rec] = []
    deadline = time.monotonic() + timeout
    while not done(got):
        assert time.monotonic() < deadline, f"gave up with {len(got)} records: {sorted(got)[:20]}"
        got += await poll(http, base)
    return got


def tails_seen(n: int) -> Any:
    """Every partition's last data record was delivered: nothing can follow."""
    return lambda got: len({v for _, _, v in got if v.startswith(b"tail-")}) == n


async def read_range(http: httpx.AsyncClient, topic: str, partition: int, level: str, max_bytes: int = 64,
                     offset: int = 0) -> tuple[list[Rec], dict[str, Any]]:
    """Read one partition page by page from ``offset`` until next_offset >= end_offset; (records, last page)."""
    out: list[Rec] = []
    while True:
        r = await http.get(f"/topics/{topic}/partitions/{partition}/records", headers={"Accept": BIN}, params={
            "offset": offset, "isolation_level": level, "max_bytes": max_bytes})
        assert r.status_code == 200, r.text
        body = r.json()
        out += [(partition, int(x["offset"]), base64.b64decode(x["value"])) for x in body["records"]]
        assert body["next_offset"] > offset or body["next_offset"] >= body["end_offset"], body
        offset = body["next_offset"]
        if offset >= body["end_offset"]:
            return out, body


async def read_range_arrow(http: httpx.AsyncClient, topic: str, partition: int, level: str,
                           max_bytes: int = 64) -> list[Rec]:
    """The same as Arrow IPC streams (paging state in the schema metadata)."""
    out: list[Rec] = []
    offset = 0
    while True:
        r = await http.get(f"/topics/{topic}/partitions/{partition}/records", headers={"Accept": ARROW}, params={
            "offset": offset, "isolation_level": level, "max_bytes": max_bytes})
        assert r.status_code == 200, r.text
        reader = pa.ipc.open_stream(r.content)
        t = reader.read_all()
        out += [(p, o, v) for p, o, v in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                                             t.column("value").to_pylist(), strict=True)]
        meta = reader.schema.metadata
        offset = int(meta[b"next_offset"])
        if offset >= int(meta[b"end_offset"]):
            return out


def assert_exactly(got: list[Rec], want: set[Rec]) -> None:
    assert len(got) == len(set(got)), "a record delivered twice"
    missing, extra = want - set(got), set(got) - want
    assert not missing and not extra, (sorted(missing)[:10], sorted(extra)[:10])
    assert len(got) == len(want)


async def test_interleaved_transactions_poll_stream_and_ranges(kafka: EmbeddedKafka, http: httpx.AsyncClient) -> None:
    topic = create_topic(kafka.bootstrap, 3)
    w = await asyncio.to_thread(write_interleaved, kafka.bootstrap, topic)
    assert len(w.committed) == 4 * 6 + 4 * 3 + 3 and len(w.aborted) == 4 * 6  # 39 shown, 24 never
    everything = w.committed | w.aborted
    per_partition = {p: len([r for r in everything if r[0] == p]) for p in range(3)}
    assert per_partition == {0: 21, 1: 21, 2: 21}

    # HTTP poll, binary, one instance at each isolation level
    for level, want in (("read_committed", w.committed), ("read_uncommitted", everything)):
        base = await create(http, f"g-{topic}-{level}", level)
        await subscribe(http, base, topic)
        got = await poll_until(http, base, tails_seen(3))
        got += await poll(http, base, 300)  # nothing further (a record shown late or twice would be here)
        assert_exactly(got, want)
        # per partition in offset order
        for p in range(3):
            seen = [o for q, o, _ in got if q == p]
            assert seen == sorted(seen)
        assert (await http.delete(base)).status_code == 204

    # the NDJSON stream, read_committed
    base = await create(http, f"g-{topic}-stream", "read_committed")
    await subscribe(http, base, topic)
    streamed: list[Rec] = []
    async with http.stream("GET", f"{base}/records", headers={"Accept": NDJSON}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith(NDJSON)
        async for line in resp.aiter_lines():
            if line:
                streamed += decode([json.loads(line)])
                if tails_seen(3)(streamed):
                    break
    assert_exactly(streamed, w.committed)
    assert (await http.delete(base)).status_code == 204

    # a read_committed instance assigned the partitions and seeking into the middle of the log (inside transactions,
    # committed or aborted: a fetch starting there still learns of the aborted ones that began before it)
    base = await create(http, f"g-{topic}-seek", "read_committed")
    r = await http.post(f"{base}/assignments", headers=H, json={
        "partitions": [{"topic": topic, "partition": p} for p in range(3)]})
    assert r.status_code == 204, r.text
    middle = {p: 5 + 3 * p for p in range(3)}
    r = await http.post(f"{base}/positions", headers=H, json={
        "offsets": [{"topic": topic, "partition": p, "offset": o} for p, o in middle.items()]})
    assert r.status_code == 204, r.text
    got = await poll_until(http, base, tails_seen(3))
    got += await poll(http, base, 300)
    assert_exactly(got, {x for x in w.committed if x[1] >= middle[x[0]]})
    assert (await http.delete(base)).status_code == 204

    # a range read from every offset of the log (markers and aborted records included), one page each
    for p in range(3):
        for start in range(21 + 8):
            recs, _ = await read_range(http, topic, p, "read_committed", max_bytes=1 << 20, offset=start)
            assert_exactly(recs, {x for x in w.committed if x[0] == p and x[1] >= start})

    # offset-range reads, in pages of about one record (the pages cut through the transactions)
    for level, want in (("read_committed", w.committed), ("read_uncommitted", everything)):
        ranged: list[Rec] = []
        for p in range(3):
            recs, last = await read_range(http, topic, p, level)
            ranged += recs
            # every transaction ended: the LSO is the high watermark, past 21 records and 8 control batches (one
            # marker per transaction on each partition; Kafka may write a round's last one after the tail record)
            assert last["last_stable_offset"] == last["high_watermark"] == 21 + 8, last
        assert_exactly(ranged, want)
        arrow: list[Rec] = []
        for p in range(3):
            arrow += await read_range_arrow(http, topic, p, level)
        assert_exactly(arrow, want)


async def test_consumer_waits_at_the_lso_until_the_transaction_ends(kafka: EmbeddedKafka,
                                                                     http: httpx.AsyncClient) -> None:
    """Partition 0's open transaction is committed, partition 1's aborted: while they are open nothing at or past
    either LSO is shown (plain records written after them neither); then 0 shows its transaction and what followed,
    1 only what followed."""
    b = kafka.bootstrap
    topic = create_topic(b, 2)
    w = Written()
    plain = CKProducer({"bootstrap.servers": b, "linger.ms": 2})

    def write_plain(tag: bytes) -> None:
        for p in range(2):
            for i in range(5):
                plain.produce(topic, value=b"%s-%d-%d" % (tag, p, i), partition=p, on_delivery=w.report("plain"))
        assert plain.flush(30) == 0
        w.end("plain", True)

    def open_txns() -> tuple[CKProducer, CKProducer]:
        t0, t1 = txn_producer(b, f"{topic}-0"), txn_producer(b, f"{topic}-1")
        for p, t in enumerate((t0, t1)):
            t.begin_transaction()
            for i in range(4):
                t.produce(topic, value=b"open-%d-%d" % (p, i), partition=p, on_delivery=w.report(f"t{p}"))
            assert t.flush(30) == 0
        return t0, t1

    await asyncio.to_thread(write_plain, b"before")
    before = set(w.committed)
    t0, t1 = await asyncio.to_thread(open_txns)
    lso = {p: min(o for q, o, _ in w.pending[f"t{p}"] if q == p) for p in range(2)}
    assert lso == {0: 5, 1: 5}
    await asyncio.to_thread(write_plain, b"after")

    base = await create(http, f"g-{topic}", "read_committed")
    await subscribe(http, base, topic)
    got = await poll_until(http, base, lambda g: len(g) >= len(before))
    for _ in range(3):  # the open transactions hold both partitions at their LSO
        got += await poll(http, base, 300)
    assert_exactly(got, before)
    for p in range(2):
        r = await http.get(f"/topics/{topic}/partitions/{p}/offsets")
        assert r.status_code == 200, r.text
        assert r.json() == {"beginning_offset": 0, "end_offset": 14, "last_stable_offset": lso[p]}, r.text
        # a range read at read_committed stops at the LSO; at read_uncommitted it shows the open records too
        recs, last = await read_range(http, topic, p, "read_committed", max_bytes=1 << 20)
        assert (last["end_offset"], last["last_stable_offset"]) == (lso[p], lso[p])
        assert set(recs) == {r for r in before if r[0] == p} and len(recs) == 5
        recs, last = await read_range(http, topic, p, "read_uncommitted", max_bytes=1 << 20)
        assert {v for _, _, v in recs} == {b"%s-%d-%d" % (t, p, i) for t in (b"before", b"open", b"after")
                                           for i in range(5) if t != b"open" or i < 4}
        # an end_offset past the LSO is cut to it at read_committed
        r = await http.get(f"/topics/{topic}/partitions/{p}/records", headers={"Accept": BIN},
                           params={"offset": 0, "end_offset": 14})
        assert r.status_code == 200, r.text
        assert (r.json()["end_offset"], len(r.json()["records"])) == (lso[p], 5), r.text

    # an instance seeking to the end while they are open starts at the LSO (Kafka's end under read_committed), not
    # at the high watermark: it gets the held records once the transactions end
    late = await create(http, f"g-{topic}-late", "read_committed")
    r = await http.post(f"{late}/assignments", headers=H, json={
        "partitions": [{"topic": topic, "partition": p} for p in range(2)]})
    assert r.status_code == 204, r.text
    r = await http.post(f"{late}/positions/end", headers=H, json={
        "partitions": [{"topic": topic, "partition": p} for p in range(2)]})
    assert r.status_code == 204, r.text
    assert await poll(http, late, 300) == []

    await asyncio.to_thread(t0.commit_transaction, 30)
    w.end("t0", True)
    await asyncio.to_thread(t1.abort_transaction, 30)
    w.end("t1", False)
    assert len(w.committed) == 5 * 4 + 4 and len(w.aborted) == 4
    done = {r for r in w.committed if r[2].startswith(b"after")}
    got += await poll_until(http, base, lambda g: done <= {x for x in g})
    got += await poll(http, base, 300)
    assert_exactly(got, w.committed)
    assert (await http.delete(base)).status_code == 204
    got = await poll_until(http, late, lambda g: done <= {x for x in g})

    # partition 1's log then ends with a whole aborted transaction (its records, then its marker)
    def abort_again() -> None:
        t1.begin_transaction()
        for i in range(3):
            t1.produce(topic, value=b"last-1-%d" % i, partition=1, on_delivery=w.report("t1"))
        assert t1.flush(30) == 0
        t1.abort_transaction(30)
        w.end("t1", False)

    await asyncio.to_thread(abort_again)
    assert len(w.aborted) == 4 + 3
    # 14 data records and a marker on partition 0; 14 + 3 data records and two markers on partition 1, the last at
    # offset 18 (written a moment after EndTxn was answered)
    hw = {0: 15, 1: 19}
    deadline = time.monotonic() + 10
    while (await http.get(f"/topics/{topic}/partitions/1/offsets")).json()["last_stable_offset"] != hw[1]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)  # the abort marker is written after EndTxn was answered
    got += await poll(http, late, 300)
    got += await poll(http, late, 300)
    assert_exactly(got, w.committed - before)
    # committing what was consumed stores the position, past the markers and the aborted records (as Kafka's own
    # consumer does: a read_committed group at the end of a transactional partition has no lag)
    r = await http.post(f"{late}/offsets", headers=H)
    assert r.status_code == 200, r.text
    r = await http.request("GET", f"{late}/offsets", headers=H, json={
        "partitions": [{"topic": topic, "partition": p} for p in range(2)]})
    assert r.status_code == 200, r.text
    assert {o["partition"]: o["offset"] for o in r.json()["offsets"]} == {0: 15, 1: 19}, r.text
    assert (await http.delete(late)).status_code == 204
    # range reads from every offset, markers included
    for p in range(2):
        for start in range(hw[p] + 1):
            recs, last = await read_range(http, topic, p, "read_committed", max_bytes=200, offset=start)
            assert_exactly(recs, {x for x in w.committed if x[0] == p and x[1] >= start})
            assert last["next_offset"] == last["end_offset"] == last["high_watermark"] == hw[p], last


# -- a transaction left open by a killed producer -----------------------------------------------------------------
TXN_TIMEOUT_MS = 2000
HANGING_PRODUCER = """
import sys
from confluent_kafka import Producer
bootstrap, topic, txn_id, timeout_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 2,
              "transaction.timeout.ms": timeout_ms, "socket.timeout.ms": timeout_ms - 100})
p.init_transactions(30)
p.begin_transaction()
for part in (0, 1):
    for i in range(5):
        p.produce(topic, value=b"dead-%d-%d" % (part, i), partition=part)
assert p.flush(30) == 0
print("open", flush=True)
sys.stdin.read()  # until killed
"""


@pytest.fixture(scope="module")
def short_txn_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """A broker that looks for timed-out transactions every 500 ms (Kafka's default: every 10 s)."""
    d = tmp_path_factory.mktemp("kafka-txn")
    k = EmbeddedKafka(log_file=d / "kafka.log", overrides={
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"})
    k.start()
    try:
        yield k
    finally:
        k.stop()


async def test_a_killed_producers_open_transaction_is_aborted_by_the_broker(
        short_txn_kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A producer inside a transaction (records flushed to both partitions) is killed with SIGKILL: no EndTxn ever
    comes. Plain records written after it wait behind its LSO until the broker aborts it on its timeout (2 s, seen
    within 500 ms); then they flow, the dead records are never shown at read_committed (they are in the log:
    read_uncommitted shows them), and records written later flow too."""
    b = short_txn_kafka.bootstrap
    topic = create_topic(b, 2)
    w = Written()
    plain = CKProducer({"bootstrap.servers": b, "linger.ms": 2})

    def write_plain(tag: bytes) -> None:
        for p in range(2):
            for i in range(5):
                plain.produce(topic, value=b"%s-%d-%d" % (tag, p, i), partition=p, on_delivery=w.report("plain"))
        assert plain.flush(30) == 0
        w.end("plain", True)

    await asyncio.to_thread(write_plain, b"before")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HANGING_PRODUCER, b, topic, f"{topic}-dead", str(TXN_TIMEOUT_MS),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line == b"open\n", line
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # kill -9: no abort, no EndTxn
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    await asyncio.to_thread(write_plain, b"after")  # past the dead transaction: held at the LSO until it is aborted

    with GatewayProcess(b, log_file=tmp_path / "gateway.log") as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            base = await create(http, f"g-{topic}", "read_committed")
            await subscribe(http, base, topic)
            # the broker aborts the transaction after its timeout (2 s + up to 0.5 s); then "after" flows
            got = await poll_until(http, base, lambda g: len(g) >= len(w.committed))
            got += await poll(http, base, 300)
            assert_exactly(got, w.committed)
            assert len(w.committed) == 20
            for p in range(2):
                # the dead transaction's records are in the log (read_uncommitted shows them) and never shown at
                # read_committed; its abort marker is at offset 15, after "after" (10-14)
                recs, last = await read_range(http, topic, p, "read_uncommitted", max_bytes=1 << 20)
                assert sorted(v for _, _, v in recs) == sorted(
                    [b"%s-%d-%d" % (t, p, i) for t in (b"before", b"dead", b"after") for i in range(5)])
                assert last["high_watermark"] == last["last_stable_offset"] == 16, last
                recs, _ = await read_range(http, topic, p, "read_committed", max_bytes=100)
                assert set(recs) == {r for r in w.committed if r[0] == p} and len(recs) == 10
            await asyncio.to_thread(write_plain, b"later")  # later records flow
            got += await poll_until(http, base, lambda g: len(g) >= 10)
            got += await poll(http, base, 300)
            assert_exactly(got, w.committed)
            assert len(w.committed) == 30
