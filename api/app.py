"""The HTTP application: Confluent-v2-compatible consumer API, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from api.auth import AuthFailureLimiter, TrustedProxies, count_wrong_secret, tenant_error_handler
from api.deps import V2, acceptable_content_type
from api.docs_ui import install_docs
from api.errors import error_response, install_error_handlers, v3_aware
from api.hosts import AllowedHosts, HostCheckMiddleware, HostGuard
from api.kafka_texts import client_text
from api.openapi import install_openapi
from api.replicas import install_routing
from api.responses import OrjsonResponse
from api.server.fastpath import LeanProduce, RecordsFastPath
from api.server.gcpolicy import GcPolicy
from api.server.http import held_send
from api.share import router as share_router
from api.v2.consumers import router as consumers_router
from api.v2.produce import router as produce_router
from api.v2.records import router as records_router
from api.v2.topics import router as topics_router
from api.v3 import router as v3_router
from service.client.client import KafkaClient
from service.client.errors import KafkaError
from service.instances.budget import BudgetExhausted, MemoryBudget
from service.instances.registry import Gateway
from service.instances.share import ShareRegistry
from service.metrics import GatewayCollector, GatewayMetrics, SchemaCacheCollector, brokers_ready, labelled
from service.protocol.records import set_max_inflated_bytes
from service.ring import TOKEN_HEADER
from service.schemas import avro_limits
from service.schemas.formats import SchemaService
from service.settings import Settings
from service.tenants import TenantError, TenantRegistry, TopicDenyList

log = logging.getLogger(__name__)

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[MutableMapping[str, Any]]],
                    Callable[[MutableMapping[str, Any]], Awaitable[None]]], Awaitable[None]]


def _budget_of(scope: MutableMapping[str, Any]) -> MemoryBudget | None:
    app = scope.get("app")
    gateway = getattr(getattr(app, "state", None), "gateway", None)
    return getattr(gateway, "budget", None)


class ObserveMiddleware:
    """Request guards (body size 413/41301, content type 415/41501) and the request-duration histogram,
    as a plain ASGI middleware: no extra task or body stream per request (BaseHTTPMiddleware has both).
    The duration is measured to the start of the response (a stream's headers)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: GatewayMetrics, memory_wait_s: float = 2.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.memory_wait_s = memory_wait_s

    async def __call__(self, scope: MutableMapping[str, Any],
                       receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
                       send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if len(path) > 1 and path.endswith("/"):
            # A trailing slash matches the route directly (Confluent does; a 307 redirect breaks clients
            # that do not follow it on POST/DELETE, and loses X-Forwarded-Prefix).
            scope = dict(scope, path=path.rstrip("/") or "/")
            raw = scope.get("raw_path")
            if raw:
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length")
        rejected: Response | None = None
        if length is not None:
            try:
                too_big = int(length) > self.max_body_bytes
            except ValueError:
                rejected = error_response(400, 40001, "invalid Content-Length header")
            else:
                if too_big:
                    rejected = error_response(413, 41301, f"request body larger than {self.max_body_bytes} bytes")
        method = scope["method"]
        if rejected is None and method in ("POST", "PUT", "PATCH", "GET") and scope["path"].startswith(
                ("/consumers/", "/share-groups/")):
            ct = headers.get("content-type", "").split(";")[0].strip().lower()
            has_body = (length not in (None, "0")) or "transfer-encoding" in headers
            if has_body and ct and not acceptable_content_type(ct):
                rejected = error_response(415, 41501, f"unsupported content type {ct!r}; use {V2} or application/json")
        if rejected is not None:
            await rejected(scope, receive, send)
            return
        started = time.perf_counter()
        observed = False

        def observe(status: int) -> None:
            nonlocal observed
            observed = True
            route = scope.get("route")
            tenant = scope.get("state", {}).get("tenant")
            labelled(self.metrics.http_seconds, tenant.id if tenant is not None else "",
                     getattr(route, "path", "unmatched"), method, str(status)).observe(time.perf_counter() - started)

        async def send_observed(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and not observed:
                observe(message["status"])
            await send(message)

        # The limit holds for the bytes actually received, also for chunked bodies without Content-Length.
        limit = self.max_body_bytes
        received = 0
        too_large = False
        started_response = False
        # Request bodies are charged to the process memory budget (service/instances/budget.py) at twice their size
        # (the bytes and what they decode to) until the request ends: a declared length before the route
        # runs (waiting GATEWAY_MEMORY_WAIT_S for room, else 503/50305), a chunked body as it arrives; a
        # stream of records (v3 produce) only for the chunk in hand.
        budget = _budget_of(scope) if method in ("POST", "PUT", "PATCH") else None
        charged = 0
        no_memory: BudgetExhausted | None = None
        if budget is not None and length is not None and length.isdigit() and int(length):
            try:
                charged = await budget.reserve(2 * int(length), "body", self.memory_wait_s)
            except BudgetExhausted as exc:
                await error_response(503, 50305, str(exc), {"Retry-After": str(exc.retry_after)})(
                    scope, receive, send_observed)
                return
        declared = charged

        async def receive_counted() -> MutableMapping[str, Any]:
            nonlocal received, too_large, charged, no_memory
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                received += size
                per_record = scope.get("state", {}).get("body_limit_per_record")
                # a route that reads a stream of records (v3 produce) caps each record instead
                if received > limit and not per_record:
                    too_large = True
                    raise HTTPException(413, f"request body larger than {limit} bytes")
                if budget is not None and size and not declared:
                    if per_record and charged:
                        budget.release(charged, "body")
                        charged = 0
                    if not budget.try_reserve(2 * size, "body"):
                        no_memory = BudgetExhausted("body", 2 * size, budget, max(1, int(self.memory_wait_s)))
                        raise no_memory
                    charged += 2 * size
            return message

        async def send_guarded(message: MutableMapping[str, Any]) -> None:
            nonlocal started_response
            if message["type"] == "http.response.start":
                started_response = True
            await send_observed(message)

        try:
            await self.app(scope, receive_counted, send_guarded)
        except Exception:
            if not (too_large or no_memory) or started_response:
                raise
            # the route let the refusal escape: answer it here
            if no_memory is not None:
                await error_response(503, 50305, str(no_memory), {"Retry-After": str(no_memory.retry_after)})(
                    scope, receive, send_guarded)
            else:
                await error_response(413, 41301, f"request body larger than {limit} bytes")(
                    scope, receive, send_guarded)
        finally:
            if charged and budget is not None:
                budget.release(charged, "body")
            if not observed:
                observe(500)


# FastAPI's native OpenTelemetry hooks (newer releases) look up the global tracer and meter providers on every
# request (~16 µs in the produce profile); the gateway's telemetry is its Prometheus metrics, so they are
# off where the installed FastAPI has them.
_NO_FRAMEWORK_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


class GatewayApp(FastAPI):
    """The FastAPI app with the lean produce path (api/server/fastpath.py ``LeanProduce``) ahead of the framework
    and the middleware stack: a plain ``POST /topics/...`` is served there, anything else as usual."""

    lean_produce: LeanProduce | None = None
    #: answers are written in pieces of at most this (GATEWAY_HTTP_MAX_UNSENT_BYTES) and held in the memory
    #: budget until they left the process (api/server/http.py ``held_send``)
    output_chunk_bytes: int = 1024 * 1024

    async def __call__(self, scope: MutableMapping[str, Any],
                       receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
                       send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "http":
            send = held_send(send, getattr(getattr(self.state, "gateway", None), "budget", None),
                             self.output_chunk_bytes)
            lean = self.lean_produce
            if lean is not None and scope["method"] == "POST" and await lean(self, scope, receive, send):
                return
        await super().__call__(scope, receive, send)

    def lean_begin(self, scope: MutableMapping[str, Any]) -> Any:
        """The protocol-level produce path's hook (api/server/http.py ``LeanCycle``): a plain produce
        request's call once its head is parsed, or None (the request then goes through ``__call__``)."""
        lean = self.lean_produce
        return lean.begin(self, scope) if lean is not None else None


def create_app(settings: Settings, bootstrap: str) -> FastAPI:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    connection = settings.connection_config()
    # the gateway's own topic (instance descriptors) is never a tenant's, whatever its name
    denied_topics = TopicDenyList.from_setting(
        ",".join(filter(None, [settings.denied_topics, settings.instances_topic])),
                                               defaults=settings.denied_topics_defaults)
    if settings.tenants_file:
        tenants = TenantRegistry.from_file(settings.tenants_file, default_bootstrap=bootstrap,
                                           default_connection=connection, denied_topics=denied_topics,
                                           default_quotas=settings.default_quotas())
    else:
        tenants = TenantRegistry.single_default(bootstrap=bootstrap, connection=connection,
                                                denied_topics=denied_topics, default_quotas=settings.default_quotas())
    gateway = Gateway(
        replica_id=settings.replica_id,
        idle_timeout=settings.instance_idle_timeout_s,
        max_poll_timeout=settings.max_poll_timeout_ms / 1000,
        prefetch_bytes=settings.prefetch_bytes_per_instance,
        memory_budget_bytes=settings.memory_budget_bytes,
        max_instances=settings.max_instances,
        shutdown_timeout=settings.shutdown_timeout_s,
        static_membership=settings.static_membership,
        durable_instances=settings.durable_instances,
        instances_topic=settings.instances_topic,
        consumer_defaults={
            "session_timeout_ms": settings.session_timeout_ms(),
            "heartbeat_interval_ms": settings.heartbeat_interval_ms(),
            "max_poll_interval_ms": settings.consumer_max_poll_interval_ms,
            "fetch_max_wait_ms": settings.consumer_fetch_max_wait_ms,
            "fetch_active_max_wait_ms": settings.long_poll_fetch_wait_ms(),
            "poll_linger_ms": settings.poll_linger_ms,
            "client_rack": "",
            "group_protocol": settings.group_protocol,
        },
    )
    shares = ShareRegistry(idle_timeout=settings.instance_idle_timeout_s,
                           max_poll_timeout=settings.max_poll_timeout_ms / 1000, max_instances=settings.max_instances,
                           replica_id=settings.replica_id, metrics=metrics, budget=gateway.budget)
    collector = GatewayCollector(gateway, readyz_tenants=settings.readyz_tenants)
    registry.register(collector)
    # Schema Registry formats: the gateway-wide registry; tenants may name their own
    avro_limits.configure(max_depth=settings.schema_max_depth, max_decoded_bytes=settings.schema_max_decoded_bytes,
                          max_expansion=settings.schema_max_expansion)
    schemas = SchemaService(settings.schema_registry_config(), avro_rendering=settings.avro_json_rendering,
                            limits=settings.schema_limits(), max_depth=settings.schema_max_depth)
    registry.register(SchemaCacheCollector(schemas))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway.start()
        shares.start()
        gateway.on_drain(lambda: setattr(shares, "draining", True))
        if routing is not None:
            await routing.start()  # peer discovery (api/replicas/peers.py)
        lag_task = asyncio.create_task(metrics.watch_event_loop())
        gc_task = None
        if settings.gc_freeze_interval_s > 0:
            policy = GcPolicy(lambda: gateway.instance_count, lambda: gateway.closed_total,
                              freeze_interval=settings.gc_freeze_interval_s)
            gc_task = asyncio.create_task(policy.run(), name="gc-policy")
        try:
            yield
        finally:
            lag_task.cancel()
            if gc_task is not None:
                gc_task.cancel()
            if routing is not None:
                await routing.stop()
            await shares.close(settings.shutdown_timeout_s)  # before the tenants' clients close
            await gateway.close()
            await schemas.close()

    app = GatewayApp(title="kafka-consumer-gateway", version="0.1.0", lifespan=lifespan,
                  default_response_class=OrjsonResponse, docs_url=None, redoc_url=None,  # api/docs_ui.py
                  description="HTTP gateway to consume Kafka as members of consumer groups; compatible with "
                              "the Confluent REST Proxy v2 consumer API, with long-poll, streaming, timestamps "
                              "and headers as extensions.", **_NO_FRAMEWORK_TELEMETRY)
    app.router.redirect_slashes = False  # trailing slashes are stripped by ObserveMiddleware instead
    app.state.settings = settings
    set_max_inflated_bytes(settings.max_batch_inflated_bytes)  # every decode of this process: bounded decompression
    app.state.tenants = tenants
    app.state.gateway = gateway
    app.state.shares = shares
    app.state.schemas = schemas
    app.state.metrics = metrics
    app.state.trusted_proxies = TrustedProxies(settings.forwarded_allow_ips)
    app.state.auth_limiter = AuthFailureLimiter(settings.auth_failures_per_minute)
    install_error_handlers(app)
    app.add_exception_handler(TenantError, v3_aware(tenant_error_handler))  # 401 with WWW-Authenticate, 429 Retry-After
    admin_token = settings.admin_token.get_secret_value() if settings.admin_token else None

    def is_admin(request: Request) -> bool:
        """The request carries ``Authorization: Bearer <GATEWAY_ADMIN_TOKEN>`` (never true when unset)."""
        if not admin_token:
            return False
        scheme, _, credential = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            return False
        if hmac.compare_digest(credential.strip().encode(), admin_token.encode()):
            return True
        count_wrong_secret(request)  # a wrong admin token counts like a wrong API key (429 when blocked)
        return False

    # The lean GET .../records (api/server/fastpath.py): innermost, so routing and ObserveMiddleware still apply
    app.add_middleware(RecordsFastPath)
    # Forwarding to the replica holding an instance (api/replicas/); inside ObserveMiddleware (added after
    # it, so outer: slashes stripped, bodies capped before routing)
    routing = install_routing(app, settings, gateway)
    app.add_middleware(ObserveMiddleware, max_body_bytes=settings.max_body_bytes, metrics=metrics,
                       memory_wait_s=settings.memory_wait_s)
    guard = None
    if settings.allowed_hosts is not None:  # the Host check (api/hosts.py), outermost; main.py sets its default
        guard = HostGuard(AllowedHosts.from_setting(settings.allowed_hosts),
                          peer_token=settings.peer_token.get_secret_value() if settings.peer_token else None,
                          peer_token_header=TOKEN_HEADER)
        app.add_middleware(HostCheckMiddleware, guard=guard)
    # plain produce requests skip the framework and the middlewares above, doing their duties itself
    app.output_chunk_bytes = settings.http_max_unsent_bytes
    app.lean_produce = LeanProduce(settings.max_body_bytes, settings.memory_wait_s, metrics, guard)

    @app.get("/", tags=["ops"], summary="Service name, version and links (Confluent's v2 answers {} here)")
    async def root() -> dict[str, Any]:
        # A superset of Confluent's empty object, so v2 clients that probe the root still work.
        return {"service": app.title, "version": app.version,
                "links": {"docs": "/docs", "openapi": "/openapi.json", "metrics": "/metrics"}}

    @app.get("/healthz", tags=["ops"], summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    # /readyz answers from the last broker check for GATEWAY_READYZ_CACHE_S and concurrent probes share one
    # check: anonymous probes cannot make the gateway send Metadata requests at their rate.
    ready_cache: dict[str, Any] = {"at": None, "problems": {}, "task": None}

    async def check_brokers() -> dict[str, str]:
        problems: dict[str, str] = {}

        async def check(tenant: Any) -> None:
            rt = gateway.tenant(tenant.id, tenant.bootstrap, tenant.connection_config)
            client: KafkaClient = rt.client
            try:
                await asyncio.wait_for(client.refresh_metadata(), 5.0)
            except (KafkaError, TimeoutError) as exc:
                # the error's name, not broker addresses (logged by client_text)
                problems[tenant.id] = client_text(exc) if isinstance(exc, KafkaError) else "timed out"

        # every tenant's brokers at once: the probe takes at most 5 s however many tenants are unreachable
        await asyncio.gather(*(check(t) for t in tenants.tenants.values()))
        ready_cache["at"], ready_cache["problems"] = time.monotonic(), problems
        return problems

    async def broker_problems() -> dict[str, str]:
        at = ready_cache["at"]
        if at is not None and time.monotonic() - at < settings.readyz_cache_s:
            return ready_cache["problems"]
        task: asyncio.Task[dict[str, str]] | None = ready_cache["task"]
        if task is None or task.done():
            task = ready_cache["task"] = asyncio.create_task(check_brokers(), name="readyz-check")
        return await asyncio.shield(task)

    @app.get("/readyz", tags=["ops"], summary="Brokers of every tenant are reachable")
    async def readyz(request: Request) -> Response:
        # Tenant ids, broker counts and broker errors only for the admin token: anyone may probe readiness.
        # Without a tenants file (one open 'default' tenant, every API unauthenticated anyway) and without
        # an admin token, the details stay public.
        detailed = is_admin(request) or (not tenants.auth_required and admin_token is None)
        problems = await broker_problems()
        if problems and not brokers_ready({t: t not in problems for t in tenants.tenants}, settings.readyz_tenants):
            if not detailed:
                return OrjsonResponse({"status": "unavailable"}, status_code=503)
            return OrjsonResponse({"status": "unavailable", "error_code": 50302, "tenants": problems},
                                  status_code=503)
        status = "degraded" if problems else "ready"  # degraded: GATEWAY_READYZ_TENANTS=any, some tenants fail
        if not detailed:
            return OrjsonResponse({"status": status})
        body: dict[str, Any] = {"status": status, "tenants": sorted(tenants.tenants),
                                "brokers": {t: len(gateway.tenants[t].client.metadata.brokers)
                                            for t in tenants.tenants if t not in problems}}
        if problems:
            body["failing"] = problems
        return OrjsonResponse(body)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics (Bearer GATEWAY_ADMIN_TOKEN when set)")
    async def prom_metrics(request: Request) -> Response:
        # Metrics name tenants, groups and topics: with a tenants file (or an admin token) only the admin
        # token may read them. A multi-tenant gateway without a token serves no metrics at all.
        if (admin_token or tenants.auth_required) and not is_admin(request):
            why = ("/metrics needs 'Authorization: Bearer <GATEWAY_ADMIN_TOKEN>'" if admin_token else
                   "/metrics of a multi-tenant gateway needs an admin token: set GATEWAY_ADMIN_TOKEN and scrape "
                   "with 'Authorization: Bearer <token>'")
            return error_response(401, 40101, why, {"WWW-Authenticate": 'Bearer realm="kafka-consumer-gateway-admin"'})
        # Live state is read on the event loop in slices; the text exposition (about 10 µs per series:
        # 10,000 lag series at 10,000 instances) runs in a worker thread, off the event loop.
        async with collector.lock:
            await collector.prepare()
            body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.include_router(consumers_router)
    app.include_router(records_router)
    app.include_router(topics_router)
    app.include_router(produce_router)
    app.include_router(v3_router)
    app.include_router(share_router)
    install_openapi(app)
    install_docs(app)  # /docs and /redoc from packaged assets, with a Content-Security-Policy
    return app
