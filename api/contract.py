"""The published contract as the app generates it: an app built with default settings, its enriched OpenAPI
document (:mod:`api.openapi`). Used by ``tools/export_openapi.py`` (which writes ``openapi.yaml``) and the
contract tests. Kept apart from :mod:`api.openapi`, which :mod:`api.app` imports, so that neither module
imports the other's importer."""

from __future__ import annotations

import logging
from typing import Any

from api.app import create_app
from service.settings import Settings


def app_schema() -> dict[str, Any]:
    """The contract as the app generates it, from an app built with default settings (nothing is started,
    no environment variable is read)."""
    tenants_log = logging.getLogger("service.tenants")
    level = tenants_log.level
    tenants_log.setLevel(logging.ERROR)  # the 'no authentication' warning is about serving, not documenting
    try:
        app = create_app(Settings.model_construct(), "localhost:9092")
    finally:
        tenants_log.setLevel(level)
    return app.openapi()
