"""The lean records route (api/server/fastpath.py): what it serves itself, what it hands to the full app, and that
its answers are the full route's (same handlers, same bodies)."""

from __future__ import annotations

from typing import Any

import pytest

from api.server.fastpath import RecordsFastPath, _query
from service.settings import Settings


def test_query_accepts_only_plain_in_range_integers() -> None:
    assert _query(b"") == {}
    assert _query(b"timeout=1000&max_bytes=5&max_records=100000&other=x") == {
        "timeout": 1000, "max_bytes": 5, "max_records": 100000}
    for bad in (b"timeout=-1", b"timeout=1.5", b"timeout=", b"max_records=0", b"max_records=100001",
                b"max_bytes=0", b"timeout=2147483648", b"timeout=1&timeout=2", b"timeout=%D9%A3"):
        assert _query(bad) is None, bad  # the full route answers these (422, or its own choice)


class Recorder:
    """The rest of the app behind the fast path: records what it was handed."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"full app"})


async def call(fast: RecordsFastPath, app: Any, path: str, query: bytes = b"", method: str = "GET",
               headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": query,
             "headers": headers or [(b"accept", b"application/vnd.kafka.binary.v2+json")], "app": app,
             "state": {}, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080), "scheme": "http",
             "http_version": "1.1", "root_path": ""}
    await fast(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


@pytest.fixture
def app() -> Any:
    from api.app import create_app

    return create_app(Settings(kafka_bootstrap="127.0.0.1:1"), "127.0.0.1:1")


async def test_unusual_requests_go_to_the_full_app(app: Any) -> None:
    rest = Recorder()
    fast = RecordsFastPath(rest)
    records = "/consumers/g/instances/i/records"
    for kwargs in ({"path": records, "method": "POST"}, {"path": "/consumers/g/instances/i/offsets"},
                   {"path": records, "query": b"timeout=-5"},
                   {"path": records, "query": b"max_records=1&max_records=2"},
                   {"path": records, "headers": [(b"accept", b"application/x-ndjson")]},
                   {"path": records, "headers": [(b"accept", b"text/event-stream")]},
                   # media types are case-insensitive: the full route streams these too
                   {"path": records, "headers": [(b"accept", b"Application/X-NDJSON")]},
                   {"path": records, "headers": [(b"accept", b"Text/Event-Stream")]},
                   {"path": records, "headers": [(b"content-length", b"3")]},
                   {"path": records, "headers": [(b"transfer-encoding", b"chunked")]},
                   {"path": "/consumers/g/instances/i/x/records"}):
        before = rest.calls
        status, _, body = await call(fast, app, **kwargs)
        assert (status, body, rest.calls) == (299, b"full app", before + 1), kwargs


async def test_errors_are_the_full_routes_answers(app: Any) -> None:
    """An unknown instance: answered here (the full app is not called) with the app's own handler, so the
    status, error code, message and media type are what the full route answers."""
    rest = Recorder()
    fast = RecordsFastPath(rest)
    async with app.router.lifespan_context(app):
        status, headers, body = await call(fast, app, "/consumers/g/instances/nobody/records")
        assert rest.calls == 0
        assert status == 404 and b'"error_code":40403' in body and b"nobody" in body
        assert headers[b"content-type"] == b"application/vnd.kafka.v2+json"
        import httpx

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            full = await http.get("/consumers/g/instances/nobody/records?timeout=1&timeout=1",
                                  headers={"accept": "application/vnd.kafka.binary.v2+json"})
        assert (full.status_code, full.content) == (status, body)


async def test_share_records_and_outcomes_go_to_the_full_app_when_unusual(app: Any) -> None:
    rest = Recorder()
    fast = RecordsFastPath(rest)
    records = "/share-groups/g/instances/i/records"
    for kwargs in ({"path": records, "method": "POST"}, {"path": "/share-groups/g/instances/i/subscription"},
                   {"path": "/share-groups/g/instances/i/acknowledgements", "method": "POST"},
                   {"path": records, "query": b"max_records=0"},
                   {"path": records, "headers": [(b"accept", b"application/x-ndjson")]},
                   {"path": records, "headers": [(b"accept", b"text/event-stream")]},
                   {"path": records, "headers": [(b"accept", b"Application/X-NDJSON")]},
                   {"path": records, "headers": [(b"accept", b"TEXT/EVENT-STREAM")]},
                   {"path": records, "headers": [(b"content-length", b"3")]},
                   {"path": "/share-groups/g/instances/i/acknowledgements", "headers": [(b"content-length", b"3")]},
                   {"path": "/share-groups/g/instances/i/acknowledgements",
                    "headers": [(b"transfer-encoding", b"chunked")]},
                   {"path": "/share-groups/g/instances/i/x/records"}, {"path": "/share-groups/g"}):
        before = rest.calls
        status, _, body = await call(fast, app, **kwargs)
        assert (status, body, rest.calls) == (299, b"full app", before + 1), kwargs


async def test_share_errors_are_the_full_routes_answers(app: Any) -> None:
    rest = Recorder()
    fast = RecordsFastPath(rest)
    import httpx

    async with app.router.lifespan_context(app):
        for path in ("/share-groups/g/instances/nobody/records", "/share-groups/g/instances/nobody/acknowledgements"):
            status, headers, body = await call(fast, app, path)
            assert rest.calls == 0
            assert status == 404 and b'"error_code":40410' in body and b"nobody" in body, body
            assert headers[b"content-type"] == b"application/vnd.kafka.v2+json"
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
                # (a repeated parameter: the full records route answers; outcomes ignore the query)
                full = await http.get(path + "?max_records=1&max_records=1")
            assert (full.status_code, full.content) == (status, body)


async def test_share_acknowledgements_are_served_here_only_with_a_body_the_model_takes(app: Any) -> None:
    """A valid body: answered here (an unknown instance: the app's own 404); anything else (malformed JSON, a
    body the model refuses, not JSON) goes to the full route with the body it was sent, which answers as
    always."""
    import httpx

    seen: list[bytes] = []

    class BodyRecorder(Recorder):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            body = b""
            while True:
                message = await receive()
                body += message["body"]
                if not message["more_body"]:
                    break
            seen.append(body)
            await super().__call__(scope, receive, send)

    rest = BodyRecorder()
    fast = RecordsFastPath(rest)
    path = "/share-groups/g/instances/nobody/acknowledgements"
    good = b'{"acknowledgements": [{"topic": "t", "partition": 0, "first_offset": 1, "last_offset": 3}]}'

    async def post(body: bytes, ct: bytes = b"application/vnd.kafka.v2+json") -> tuple[int, bytes]:
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": body[:10], "more_body": True},
                    {"type": "http.request", "body": body[10:], "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "headers": [(b"content-type", ct), (b"content-length", b"%d" % len(body))], "app": app,
                 "state": {}, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080), "scheme": "http",
                 "http_version": "1.1", "root_path": ""}
        await fast(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    async with app.router.lifespan_context(app):
        status, body = await post(good)
        assert rest.calls == 0 and status == 404 and b'"error_code":40410' in body
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            full = await http.post(path, content=good, headers={"content-type": "application/json"})
        assert (full.status_code, full.content) == (status, body)
        for bad, ct in ((b'{"acknowledgements": [', b"application/json"),
                        (b'{"acknowledgements": [], "extra": 1}', b"application/json"),
                        (b'{"acknowledgements": [{"topic": "t", "partition": -1, "offset": 1}]}', b"application/json"),
                        (good, b"text/plain"), (good, b"application/a/b+json")):
            before = rest.calls
            assert await post(bad, ct) == (299, b"full app")
            assert rest.calls == before + 1 and seen[-1] == bad  # the full route reads the body it was sent
        # two Content-Type headers: the full route decides which one counts
        before = rest.calls
        sent2: list[dict[str, Any]] = []
        chunks = [{"type": "http.request", "body": good, "more_body": False}]

        async def receive2() -> dict[str, Any]:
            return chunks.pop(0)

        async def send2(message: dict[str, Any]) -> None:
            sent2.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "headers": [(b"content-type", b"text/plain"), (b"content-type", b"application/json"),
                             (b"content-length", b"%d" % len(good))], "app": app, "state": {},
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080), "scheme": "http", "http_version": "1.1",
                 "root_path": ""}
        await fast(scope, receive2, send2)
        assert rest.calls == before + 1 and seen[-1] == good


async def test_healthz_is_answered_here_with_the_routes_answer(app: Any) -> None:
    rest = Recorder()
    status, headers, body = await call(RecordsFastPath(rest), app, "/healthz", headers=[])
    assert rest.calls == 0
    # what the route answers (FastAPI renders its dict as a JSONResponse): same status, body and media type
    from fastapi.responses import JSONResponse

    route = JSONResponse({"status": "ok"})
    assert (status, body, headers[b"content-type"]) == (200, route.body, route.media_type.encode())
    assert headers[b"content-length"] == b"%d" % len(body) and body == b'{"status":"ok"}'
    for other in ({"path": "/healthz", "method": "POST"}, {"path": "/healthz/"}, {"path": "/readyz"}):
        before = rest.calls
        await call(RecordsFastPath(rest), app, **other)
        assert rest.calls == before + 1, other


# -- the lean produce path (LeanProduce, ahead of the framework) ------------------------------------------------
BINARY_CT = (b"content-type", b"application/vnd.kafka.binary.v2+json")


async def lean_call(app: Any, path: str, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
                    ) -> tuple[bool, int | None, dict[bytes, bytes], bytes]:
    """Call the app's LeanProduce directly: (served?, status, headers, body)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    hdrs = headers if headers is not None else [(b"host", b"localhost"), BINARY_CT,
                                                 (b"content-length", b"%d" % len(body))]
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": hdrs, "state": {}, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080),
             "scheme": "http", "http_version": "1.1", "root_path": ""}
    served = await app.lean_produce(app, scope, receive, send)
    if not served:
        assert sent == []  # declined before answering anything
        return False, None, {}, b""
    start = next(m for m in sent if m["type"] == "http.response.start")
    return True, start["status"], dict(start["headers"]), b"".join(
        m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def guarded_app() -> Any:
    from api.app import create_app

    return create_app(Settings(kafka_bootstrap="127.0.0.1:1", allowed_hosts="localhost", max_body_bytes=1000,
                               memory_budget_bytes=4096, memory_wait_s=0.01), "127.0.0.1:1")


async def test_lean_produce_declines_what_the_full_app_must_judge(guarded_app: Any) -> None:
    """Chunked or oversized bodies, malformed lengths, 100-continue, a replica's forwarded request, a Host
    not allowed, other paths: declined before anything is read (the full app answers them as always)."""
    ok = [(b"host", b"localhost"), BINARY_CT]
    cases = [
        ("/topics/t", [*ok, (b"transfer-encoding", b"chunked")]),
        ("/topics/t", [*ok, (b"content-length", b"1001")]),  # over GATEWAY_MAX_BODY_BYTES: 413 there
        ("/topics/t", [*ok, (b"content-length", b"-1")]),
        ("/topics/t", [*ok, (b"content-length", b"2"), (b"content-length", b"2")]),
        ("/topics/t", ok),  # no length
        ("/topics/t", [*ok, (b"content-length", b"2"), (b"expect", b"100-continue")]),
        ("/topics/t", [*ok, (b"content-length", b"2"), (b"x-kcg-forwarded-by", b"peer")]),
        ("/topics/t", [(b"host", b"attacker.example"), BINARY_CT, (b"content-length", b"2")]),  # 421 there
        ("/topics/t/", [*ok, (b"content-length", b"2")]),
        ("/topics/t/partitions/2147483648", [*ok, (b"content-length", b"2")]),
        ("/topics/t/partitions/x", [*ok, (b"content-length", b"2")]),
        ("/topics", [*ok, (b"content-length", b"2")]),
        ("/consumers/g", [*ok, (b"content-length", b"2")]),
    ]
    for path, headers in cases:
        served, *_ = await lean_call(guarded_app, path, b"{}", headers)
        assert not served, (path, headers)


async def test_lean_produce_answers_as_the_full_route(guarded_app: Any) -> None:
    """Errors come from the app's handlers: the same status, error code and body as through the framework
    (which serves the declined twin of the request: a trailing slash)."""
    import httpx

    async with guarded_app.router.lifespan_context(guarded_app):
        cases = [(b"not json", [BINARY_CT]), (b"", [BINARY_CT]), (b'{"records":[{"value":"!!"}]}', [BINARY_CT]),
                 (b'{"records":[{"value":null}]}', [(b"content-type", b"text/plain")]),
                 (b'{"records":[{"value":null}]}', [(b"content-type", b"Text/Plain; charset=utf-8")]),
                 (b'{"records":[{"value":null}]}', []),  # no Content-Type: 415 naming "(none)"
                 # two: the first counts, as on the full route
                 (b'{"records":[{"value":null}]}', [(b"content-type", b"text/plain"), BINARY_CT])]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded_app),
                                     base_url="http://localhost") as http:
            for body, extra in cases:
                served, status, headers, answer = await lean_call(
                    guarded_app, "/topics/t", body, [(b"host", b"localhost"), *extra,
                                                     (b"content-length", b"%d" % len(body))])
                full = await http.post("/topics/t/", content=body, headers=[(k.decode(), v.decode()) for k, v in extra])
                assert served and (status, answer) == (full.status_code, full.content), body
                assert status in (400, 415, 422) and b'"error_code"' in answer
                assert headers[b"content-type"] == full.headers["content-type"].encode()


async def test_lean_produce_charges_the_memory_budget_and_observes_the_request(guarded_app: Any) -> None:
    from service.metrics import labelled

    async with guarded_app.router.lifespan_context(guarded_app):
        budget = guarded_app.state.gateway.budget
        # refused before authentication: no tenant label (as ObserveMiddleware labels such a refusal)
        hist = labelled(guarded_app.state.metrics.http_seconds, "", "/topics/{topic}", "POST", "503")
        before = sum(b.get() for b in hist._buckets)
        assert budget.try_reserve(budget.total - 100, "body")  # nearly full: 2 x 900 bytes cannot fit
        try:
            body = b'{"records":[{"value":null}]}'.ljust(900)
            served, status, headers, answer = await lean_call(guarded_app, "/topics/t", body)
            assert served and status == 503 and b'"error_code":50305' in answer
            assert dict((k.lower(), v) for k, v in headers.items())[b"retry-after"] == b"1"
        finally:
            budget.release(budget.total - 100, "body")
        assert sum(b.get() for b in hist._buckets) == before + 1
        # nothing stays charged after an answer
        free_before = budget.total - budget.used
        served, status, _, _ = await lean_call(guarded_app, "/topics/t", b"{}")
        assert served and status == 422 and budget.total - budget.used == free_before


async def test_the_producer_takes_the_producer_settings() -> None:
    """GATEWAY_PRODUCER_* reach the tenant's producer (api/produce.producer_for)."""
    from starlette.requests import Request

    from api.app import create_app
    from api.v2.produce import producer_for

    app = create_app(Settings(kafka_bootstrap="127.0.0.1:1", producer_max_in_flight_per_broker=3,
                              producer_linger_ms=2, producer_compression="lz4", producer_idempotent=False),
                     "127.0.0.1:1")
    async with app.router.lifespan_context(app):
        tenant = app.state.tenants.authenticate({})
        request = Request({"type": "http", "app": app, "headers": [], "state": {}})
        cfg = producer_for(request, tenant).config
        assert (cfg.max_in_flight_per_broker, cfg.linger_ms, cfg.idempotent) == (3, 2, False)
        assert cfg.compression == 3  # lz4
    with pytest.raises(ValueError):
        Settings(kafka_bootstrap="127.0.0.1:1", producer_max_in_flight_per_broker=0)
