"""The Spark sink against the protocol-level test broker (it has Kafka's aborted-transaction index; Tansu has
not), through a real gateway process: aborted transactions never reach the table, also when they span pages,
input ranges and partitions; an open transaction holds a partition at its LSO until it ends (then committed
records follow, aborted ones never); ``--trigger interval=...`` picks up records produced while it runs; a
tenant without access to the topic gets a clear error and nothing is written; a gateway that goes away in the
middle of a batch (a TCP proxy cuts its connections after some response bytes) makes the batch fail with
nothing of it visible, and the batch is read again on the next run, or is retried inside the task when the
gateway comes back at once. One Spark session (local[2]) for the module; the test broker runs on its own
event loop in a thread (the Spark calls block)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.fakes.broker import TestCluster
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
pytest.importorskip("pyspark")

T = TypeVar("T")
P1, P2, P3 = 1001, 1002, 1003


class ThreadedCluster:
    """A :class:`TestCluster` on an event loop of its own thread; ``call`` runs a function on that loop."""

    def __init__(self, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cluster = TestCluster(**kw)
        asyncio.run_coroutine_threadsafe(self.cluster.start(), self.loop).result(30)

    def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        async def run() -> T:
            return fn(*args, **kw)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.cluster.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        assert not self.cluster.errors, self.cluster.errors


class CuttingProxy:
    """A TCP proxy to the gateway that, when armed, closes every connection once ``cut_after`` response bytes
    have gone through, then either lets new connections through again (``then="pass"``) or refuses them
    (``then="down"``) until :meth:`restore`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cut_after: int | None = None
        self.then = "pass"
        self.down = False
        self.passed = 0
        self.cuts = 0
        self.refused = 0
        self._writers: set[asyncio.StreamWriter] = set()

    def arm(self, cut_after: int, then: str) -> None:
        def set_() -> None:
            self.passed, self.cut_after, self.then = 0, cut_after, then

        self.loop.call_soon_threadsafe(set_)

    def restore(self) -> None:
        def set_() -> None:
            self.down, self.cut_after = False, None

        self.loop.call_soon_threadsafe(set_)

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if self.down:
            self.refused += 1
            w.close()
            return
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            w.close()
            return
        self._writers |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            try:
                while data := await src.read(16384):
                    dst.write(data)
                    await dst.drain()
                    if count and self.cut_after is not None:
                        self.passed += len(data)
                        if self.passed >= self.cut_after:
                            self._cut()
                            return
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(r, uw, False), pipe(ur, w, True))
        self._writers -= {w, uw}

    def _cut(self) -> None:
        self.cuts += 1
        self.cut_after = None
        self.down = self.then == "down"
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def close(self) -> None:
        self.server.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def broker() -> Iterator[ThreadedCluster]:
    c = ThreadedCluster(topics={"t": 2})
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def gw(broker: ThreadedCluster, tmp_path: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.cluster.bootstrap_servers, log_file=tmp_path / "gw.log") as g:
        yield g


def sink_args(url: str, tmp: Path, *extra: str, topic: str = "t") -> Any:
    from sink.cli import parse_args

    return parse_args(["--gateway", url, "--topics", topic, "--table", str(tmp / "table"),
                       "--checkpoint", str(tmp / "cp"), "--quiet", *extra])


def values(spark: Any, tmp: Path) -> list[tuple[int, int, bytes]]:
    if not (tmp / "table" / "_spark_metadata").exists() or not list((tmp / "table").glob("*.parquet")):
        return []
    rows = spark.read.parquet(str(tmp / "table")).select("partition", "offset", "value").collect()
    return sorted((r[0], r[1], bytes(r[2])) for r in rows)


def plain(c: TestCluster, p: int, vs: list[bytes]) -> None:
    c.append("t", p, vs)


def write_mixed(c: TestCluster) -> list[bytes]:
    """Committed, aborted and plain records on partitions 0 and 1; transactions interleave, span several
    batches (so several pages at a small page size) and both partitions (P1's aborted transaction and P2's
    committed one write to both). Returns the values that are committed or plain."""
    want: list[bytes] = []
    for p in (0, 1):
        c.append("t", p, [b"plain-%d-%d" % (p, i) for i in range(3)])
        want += [b"plain-%d-%d" % (p, i) for i in range(3)]
    for i in range(4):  # P1 (aborted later, both partitions) and P2 (committed later, both partitions) interleave
        for p in (0, 1):
            c.append_txn("t", p, [b"abort-%d-%d-%d" % (p, i, j) for j in range(5)], producer_id=P1)
            c.append_txn("t", p, [b"keep-%d-%d-%d" % (p, i, j) for j in range(5)], producer_id=P2)
            want += [b"keep-%d-%d-%d" % (p, i, j) for j in range(5)]
    for p in (0, 1):
        c.end_txn("t", p, P1, commit=False)
        c.append("t", p, [b"mid-%d" % p])
        want.append(b"mid-%d" % p)
        c.end_txn("t", p, P2, commit=True)
    c.append_txn("t", 1, [b"abort-late-%d" % j for j in range(8)], producer_id=P3)
    c.end_txn("t", 1, P3, commit=False)
    c.append("t", 0, [b"tail-0"])
    want.append(b"tail-0")
    return sorted(want)


def test_aborted_transactions_never_reach_the_table(broker: ThreadedCluster, gw: GatewayProcess, spark: Any,
                                                    tmp_path: Path) -> None:
    from sink.cli import run

    want = broker.call(write_mixed, broker.cluster)
    # small pages (one or two batches each) and input ranges that cut through the transactions
    s = run(spark, sink_args(gw.url, tmp_path, "--max-offsets-per-task", "7", "--max-records-per-trigger", "40"),
            out=io.StringIO())
    got = values(spark, tmp_path)
    assert sorted(v for _, _, v in got) == want
    assert not [v for _, _, v in got if v.startswith(b"abort")]
    assert len({(p, o) for p, o, _ in got}) == len(got) and s["rows"] == len(want) and s["batches"] >= 3
    # the batch reader, with pages of about one record
    df = (spark.read.format("kafka_gateway").option("gateway", gw.url).option("topics", "t")
          .option("maxOffsetsPerTask", "11").option("maxBytesPerPage", "1").load())
    assert sorted(bytes(r.value) for r in df.select("value").collect()) == want
    # and the JSON answers decode to the same rows
    df = (spark.read.format("kafka_gateway").option("gateway", gw.url).option("topics", "t")
          .option("responseFormat", "json").option("maxBytesPerPage", "100").load())
    assert sorted(bytes(r.value) for r in df.select("value").collect()) == want


def test_open_transaction_holds_the_partition_until_it_ends(broker: ThreadedCluster, gw: GatewayProcess,
                                                            spark: Any, tmp_path: Path) -> None:
    from sink.cli import run

    c = broker.cluster
    broker.call(plain, c, 0, [b"before-0"])
    broker.call(plain, c, 1, [b"before-1"])
    broker.call(c.append_txn, "t", 0, [b"open-a"], producer_id=P1)  # partition 0's LSO stays here
    broker.call(c.append_txn, "t", 1, [b"open-b"], producer_id=P2)
    broker.call(plain, c, 0, [b"after-0"])
    broker.call(plain, c, 1, [b"after-1"])
    run(spark, sink_args(gw.url, tmp_path), out=io.StringIO())
    assert [v for _, _, v in values(spark, tmp_path)] == [b"before-0", b"before-1"]
    run(spark, sink_args(gw.url, tmp_path), out=io.StringIO())  # still open: nothing new
    assert [v for _, _, v in values(spark, tmp_path)] == [b"before-0", b"before-1"]
    broker.call(c.end_txn, "t", 0, P1, commit=True)
    broker.call(c.end_txn, "t", 1, P2, commit=False)
    s = run(spark, sink_args(gw.url, tmp_path), out=io.StringIO())
    assert sorted(v for _, _, v in values(spark, tmp_path)) == sorted(
        [b"before-0", b"before-1", b"open-a", b"after-0", b"after-1"])
    assert s["rows"] == 3


def test_interval_trigger_picks_up_new_records(broker: ThreadedCluster, gw: GatewayProcess, spark: Any,
                                               tmp_path: Path) -> None:
    from sink.cli import start_query

    c = broker.cluster
    broker.call(plain, c, 0, [b"first-%d" % i for i in range(5)])
    args = sink_args(gw.url, tmp_path, "--trigger", "interval=1s")
    q = start_query(spark, args)
    try:
        q.processAllAvailable()  # waits for the triggers that take what is there now
        assert [v for _, _, v in values(spark, tmp_path)] == [b"first-%d" % i for i in range(5)]
        broker.call(plain, c, 1, [b"second-%d" % i for i in range(4)])
        broker.call(c.append_txn, "t", 0, [b"txn-0", b"txn-1"], producer_id=P1)
        broker.call(c.end_txn, "t", 0, P1, commit=True)
        q.processAllAvailable()
        got = values(spark, tmp_path)
        assert sorted(v for _, _, v in got) == sorted(
            [b"first-%d" % i for i in range(5)] + [b"second-%d" % i for i in range(4)] + [b"txn-0", b"txn-1"])
        assert q.isActive and q.exception() is None
    finally:
        q.stop()


KEY_A = "key-of-sink-tenant-a"


def test_a_tenant_without_access_gets_a_clear_error(broker: ThreadedCluster, spark: Any, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from sink.cli import main, run

    f = tmp_path / "tenants.yaml"
    f.write_text(f"""
version: 1
tenants:
  - id: tenant-a
    api_keys: ["sha256:{hashlib.sha256(KEY_A.encode()).hexdigest()}"]
    topics: ["a-*"]
""")
    broker.call(plain, broker.cluster, 0, [b"secret"])
    with GatewayProcess(broker.cluster.bootstrap_servers, env={"GATEWAY_TENANTS_FILE": str(f)},
                        log_file=tmp_path / "gw.log") as gw:
        argv = ["--gateway", gw.url, "--topics", "t", "--table", str(tmp_path / "table"),
                "--checkpoint", str(tmp_path / "cp"), "--api-key", KEY_A]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "403" in err and "40301" in err and "'t'" in err and "tenant-a" in err, err
        assert not (tmp_path / "table").exists()
        # through Spark itself (no preflight): the query fails with the gateway's answer, nothing written
        with pytest.raises(Exception, match="40301"):
            run(spark, sink_args(gw.url, tmp_path, "--api-key", KEY_A), out=io.StringIO())
        assert values(spark, tmp_path) == []
        # a wrong key is a clear 401
        assert main([*argv[:-1], "wrong-key"]) == 1
        assert "401" in capsys.readouterr().err


def page_bytes_estimate(n: int) -> int:
    return n * 140  # Arrow: ~100 B value + ~10 B key + offset, timestamp, list offsets


@pytest.mark.parametrize("then", ["down", "pass"])
def test_gateway_going_away_mid_batch(broker: ThreadedCluster, gw: GatewayProcess, spark: Any, tmp_path: Path,
                                      then: str) -> None:
    """``down``: the gateway goes away in the middle of batch 1 (after batch 0 was committed and some of batch
    1's tasks wrote their files): the run fails, only batch 0 is visible, and the next run reads batch 1 again
    and completes exactly. ``pass``: it comes back at once: the page is asked again inside the task and the
    run completes exactly."""
    from sink.cli import run

    want: list[bytes] = []
    seen = 0
    for p in (0, 1):
        for b in range(10):
            vs = [b"v-%d-%03d-" % (p, b * 100 + i) + b"x" * 90 for i in range(100)]
            broker.call(plain, broker.cluster, p, vs)
            want += vs
    proxy = CuttingProxy(gw.port)
    try:
        args = sink_args(proxy.url, tmp_path, "--max-records-per-trigger", "1000", "--max-offsets-per-task", "125")
        # batch 0 is 1000 records; cut when about a third of batch 1 has gone through
        proxy.arm(page_bytes_estimate(1330), then)
        if then == "down":
            with pytest.raises(Exception, match="unreachable"):
                run(spark, args, out=io.StringIO())
            assert proxy.cuts == 1 and proxy.refused > 0
            got = values(spark, tmp_path)
            seen = len(got)
            assert seen == len({(p, o) for p, o, _ in got}) and seen % 1000 == 0 and 0 < seen < len(want), seen
            for p in (0, 1):  # whole batches: a contiguous prefix of each partition
                offs = sorted(o for q, o, _ in got if q == p)
                assert offs == list(range(len(offs)))
            proxy.restore()
        s = run(spark, args, out=io.StringIO())
        assert proxy.cuts == 1
        got = values(spark, tmp_path)
        assert sorted(v for _, _, v in got) == sorted(want) and len({(p, o) for p, o, _ in got}) == len(want)
        assert s["rows"] == (len(want) - seen if then == "down" else len(want))
    finally:
        proxy.close()
