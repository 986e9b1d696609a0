"""``make fuzz`` (tools/fuzz.sh) works on this machine, as docs/security.md says: it builds the three C extensions
with AddressSanitizer + UndefinedBehaviorSanitizer into a temporary copy, checks the tier imports those builds,
and runs the tier's tests there. A short run (one test, a few examples) proves the recipe; the long run is
``make fuzz`` itself. Outside tests/fuzz on purpose: tools/fuzz.sh runs tests/fuzz, which must not run itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def test_fuzz_script_runs_the_tier_against_sanitizer_builds(tmp_path: Path) -> None:
    env = {**os.environ, "KCG_FUZZ_EXAMPLES": "3", "TMPDIR": str(tmp_path)}
    env.pop("LD_PRELOAD", None)
    proc = subprocess.run(["sh", "tools/fuzz.sh", sys.executable, "-k", "every_public_c_function"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=280, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "the three extensions import from the sanitizer builds" in out, out[-4000:]
    assert "1 passed" in out, out[-4000:]
    assert "sanitizer report" not in out, out[-4000:]
    assert list(tmp_path.iterdir()) == []  # the temporary copy is removed
