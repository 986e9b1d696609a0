"""The sink's JVM class-data-sharing cache (sink/jvm.py): which flags a local Spark JVM gets, and the
cache directory's housekeeping. The real JVM round trip (record, then map) is in
tests/integration/test_sink_tansu.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sink import jvm


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SINK_CLASS_CACHE", str(tmp_path / "cds"))
    monkeypatch.setattr(jvm, "_recording", None)
    return tmp_path / "cds"


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_cache_dir_default_env_and_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SINK_CLASS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jvm.cache_dir() == tmp_path / "kafka-consumer-gateway" / "spark-cds"
    monkeypatch.setenv("SINK_CLASS_CACHE", "~/x")
    assert jvm.cache_dir() == Path("~/x").expanduser()
    for off in ("off", "OFF", "0", "false", "none"):
        monkeypatch.setenv("SINK_CLASS_CACHE", off)
        assert jvm.cache_dir() is None
        assert jvm.java_options() == ""


def test_key_names_pyspark_and_changes_with_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    key = jvm.archive_key()
    assert key is not None and key.startswith(f"spark-{pyspark.__version__}-")
    assert jvm.archive_key() == key  # stable
    monkeypatch.setattr(sys, "prefix", "/some/other/venv")
    assert jvm.archive_key() != key
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert jvm.archive_key() is None


def test_first_start_records_then_a_stored_archive_is_mapped(cache: Path) -> None:
    key = jvm.archive_key()
    opts = jvm.java_options()
    tmp = cache / f"{key}.{os.getpid()}.tmp"
    assert opts == f"{jvm.QUIET} -XX:ArchiveClassesAtExit={tmp}"
    assert jvm._recording == (tmp, cache / f"{key}.jsa")
    # while this process records, another start neither records nor maps
    jvm._recording = None
    tmp.write_bytes(b"x")
    assert jvm.java_options() == ""
    tmp.unlink()
    (cache / f"{key}.jsa").write_bytes(b"archive")
    assert jvm.java_options() == f"{jvm.QUIET} -XX:SharedArchiveFile={cache / f'{key}.jsa'}"
    assert jvm._recording is None


def test_paths_with_spaces_are_quoted_for_sparks_option_splitting(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "with space"
    monkeypatch.setenv("SINK_CLASS_CACHE", str(d))
    monkeypatch.setattr(jvm, "_recording", None)
    opts = jvm.java_options()
    assert opts.startswith(f'{jvm.QUIET} "-XX:ArchiveClassesAtExit={d}/') and opts.endswith('.tmp"')


def test_clean_drops_dead_recordings_and_old_archives_of_other_environments(cache: Path) -> None:
    cache.mkdir(parents=True)
    key = "spark-9.9.9-aaaa"
    dead, live = cache / f"{key}.{dead_pid()}.tmp", cache / f"{key}.{os.getpid()}.tmp"
    dead.write_bytes(b"half")
    live.write_bytes(b"busy")
    mine = cache / f"{key}.jsa"
    mine.write_bytes(b"a")
    others = []
    for i in range(4):
        p = cache / f"spark-9.9.9-other{i}.jsa"
        p.write_bytes(b"o")
        os.utime(p, (1000 + i, 1000 + i))
        others.append(p)
    jvm.clean(cache, key)
    assert not dead.exists() and live.exists() and mine.exists()
    assert [p.exists() for p in others] == [False, False, True, True]  # the newest KEEP_OTHERS stay


def test_finish_recording_is_a_no_op_without_a_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm, "_recording", None)
    assert jvm.finish_recording() is False


def test_unwritable_cache_gives_no_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("not a directory")
    monkeypatch.setenv("SINK_CLASS_CACHE", str(f / "cds"))
    assert jvm.java_options() == ""
