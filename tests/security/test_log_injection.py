"""A request path is logged escaped in the text log format, so a percent-encoded newline
(or carriage return, escape sequence) in it cannot forge log lines.

A real gateway (replica r0, text logs) forwards a request for an instance whose ring owner is r1; "r1" is a
stand-in peer that answers the peer probe and then breaks off every forwarded request, so r0 logs the
failed forward with the request's path. The path's group segment carries a forged log line."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import pytest

from service.embedded.tansu import EmbeddedBroker, free_port
from service.ring import ROUTING_VERSION, owner, routing_key
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
TOKEN = "log-injection-peer-token-0123456789"
FORGED = "2026-01-01 00:00:00,000 CRITICAL gateway admin token accepted from 203.0.113.7"
GROUP = f"g\n{FORGED}\r\x1b[2K"


class BrokenPeer(socketserver.StreamRequestHandler):
    """Answers GET /internal/peer as replica r1; reads any other request and closes without an answer."""

    def handle(self) -> None:
        request_line = self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        if request_line.startswith(b"GET /internal/peer"):
            body = orjson.dumps({"replica_id": "r1", "boot": "fake", "routing_version": ROUTING_VERSION})
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)


@pytest.fixture
def fake_peer() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), BrokenPeer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def name_owned_by_r1() -> str:
    for i in range(1000):
        if owner(["r0", "r1"], routing_key(GROUP, f"i{i}")) == "r1":
            return f"i{i}"
    raise AssertionError("no name owned by r1")


def test_forged_log_line_is_escaped(tansu: EmbeddedBroker, fake_peer: int, tmp_path: Path) -> None:
    log = tmp_path / "gw.log"
    port = free_port()
    g = GatewayProcess(tansu.bootstrap, log_file=log, env={
        "GATEWAY_LOG_FORMAT": "text", "GATEWAY_LOG_LEVEL": "info", "GATEWAY_REPLICA_ID": "r0",
        "GATEWAY_PEER_TOKEN": TOKEN, "GATEWAY_PEER_REFRESH_S": "60"})
    g.port, g.url = port, f"http://127.0.0.1:{port}"
    g.env["GATEWAY_PORT"] = str(port)
    g.env["GATEWAY_PEERS"] = f"http://127.0.0.1:{port},http://127.0.0.1:{fake_peer}"
    with g, httpx.Client(base_url=g.url, timeout=30) as c:
        path = f"/consumers/{quote(GROUP, safe='')}/instances/{name_owned_by_r1()}/offsets"
        r = c.get(path, headers={"Content-Type": "application/vnd.kafka.v2+json"})
        assert r.status_code == 503 and r.json()["error_code"] == 50303, r.text  # forwarded, and the peer broke off
        assert c.get("/topics").status_code == 200  # everyone else is still served
    text = log.read_text()
    lines = text.splitlines()
    assert not any(line.startswith(FORGED) for line in lines), text  # no forged record
    assert not any("\r" in line or "\x1b" in line for line in lines), text
    forward = [line for line in lines if "forwarding GET" in line]
    assert len(forward) == 1, text
    assert f"g\\n{FORGED}\\r\\x1b[2K" in forward[0]  # the path, escaped, on the record's own line
