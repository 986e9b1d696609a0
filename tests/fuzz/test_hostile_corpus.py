"""The hostile-schema corpus (tests/corpus/hostile/*.json): deep, recursive, wide and huge schemas and values,
amplifying block counts, pathological patterns. Each case runs through the in-process decoding stack in a
child process (tests/fuzz/hostile.py), so a segfault, a hang or a memory blow-up fails that case and nothing
else; the case's outcome class (record_error / schema_refused / ok) must be what the case expects, within a
time and a memory bound.

``KCG_HOSTILE_SECONDS`` (default 5) bounds the decode step; ``make fuzz`` raises it for the sanitizer builds.
The child is killed after three times that (at least 15 s) or when its resident memory passes 1.5 GB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus" / "hostile"
CASES = sorted(CORPUS.glob("*.json"))
OUTCOMES = {"record_error", "schema_refused", "ok"}
SECONDS = float(os.environ.get("KCG_HOSTILE_SECONDS") or 5)
KILL_AFTER = max(15.0, 3 * SECONDS)
KILL_RSS_KB = 1_500_000
RSS_GROWTH_MB = 256


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _run_child(case: Path) -> tuple[int | None, str, str, str]:
    """(exit code or None if killed, why killed, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.hostile", str(case)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + KILL_AFTER
    killed = ""
    while True:
        try:
            out, err = proc.communicate(timeout=0.1)
            return proc.returncode, killed, out, err
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            killed = f"still running after {KILL_AFTER:.0f} s (a hang)"
        elif _rss_kb(proc.pid) > KILL_RSS_KB:
            killed = f"resident memory passed {KILL_RSS_KB // 1000} MB"
        if killed:
            proc.kill()
            out, err = proc.communicate()
            return None, killed, out, err


def test_the_corpus_is_well_formed() -> None:
    assert len(CASES) >= 20
    for path in CASES:
        case = json.loads(path.read_text())
        expect = case["expect"] if isinstance(case["expect"], list) else [case["expect"]]
        assert set(expect) <= OUTCOMES and expect, path.name
        assert case["format"] in ("avro", "jsonschema", "protobuf", "json"), path.name
        assert case["direction"] in ("consume", "produce") and case["description"], path.name
        assert path.stat().st_size < 4096, f"{path.name}: generate big schemas and payloads in code"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_hostile_case(path: Path) -> None:
    case = json.loads(path.read_text())
    expect = case["expect"] if isinstance(case["expect"], list) else [case["expect"]]
    code, killed, out, err = _run_child(path)
    assert not killed, f"{path.stem}: {killed}. {case['description']}"
    assert code == 0, f"{path.stem}: the child died with {code} ({case['description']}):\n{err[-3000:]}"
    assert "ERROR: AddressSanitizer" not in err and "runtime error:" not in err, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["outcome"] in expect, f"{path.stem}: {result} (expected {expect}). {case['description']}"
    assert result["seconds"] < SECONDS, f"{path.stem}: {result['seconds']} s. {case['description']}"
    assert result["rss_growth_mb"] < RSS_GROWTH_MB, f"{path.stem}: {result}. {case['description']}"
