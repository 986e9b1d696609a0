"""``GET /`` (service name, version, links; a superset of Confluent's ``{}``), ``/docs`` and ``/openapi.json``
of the application, driven in-process (no broker is contacted by these routes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib.metadata import version

import httpx
import pytest

from api.app import create_app
from service.settings import Settings


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(), "127.0.0.1:1")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        yield c


async def test_root_names_the_service_and_links_docs_openapi_and_metrics(http: httpx.AsyncClient) -> None:
    r = await http.get("/")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body == {"service": "kafka-consumer-gateway", "version": version("kafka-consumer-gateway"),
                    "links": {"docs": "/docs", "openapi": "/openapi.json", "metrics": "/metrics"}}
    for link in body["links"].values():  # every link answers
        assert (await http.get(link)).status_code == 200, link


async def test_docs_page_loads_the_openapi_document(http: httpx.AsyncClient) -> None:
    r = await http.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "swagger-ui" in r.text and "/openapi.json" in r.text
    spec = (await http.get("/openapi.json")).json()
    assert spec["info"]["title"] == "kafka-consumer-gateway" and "/consumers/{group}" in spec["paths"]
    assert spec["paths"]["/"]["get"]["summary"].startswith("Service name")
