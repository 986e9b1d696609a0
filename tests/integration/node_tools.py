"""The npm tools the contract tests run (Redocly CLI, tsc), installed into ``.tools/`` by
``tools/install-node-deps.sh`` (which ``make test`` runs; a test run on its own runs it here, idempotently)."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".tools" / "node_modules" / ".bin"
INSTALL = REPO / "tools" / "install-node-deps.sh"
#: Quiet, offline-friendly npm tools: no telemetry, no update notices.
NODE_ENV = {**os.environ, "REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true",
            "NO_UPDATE_NOTIFIER": "1", "NPM_CONFIG_UPDATE_NOTIFIER": "false"}


@functools.cache
def _installed() -> None:
    proc = subprocess.run(["sh", str(INSTALL)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{INSTALL.name} failed:\n{proc.stdout}\n{proc.stderr}"


def node_tool(name: str) -> Path:
    """The path of an npm tool's executable (``redocly``, ``tsc``), installed first when missing."""
    _installed()
    path = BIN / name
    assert path.exists(), f"{path} missing after {INSTALL.name}"
    return path
