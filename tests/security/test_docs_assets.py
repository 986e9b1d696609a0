"""``/docs`` and ``/redoc`` load no third-party script.

Before: FastAPI's default pages loaded Swagger UI and ReDoc, unpinned, from a CDN (``cdn.jsdelivr.net``) and
the Swagger page ran an inline script, so a compromised CDN could run script in the gateway's origin. Now,
against a real gateway process: every script, stylesheet and icon of both pages is the gateway's own (no
scheme, no host), answers 200 with the right content type, no script is inline, and each page carries a
Content-Security-Policy whose ``script-src`` is ``'self'`` alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration


class Refs(HTMLParser):
    """The URLs of a page's script, link and img tags, and the text of scripts without ``src``."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str]] = []  # (tag, url)
        self.inline: list[str] = []
        self._in_inline = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        url = a.get("src") if tag in ("script", "img") else a.get("href") if tag == "link" else None
        if url:
            self.refs.append((tag, url))
        self._in_inline = tag == "script" and not a.get("src")
        if self._in_inline:
            self.inline.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_inline = False

    def handle_data(self, data: str) -> None:
        if self._in_inline:
            self.inline[-1] += data


def csp(resp: httpx.Response) -> dict[str, list[str]]:
    header = resp.headers.get("content-security-policy")
    assert header, f"no Content-Security-Policy on {resp.request.url}"
    out: dict[str, list[str]] = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            out[words[0].lower()] = words[1:]
    return out


def expected_type(url: str) -> str:
    path = urlsplit(url).path
    if path.endswith(".js"):
        return "javascript"
    if path.endswith(".css"):
        return "text/css"
    if path.endswith(".png"):
        return "image/png"
    if path.endswith(".json"):
        return "application/json"
    raise AssertionError(f"unexpected asset {url}")


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("docs-assets")
    with GatewayProcess(tansu.bootstrap, log_file=Path(d) / "gw.log") as g:
        yield g


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_the_gateways_own_assets(gw: GatewayProcess, page: str) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        r = http.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
        policy = csp(r)
        assert policy["script-src"] == ["'self'"], policy
        assert policy["default-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"], policy
        assert r.headers["x-content-type-options"] == "nosniff"

        refs = Refs()
        refs.feed(r.text)
        scripts = [u for t, u in refs.refs if t == "script"]
        assert scripts, f"{page} references no script"
        assert not [s for s in refs.inline if s.strip()], f"inline script on {page}: {refs.inline}"
        for tag, url in refs.refs:
            parts = urlsplit(url)
            assert not parts.scheme and not parts.netloc and url.startswith("/"), f"{page}: external {tag} {url}"
        assert "http://" not in r.text and "https://" not in r.text, f"{page} names an external URL"

        for tag, url in refs.refs:
            a = http.get(urljoin(gw.url, url))
            assert a.status_code == 200, (url, a.status_code, a.text[:200])
            want = expected_type(url)
            assert want in a.headers["content-type"], (url, a.headers["content-type"])
            assert a.headers.get("x-content-type-options") == "nosniff" or want == "application/json", url
            if tag == "script":
                assert len(a.content) > 200, url  # a real bundle / initialisation, not an empty answer

        if page == "/docs":  # the moved initialisation renders the gateway's OpenAPI document
            init = http.get(next(u for u in scripts if u.endswith("swagger-init.js"))).text
            assert "SwaggerUIBundle(" in init and "/openapi.json" in init
            assert "https://" not in init and "http://" not in init
            bundle = next(u for u in scripts if u.endswith("swagger-ui-bundle.js"))
            assert "SwaggerUIBundle" in http.get(bundle).text
        else:
            assert any(u.endswith("redoc.standalone.js") for u in scripts)


def test_only_the_listed_assets_are_served(gw: GatewayProcess) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        for path in ("/docs-assets/__init__.py", "/docs-assets/core.py", "/docs-assets/..%2fcore.py",
                     "/docs-assets/%2e%2e%2f%2e%2e%2fMETADATA", "/docs-assets/swagger-ui.js.map"):
            r = http.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert r.json()["error_code"] == 40400
        assert http.get("/docs-assets/favicon.png").headers["content-type"] == "image/png"
