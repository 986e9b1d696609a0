"""Readiness with tenants on separate clusters (GATEWAY_READYZ_TENANTS): by default one tenant whose brokers fail
makes the replica not ready; with ``any`` the replica stays ready while another tenant's brokers answer, and the
failing tenants are listed (status ``degraded``) -- black-box against a gateway process."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from service.metrics import brokers_ready
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

ADMIN = "admin-token-for-readyz-tenants-1"
KEY_UP, KEY_DOWN = "readyz-key-of-the-up-tenant-1", "readyz-key-of-the-down-tenant-2"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gateways(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GatewayProcess]]:
    d = tmp_path_factory.mktemp("readyz")
    f = Path(d) / "tenants.yaml"
    f.write_text(f"""
version: 1
tenants:
  - id: up
    api_keys: ["{sha(KEY_UP)}"]
  - id: down
    api_keys: ["{sha(KEY_DOWN)}"]
    kafka:
      bootstrap: "127.0.0.1:{closed_port()}"
""")
    env = {"GATEWAY_TENANTS_FILE": str(f), "GATEWAY_ADMIN_TOKEN": ADMIN, "GATEWAY_READYZ_CACHE_S": "0"}
    with GatewayProcess(tansu.bootstrap, log_file=d / "all.log", env=env) as every, \
            GatewayProcess(tansu.bootstrap, log_file=d / "any.log",
                           env={**env, "GATEWAY_READYZ_TENANTS": "any"}) as one:
        yield {"all": every, "any": one}


def probed_metrics(url: str) -> str:
    """/metrics once the background broker probe its scrapes start has completed (kcg_ready present)."""
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).text
        if "\nkcg_ready " in text or time.monotonic() > deadline:
            return text
        time.sleep(0.1)  # the probe runs in another process


def test_one_failing_tenant_makes_the_replica_unready_by_default(gateways: dict[str, GatewayProcess]) -> None:
    url = gateways["all"].url
    r = httpx.get(f"{url}/readyz", timeout=30)
    assert r.status_code == 503 and r.json() == {"status": "unavailable"}, r.text
    r = httpx.get(f"{url}/readyz", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert r.status_code == 503 and set(r.json()["tenants"]) == {"down"}, r.text
    metrics = probed_metrics(url)
    assert 'kcg_broker_reachable{tenant="down"} 0.0' in metrics and "kcg_ready 0.0" in metrics, metrics[-2000:]


def test_with_any_the_replica_stays_ready_and_names_the_failing_tenant(gateways: dict[str, GatewayProcess]) -> None:
    url = gateways["any"].url
    r = httpx.get(f"{url}/readyz", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "degraded"}, r.text  # no tenant names without the token
    r = httpx.get(f"{url}/readyz", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "degraded", r.text
    assert body["tenants"] == ["down", "up"] and set(body["failing"]) == {"down"} and body["brokers"] == {"up": 1}
    # the working tenant is served; the failing one gets its own 503
    h = {"Content-Type": "application/vnd.kafka.v2+json"}
    assert httpx.get(f"{url}/topics", headers={**h, "Authorization": f"Bearer {KEY_UP}"}, timeout=30).status_code == 200
    r = httpx.get(f"{url}/topics", headers={**h, "Authorization": f"Bearer {KEY_DOWN}"}, timeout=30)
    assert r.status_code == 503 and r.json()["error_code"] == 50302, r.text
    # the metric follows the same rule once a scrape's background probe completed
    metrics = probed_metrics(url)
    assert 'kcg_broker_reachable{tenant="down"} 0.0' in metrics and "kcg_ready 1.0" in metrics, metrics[-2000:]


def test_the_rule() -> None:
    assert brokers_ready({}, "all") and brokers_ready({}, "any")
    assert brokers_ready({"a": True, "b": True}, "all") and not brokers_ready({"a": True, "b": False}, "all")
    assert brokers_ready({"a": True, "b": False}, "any") and not brokers_ready({"a": False, "b": False}, "any")
