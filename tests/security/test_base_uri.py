"""``base_uri`` (v2) and the v3 links are never built from an unchecked Host or a
forged ``Forwarded: proto=``: GATEWAY_PUBLIC_URL when set, else an http(s) URL of a plain host name or
address (400/40003 otherwise, and nothing is created). Real gateway processes over real sockets; the test
client connects from 127.0.0.1, the default trusted proxy, so its forwarded headers are believed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # '*': the Host check (item 7) steps aside, so base_uri's own validation is what is tested
    g = GatewayProcess(tansu.bootstrap, log_file=tmp_path_factory.mktemp("baseuri") / "gw.log",
                       env={"GATEWAY_ALLOWED_HOSTS": "*", "GATEWAY_FORWARDED_ALLOW_IPS": "127.0.0.1"})
    g.env.pop("GATEWAY_PUBLIC_URL", None)
    g.start()
    try:
        yield g
    finally:
        g.stop()


ATTACKS = [
    {"Forwarded": "proto=javascript;host=alert(1)"},
    {"Forwarded": 'proto="javascript";host="x.example"'},
    {"X-Forwarded-Proto": "javascript"},
    {"X-Forwarded-Proto": "data"},
    {"X-Forwarded-Host": "evil.example/phish?"},
    {"X-Forwarded-Host": "user:pass@evil.example"},
    {"Forwarded": 'host="evil.example#"'},
    {"X-Forwarded-Host": "evil.example:99999"},
    {"X-Forwarded-Prefix": '/p"><script>'},
    {"Host": "evil.example/path"},
]


@pytest.mark.parametrize("headers", ATTACKS, ids=[str(sorted(h.items())) for h in ATTACKS])
def test_forged_base_uri_is_refused(gw: GatewayProcess, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        r = c.post("/consumers/baseuri-g", headers={**V2, **headers}, json={"name": "victim"})
        assert r.status_code == 400, r.text
        assert r.json()["error_code"] == 40003 and "GATEWAY_PUBLIC_URL" in r.json()["message"]
        # nothing was created, and an honest client is served at once with the same name
        r = c.post("/consumers/baseuri-g", headers=V2, json={"name": "victim"})
        assert r.status_code == 200, r.text
        uri = r.json()["base_uri"]
        assert uri == f"{gw.url}/consumers/baseuri-g/instances/victim"
        assert c.delete(uri, headers=V2).status_code == 204
        # v3 links come from the same base URL
        r = c.get("/v3/clusters", headers=headers)
        assert r.status_code == 400 and r.json()["error_code"] == 40003, r.text


def test_valid_forwarded_headers_still_shape_base_uri(gw: GatewayProcess) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        h = {"X-Forwarded-Proto": "HTTPS", "X-Forwarded-Host": "kafka-gw.example.com:8443",
             "X-Forwarded-Prefix": "/kafka"}
        r = c.post("/consumers/baseuri-ok", headers={**V2, **h}, json={"name": "fine"})
        assert r.status_code == 200, r.text
        assert r.json()["base_uri"] == "https://kafka-gw.example.com:8443/kafka/consumers/baseuri-ok/instances/fine"
        r = c.post("/consumers/baseuri-ok",
                   headers={**V2, "Forwarded": 'for=1.2.3.4;proto=http;host="[2001:db8::1]:80"'},
                   json={"name": "v6"})
        assert r.status_code == 200 and r.json()["base_uri"].startswith("http://[2001:db8::1]:80/consumers/"), r.text
        for name in ("fine", "v6"):
            assert c.delete(f"/consumers/baseuri-ok/instances/{name}", headers=V2).status_code == 204


def test_public_url_wins_over_any_header(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    g = GatewayProcess(tansu.bootstrap, log_file=tmp_path / "gw.log",
                       env={"GATEWAY_PUBLIC_URL": "https://gw.example.com/base", "GATEWAY_ALLOWED_HOSTS": "*"})
    with g, httpx.Client(base_url=g.url, timeout=10) as c:
        r = c.post("/consumers/baseuri-pub", headers={**V2, "Forwarded": "proto=javascript;host=alert(1)"},
                   json={"name": "p"})
        assert r.status_code == 200, r.text
        assert r.json()["base_uri"] == "https://gw.example.com/base/consumers/baseuri-pub/instances/p"
