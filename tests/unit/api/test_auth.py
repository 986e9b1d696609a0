"""api.auth.current_tenant and tenant_error_handler on a throwaway FastAPI app (httpx TestClient)."""

from __future__ import annotations

import logging

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from api.auth import current_tenant, tenant_error_handler
from service.client.connection import ConnectionConfig
from service.tenants import Quotas, Tenant, TenantError, TenantRegistry, hash_api_key

KEY_A = "api-key-for-tenant-a-1234"
KEY_B = "api-key-for-tenant-b-5678"


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def make_app(registry: TenantRegistry) -> FastAPI:
    app = FastAPI()
    app.state.tenants = registry
    app.add_exception_handler(TenantError, tenant_error_handler)

    @app.get("/whoami")
    async def whoami(tenant: Tenant = Depends(current_tenant)) -> dict[str, str]:
        return {"tenant": tenant.id}

    @app.get("/topics/{topic}")
    async def topic(topic: str, tenant: Tenant = Depends(current_tenant)) -> dict[str, str]:
        tenant.require_topic(topic)
        return {"topic": topic}

    return app


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(clock: FakeClock) -> TestClient:
    conn = ConnectionConfig()
    tenants = {
        "a": Tenant("a", "k:9092", conn, Quotas(requests_per_second=1, burst=2), topics=["a.*"], clock=clock),
        "b": Tenant("b", "k:9092", conn, clock=clock),
    }
    registry = TenantRegistry(tenants, api_keys=[(hash_api_key(KEY_A), "a"), (hash_api_key(KEY_B), "b")])
    return TestClient(make_app(registry))


def test_authenticated_requests(client: TestClient) -> None:
    r = client.get("/whoami", headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 200 and r.json() == {"tenant": "a"}
    r = client.get("/whoami", headers={"X-API-Key": KEY_B})
    assert r.status_code == 200 and r.json() == {"tenant": "b"}


def test_unauthenticated(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    r = client.get("/whoami")
    assert r.status_code == 401
    assert r.json()["error_code"] == 40101
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = client.get("/whoami", headers={"X-API-Key": "not-the-key-9876"})
    assert r.status_code == 401
    assert r.json() == {"error_code": 40101, "message": "invalid API key"}
    assert "not-the-key-9876" not in r.text and "not-the-key-9876" not in caplog.text


def test_rate_limit_and_forbidden_topic(client: TestClient, clock: FakeClock) -> None:
    headers = {"X-API-Key": KEY_A}
    assert client.get("/topics/a.x", headers=headers).status_code == 200
    r = client.get("/topics/b.x", headers=headers)
    assert r.status_code == 403 and r.json()["error_code"] == 40301
    r = client.get("/whoami", headers=headers)  # burst of 2 used up
    assert r.status_code == 429
    assert r.json()["error_code"] == 42901
    assert r.headers["retry-after"] == "1"
    # Tenant b has no limit and is unaffected.
    assert client.get("/whoami", headers={"X-API-Key": KEY_B}).status_code == 200
    clock.now += 1.0
    assert client.get("/whoami", headers=headers).status_code == 200


def test_single_default_needs_no_credentials() -> None:
    registry = TenantRegistry.single_default(bootstrap="k:9092", connection=ConnectionConfig())
    client = TestClient(make_app(registry))
    r = client.get("/whoami")
    assert r.status_code == 200 and r.json() == {"tenant": "default"}
