"""A class-data-sharing (CDS) archive for the sink's local Spark JVM: a faster start and first batch.

A local Spark JVM loads and verifies some twenty thousand classes before and during its first micro-batch.
Java 13+ can record the classes an application loaded into a *dynamic CDS archive* when it exits
(``-XX:ArchiveClassesAtExit``) and map that archive at the next start (``-XX:SharedArchiveFile``), which
skips parsing and verifying them. Measured with ``bench/sink.py``-sized runs (1M records, local[2], 2 cores):
session start 7-8 s -> 4-5 s and the first run 11.5-13 s -> 9-10 s; steady-state runs are unchanged.

The archive lives in a cache directory (``$SINK_CLASS_CACHE``, default
``${XDG_CACHE_HOME:-~/.cache}/kafka-consumer-gateway/spark-cds``; ``SINK_CLASS_CACHE=off`` disables it), one
file per (java binary, pyspark version and jars, Python environment), about 180 MB. The first process records
into ``<key>.<pid>.tmp`` (its run is slightly slower) and, at its end, :func:`finish_recording` stops the JVM,
waits for the archive to be written and renames it into place; a recording whose process died first is
deleted by a later start. A stale archive (other JVM, other jars) is harmless: the JVM's default
``-Xshare:auto`` then runs without it.

Only for a JVM this process launches itself (``local[...]`` masters): with spark-submit, pass the flags in
``spark.driver.extraJavaOptions`` yourself (see docs/sink.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

SUFFIX = ".jsa"
KEEP_OTHERS = 2  # archives of other environments (another venv, another pyspark) kept besides this one's
QUIET = "-Xlog:cds*=off"  # the recording run would list every class it cannot archive on stderr


def cache_dir() -> Path | None:
    v = os.environ.get("SINK_CLASS_CACHE", "")
    if v.strip().lower() in ("off", "0", "false", "no", "none"):
        return None
    if v:
        return Path(v).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kafka-consumer-gateway" / "spark-cds"


def java_binary() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    exe = Path(home) / "bin" / "java" if home else None
    if exe is None or not exe.exists():
        found = shutil.which("java")
        exe = Path(found) if found else None
    return exe.resolve() if exe is not None else None


def archive_key() -> str | None:
    """What an archive is valid for: the JVM binary, pyspark's jars and this Python environment."""
    java = java_binary()
    if java is None:
        return None
    try:
        import pyspark
    except ImportError:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    h = hashlib.sha256()
    st = java.stat()
    h.update(f"{java}|{st.st_size}|{st.st_mtime_ns}|{pyspark.__version__}|{sys.prefix}|".encode())
    if jars.is_dir():
        h.update("|".join(sorted(p.name for p in jars.iterdir())).encode())
    return f"spark-{pyspark.__version__}-{h.hexdigest()[:16]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_recording: tuple[Path, Path] | None = None  # (this process's recording, where it goes when finished)


def clean(directory: Path, key: str) -> None:
    """Delete recordings whose process is gone (unfinished: the JVM may have died while writing) and all
    but the newest :data:`KEEP_OTHERS` archives of other keys (another JVM, pyspark or environment)."""
    for p in directory.glob("*.tmp"):
        try:
            pid = int(p.name[:-len(".tmp")].rsplit(".", 1)[1])
        except (ValueError, IndexError):
            continue
        if not _alive(pid):
            try:
                p.unlink()
            except OSError:
                pass
    others = sorted((p for p in directory.glob(f"*{SUFFIX}") if p.name != f"{key}{SUFFIX}"),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for p in others[KEEP_OTHERS:]:
        try:
            p.unlink()
        except OSError:
            pass


def java_options() -> str:
    """``-XX`` flags for the driver JVM: map the archive if there is one, else record one at exit."""
    directory, key = cache_dir(), archive_key()
    if directory is None or key is None:
        return ""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        clean(directory, key)
    except OSError:
        return ""
    final = directory / f"{key}{SUFFIX}"
    if final.exists():
        return _flag("SharedArchiveFile", final)
    if any(directory.glob(f"{key}.*.tmp")):
        return ""  # another process is recording: do not record twice
    if not os.access(directory, os.W_OK):
        return ""
    global _recording
    _recording = (directory / f"{key}.{os.getpid()}.tmp", final)
    return _flag("ArchiveClassesAtExit", _recording[0])


def finish_recording(timeout: float = 120.0) -> bool:
    """If this process's JVM is recording an archive: stop the JVM (after ``spark.stop()``), wait until it
    has written the archive and move it into place. A no-op otherwise. True when an archive was stored."""
    global _recording
    if _recording is None:
        return False
    tmp, final = _recording
    _recording = None
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return False
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # the PySpark JVM exits at end of input; the archive is written on exit
        proc.wait(timeout=timeout)
    except Exception:
        return False
    finally:
        SparkContext._gateway = None
        SparkContext._jvm = None
    try:
        if proc.returncode == 0 and tmp.stat().st_size > 0:
            os.replace(tmp, final)
            return True
        tmp.unlink()
    except OSError:
        pass
    return False


def _flag(name: str, path: Path) -> str:
    flag = f"-XX:{name}={path}"
    if any(c.isspace() for c in flag):
        flag = f'"{flag}"'  # Spark splits the options like a shell
    return f"{QUIET} {flag}"
