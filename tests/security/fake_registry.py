"""A Schema Registry stand-in for attacks against a running gateway: real HTTP on a real socket, answers under
the test's control, and a record of what the gateway asked (requests, how many were in flight at once).

* ``GET /schemas/ids/{id}``: the schema of ``schemas[id]`` (200), else 404 / 40403, after ``delay`` seconds;
* ``GET /schemas/ids/{id}/versions``: the subjects of ``id_subjects[id]`` (each at version 1), else 404 / 40403;
* ``POST /subjects/{s}/versions``: ``register`` decides -- ``"refuse"`` answers 422 / 42201 (the registry's
  "invalid schema"), ``"accept"`` gives the schema a new id (or its existing one) and keeps it;
* anything else: 404 / 40401.

Each connection is served on a thread of its own, so the registry itself never limits the concurrency the
gateway reaches: ``max_in_flight`` is the gateway's.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: hundreds of connections at once are the point


class FakeRegistry:
    def __init__(self, *, delay: float = 0.0, register: str = "refuse") -> None:
        self.delay = delay
        self.register = register
        self.schemas: dict[int, str] = {}
        self.id_subjects: dict[int, list[str]] = {}
        self.asked: dict[str, int] = {}  # GET paths -> how many times asked
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.registered: list[str] = []  # subjects of register requests
        self._lock = threading.Lock()
        self._next_id = 1_000_000
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _enter(self) -> None:
                with registry._lock:
                    registry.requests += 1
                    registry.in_flight += 1
                    registry.max_in_flight = max(registry.max_in_flight, registry.in_flight)

            def _leave(self) -> None:
                with registry._lock:
                    registry.in_flight -= 1

            def do_GET(self) -> None:
                self._enter()
                try:
                    if registry.delay:
                        time.sleep(registry.delay)  # a registry thread per connection: not the gateway's time
                    path = self.path.split("?", 1)[0]
                    with registry._lock:
                        registry.asked[path] = registry.asked.get(path, 0) + 1
                    parts = path.strip("/").split("/")
                    if len(parts) == 4 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit() \
                            and parts[3] == "versions":
                        subjects = registry.id_subjects.get(int(parts[2]))
                        if subjects is not None:
                            return self._answer(200, [{"subject": s, "version": 1} for s in subjects])
                        return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                    if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
                        text = registry.schemas.get(int(parts[2]))
                        if text is not None:
                            return self._answer(200, {"schema": text})
                        return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                    return self._answer(404, {"error_code": 40401, "message": "Subject not found"})
                finally:
                    self._leave()

            def do_POST(self) -> None:
                self._enter()
                try:
                    doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                    parts = self.path.split("?", 1)[0].strip("/").split("/")
                    if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
                        with registry._lock:
                            registry.registered.append(parts[1])
                        if registry.register == "refuse":
                            return self._answer(422, {"error_code": 42201, "message": "Invalid schema"})
                        with registry._lock:
                            for sid, text in registry.schemas.items():
                                if text == doc.get("schema"):
                                    return self._answer(200, {"id": sid})
                            registry._next_id += 1
                            registry.schemas[registry._next_id] = doc.get("schema")
                            return self._answer(200, {"id": registry._next_id})
                    return self._answer(404, {"error_code": 40401, "message": "Subject not found"})
                finally:
                    self._leave()

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-registry", daemon=True)

    def __enter__(self) -> FakeRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
