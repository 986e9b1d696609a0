"""Fixtures shared by integration tests: ``http``, an httpx client of the module's ``gw`` gateway process;
a local S3 server (moto) for a Tansu broker that must keep its log, groups and committed offsets across a
kill -9 (``memory://`` forgets everything on restart); ``schema_registry``, a real Karapace Schema Registry on the
session's Tansu broker."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker, free_port
from tests.integration.gateway_proc import GatewayProcess

S3_BUCKET = "tansu"
#: the Karapace launcher of ../shared; tools/install-registry.sh pre-builds its venv in `make test`
REGISTRY_START = Path(__file__).resolve().parents[2].parent / "shared" / "registry" / "start"


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the module's ``gw`` fixture (a GatewayProcess); redirects are not followed."""
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One local Spark session per test module (the sink tests; needs the ``spark`` extra)."""
    from sink.cli import build_session, stop_session

    s = build_session()
    try:
        yield s
    finally:
        stop_session(s)  # also stores the JVM class-data archive if this session recorded it


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    """A running ``moto_server`` with the bucket :data:`S3_BUCKET` created; yields the AWS_* environment a
    Tansu broker with ``--storage-engine s3://tansu/`` needs (without it Tansu tries a cloud metadata
    address). Use: ``EmbeddedBroker(storage=f"s3://{S3_BUCKET}/", env=s3_env)``."""
    port = free_port()
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    assert exe, "moto[server] is a test dependency"
    proc = subprocess.Popen([exe, "-p", str(port), "-H", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(endpoint, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)  # waiting for an external process to bind its port
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"}
        r = httpx.put(f"{endpoint}/{S3_BUCKET}")  # create the bucket (moto accepts unsigned requests)
        assert r.status_code == 200, r.text
        yield env
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def s3_broker(s3_env: dict[str, str], tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A started Tansu broker on the moto bucket; ``kill()`` then ``start()`` restarts it on the same port
    and bucket with its data."""
    broker = EmbeddedBroker(storage=f"s3://{S3_BUCKET}/", env=s3_env, log_file=tmp_path / "tansu-s3.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def cleanup() -> Iterator[list[GatewayProcess]]:
    """Gateway processes a test started (append them): stopped at the end, whatever happened."""
    started: list[GatewayProcess] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture(scope="session")
def registry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A Tansu broker of the schema registry's own: on the session broker, after the rest of the suite had used
    it for a while, Karapace's master election never completed ("No master set", its ``_schemas`` topic never
    created) and the registry did not start within its timeout. It holds only the schemas: the gateways of the schema
    tests and their records are on the module's ``broker`` (Tansu, then Apache Kafka)."""
    broker = EmbeddedBroker(log_file=tmp_path_factory.mktemp("registry-tansu") / "tansu.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def schema_registry(registry_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a real Schema Registry (Karapace 5.0.3, started by ../shared/registry/start) keeping its
    schemas in ``registry_broker``'s ``_schemas`` topic; stopped at the end of the session."""
    if not REGISTRY_START.is_file():
        pytest.skip(f"no Karapace launcher at {REGISTRY_START} (../shared is absent)")
    tansu = registry_broker
    log = tmp_path_factory.mktemp("registry") / "karapace.log"
    # Tansu answers Karapace's master-election JoinGroup after about half the session timeout
    env = {**os.environ, "KARAPACE_SESSION_TIMEOUT_MS": "6000"}
    run = subprocess.run(
        [sys.executable, str(REGISTRY_START), "--bootstrap", tansu.bootstrap, "--port", str(free_port()),
         "--background", "--log-file", str(log)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, f"the schema registry did not start:\n{run.stdout}\n{run.stderr}"
    url, pid_line = run.stdout.split()[:2]
    pid = int(pid_line.removeprefix("pid="))
    try:
        yield url
    finally:
        _stop_detached(pid)


def _stop_detached(pid: int, timeout: float = 10) -> None:
    """SIGTERM a process that is not our child (the launcher detached it), wait for its exit, then SIGKILL."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        if not select.select([fd], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
            select.select([fd], [], [], timeout)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)
