"""The sink's JVM class-data-sharing archive with a real local Spark JVM: a first session records it when it
ends (``finish_recording``), the next session's JVM maps it (seen in the JVM's /proc/<pid>/maps), and a
damaged archive only costs the speed-up (the JVM runs without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
pytest.importorskip("pyspark")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
from pyspark import SparkContext
from sink.cli import build_session
from sink.jvm import finish_recording
s = build_session()
pid = SparkContext._gateway.proc.pid
maps = open(f"/proc/{pid}/maps").read()
opts = s.sparkContext.getConf().get("spark.driver.extraJavaOptions", "")
n = s.range(1000).selectExpr("sum(id)").collect()[0][0]
s.stop()
print(json.dumps({"opts": opts, "maps": maps, "sum": n, "stored": finish_recording()}))
"""


def session(cache: Path) -> dict:
    env = {**os.environ, "SINK_CLASS_CACHE": str(cache)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_record_then_map_then_survive_a_damaged_archive(tmp_path: Path) -> None:
    cache = tmp_path / "cds"
    first = session(cache)
    assert "-XX:ArchiveClassesAtExit=" in first["opts"] and first["stored"] is True and first["sum"] == 499500
    archives = list(cache.glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1_000_000
    assert not list(cache.glob("*.tmp"))

    second = session(cache)
    assert f"-XX:SharedArchiveFile={archives[0]}" in second["opts"] and second["stored"] is False
    assert str(archives[0]) in second["maps"], "the JVM did not map the class-data archive"
    assert second["sum"] == 499500

    archives[0].chmod(0o644)
    archives[0].write_bytes(b"\0" * 4096)  # damaged: the JVM must start anyway, without sharing
    third = session(cache)
    assert third["sum"] == 499500 and str(archives[0]) not in third["maps"]
