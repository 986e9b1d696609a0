"""The protocol-level produce path (api/server/http.py ``LeanCycle`` + api/server/fastpath.py ``LeanProduceCall``)
seen from a raw HTTP/1.1 client of a real gateway process: the same answers as the full app (status, headers,
body), keep-alive, pipelining in order, ``Connection: close``, a client that goes away mid-body, and HTTP/1.0."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
BIN = b"application/vnd.kafka.binary.v2+json"


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, log_file=tmp_path_factory.mktemp(f"gw-{broker.name}") / "gateway.log") as g:
        yield g


def post(path: str, body: bytes, *extra: bytes, version: bytes = b"1.1") -> bytes:
    head = [b"POST %s HTTP/%s" % (path.encode(), version), b"Host: 127.0.0.1", b"Content-Type: " + BIN,
            b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def records(n: int, tag: bytes = b"v") -> bytes:
    return orjson.dumps({"records": [{"value": base64.b64encode(b"%s-%d" % (tag, i)).decode()} for i in range(n)]})


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        assert name.lower() not in headers, f"repeated header {name!r}"
        headers[name.lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), 30)
    return status, headers, body


async def connect(gw: GatewayProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", gw.port)


async def test_keep_alive_answers_like_the_full_app(gw: GatewayProcess, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    reader, writer = await connect(gw)
    try:
        answers = []
        # the lean path serves /topics/t; the full app serves /topics/t/ (a trailing slash is declined)
        for path in (f"/topics/{topic_name}", f"/topics/{topic_name}/", f"/topics/{topic_name}"):
            writer.write(post(path, records(3)))
            answers.append(await read_response(reader))
        (s1, h1, b1), (s2, h2, b2), (s3, _, b3) = answers
        assert s1 == s2 == s3 == 200
        assert set(h1) == set(h2) == {b"date", b"server", b"content-length", b"content-type"}
        assert h1[b"content-type"] == h2[b"content-type"] == b"application/vnd.kafka.v2+json"
        offsets = [orjson.loads(b)["offsets"] for b in (b1, b2, b3)]
        assert [len(o) for o in offsets] == [3, 3, 3]
        assert all(o["error_code"] is None for batch in offsets for o in batch)
        assert len({(o["partition"], o["offset"]) for batch in offsets for o in batch}) == 9
        # errors: the app's exception handlers' answers, the same either way
        missing = f"/topics/{topic_name}-missing"
        writer.write(post(missing, records(1)))
        lean = await read_response(reader)
        writer.write(post(missing + "/", records(1)))
        full = await read_response(reader)
        assert lean[0] == full[0] == 404 and lean[2] == full[2]
        assert orjson.loads(lean[2])["error_code"] == 40401
        assert set(lean[1]) == set(full[1])
        writer.write(post(f"/topics/{topic_name}", b'{"records": [{"value": "not base64!"}]}'))
        status, _, body = await read_response(reader)
        assert status == 422 and orjson.loads(body)["error_code"] == 42206
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order(gw: GatewayProcess, bclient: KafkaClient,
                                                        topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    reader, writer = await connect(gw)
    try:
        # three produce requests and a health probe in one write: answered in the order they were sent
        writer.write(post(f"/topics/{topic_name}/partitions/0", records(2, b"a"))
                     + post(f"/topics/{topic_name}/partitions/0", records(5, b"b"))
                     + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                     + post(f"/topics/{topic_name}/partitions/0", records(1, b"c")))
        first, second, health, third = [await read_response(reader) for _ in range(4)]
        assert [first[0], second[0], health[0], third[0]] == [200, 200, 200, 200]
        assert orjson.loads(health[2]) == {"status": "ok"}
        assert [o["offset"] for o in orjson.loads(first[2])["offsets"]] == [0, 1]
        assert [o["offset"] for o in orjson.loads(second[2])["offsets"]] == [2, 3, 4, 5, 6]
        assert [o["offset"] for o in orjson.loads(third[2])["offsets"]] == [7]
    finally:
        writer.close()


async def test_connection_close_and_http_1_0(gw: GatewayProcess, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    reader, writer = await connect(gw)
    writer.write(post(f"/topics/{topic_name}", records(2), b"Connection: close"))
    status, headers, body = await read_response(reader)
    assert status == 200 and headers[b"connection"] == b"close" and len(orjson.loads(body)["offsets"]) == 2
    assert await asyncio.wait_for(reader.read(), 30) == b""  # the gateway closed the connection
    writer.close()
    # HTTP/1.0 (no keep-alive) goes the full app's way: the same answer, then the connection closes
    reader, writer = await connect(gw)
    writer.write(post(f"/topics/{topic_name}", records(1), version=b"1.0"))
    status, headers, body = await read_response(reader)
    assert status == 200 and [o["offset"] for o in orjson.loads(body)["offsets"]] == [2]
    assert await asyncio.wait_for(reader.read(), 30) == b""
    writer.close()


async def test_a_client_gone_mid_body_produces_nothing_and_frees_its_memory(
        gw: GatewayProcess, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    for _ in range(20):
        reader, writer = await connect(gw)
        request = post(f"/topics/{topic_name}", records(50))
        writer.write(request[:-10])  # the head and most of the body
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    # nothing of those was produced, and the memory they were charged was given back: the next requests are
    # served (a leak of 20 bodies would not exhaust the default budget, so the gauge is checked too)
    reader, writer = await connect(gw)
    try:
        writer.write(post(f"/topics/{topic_name}", records(1)))
        status, _, body = await read_response(reader)
        assert status == 200 and [o["offset"] for o in orjson.loads(body)["offsets"]] == [0]
        for _ in range(100):
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _, _, metrics = await read_response(reader)
            body_lines = [line for line in metrics.split(b"\n") if line.startswith(b"kcg_memory_budget_used_bytes")
                          and b'kind="body"' in line]
            if body_lines and all(float(line.rsplit(b" ", 1)[1]) == 0 for line in body_lines):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"body memory still charged: {body_lines}")
    finally:
        writer.close()


async def test_each_request_is_charged_to_the_rate_limit_once(broker: AnyBroker, bclient: KafkaClient,
                                                              topic_name: str, tmp_path: Path) -> None:
    """The first request to a topic goes the awaited way (its metadata is fetched), the next ones are answered
    from the producer's callback: either way one token of the tenant's bucket each (burst 6: six answers, then
    429/42901), and what was answered 200 is stored once."""
    await bclient.create_topics({topic_name: 1})
    env = {"GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0.001", "GATEWAY_DEFAULT_BURST": "6"}
    with GatewayProcess(broker.bootstrap, env=env, log_file=tmp_path / "gateway.log") as g:
        reader, writer = await connect(g)
        try:
            statuses = []
            for i in range(8):
                writer.write(post(f"/topics/{topic_name}", records(1, b"r%d" % i)))
                status, _, body = await read_response(reader)
                statuses.append(status)
                if status == 200:
                    assert [o["offset"] for o in orjson.loads(body)["offsets"]] == [i]
                else:
                    assert orjson.loads(body)["error_code"] == 42901
        finally:
            writer.close()
    assert statuses == [200] * 6 + [429] * 2
