"""GET /topics/{t}/partitions/{p}/records (stateless offset-range reads), black-box: a real gateway process
with a tenants file over Tansu, driven with httpx. Plain records (keys, headers, paging with gaps), JSON and
Arrow agreeing, committed transactions (confluent-kafka's transactional producer), an open transaction
holding reads at the LSO until it commits, and every error."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_topics_tansu import open_transaction

pytestmark = pytest.mark.integration
BINARY = "application/vnd.kafka.binary.v2+json"
JSONFMT = "application/vnd.kafka.json.v2+json"
ARROW = "application/vnd.apache.arrow.stream"
V2 = "application/vnd.kafka.v2+json"
KEY_ALL, KEY_TA = "key-ranges-all-0001", "key-ranges-ta-0002"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: everything
    api_keys: ["{sha(KEY_ALL)}"]
  - id: ta
    api_keys: ["{sha(KEY_TA)}"]
    topics: ["ta-*"]
"""
H = {"Authorization": f"Bearer {KEY_ALL}"}


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("ranges")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(f)}, log_file=d / "gw.log") as g:
        yield g



def produce(bootstrap: str, topic: str, rows: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]],
            config: dict[str, Any] | None = None, commit: bool = False) -> list[int]:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 50, **(config or {})})
    if commit:
        p.init_transactions(30)
        p.begin_transaction()
    offsets: list[int] = []
    for k, v, h in rows:
        p.produce(topic, key=k, value=v, partition=0, headers=h or None,
                  on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None else None)
    assert p.flush(30) == 0
    if commit:
        p.commit_transaction(30)
    return offsets


async def read_all(http: httpx.AsyncClient, topic: str, offset: int = 0, accept: str = BINARY,
                   **params: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Loop pages until next_offset >= end_offset; (records, page summaries)."""
    out: list[dict[str, Any]] = []
    pages: list[dict[str, Any]] = []
    while True:
        r = await http.get(f"/topics/{topic}/partitions/0/records", params={"offset": offset, **params},
                           headers={**H, "Accept": accept})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == accept
        body = r.json()
        assert int(r.headers["X-Next-Offset"]) == body["next_offset"]
        assert int(r.headers["X-End-Offset"]) == body["end_offset"]
        out += body["records"]
        pages.append({k: v for k, v in body.items() if k != "records"} | {"n": len(body["records"])})
        assert body["next_offset"] >= offset
        offset = body["next_offset"]
        if offset >= body["end_offset"]:
            return out, pages


async def read_all_arrow(http: httpx.AsyncClient, topic: str, offset: int = 0, **params: Any) -> pa.Table:
    tables = []
    while True:
        r = await http.get(f"/topics/{topic}/partitions/0/records", params={"offset": offset, **params},
                           headers={**H, "Accept": ARROW})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == ARROW
        reader = pa.ipc.open_stream(r.content)
        tables.append(reader.read_all())
        meta = reader.schema.metadata
        assert int(meta[b"next_offset"]) == int(r.headers["X-Next-Offset"])
        offset = int(meta[b"next_offset"])
        if offset >= int(meta[b"end_offset"]):
            return pa.concat_tables(tables)


def b64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


async def test_plain_records_paged_in_json_and_arrow(broker: AnyBroker, http: httpx.AsyncClient,
                                                     bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    rows = [(b"k%d" % i if i % 3 else None, b"value-%04d" % i, [("h", b"%d" % i)] if i % 5 == 0 else [])
            for i in range(300)]
    assert await asyncio.to_thread(produce, broker.bootstrap, topic_name, rows) == list(range(300))
    records, pages = await read_all(http, topic_name, max_bytes=500)
    assert [r["offset"] for r in records] == list(range(300))
    assert len(pages) > 5 and all(p["end_offset"] == 300 for p in pages)
    for r, (k, v, h) in zip(records, rows, strict=True):
        assert (r["topic"], r["partition"], r["key"], r["value"]) == (topic_name, 0, b64(k), b64(v))
        assert r["headers"] == [{"key": hk, "value": b64(hv)} for hk, hv in h]
        assert r["timestamp"] > 0
    table = await read_all_arrow(http, topic_name, max_bytes=500)
    assert table.column("offset").to_pylist() == list(range(300))
    assert table.column("key").to_pylist() == [k for k, _, _ in rows]
    assert table.column("value").to_pylist() == [v for _, v, _ in rows]
    assert table.column("headers").to_pylist() == [[{"key": hk, "value": hv} for hk, hv in h] for *_, h in rows]
    assert set(table.column("topic").to_pylist()) == {topic_name}
    assert set(table.column("partition").to_pylist()) == {0}
    assert [int(t.timestamp() * 1000) for t in table.column("timestamp").to_pylist()] == [
        r["timestamp"] for r in records]
    # a sub-range, read_uncommitted, embedded JSON
    sub, _ = await read_all(http, topic_name, offset=100, accept=JSONFMT, end_offset=110,
                            isolation_level="read_uncommitted")
    assert [r["offset"] for r in sub] == list(range(100, 110))
    assert sub[0]["value"] is None and sub[0]["value_base64"] == b64(rows[100][1])  # not JSON text
    # at the end: an empty page that says so
    r = await http.get(f"/topics/{topic_name}/partitions/0/records?offset=300", headers=H)
    assert r.json() == {"topic": topic_name, "partition": 0, "offset": 300, "records": [], "next_offset": 300,
                        "end_offset": 300, "high_watermark": 300, "last_stable_offset": 300,
                        "log_start_offset": 0}


async def test_committed_transactions_and_an_open_one(broker: AnyBroker, http: httpx.AsyncClient,
                                                      bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    txn = {"transactional.id": f"txn-{topic_name}-a"}
    first = await asyncio.to_thread(produce, broker.bootstrap, topic_name, [(None, b"c%d" % i, []) for i in range(5)],
                                    txn, True)
    second = await asyncio.to_thread(produce, broker.bootstrap, topic_name,
                                     [(None, b"d%d" % i, []) for i in range(5)], txn, True)
    assert second[0] > first[-1] + 1  # the COMMIT marker takes an offset: a gap
    records, pages = await read_all(http, topic_name, max_bytes=30)
    assert [base64.b64decode(r["value"]) for r in records] == [b"c%d" % i for i in range(5)] + [
        b"d%d" % i for i in range(5)]
    assert [r["offset"] for r in records] == first + second
    end = pages[-1]["end_offset"]
    assert end > second[-1]  # the trailing marker is inside the range: next_offset reaches the end
    # an open transaction: nothing at or past the LSO, even with an explicit end_offset past it
    with open_transaction(broker.bootstrap, topic_name, 3, f"txn-{topic_name}-b") as open_txn:
        after = await asyncio.to_thread(produce, broker.bootstrap, topic_name, [(None, b"after", [])])
        r = await http.get(f"/topics/{topic_name}/partitions/0/records",
                           params={"offset": end, "end_offset": after[0] + 1}, headers=H)
        body = r.json()
        assert body["records"] == [] and body["next_offset"] == body["end_offset"] == body["last_stable_offset"] == end
        assert body["high_watermark"] == after[0] + 1
        uncommitted, _ = await read_all(http, topic_name, offset=end, isolation_level="read_uncommitted")
        assert [base64.b64decode(r["value"]) for r in uncommitted] == [b"t0", b"t1", b"t2", b"after"]
        await asyncio.to_thread(open_txn.commit_transaction, 30)
    records, _ = await read_all(http, topic_name, offset=end)
    assert [base64.b64decode(r["value"]) for r in records] == [b"t0", b"t1", b"t2", b"after"]


def err(r: httpx.Response, status: int, code: int) -> None:
    assert (r.status_code, r.json()["error_code"]) == (status, code), r.text
    assert r.headers["content-type"] == V2


async def test_errors(broker: AnyBroker, http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2, f"ta-{topic_name}": 1})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, [(None, b"x", [])] * 3)
    url = f"/topics/{topic_name}/partitions/0/records"
    err(await http.get(f"/topics/{topic_name}-missing/partitions/0/records?offset=0", headers=H), 404, 40401)
    for p in (2, -1):
        err(await http.get(f"/topics/{topic_name}/partitions/{p}/records?offset=0", headers=H), 404, 40402)
    r = await http.get(url, params={"offset": 4}, headers=H)
    err(r, 422, 42207)
    assert (r.headers["X-Log-Start-Offset"], r.headers["X-High-Watermark"]) == ("0", "3")
    assert "out of range" in r.json()["message"]
    r = await http.get(url, params={"offset": 2, "end_offset": 1}, headers=H)  # an empty range
    assert r.status_code == 200 and r.json()["records"] == [] and r.json()["next_offset"] >= r.json()["end_offset"]
    for bad in ({}, {"offset": -1}, {"offset": "x"}, {"offset": 0, "isolation_level": "dirty"},
                {"offset": 0, "max_bytes": 0}, {"offset": 0, "end_offset": -5}):
        r = await http.get(url, params=bad, headers=H)
        assert r.status_code == 422, (bad, r.text)
    err(await http.get(url, params={"offset": 0}, headers={**H, "Accept": "text/csv"}), 406, 40601)
    # tenants: authentication, topic patterns (forbidden whether the topic exists or not)
    err(await http.get(url, params={"offset": 0}), 401, 40101)
    ta = {"Authorization": f"Bearer {KEY_TA}"}
    err(await http.get(url, params={"offset": 0}, headers=ta), 403, 40301)
    err(await http.get("/topics/nope/partitions/0/records", params={"offset": 0}, headers=ta), 403, 40301)
    r = await http.get(f"/topics/ta-{topic_name}/partitions/0/records", params={"offset": 0}, headers=ta)
    assert r.status_code == 200 and r.json()["records"] == []
    # offset 0 of an empty partition is the end, not out of range
    r = await http.get(f"/topics/{topic_name}/partitions/1/records", params={"offset": 0}, headers=H)
    assert r.status_code == 200 and r.json()["next_offset"] == r.json()["end_offset"] == 0
