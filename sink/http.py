"""A tiny blocking HTTP client for the gateway (stdlib ``http.client``: picklable settings, no extra dependency).

One keep-alive connection per :class:`GatewayHTTP`; a request that fails on the transport is retried on a new
connection with a short backoff (the gateway closes idle keep-alive connections after a few seconds), and
after :data:`ATTEMPTS` failures :class:`GatewayUnavailable` says which gateway could not be reached. A GET
answered 502/503/504 (retriable) is asked again the same way. An HTTP error answer is
:class:`GatewayHTTPError` with the gateway's ``error_code`` and ``message``.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import Any

ARROW = "application/vnd.apache.arrow.stream"
V2 = "application/vnd.kafka.v2+json"
BINARY_JSON = "application/vnd.kafka.binary.v2+json"
ATTEMPTS = 4
BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
RETRY_STATUS = (502, 503, 504)  # GETs answered with these are asked again (ATTEMPTS in all)


class GatewayError(RuntimeError):
    """Base class: the gateway could not answer what the sink needs."""


class GatewayUnavailable(GatewayError):
    pass


class GatewayHTTPError(GatewayError):
    def __init__(self, status: int, error_code: int | None, message: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}" + (f" / {error_code}" if error_code else "") + f": {message}")
        self.status = status
        self.error_code = error_code


class GatewayHTTP:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"gateway URL {url!r}: expected http(s)://host[:port]")
        self.url = url.rstrip("/")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self._timeout)
        return self._conn

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None,
                accept: str = V2) -> tuple[int, dict[str, str], bytes]:
        target = self._prefix + path + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = {**self._headers, "Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = V2
        last: Exception | None = None
        for attempt in range(ATTEMPTS):
            try:
                conn = self._connection()
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
            except (OSError, http.client.HTTPException) as e:
                last = e
                self.close()
                if attempt + 1 < ATTEMPTS:
                    time.sleep(BACKOFF_S[attempt])
        raise GatewayUnavailable(f"the gateway at {self.url} is unreachable ({method} {path}: {last!r})")

    def call(self, method: str, path: str, what: str, params: dict[str, Any] | None = None, body: Any = None,
             accept: str = V2) -> tuple[dict[str, str], bytes]:
        for attempt in range(ATTEMPTS):
            status, headers, payload = self.request(method, path, params, body, accept)
            if status not in RETRY_STATUS or attempt + 1 == ATTEMPTS or method != "GET":
                break
            time.sleep(BACKOFF_S[attempt])  # a retriable answer (503: the broker is busy or moving a leader)
        if status >= 400:
            code, message = None, payload[:500].decode(errors="replace")
            try:
                err = json.loads(payload)
                code, message = err.get("error_code"), err.get("message", message)
            except (ValueError, AttributeError):
                pass
            raise GatewayHTTPError(status, code, message, what)
        return headers, payload

    def get_json(self, path: str, what: str, params: dict[str, Any] | None = None) -> Any:
        _, payload = self.call("GET", path, what, params)
        return json.loads(payload)


def quote(s: str) -> str:
    return urllib.parse.quote(s, safe="")
