"""``/docs`` (Swagger UI) and ``/redoc`` served from the gateway itself: no third-party script, no CDN.

The browser assets come from the pinned ``fastapi-offline`` package (its ``static`` directory ships
Swagger UI's ``swagger-ui-bundle.js`` / ``swagger-ui.css`` and ReDoc's ``redoc.standalone.js``) and are
answered under :data:`ASSETS_PATH` with fixed content types. The pages are FastAPI's own
(``get_swagger_ui_html`` / ``get_redoc_html``) pointed at those assets; the one inline script of the Swagger
page (the ``SwaggerUIBundle({...})`` call) is moved to ``/docs/swagger-init.js`` so that both pages carry a
Content-Security-Policy allowing only the gateway's own scripts (:data:`CSP`).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

from api.errors import error_response

ASSETS_PATH = "/docs-assets"
SWAGGER_INIT_PATH = "/docs/swagger-init.js"
#: scripts and styles only from the gateway's origin (ReDoc injects <style> elements and starts its search
#: worker from a blob: URL); nothing may frame the pages
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
_JS = "text/javascript; charset=utf-8"
#: the files served under ASSETS_PATH, and their content types (nothing else of the package is reachable)
ASSETS: dict[str, str] = {
    "swagger-ui-bundle.js": _JS,
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": _JS,
    "favicon.png": "image/png",
}
#: every path install_docs serves (none of them is an API operation of the contract)
DOCS_PATHS = ("/docs", SWAGGER_INIT_PATH, "/redoc", ASSETS_PATH + "/{name}")
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


@cache
def _asset(name: str) -> bytes:
    return (assets_dir() / name).read_bytes()


def _page_headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def swagger_page(app: FastAPI, root: str) -> tuple[str, str]:
    """The Swagger UI page (its inline script replaced by a reference) and the script it had inline."""
    html = bytes(get_swagger_ui_html(
        openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
        swagger_ui_parameters=app.swagger_ui_parameters).body).decode()
    found = _INLINE_SCRIPT.search(html)
    if found is None:  # FastAPI changed its page: fail loudly rather than serve a page the CSP breaks
        raise RuntimeError("get_swagger_ui_html has no inline initialisation script")
    page = html[:found.start()] + f'<script src="{root}{SWAGGER_INIT_PATH}"></script>' + html[found.end():]
    # the document the page renders, also for readers without scripts
    page = page.replace("</head>", f'<link rel="alternate" type="application/json" href="{root}{app.openapi_url}">\n'
                        "    </head>", 1)
    return page, found.group(1)


def install_docs(app: FastAPI) -> None:
    """``/docs``, ``/docs/swagger-init.js``, ``/redoc`` and the assets (create the app with ``docs_url=None,
    redoc_url=None``)."""

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> Response:
        page, _ = swagger_page(app, request.scope.get("root_path", ""))
        return Response(page, media_type="text/html; charset=utf-8", headers=_page_headers())

    @app.get(SWAGGER_INIT_PATH, include_in_schema=False)
    async def swagger_init(request: Request) -> Response:
        _, script = swagger_page(app, request.scope.get("root_path", ""))
        return Response(script, media_type=_JS, headers={"X-Content-Type-Options": "nosniff",
                                                           "Cache-Control": "no-cache"})

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        html = get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png", with_google_fonts=False)
        return Response(html.body, media_type="text/html; charset=utf-8", headers=_page_headers())

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        media = ASSETS.get(name)
        if media is None:
            return error_response(404, 40400, f"no such endpoint: GET {ASSETS_PATH}/{name}")
        return Response(_asset(name), media_type=media, headers={"X-Content-Type-Options": "nosniff",
                                                                  "Cache-Control": "public, max-age=86400"})
