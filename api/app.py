"""The HTTP application. Until the consumer API lands it serves /healthz, /readyz and /metrics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from api.responses import OrjsonResponse
from service.client.client import KafkaClient
from service.client.errors import KafkaError
from service.metrics import GatewayMetrics
from service.settings import Settings


def create_app(settings: Settings, bootstrap: str) -> FastAPI:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    client = KafkaClient(bootstrap, settings.connection_config())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="kafka-consumer-gateway", version="0.1.0", lifespan=lifespan,
                  default_response_class=OrjsonResponse)
    app.state.settings = settings
    app.state.client = client
    app.state.metrics = metrics

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"])
    async def readyz() -> Response:
        try:
            await client.refresh_metadata()
        except KafkaError as exc:
            return OrjsonResponse({"status": "unavailable", "error_code": 50302, "message": str(exc)},
                                  status_code=503)
        return OrjsonResponse({"status": "ready", "brokers": len(client.metadata.brokers)})

    @app.get("/metrics", tags=["ops"])
    async def prom_metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
