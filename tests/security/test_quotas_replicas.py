"""``max_instances`` holds across the replica set, not per replica. Two real gateway replicas
(peer token, a tenants file): a tenant with ``max_instances: 3`` creating instances whose names hash to both
replicas gets exactly 3, then 429/42901 with Retry-After on either replica; deleting one frees one slot; a
replica killed with -9 leaks none of the tenant's slots. Another tenant is served throughout; the
``/internal/quota/*`` endpoints need the peer token."""

from __future__ import annotations

import hashlib
import itertools
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from service.ring import owner, routing_key
from tests.integration.gateway_proc import GatewayProcess, tenants_replicas

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
TOKEN = "quota-replicas-peer-token-0123456789"
PEER = {"x-kcg-peer-token": TOKEN}
V2 = "application/vnd.kafka.v2+json"
KEY_CAPPED, KEY_OTHER = "quota-replicas-key-capped-0123456789", "quota-replicas-key-other-0123456789"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: capped
    api_keys: ["{sha(KEY_CAPPED)}"]
    quotas: {{max_instances: 3}}
  - id: other
    api_keys: ["{sha(KEY_OTHER)}"]
"""


def auth(key: str) -> dict[str, str]:
    return {"X-API-Key": key, "Content-Type": V2}


def start_pair(bootstrap: str, d: Path, tenants: str = TENANTS) -> list[GatewayProcess]:
    return tenants_replicas(bootstrap, tenants, d, TOKEN)


@pytest.fixture(scope="module")
def pair(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    procs = start_pair(tansu.bootstrap, tmp_path_factory.mktemp("quota-replicas"))
    yield procs
    for p in procs:
        p.stop()


def names_on(group: str, replica: str, n: int) -> list[str]:
    """Instance names whose ring owner (where a create places them) is ``replica``."""
    found = (f"i-{i}" for i in itertools.count())
    return list(itertools.islice((x for x in found if owner(["a", "b"], routing_key(group, x)) == replica), n))


def holder(pair: list[GatewayProcess], group: str, name: str) -> list[str]:
    out = []
    for rid, p in zip("ab", pair, strict=True):
        r = httpx.get(f"{p.url}/internal/lookup", params={"group": group, "name": name}, headers=PEER)
        assert r.status_code == 200, r.text
        if r.json()["held"]:
            out.append(rid)
    return out


def create(url: str, group: str, name: str, key: str = KEY_CAPPED) -> httpx.Response:
    return httpx.post(f"{url}/consumers/{group}", json={"name": name}, headers=auth(key), timeout=30)


def assert_refused(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    assert r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1, r.text
    assert re.search(r"limit (of )?3\b", r.json()["message"]), r.text


def test_max_instances_holds_across_both_replicas(pair: list[GatewayProcess]) -> None:
    a, b = pair
    group = "g-" + uuid.uuid4().hex[:8]
    on_a, on_b = names_on(group, "a", 3), names_on(group, "b", 3)
    # three instances, on both replicas, created through either replica
    for url, name in ((a.url, on_a[0]), (a.url, on_b[0]), (b.url, on_a[1])):
        r = create(url, group, name)
        assert r.status_code == 200, r.text
    assert [holder(pair, group, n) for n in (on_a[0], on_b[0], on_a[1])] == [["a"], ["b"], ["a"]]
    # the fourth is refused whichever replica it would live on and whichever receives the create
    for url, name in ((a.url, on_b[1]), (b.url, on_b[1]), (a.url, on_a[2]), (b.url, on_a[2])):
        assert_refused(create(url, group, name))
    assert holder(pair, group, on_b[1]) == [] and holder(pair, group, on_a[2]) == []
    # another tenant is served meanwhile, on both replicas
    for name in (on_a[2], on_b[1], on_b[2]):
        r = create(b.url, group, name, KEY_OTHER)
        assert r.status_code == 200, r.text
        r = httpx.delete(f"{a.url}/consumers/{group}/instances/{name}", headers=auth(KEY_OTHER))
        assert r.status_code == 204, r.text
    # deleting one (held by b, deleted through a) frees exactly one slot
    r = httpx.delete(f"{a.url}/consumers/{group}/instances/{on_b[0]}", headers=auth(KEY_CAPPED))
    assert r.status_code == 204, r.text
    r = create(a.url, group, on_b[1])
    assert r.status_code == 200, r.text
    assert holder(pair, group, on_b[1]) == ["b"]
    assert_refused(create(b.url, group, on_a[2]))
    for name in (on_a[0], on_a[1], on_b[1]):  # leave the tenant empty for the next test
        assert httpx.delete(f"{b.url}/consumers/{group}/instances/{name}",
                            headers=auth(KEY_CAPPED)).status_code == 204
    for url in (a.url, b.url):
        r = create(url, group, "again-" + uuid.uuid4().hex[:6])
        assert r.status_code == 200, r.text


def test_internal_quota_endpoints_need_the_peer_token(pair: list[GatewayProcess]) -> None:
    a, _ = pair
    calls = [("GET", "/internal/quota/held?tenant=capped", None),
             ("POST", "/internal/quota/reserve", {"tenant": "capped", "replica": "a", "token": "x", "limit": 3}),
             ("POST", "/internal/quota/release", {"tenant": "capped", "token": "x"})]
    for method, path, body in calls:
        for headers in ({}, {"x-kcg-peer-token": "wrong"}, {"X-API-Key": KEY_CAPPED}):
            r = httpx.request(method, f"{a.url}{path}", json=body, headers=headers)
            assert r.status_code == 403 and r.json()["error_code"] == 40302, (path, headers, r.text)
    r = httpx.get(f"{a.url}/internal/quota/held", params={"tenant": "capped"}, headers=PEER)
    assert r.status_code == 200 and set(r.json()) == {"replica_id", "tokens", "pending"}, r.text


def test_a_killed_replica_leaks_no_slot(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    a, b = start_pair(tansu.bootstrap, tmp_path)
    try:
        group = "g-" + uuid.uuid4().hex[:8]
        on_a, on_b = names_on(group, "a", 4), names_on(group, "b", 3)
        for name in on_b:
            assert create(a.url, group, name).status_code == 200
        assert_refused(create(a.url, group, on_a[0]))
        b.kill()  # kill -9: its instances are gone, and so must be their slots
        deadline = time.monotonic() + 30
        while True:
            r = create(a.url, group, on_a[0])
            if r.status_code == 200:
                break
            assert_refused(r)  # until a sees b gone (probe every 0.2 s)
            assert time.monotonic() < deadline, "the killed replica's slots were never freed"
            time.sleep(0.1)  # polling a condition in another process
        for name in on_a[1:3]:
            assert create(a.url, group, name).status_code == 200
        assert_refused(create(a.url, group, on_a[3]))  # still exactly 3
    finally:
        a.stop()
        b.stop()


def test_an_owner_that_does_not_answer_fails_closed(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    """The tenant's owner of record is reachable but silent (SIGSTOP): the create is refused with 503/50306 and
    Retry-After, nothing is created; once the owner is seen gone, the remaining replica counts by itself."""
    procs = start_pair(tansu.bootstrap, tmp_path)
    by_id = dict(zip("ab", procs, strict=True))
    silent = owner(["a", "b"], routing_key("\x00quota", "capped"))
    other = "b" if silent == "a" else "a"
    group = "g-" + uuid.uuid4().hex[:8]
    names = names_on(group, other, 4)
    proc = by_id[silent].proc
    assert proc is not None
    try:
        proc.send_signal(signal.SIGSTOP)
        # without a name: created where it arrives, no lookup first (a lookup would wait out its timeout, and
        # the peer probe might meanwhile drop the silent replica from the ring)
        r = httpx.post(f"{by_id[other].url}/consumers/{group}", json={}, headers=auth(KEY_CAPPED), timeout=30)
        assert r.status_code == 503, r.text
        assert r.json()["error_code"] == 50306 and r.headers["Retry-After"] == "1", r.text
        assert "did not answer" in r.json()["message"]
        deadline = time.monotonic() + 30
        while httpx.get(f"{by_id[other].url}/internal/peers", headers=PEER).json()["placement"] != [other]:
            assert time.monotonic() < deadline
            time.sleep(0.1)  # polling a condition: the peer probe runs every 0.2 s (1 s timeout)
        # the refused create holds no slot: three more fit, the fourth does not
        for name in names[:3]:
            r = create(by_id[other].url, group, name)
            assert r.status_code == 200, r.text
        assert_refused(create(by_id[other].url, group, names[3]))
    finally:
        proc.send_signal(signal.SIGCONT)
        for p in procs:
            p.stop()
