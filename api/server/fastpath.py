"""The lean routes of the hot paths: ``GET /consumers/{group}/instances/{name}/records`` (not streams), the share
consumer's ``GET /share-groups/{group}/instances/{name}/records`` (not streams), ``GET .../acknowledgements`` and
``POST .../acknowledgements`` (a JSON body the route's model accepts; any other body goes to the full route, which
reads it again), and ``POST /topics/{topic}[/partitions/{partition}]`` (produce, :class:`LeanProduce`: ahead of
the whole middleware stack: fewer objects per request on the hot path).

A consumer polls this endpoint in a loop, so what the web framework does around each poll — route
matching over every route, dependency solving, query validation, exception-middleware wrappers — is paid
hundreds of times a second per instance. This ASGI middleware (innermost of the app's middlewares:
ObserveMiddleware's slash stripping, body cap and metrics, and replica routing, still apply) answers
the common request itself with plain checks and the route's own functions (``current_tenant``,
``instance``, ``accepted_media``, ``poll_records``), so the two cannot drift apart:

* Anything unusual goes to the full app untouched, before anything was charged or read: other methods
  or paths, a query parameter that is not a plain in-range integer (the full route then answers 422 as
  always), a repeated parameter, a streaming ``Accept`` (ndjson / SSE), or a request with a body (a GET's;
  a POST's that is not JSON): one header rule for all of them, :func:`_declines`.
* ``GET /healthz`` (liveness probes) is answered here with the route's body: probes every few seconds
  per replica should not pay for the framework.
* Errors raised on the way (authentication, unknown instance, Accept mismatch, Kafka errors, anything
  else) are answered by the app's own exception handlers, so every error keeps its JSON body, status,
  error code and headers (:func:`_answer`, through which every lean route but produce answers).
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import charge_tenant, current_tenant
from api.deps import INT32_MAX, V2
from api.hosts import HostGuard
from api.server.http import INTERNAL_ERROR, Answer
from api.share.routes import BASE as SHARE_BASE
from api.share.routes import Acknowledgements, acknowledge_share, outcomes_body, poll_share_records, share_instance
from api.v2.consumers import BASE, instance
from api.v2.produce import produce_answer, produce_now
from api.v2.records import accepted_media, poll_records
from service.metrics import GatewayMetrics, labelled
from service.ring import HOP_HEADER
from service.tenants import Tenant

log = logging.getLogger(__name__)
Respond = Callable[[int, list[tuple[bytes, bytes]], bytes], None]

_PATH = re.compile(r"/consumers/([^/]+)/instances/([^/]+)/records")
_SHARE_PATH = re.compile(r"/share-groups/([^/]+)/instances/([^/]+)/(records|acknowledgements)")
# the bounds of the full route's Query(...) declarations: outside them the full route answers 422
_LIMITS = {"timeout": (0, INT32_MAX), "max_bytes": (1, INT32_MAX), "max_records": (1, 100000)}


class _Route:
    """What ObserveMiddleware reads from ``scope["route"]`` for its metric label (the route's path)."""

    path = BASE + "/records"


_ROUTE = _Route()


class _ShareRoute:
    def __init__(self, path: str) -> None:
        self.path = path


_SHARE_ROUTES = {"records": _ShareRoute(SHARE_BASE + "/records"),
                 "acknowledgements": _ShareRoute(SHARE_BASE + "/acknowledgements")}
_SHARE_ACK_ROUTE = _SHARE_ROUTES["acknowledgements"]


def _replay(bodies: list[bytes], last: MutableMapping[str, Any] | None, receive: Receive) -> Receive:
    """A ``receive`` that hands out a body already read (then ``last``, then the connection's own)."""
    pending: list[MutableMapping[str, Any]] = [{"type": "http.request", "body": b"".join(bodies), "more_body": False}]
    if last is not None:
        pending = [last]

    async def again() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return again


def _query(raw: bytes) -> dict[str, int] | None:
    """The known parameters as ints, or None when the full route must judge them."""
    if not raw:
        return {}
    out: dict[str, int] = {}
    for key, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        bounds = _LIMITS.get(key)
        if bounds is None:
            continue  # unknown parameters are ignored, as by the full route
        if key in out or not value.isdigit() or not value.isascii():
            return None
        n = int(value)
        if not bounds[0] <= n <= bounds[1]:
            return None
        out[key] = n
    return out


def _lookup_handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            return handler
    return None


async def _error_response(scope: Scope, request: Request, exc: Exception) -> Any:
    """The app's own exception handler's answer to ``exc`` (re-raised when no handler takes it)."""
    handler = _lookup_handler(scope["app"].exception_handlers, exc)
    if handler is None:
        raise exc
    response = handler(request, exc)
    if inspect.isawaitable(response):
        response = await response
    return response


def _declines(headers: list[tuple[bytes, bytes]], *, streams: bool = False, json_body: bool = False) -> bool:
    """Whether a request with these headers goes to the full route untouched (one rule for the lean records and
    acknowledgements routes): a chunked body; a GET (not ``json_body``) with a body; a POST (``json_body``) with
    more than one ``Content-Type`` or one that is not JSON (``application/json`` or ``application/<name>+json``);
    with ``streams``, an ``Accept`` naming a stream (ndjson / SSE, in any case: media types are case-insensitive)."""
    content_type = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            if not json_body and value != b"0":
                return True  # a GET with a body: the full route judges it
        elif name == b"content-type":
            if content_type is not None:
                return True  # two of them: the full route decides which one counts
            content_type = value
        elif streams and name == b"accept":
            value = value.lower()
            if b"ndjson" in value or b"event-stream" in value:
                return True  # streams: the full route
    if not json_body:
        return False
    media = (content_type or b"").split(b";")[0].strip().lower()
    if media == b"application/json":
        return False
    subtype = media[12:] if media.startswith(b"application/") else b""
    return not (subtype.endswith(b"+json") and b"/" not in subtype)  # application/a/b+json is not JSON there


#: A lean route's answer: its content type, body, and what to call once the body was sent (or never will be)
_Served = tuple[bytes, bytes, Callable[[], None] | None]


async def _answer(scope: Scope, receive: Receive, send: Send, request: Request, work: Awaitable[_Served]) -> None:
    """A lean route's answer: 200 with what ``work`` served, or the app's own exception handler's answer to what it
    raised (the full route's status, error code, body and headers)."""
    try:
        content_type, body, done = await work
    except Exception as exc:
        response = await _error_response(scope, request, exc)
        await response(scope, receive, send)
        return
    try:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
    finally:
        if done is not None:
            done()


async def _consumer_records(request: Request, group: str, name: str, query: dict[str, int]) -> _Served:
    tenant = await current_tenant(request)
    inst = await instance(request, tenant, group, name)
    media = accepted_media(request, inst)
    body = await poll_records(request, inst, tenant, query.get("timeout"), query.get("max_bytes"),
                              query.get("max_records"))
    return media.encode(), body, None


async def _share_get(request: Request, group: str, name: str, records: bool, query: dict[str, int]) -> _Served:
    """Records, or (not ``records``) the acknowledgement outcomes."""
    tenant = await current_tenant(request)
    inst = share_instance(request, tenant, group, name)
    charge = 0
    if records:
        body, charge = await poll_share_records(request, inst, tenant, query.get("timeout"), query.get("max_bytes"),
                                                query.get("max_records"))
    else:
        body = outcomes_body(inst.take_outcomes())
    # the records stay charged to the memory budget until they left (or never will: the client went away)
    return _V2, body, functools.partial(inst.release_charge, charge)


async def _share_acknowledge(request: Request, group: str, name: str, body: Acknowledgements) -> _Served:
    tenant = await current_tenant(request)
    inst = share_instance(request, tenant, group, name)
    return _V2, await acknowledge_share(request, inst, body), None


HEALTHZ_BODY = b'{"status":"ok"}'
_HEALTHZ_START = {"type": "http.response.start", "status": 200,
                  "headers": [(b"content-length", b"%d" % len(HEALTHZ_BODY)), (b"content-type", b"application/json")]}
_HEALTHZ_BODY = {"type": "http.response.body", "body": HEALTHZ_BODY}


_PRODUCE_PATH = re.compile(r"/topics/([^/]+)(?:/partitions/(\d{1,10}))?")


class _ProduceRoute:
    def __init__(self, path: str) -> None:
        self.path = path


_PRODUCE_ROUTE = _ProduceRoute("/topics/{topic}")
_PRODUCE_PARTITION_ROUTE = _ProduceRoute("/topics/{topic}/partitions/{partition}")


class RecordsFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/share-groups/"):
            if scope["method"] == "GET":
                await self._share(scope, receive, send)
                return
            if scope["method"] == "POST" and scope["path"].endswith("/acknowledgements"):
                await self._share_acks(scope, receive, send)
                return
        if scope["type"] != "http" or scope["method"] != "GET" or not scope["path"].endswith("/records"):
            if scope["type"] == "http" and scope["path"] == "/healthz" and scope["method"] == "GET":
                # Liveness probes (Kubernetes, the Docker HEALTHCHECK, load balancers): the route's own answer
                # without the framework's routing and dependency machinery, ~10x cheaper.
                await send(_HEALTHZ_START)
                await send(_HEALTHZ_BODY)
                return
            await self.app(scope, receive, send)
            return
        match = _PATH.fullmatch(scope["path"])
        query = _query(scope["query_string"]) if match is not None else None
        if match is None or query is None or "app" not in scope or _declines(scope["headers"], streams=True):
            await self.app(scope, receive, send)
            return
        scope["route"] = _ROUTE
        request = Request(scope, receive)
        await _answer(scope, receive, send, request, _consumer_records(request, match[1], match[2], query))

    async def _share_acks(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /share-groups/{group}/instances/{name}/acknowledgements`` with a JSON body the route's model
        accepts (read here, then judged by that model); any other body (malformed, refused by the model, not
        JSON) goes to the full route, which reads it again and answers as always."""
        match = _SHARE_PATH.fullmatch(scope["path"])
        if (match is None or match[3] != "acknowledgements" or "app" not in scope
                or _declines(scope["headers"], json_body=True)):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the full app sees it too
                await self.app(scope, _replay([], message, receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            body = Acknowledgements.model_validate(orjson.loads(raw))
        except (orjson.JSONDecodeError, ValidationError):
            await self.app(scope, _replay([raw], None, receive), send)  # the full route's own answer
            return
        scope["route"] = _SHARE_ACK_ROUTE
        request = Request(scope, receive)
        await _answer(scope, receive, send, request, _share_acknowledge(request, match[1], match[2], body))

    async def _share(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /share-groups/{group}/instances/{name}/records`` (not streams) and ``.../acknowledgements``
        with the share routes' own functions, as the consumer records route above."""
        match = _SHARE_PATH.fullmatch(scope["path"])
        records = match is not None and match[3] == "records"
        query = _query(scope["query_string"]) if records else {}
        if match is None or query is None or "app" not in scope or _declines(scope["headers"], streams=records):
            await self.app(scope, receive, send)
            return
        scope["route"] = _SHARE_ROUTES[match[3]]
        request = Request(scope, receive)
        await _answer(scope, receive, send, request, _share_get(request, match[1], match[2], records, query))


#: Headers after which the full app judges a produce request (chunked bodies, 100-continue, forwarded by a
#: replica peer: the routing layer checks its token)
_PRODUCE_DECLINE = frozenset({b"transfer-encoding", b"expect", HOP_HEADER.encode()})
_PRODUCE_START_HEADERS = (b"content-type", V2.encode())
_V2 = V2.encode()


class LeanProduce:
    """``POST /topics/{topic}[/partitions/{p}]`` answered ahead of the framework and its middlewares
    (a producer posts in a loop, and the middleware stack, request and response objects cost
    more than parsing its records). Called by the app (``GatewayApp.__call__``) before anything else; it
    either declines before reading anything (the full app then serves the request as always) or serves
    it doing what the middlewares would have done for it:

    * the Host check (:class:`api.hosts.HostGuard`; a refused Host is declined: the full app answers 421);
    * the body cap and memory budget of ``ObserveMiddleware``: only a ``Content-Length`` body within
      ``GATEWAY_MAX_BODY_BYTES`` is served here (chunked, oversized or malformed lengths are declined:
      the full app answers 400/413), charged twice its size to the memory budget until answered
      (503/50305 when there is no room within ``GATEWAY_MEMORY_WAIT_S``);
    * the request-duration histogram with the route's label, its tenant and status;
    * the route's own functions (``current_tenant``, ``produce_answer``), errors answered by the app's
      exception handlers: the same status, error code, body and headers as the full route.
    """

    def __init__(self, max_body_bytes: int, memory_wait_s: float, metrics: GatewayMetrics,
                 guard: HostGuard | None) -> None:
        self.max_body_bytes = max_body_bytes
        self.memory_wait_s = memory_wait_s
        self.metrics = metrics
        self.guard = guard

    def begin(self, app: Any, scope: Scope, *, reserve_now: bool = True) -> LeanProduceCall | None:
        """A plain produce request's call (its body then goes to :meth:`LeanProduceCall.answer`), or None having
        done nothing (the full app serves the request). With ``reserve_now`` the body's memory is charged to the
        budget at once, or None is returned when there is no room (the ASGI path then waits for it; without
        ``reserve_now`` the caller awaits :meth:`LeanProduceCall.reserve`)."""
        path = scope["path"]
        if not path.startswith("/topics/"):
            return None
        match = _PRODUCE_PATH.fullmatch(path)
        if match is None or (match[2] is not None and int(match[2]) > INT32_MAX):
            return None
        length = -1
        content_type = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length >= 0 or not value.isdigit():
                    return None
                length = int(value)
            elif name == b"content-type":
                if content_type is None:  # the first, as the full route reads it
                    content_type = value.decode("latin-1")
            elif name in _PRODUCE_DECLINE:
                return None
        if not 0 <= length <= self.max_body_bytes or (self.guard is not None and not self.guard.permits(scope)):
            return None
        budget = app.state.gateway.budget
        charged = 0
        if length and budget is not None and reserve_now:
            if not budget.try_reserve(2 * length, "body"):
                return None
            charged = 2 * length
        scope["app"] = app
        return LeanProduceCall(self, scope, match[1], int(match[2]) if match[2] is not None else None, length,
                               budget, charged, content_type or "")

    async def __call__(self, app: Any, scope: Scope, receive: Receive, send: Send) -> bool:
        """Serve a plain produce request and return True, or return False having done nothing: the ASGI form
        of :meth:`begin` (for the h11 parser, and for requests the protocol-level path passed on, e.g. one that
        has to wait for memory)."""
        call = self.begin(app, scope, reserve_now=False)
        if call is None:
            return False
        try:
            await call.reserve(self.memory_wait_s)
        except Exception as exc:
            response = await _error_response(scope, Request(scope, receive), exc)
            call.observe(response.status_code)
            await response(scope, receive, send)
            return True
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                call.abandon()  # the client went away: nothing to answer, nothing produced
                return True
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        status, headers, content = await call.answer(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        return True


class LeanProduceCall:
    """One plain produce request taken by :class:`LeanProduce`: its body is answered by :meth:`answer` (status,
    headers, body: the route's answer or the app's exception handler's), or :meth:`abandon` ed when the client
    goes away first. Either way the memory charge is released and the duration histogram observed once."""

    __slots__ = ("budget", "charged", "content_type", "lean", "length", "partition", "scope", "started", "topic")

    def __init__(self, lean: LeanProduce, scope: Scope, topic: str, partition: int | None, length: int,
                 budget: Any, charged: int, content_type: str = "") -> None:
        self.lean = lean
        self.content_type = content_type
        self.scope = scope
        self.topic = topic
        self.partition = partition
        self.length = length
        self.budget = budget
        self.charged = charged
        scope["route"] = _PRODUCE_ROUTE if partition is None else _PRODUCE_PARTITION_ROUTE
        self.started = time.perf_counter()

    async def reserve(self, wait_s: float) -> None:
        """Charge twice the body's length to the memory budget, waiting up to ``wait_s`` (BudgetExhausted)."""
        if self.length and self.budget is not None and not self.charged:
            self.charged = await self.budget.reserve(2 * self.length, "body", wait_s)

    async def answer(self, body: bytes, tenant: Tenant | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The answer (status, headers, body); ``tenant``: already authenticated and charged (answer_now)."""
        scope = self.scope
        request = Request(scope)
        request._body = body
        status = 500
        try:
            try:
                if tenant is None:
                    tenant = await current_tenant(request)
                content, status = await produce_answer(request, tenant, self.topic, self.partition)
            except Exception as exc:
                response = await _error_response(scope, request, exc)
                status = response.status_code
                return status, response.raw_headers, response.body
            return status, [(b"content-length", b"%d" % len(content)), _PRODUCE_START_HEADERS], content
        finally:
            self._release()
            self.observe(status)

    def answer_now(self, body: bytes, respond: Respond) -> Awaitable[Answer] | None:
        """The answer without a task or an await, when nothing must be awaited: None is returned and
        ``respond(status, headers, body)`` is called once, at once or when the records are acknowledged.
        Otherwise (a topic not in fresh metadata, a schema'd format, an error for the app's handlers to answer)
        an awaitable of :meth:`answer`'s result is returned for the caller to run in a task; the request is
        charged to its tenant's rate limit once either way."""
        request = Request(self.scope)
        request._body = body
        try:
            tenant = charge_tenant(request)
        except Exception as exc:
            return self._error_answer(request, exc)

        def answer(content: bytes, status: int) -> None:
            # the body's memory charge is held until the answer left the process (:meth:`sent`)
            self.observe(status)
            respond(status, [(b"content-length", b"%d" % len(content)), _PRODUCE_START_HEADERS], content)

        def failed(exc: Exception) -> None:
            log.error("answering a produce request failed", exc_info=exc)
            self._release()
            self.observe(500)
            respond(*INTERNAL_ERROR)

        try:
            if produce_now(request, tenant, self.topic, self.partition, answer, failed, self.content_type):
                return None
        except Exception as exc:
            return self._error_answer(request, exc)
        return self.answer(body, tenant)

    async def _error_answer(self, request: Request, exc: Exception) -> Answer:
        status = 500
        try:
            response = await _error_response(self.scope, request, exc)
            status = response.status_code
            return status, response.raw_headers, response.body
        finally:
            self._release()
            self.observe(status)

    def abandon(self) -> None:
        """The client went away before the body was complete: nothing produced, nothing to answer."""
        self._release()
        self.observe(500)

    def sent(self) -> None:
        """The answer left the process, or the client went away (api/server/http.py ``LeanCycle``)."""
        self._release()

    def _release(self) -> None:
        if self.charged:
            self.budget.release(self.charged, "body")
            self.charged = 0

    def observe(self, status: int) -> None:
        tenant = self.scope.get("state", {}).get("tenant")
        labelled(self.lean.metrics.http_seconds, tenant.id if tenant is not None else "", self.scope["route"].path,
                 "POST", str(status)).observe(time.perf_counter() - self.started)
