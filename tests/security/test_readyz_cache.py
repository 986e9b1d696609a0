"""Anonymous /readyz probes cannot make the gateway call the brokers at their rate.

A gateway process runs against the protocol-level test broker (in a thread of this process), whose request
log counts the Metadata requests: a burst of concurrent and back-to-back probes within one cache window
costs at most one broker check, and the next window gets a fresh one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from service.protocol import messages as M
from tests.fakes.broker.cluster import TestCluster
from tests.integration.gateway_proc import GatewayProcess

CACHE_S = 2.0


class BrokerThread:
    """A TestCluster served by its own event loop in a thread (the gateway process is its client)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-broker", daemon=True)
        self.cluster = TestCluster(topics={"t": 1})

    def __enter__(self) -> BrokerThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.cluster.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.cluster.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def metadata_requests(self) -> int:
        async def count() -> int:
            return len(self.cluster.requests(M.ApiKey.METADATA))

        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(10)


@pytest.fixture
def broker_and_gw(tmp_path: Path) -> Iterator[tuple[BrokerThread, GatewayProcess]]:
    with BrokerThread() as broker:
        env = {"GATEWAY_READYZ_CACHE_S": str(CACHE_S)}
        with GatewayProcess(broker.cluster.bootstrap_servers, env=env, log_file=tmp_path / "gw.log") as gw:
            yield broker, gw


def _burst(url: str, concurrent: int, sequential: int) -> list[int]:
    statuses: list[int] = []
    with ThreadPoolExecutor(concurrent) as pool:
        statuses += pool.map(lambda _: httpx.get(f"{url}/readyz").status_code, range(concurrent))
    with httpx.Client() as client:
        statuses += [client.get(f"{url}/readyz").status_code for _ in range(sequential)]
    return statuses


def test_readyz_burst_costs_one_broker_check_per_cache_window(
        broker_and_gw: tuple[BrokerThread, GatewayProcess]) -> None:
    broker, gw = broker_and_gw
    before = broker.metadata_requests()
    start = time.monotonic()
    statuses = _burst(gw.url, concurrent=20, sequential=40)
    elapsed = time.monotonic() - start
    assert statuses == [200] * 60
    checks = broker.metadata_requests() - before
    # one check, plus one per further window the burst spanned (it normally fits in one)
    assert 1 <= checks <= 1 + int(elapsed // CACHE_S), (checks, elapsed)

    # once the window has passed, the next probe checks the brokers again
    time.sleep(CACHE_S + 0.2)  # waiting is the behaviour under test: the cache expiry
    before = broker.metadata_requests()
    assert httpx.get(f"{gw.url}/readyz").json() == {"status": "ready", "tenants": ["default"],
                                                    "brokers": {"default": 1}}
    assert broker.metadata_requests() - before == 1
