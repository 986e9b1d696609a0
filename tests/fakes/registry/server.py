"""A small real HTTP Schema Registry on a free loopback port, for the fault cases a real registry cannot show.

It implements the subset of the Confluent Schema Registry REST API that ``service.schemas.registry`` uses, in
memory: ``GET /schemas/ids/{id}``, ``GET /schemas/ids/{id}/versions``, ``GET /subjects``,
``GET /subjects/{s}/versions``, ``GET /subjects/{s}/versions/{v|latest}``, ``POST /subjects/{s}/versions`` (register:
one global id per distinct schema, as Confluent's) and ``POST /subjects/{s}`` (lookup), with Confluent's error bodies
(40401 subject, 40402 version, 40403 schema not found, 42201 invalid schema).

Faults: :meth:`TestRegistry.down` (connection refused until :meth:`up`), ``ssl_context`` (https), ``delay_s``
(every answer waits), :meth:`fail_next` (the next n requests answer a 5xx, optionally with Retry-After),
``required_auth`` (401 without that Authorization header). Every request is recorded (method, path, headers)
in ``requests``. It runs in a thread, so it serves asyncio tests and gateway subprocesses alike.
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class _Stored:
    schema: str
    schema_type: str
    references: list[dict[str, Any]]

    def key(self) -> tuple[str, str, str]:
        return self.schema, self.schema_type, json.dumps(self.references, sort_keys=True)

    def doc(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            d["schemaType"] = self.schema_type
        if self.references:
            d["references"] = self.references
        return d


@dataclass
class _Failure:
    status: int
    count: int
    retry_after: str | None


@dataclass
class TestRegistry:
    """Start with :meth:`start` (or as a context manager); ``url`` is its base URL."""

    __test__ = False  # not a pytest test class

    delay_s: float = 0.0
    required_auth: str | None = None
    first_id: int = 1
    #: serve https with this server context (a trustme certificate in the tests)
    ssl_context: ssl.SSLContext | None = None
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._schemas: dict[int, _Stored] = {}
        self._ids: dict[tuple[str, str, str], int] = {}
        self._subjects: dict[str, list[int]] = {}
        self._next_id = self.first_id
        self._failures: list[_Failure] = []
        self._stopping = threading.Event()  # ends delayed answers at stop
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        #: set on every request received (a test waits for it before releasing a slow answer)
        self.received = threading.Event()

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    # -- lifecycle

    def start(self) -> TestRegistry:
        registry = self

        class Handler(_Handler):
            reg = registry

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        if self.ssl_context is not None:
            server.socket = self.ssl_context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"test-registry-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def down(self) -> None:
        """Close the listening socket: connections are refused until :meth:`up` (same port)."""
        self.stop()

    def up(self) -> None:
        self.start()

    def __enter__(self) -> TestRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults and state

    def fail_next(self, status: int = 503, count: int = 1, retry_after: str | None = None) -> None:
        with self._lock:
            self._failures.append(_Failure(status, count, retry_after))

    def add(self, subject: str, schema: str, schema_type: str = "AVRO",
            references: list[dict[str, Any]] | None = None) -> int:
        """Register directly (no HTTP); returns the schema id."""
        with self._lock:
            return self._register(subject, _Stored(schema, schema_type, references or []))[0]

    def count(self, method: str | None = None, path_prefix: str = "") -> int:
        return sum(1 for r in self.requests
                   if (method is None or r.method == method) and r.path.startswith(path_prefix))

    def _register(self, subject: str, stored: _Stored) -> tuple[int, int]:
        sid = self._ids.get(stored.key())
        if sid is None:
            sid = self._next_id
            self._next_id += 1
            self._ids[stored.key()] = sid
            self._schemas[sid] = stored
        versions = self._subjects.setdefault(subject, [])
        if sid not in versions:
            versions.append(sid)
        return sid, versions.index(sid) + 1

    # -- request handling (the handler's thread)

    def handle(self, method: str, raw_path: str, headers: dict[str, str],
               body: bytes) -> tuple[int, Any, dict[str, str]]:
        self.requests.append(Recorded(method, raw_path, headers, body))
        self.received.set()
        if self.delay_s and self._stopping.wait(self.delay_s):
            return 503, {"error_code": 50003, "message": "stopping"}, {}
        with self._lock:
            if self._failures:
                f = self._failures[0]
                f.count -= 1
                if f.count <= 0:
                    self._failures.pop(0)
                extra = {"Retry-After": f.retry_after} if f.retry_after else {}
                return f.status, {"error_code": f.status * 100 + 1, "message": "injected failure"}, extra
        if self.required_auth is not None and headers.get("authorization") != self.required_auth:
            return 401, {"error_code": 40101, "message": "Unauthorized"}, {}
        parts = [unquote(p) for p in urlsplit(raw_path).path.strip("/").split("/")]
        with self._lock:
            return (*self._route(method, parts, body), {})

    def _route(self, method: str, p: list[str], body: bytes) -> tuple[int, Any]:
        if method == "GET" and len(p) == 3 and p[:2] == ["schemas", "ids"] and p[2].isdigit():
            stored = self._schemas.get(int(p[2]))
            if stored is None:
                return 404, {"error_code": 40403, "message": "Schema not found"}
            return 200, stored.doc()
        if method == "GET" and len(p) == 4 and p[:2] == ["schemas", "ids"] and p[2].isdigit() and p[3] == "versions":
            sid = int(p[2])
            if sid not in self._schemas:
                return 404, {"error_code": 40403, "message": "Schema not found"}
            return 200, [{"subject": s, "version": versions.index(sid) + 1}
                         for s, versions in sorted(self._subjects.items()) if sid in versions]
        if method == "GET" and p == ["subjects"]:
            return 200, sorted(self._subjects)
        if len(p) >= 2 and p[0] == "subjects":
            subject = p[1]
            if method == "POST" and len(p) in (2, 3) and (len(p) == 2 or p[2] == "versions"):
                try:
                    doc = json.loads(body)
                    stored = _Stored(doc["schema"], doc.get("schemaType", "AVRO"), doc.get("references") or [])
                except (ValueError, KeyError, TypeError):
                    return 422, {"error_code": 42201, "message": "Invalid schema"}
                if stored.schema_type not in ("AVRO", "PROTOBUF", "JSON"):
                    return 422, {"error_code": 42201, "message": f"Invalid schema type {stored.schema_type}"}
                if len(p) == 3:
                    return 200, {"id": self._register(subject, stored)[0]}
                if subject not in self._subjects:
                    return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
                sid = self._ids.get(stored.key())
                versions = self._subjects[subject]
                if sid is None or sid not in versions:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, self._version_doc(subject, versions.index(sid) + 1)
            if method == "GET" and len(p) >= 3 and p[2] == "versions":
                versions = self._subjects.get(subject)
                if not versions:
                    return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
                if len(p) == 3:
                    return 200, list(range(1, len(versions) + 1))
                v = p[3]
                n = len(versions) if v == "latest" else int(v) if v.isdigit() else 0
                if not 1 <= n <= len(versions):
                    return 404, {"error_code": 40402, "message": f"Version {v} not found."}
                return 200, self._version_doc(subject, n)
        return 404, {"error_code": 404, "message": "HTTP 404 Not Found"}

    def _version_doc(self, subject: str, version: int) -> dict[str, Any]:
        sid = self._subjects[subject][version - 1]
        return {"subject": subject, "version": version, "id": sid, **self._schemas[sid].doc()}


class _Handler(BaseHTTPRequestHandler):
    reg: TestRegistry
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # silence the per-request log
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, doc, extra = self.reg.handle(self.command, self.path, headers, body)
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    do_GET = _serve
    do_POST = _serve
    do_DELETE = _serve
