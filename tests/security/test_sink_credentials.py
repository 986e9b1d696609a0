"""The sink's API key is not visible to other users of the machine, nor in Spark's plans.

Before: ``consumer-gateway sink --api-key KEY`` was the way to pass a key, so every local user could read it
(``ps``, ``/proc/PID/cmdline``), and Spark got it as the data source option ``apiKey``, which Spark's default
``spark.redaction.regex`` does not match, so it was printed in clear in the streaming plan (UI, logs).

Now, against a real gateway process that requires the key (Tansu behind it):

- the key from ``--api-key-file`` or ``GATEWAY_API_KEY`` is used (the gateway answers as for that tenant: data
  is read, a missing topic is a 404, not the 401 a run without the key gets), and while a whole sink run goes
  on (Python driver, Spark's JVM, Python workers) no command line of its process tree holds the key;
- ``--api-key KEY`` still works for existing scripts, with a warning on stderr naming the risk;
- the option that carries the key, ``apiToken``, matches Spark's default redaction pattern, and the streaming
  plan of a query shows ``*********(redacted)`` instead of the key (the old ``apiKey`` still works, in clear).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer
from confluent_kafka.admin import AdminClient, NewTopic

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]
KEY = f"sink-secret-key-{uuid.uuid4().hex}"
PREFIX = "sinkcred-"
#: Spark's default spark.redaction.regex (core/src/main/scala/org/apache/spark/internal/config/package.scala)
SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"
RECORDS = 30


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("sink-credentials")
    tenants = d / "tenants.yaml"
    tenants.write_text(f"""
version: 1
tenants:
  - id: sink-team
    api_keys: ["sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]
    topics: ["{PREFIX}*"]
""")
    with GatewayProcess(tansu.bootstrap, log_file=d / "gw.log", env={"GATEWAY_TENANTS_FILE": str(tenants)}) as g:
        yield g


@pytest.fixture(scope="module")
def topic(tansu: EmbeddedBroker) -> str:
    name = f"{PREFIX}{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for f in admin.create_topics([NewTopic(name, 2, 1)]).values():
        f.result(30)
    p = CKProducer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(name, value=b"v%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    return name


def sink_argv(gw: GatewayProcess, topic: str, tmp: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gateway", "sink", "--gateway", gw.url, "--topics", topic,
            "--table", str(tmp / "table"), "--checkpoint", str(tmp / "cp"), "--quiet", *extra]


def env_without_key(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_API_KEY"}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def cmdlines(root: int) -> dict[int, str]:
    """What ``ps -ef`` shows of each process of the tree: the command line, as any local user may read it."""
    out = {}
    for pid in descendants(root):
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return out


def watch(proc: subprocess.Popen[bytes], timeout: float = 420) -> list[str]:
    """Every command line seen in the process tree of ``proc`` until it exits."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            raise AssertionError(f"the sink did not finish in {timeout} s")
        seen.update(cmdlines(proc.pid).values())
        time.sleep(0.2)  # sampling another process tree's command lines while it runs, as ps would
    return sorted(seen)


def test_key_from_a_file_runs_the_sink_and_is_on_no_command_line(gw: GatewayProcess, topic: str,
                                                                 tmp_path: Path) -> None:
    key_file = tmp_path / "gateway.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    log = tmp_path / "sink.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(sink_argv(gw, topic, tmp_path, "--api-key-file", str(key_file)), cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env_without_key())
        seen = watch(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text
    assert f"{RECORDS} rows" in text, text  # the gateway served the tenant's data: the key was used
    assert "warning" not in text, text
    assert any("java" in c and "org.apache.spark" in c for c in seen), seen  # Spark's JVM was watched too
    assert any("sink" in c and str(key_file) in c for c in seen), seen
    leaked = [c for c in seen if KEY in c]
    assert not leaked, leaked

    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "table").num_rows == RECORDS


def test_key_from_the_environment_is_used(gw: GatewayProcess, tmp_path: Path) -> None:
    missing = f"{PREFIX}missing-{uuid.uuid4().hex[:6]}"
    argv = sink_argv(gw, missing, tmp_path)
    assert KEY not in " ".join(argv)
    without = subprocess.run(argv, cwd=REPO, capture_output=True, env=env_without_key(), timeout=120)
    assert without.returncode == 1 and b"HTTP 401" in without.stderr, without.stderr
    with_env = subprocess.run(argv, cwd=REPO, capture_output=True, env=env_without_key(GATEWAY_API_KEY=KEY),
                              timeout=120)
    # authenticated: the tenant's answer for a topic that does not exist (the preflight stops before Spark)
    assert with_env.returncode == 1 and b"HTTP 404" in with_env.stderr, with_env.stderr
    assert b"warning" not in with_env.stderr and KEY.encode() not in with_env.stderr + with_env.stdout


def test_api_key_on_the_command_line_still_works_but_warns(gw: GatewayProcess, tmp_path: Path) -> None:
    missing = f"{PREFIX}missing-{uuid.uuid4().hex[:6]}"
    r = subprocess.run(sink_argv(gw, missing, tmp_path, "--api-key", KEY), cwd=REPO, capture_output=True,
                       env=env_without_key(), timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 1 and "HTTP 404" in err, err  # the key was accepted
    assert "warning: --api-key" in err and "GATEWAY_API_KEY" in err and "--api-key-file" in err, err
    assert KEY not in err
    # both at once is a usage error; an empty key file too
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    for extra in (["--api-key", KEY, "--api-key-file", str(empty)], ["--api-key-file", str(empty)],
                  ["--api-key-file", str(tmp_path / "nope.key")]):
        bad = subprocess.run(sink_argv(gw, missing, tmp_path, *extra), cwd=REPO, capture_output=True,
                             env=env_without_key(), timeout=120)
        assert bad.returncode == 2, (extra, bad.stderr)
    assert httpx.get(f"{gw.url}/healthz").status_code == 200


def test_the_spark_option_is_redacted_by_sparks_default_pattern(gw: GatewayProcess, topic: str) -> None:
    from sink.cli import API_KEY_OPTION, build_session, stop_session
    from sink.source import Settings

    assert re.search(SPARK_DEFAULT_REDACTION, API_KEY_OPTION), API_KEY_OPTION
    assert not re.search(SPARK_DEFAULT_REDACTION, "apiKey")  # why the option was renamed
    # the old name keeps working for existing jobs
    assert Settings.from_options({"gateway": gw.url, "topics": topic, "apiKey": KEY}).api_key == KEY
    s = Settings.from_options({"gateway": gw.url, "topics": topic, API_KEY_OPTION: KEY})
    assert s.api_key == KEY and KEY not in repr(s)

    spark: Any = build_session("local[1]", "1g", app_name="sink-redaction")
    try:
        assert spark.sparkContext.getConf().get("spark.redaction.regex") is None  # Spark's default is in force
        df = (spark.readStream.format("kafka_gateway").option("gateway", gw.url).option("topics", topic)
              .option(API_KEY_OPTION, KEY).load())
        plan = df._jdf.queryExecution().toString()
        assert f"{API_KEY_OPTION}=*********(redacted)" in plan, plan
        assert KEY not in plan, plan
    finally:
        stop_session(spark)
