"""Optional C extensions (built by ``hatch_build.py``): one import rule for all of them.

An extension is used when it can be imported, unless ``KCG_NO_CEXT=1`` is set in the environment at import
time; every module using one keeps a pure-Python twin and falls back to it (``make test`` sets
``KCG_REQUIRE_CEXT=1`` so that the differential tests fail rather than skip when an extension is missing).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load(name: str) -> tuple[ModuleType | None, str | None]:
    """``(module, None)`` for the extension ``name`` (dotted), or ``(None, why not)``."""
    if os.environ.get("KCG_NO_CEXT", "") not in ("", "0"):
        return None, "disabled by KCG_NO_CEXT"
    try:
        return importlib.import_module(name), None
    except ImportError as exc:  # not built (no compiler), or built for another interpreter
        return None, str(exc)
