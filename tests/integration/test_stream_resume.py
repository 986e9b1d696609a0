"""Resumable streams on Tansu through a real gateway process: a client reads part of an SSE / ndjson stream,
drops the connection, reconnects with the last resume token and gets exactly the rest (no gap, no record
twice past the token); altered, foreign and other-process tokens are refused with 400/40004 before streaming;
a token naming partitions the instance lost in a rebalance says which ones it skipped."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
H = {"Content-Type": V2}
SSE = {"Accept": "text/event-stream"}
NDJSON = {"Accept": "application/x-ndjson"}
Rec = tuple[int, int]  # (partition, offset)


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_RESUME_KEY": "resume-test-key"},
                        log_file=tmp_path_factory.mktemp(f"gw-{broker.name}") / "gateway.log") as g:
        yield g


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=i % partitions)
    assert p.flush(30) == 0


async def instance(http: httpx.AsyncClient, group: str, topic: str, name: str | None = None,
                   commit: bool = True) -> str:
    body: dict[str, object] = {"format": "binary", "auto.offset.reset": "earliest"}
    if not commit:
        body["auto.commit.enable"] = "false"
    if name:
        body["name"] = name
    r = await http.post(f"/consumers/{group}", json=body, headers=H)
    assert r.status_code == 200, r.text
    base = "/consumers/" + r.json()["base_uri"].split("/consumers/", 1)[1]
    r = await http.post(f"{base}/subscription", json={"topics": [topic]}, headers=H)
    assert r.status_code == 204, r.text
    return base


async def sse_events(resp: httpx.Response) -> AsyncIterator[tuple[str | None, dict[str, object] | None, str]]:
    """(id, data, comment) per SSE block."""
    ident: str | None = None
    data: dict[str, object] | None = None
    comment = ""
    async for line in resp.aiter_lines():
        if line == "":
            if ident is not None or data is not None or comment:
                yield ident, data, comment
            ident, data, comment = None, None, ""
        elif line.startswith("id: "):
            ident = line[4:]
        elif line.startswith("data: "):
            data = orjson.loads(line[6:])
        elif line.startswith(":"):
            comment = line


async def read_sse(http: httpx.AsyncClient, base: str, want: int, headers: dict[str, str] | None = None,
                   params: dict[str, str | int] | None = None, timeout: float = 30.0
                   ) -> tuple[list[Rec], str | None, httpx.Headers, list[str]]:
    """Read until ``want`` record events were processed (each one's id kept), then drop the connection."""
    got: list[Rec] = []
    last: str | None = None
    comments: list[str] = []
    deadline = time.monotonic() + timeout
    async with http.stream("GET", f"{base}/records", headers={**SSE, **(headers or {})},
                           params={"max_records": 7, **(params or {})}) as resp:
        assert resp.status_code == 200, (await resp.aread()).decode()
        async for ident, data, comment in sse_events(resp):
            assert time.monotonic() < deadline, f"only {len(got)} of {want} records"
            if comment and "keep-alive" not in comment:
                comments.append(comment)
            if data is None:
                continue
            assert "error_code" not in data, data
            assert ident, "an event without a resume id"
            got.append((int(data["partition"]), int(data["offset"])))  # type: ignore[call-overload]
            last = ident
            if len(got) >= want:
                break
        return got, last, resp.headers, comments


async def read_ndjson(http: httpx.AsyncClient, base: str, want: int, params: dict[str, str | int] | None = None,
                      timeout: float = 30.0) -> tuple[list[Rec], str | None, int]:
    """Read at least ``want`` lines, then drop the connection; only records up to the last line with a
    "resume" token count as processed. Returns those, the token, and how many lines were read."""
    processed: list[Rec] = []
    pending: list[Rec] = []
    token: str | None = None
    lines = 0
    deadline = time.monotonic() + timeout
    async with http.stream("GET", f"{base}/records", headers=NDJSON,
                           params={"max_records": 7, **(params or {})}) as resp:
        assert resp.status_code == 200, (await resp.aread()).decode()
        async for line in resp.aiter_lines():
            assert time.monotonic() < deadline, f"only {lines} of {want} lines"
            if not line:
                continue
            rec = orjson.loads(line)
            assert "error_code" not in rec, rec
            lines += 1
            pending.append((rec["partition"], rec["offset"]))
            if "resume" in rec:
                processed += pending
                pending = []
                token = rec["resume"]
            if lines >= want and token is not None:
                break
    return processed, token, lines


def assert_exactly(all_records: list[Rec], n: int, partitions: int) -> None:
    assert len(all_records) == len(set(all_records)), "a record delivered twice past the token"
    expect = {(p, o) for p in range(partitions) for o in range(n // partitions)}
    assert set(all_records) == expect, f"missing {sorted(expect - set(all_records))[:10]}"


async def test_sse_reconnect_with_last_event_id_has_no_gap_and_no_duplicate(
        broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    n, parts = 300, 3
    await bclient.create_topics({topic_name: parts})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, n, parts)
    base = await instance(http, "resume-sse", topic_name)
    first, last_id, _, _ = await read_sse(http, base, 40)
    assert len(first) == 40 and last_id
    # the browser way: Last-Event-ID on the URL of the first request; a stale ?resume= loses to the header
    stale = None
    rest, _, headers, comments = await read_sse(http, base, n - 40, headers={"Last-Event-ID": last_id},
                                               params={"resume": stale or last_id})
    assert "x-resume-skipped" not in headers and not comments
    assert_exactly(first + rest, n, parts)
    # once more from a token in the middle: the events after it come again, exactly once each
    again, _, _, _ = await read_sse(http, base, 1, headers={"Last-Event-ID": last_id})
    assert again[0] in rest[: parts * 7 + 1]


async def test_ndjson_reconnect_with_resume_param_has_no_gap_and_no_duplicate(
        broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    n, parts = 300, 3
    await bclient.create_topics({topic_name: parts})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, n, parts)
    base = await instance(http, "resume-ndjson", topic_name)
    first, token, lines = await read_ndjson(http, base, 30)
    assert token and 0 < len(first) <= lines
    rest: list[Rec] = []
    while len(first) + len(rest) < n:  # several cuts in a row, each resumed from the last token
        more, token, _ = await read_ndjson(http, base, min(45, n - len(first) - len(rest)), params={"resume": token})
        assert token and more
        rest += more
    assert_exactly(first + rest, n, parts)


async def test_altered_foreign_and_garbage_tokens_are_400_40004_before_streaming(
        broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 20, 2)
    base = await instance(http, "resume-bad", topic_name)
    _, token, _, _ = await read_sse(http, base, 3)
    assert token
    other = await instance(http, "resume-bad-other", topic_name)
    head, mac, place = token.split(".")
    flipped = mac[:-3] + ("A" if mac[-3] != "A" else "B") + mac[-2:]
    cases = [({"Last-Event-ID": f"{head}.{flipped}.{place}"}, None, base), ({}, {"resume": "garbage"}, base),
             ({}, {"resume": token}, other),  # another instance (and group)
             ({"Accept": "application/x-ndjson", "Last-Event-ID": "x.y"}, None, base)]
    for headers, params, url in cases:
        r = await http.get(f"{url}/records", headers={**SSE, **headers}, params=params)
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/")
        body = r.json()
        assert body["error_code"] == 40004 and "resume token" in body["message"], body
    # the instance still streams afterwards (the refused requests moved nothing)
    ok, _, _, _ = await read_sse(http, base, 1, headers={"Last-Event-ID": token})
    assert len(ok) == 1


async def test_token_of_another_process_without_a_key_is_refused_cleanly(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    """Open mode with neither GATEWAY_RESUME_KEY nor GATEWAY_PEER_TOKEN: a random key per process, so the
    token of one process is a clean 400 at another (as after a restart), never a 500."""
    await bclient.create_topics({topic_name: 1})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 10, 1)
    with GatewayProcess(broker.bootstrap) as a, GatewayProcess(broker.bootstrap) as b:
        async with httpx.AsyncClient(base_url=a.url, timeout=60) as ha, \
                httpx.AsyncClient(base_url=b.url, timeout=60) as hb:
            base_a = await instance(ha, "resume-proc-a", topic_name, name="c1")
            _, token, _, _ = await read_sse(ha, base_a, 2)
            assert token
            base_b = await instance(hb, "resume-proc-a", topic_name, name="c1")
            assert base_b == base_a  # the same tenant, group and instance id: only the key differs
            r = await hb.get(f"{base_b}/records", headers={**SSE, "Last-Event-ID": token})
            assert r.status_code == 400 and r.json()["error_code"] == 40004, r.text


async def test_partitions_lost_in_a_rebalance_are_skipped_and_named(
        broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    n, parts = 120, 4
    await bclient.create_topics({topic_name: parts})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, n, parts)
    group = "resume-rebalance"
    one = await instance(http, group, topic_name)
    first, token, _, _ = await read_sse(http, one, 10)
    assert token
    two = await instance(http, group, topic_name)
    # the second member joins; both get a share of the four partitions
    mine: set[int] = set()
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "no rebalance"
        r = await http.get(f"{two}/records", params={"timeout": 500, "max_records": 1}, headers={
            "Accept": "application/vnd.kafka.binary.v2+json"})
        assert r.status_code == 200, r.text
        a1 = (await http.get(f"{one}/assignments", headers=H)).json()["partitions"]
        a2 = (await http.get(f"{two}/assignments", headers=H)).json()["partitions"]
        if a1 and a2 and len(a1) + len(a2) == parts:
            mine = {p["partition"] for p in a1}
            break
    lost = sorted(set(range(parts)) - mine)
    got, _, headers, comments = await read_sse(http, one, 3, headers={"Last-Event-ID": token})
    assert headers["x-resume-skipped"] == ",".join(f"{topic_name}:{p}" for p in lost)
    assert comments and all(f"{topic_name}:{p}" in comments[0] for p in lost)
    assert got and {p for p, _ in got} <= mine
    # the kept partitions continue right after the token: the first record of each is the next one
    resumed_from = {p: o for p, o in reversed(got)}
    done = {p: max((o for q, o in first if q == p), default=-1) for p in mine}
    for p, o in resumed_from.items():
        assert o == done[p] + 1, (p, o, done)


@pytest.mark.timeout(180)
async def test_reconnect_after_kill_9_of_the_owner_with_durable_instances(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, tmp_path: Path) -> None:
    """The stream is cut by kill -9 of its gateway; the restarted one re-creates the instance from its
    descriptor (positions from the committed offsets: none here) and the token brings it to exactly where
    the client stopped: the rest arrives with no gap and nothing twice, in SSE and in ndjson."""
    n, parts = 150, 3
    await bclient.create_topics({topic_name: parts})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, n, parts)
    env = {"GATEWAY_DURABLE_INSTANCES": "true", "GATEWAY_STATIC_MEMBERSHIP": "true",
           "GATEWAY_RESUME_KEY": "resume-test-key", "GATEWAY_LOG_LEVEL": "info"}
    suffix = uuid.uuid4().hex[:6]
    g1 = GatewayProcess(broker.bootstrap, env=env, log_file=tmp_path / "gw.log")
    g1.start()
    try:
        async with httpx.AsyncClient(base_url=g1.url, timeout=60) as h:
            sse_base = await instance(h, f"resume-kill-sse-{suffix}", topic_name, name="c1", commit=False)
            nd_base = await instance(h, f"resume-kill-nd-{suffix}", topic_name, name="c1", commit=False)
            first_sse, last_id, _, _ = await read_sse(h, sse_base, 40)
            first_nd, token, _ = await read_ndjson(h, nd_base, 40)
            assert last_id and token
            # a stream open at the kill: the client had processed up to last_id
            async with h.stream("GET", f"{sse_base}/records", headers={**SSE, "Last-Event-ID": last_id},
                                params={"max_records": 7}) as resp:
                assert resp.status_code == 200
                g1.kill()
                with pytest.raises(httpx.HTTPError):
                    async for _ in resp.aiter_lines():
                        pass
    finally:
        g1.kill()
    g2 = GatewayProcess(broker.bootstrap, env=env, log_file=tmp_path / "gw.log")
    g2.start()
    try:
        async with httpx.AsyncClient(base_url=g2.url, timeout=60) as h:
            rest_sse, _, _, _ = await read_sse(h, sse_base, n - 40, headers={"Last-Event-ID": last_id})
            assert_exactly(first_sse + rest_sse, n, parts)
            rest_nd: list[Rec] = []
            while len(first_nd) + len(rest_nd) < n:
                more, token, _ = await read_ndjson(h, nd_base, min(45, n - len(first_nd) - len(rest_nd)),
                                                   params={"resume": token or ""})
                rest_nd += more
            assert_exactly(first_nd + rest_nd, n, parts)
    finally:
        g2.stop()
    assert "re-created consumer instance c1" in (tmp_path / "gw.log").read_text()


async def test_a_resume_ends_the_older_stream_of_the_instance(
        broker: AnyBroker, bclient: KafkaClient, http: httpx.AsyncClient, topic_name: str) -> None:
    """A cut the server has not noticed (a half-open connection): the old stream would go on taking records
    into a socket nobody reads. The resume takes the instance over: the old stream ends at its next poll,
    and the new one has exactly the rest."""
    n, parts = 200, 2
    await bclient.create_topics({topic_name: parts})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, n, parts)
    base = await instance(http, "resume-takeover", topic_name)
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=60) as old_client, \
            old_client.stream("GET", f"{base}/records", headers=SSE, params={"max_records": 5}) as old:
        assert old.status_code == 200
        first: list[Rec] = []
        last_id = None
        events = sse_events(old)
        async for ident, data, _ in events:
            if data is not None:
                first.append((int(data["partition"]), int(data["offset"])))  # type: ignore[call-overload]
                last_id = ident
                if len(first) == 25:
                    break
        assert last_id
        rest, _, _, _ = await read_sse(http, base, n - 25, headers={"Last-Event-ID": last_id})
        assert_exactly(first + rest, n, parts)

        async def drain() -> int:
            return sum([1 async for _ in events])

        await asyncio.wait_for(drain(), 15)  # the old stream's body ended: it was taken over
