"""When `make run` starts the embedded schema registry (service/embedded/registry.py): the decision alone."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from service.embedded.registry import launcher_for, start_problem
from service.settings import Settings


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    path = tmp_path / "start"
    path.write_text("")
    return path


def settings(**kw: object) -> Settings:
    """Settings independent of the GATEWAY_* environment the suite runs in."""
    base: dict[str, object] = {"kafka_bootstrap": None, "schema_registry_url": None, "embedded_registry": "auto"}
    return Settings(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("true", True), ("false", False), ("0", False)])
def test_setting_values(monkeypatch: pytest.MonkeyPatch, value: str, expected: object) -> None:
    monkeypatch.setenv("GATEWAY_EMBEDDED_REGISTRY", value)
    assert Settings().embedded_registry == expected


def test_started_only_with_the_embedded_broker_and_no_registry_url(launcher: Path) -> None:
    assert launcher_for(settings(registry_launcher=str(launcher))) == launcher
    assert launcher_for(settings(registry_launcher=str(launcher), kafka_bootstrap="k:9092")) is None
    assert launcher_for(settings(registry_launcher=str(launcher), schema_registry_url="http://r:8081")) is None
    assert launcher_for(settings(registry_launcher=str(launcher), embedded_registry=False)) is None
    assert launcher_for(settings(registry_launcher=str(launcher), embedded_registry=True)) == launcher


def test_auto_without_a_launcher_is_no_registry_and_no_problem(tmp_path: Path) -> None:
    s = settings(registry_launcher=str(tmp_path / "missing"))
    assert launcher_for(s) is None
    assert start_problem(s) is None


def test_required_without_a_launcher_refuses_to_start(tmp_path: Path, launcher: Path) -> None:
    missing = str(tmp_path / "missing")
    problem = start_problem(settings(registry_launcher=missing, embedded_registry=True))
    assert problem is not None and missing in problem and "GATEWAY_EMBEDDED_REGISTRY=true" in problem
    # not needed (an external broker or registry): no problem even when required
    assert start_problem(settings(registry_launcher=missing, embedded_registry=True, kafka_bootstrap="k:9092")) is None
    assert start_problem(settings(registry_launcher=str(launcher), embedded_registry=True)) is None


FAKE_REGISTRY = r"""
import http.server, json, sys
import asyncio
import os
from pathlib import Path
args = sys.argv[1:]
if "--install-only" in args:
    print(VENV)
    sys.exit(0)
launches = Path(VENV) / "launches"
n = int(launches.read_text()) + 1 if launches.exists() else 1
launches.write_text(str(n))
port = int(args[args.index("--port") + 1])

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"[]" if self.path == "/subjects" else json.dumps({"master_available": n >= 2}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


async def test_a_registry_without_a_master_is_restarted(tmp_path: Path) -> None:
    """Karapace on Tansu now and then never elects itself a master: a registry whose HTTP answers without a
    master for election_timeout is restarted (here the second launch elects), and then it is the default."""
    from service.embedded.registry import EmbeddedRegistry
    from service.schemas.formats import SchemaService

    venv = tmp_path / "venv"
    venv.mkdir()
    launcher = tmp_path / "start"
    launcher.write_text(f"VENV = {str(venv)!r}\n" + FAKE_REGISTRY)
    schemas = SchemaService()
    reg = EmbeddedRegistry(launcher, "127.0.0.1:1", schemas, settings(), ready_timeout=30, election_timeout=1.0)
    try:
        await asyncio.wait_for(reg.start(), 30)
        assert reg.ready and reg.launches == 2 and (venv / "launches").read_text() == "2"
        assert schemas.default is not None and schemas.pending is None
    finally:
        await reg.stop()


ENV_DUMPING_REGISTRY = r"""
import http.server, json, os, sys
from pathlib import Path
args = sys.argv[1:]
name = "install.json" if "--install-only" in args else "run.json"
(Path(VENV) / name).write_text(json.dumps(dict(os.environ)))
if "--install-only" in args:
    print(VENV)
    sys.exit(0)
port = int(args[args.index("--port") + 1])

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"[]" if self.path == "/subjects" else b'{"master_available": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


async def test_the_registry_gets_an_allow_listed_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher (its install step and the registry it execs) sees what it needs to run -- PATH, HOME, the
    locale, KARAPACE_* and pip's settings -- and none of the gateway's secrets: peer and admin tokens, registry
    credentials, or anything else the deployment put in the gateway's environment."""
    import json

    from service.embedded.registry import EmbeddedRegistry, child_env
    from service.schemas.formats import SchemaService

    secrets = {"GATEWAY_PEER_TOKEN": "peer-secret-1", "GATEWAY_ADMIN_TOKEN": "admin-secret-2",
               "GATEWAY_SCHEMA_REGISTRY_BASIC_AUTH": "u:registry-secret-3", "AWS_SECRET_ACCESS_KEY": "aws-secret-4",
               "DATABASE_PASSWORD": "db-secret-5", "PYTHONPATH": "/tmp/hijack"}
    kept = {"KARAPACE_SOME_SETTING": "x1", "LC_ALL": "C.UTF-8", "PIP_INDEX_URL": "http://pypi.local/simple",
            "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    for k, v in {**secrets, **kept}.items():
        monkeypatch.setenv(k, v)
    assert not set(secrets) & set(child_env())
    venv = tmp_path / "venv"
    venv.mkdir()
    launcher = tmp_path / "start"
    launcher.write_text(f"VENV = {str(venv)!r}\n" + ENV_DUMPING_REGISTRY)
    reg = EmbeddedRegistry(launcher, "127.0.0.1:1", SchemaService(), settings(), ready_timeout=30)
    try:
        await asyncio.wait_for(reg.start(), 30)
        assert reg.ready
    finally:
        await reg.stop()
    for dump in ("install.json", "run.json"):
        env = json.loads((venv / dump).read_text())
        leaked = {k for k, v in env.items() if k in secrets or any(s in v for s in secrets.values())}
        assert not leaked, f"{dump}: {sorted(leaked)} reached the registry launcher"
        for k, v in kept.items():
            assert env.get(k) == v, (dump, k)
        assert env.get("PATH") == os.environ["PATH"]
    run = json.loads((venv / "run.json").read_text())
    assert run["KARAPACE_SESSION_TIMEOUT_MS"]  # the gateway's own default for the registry
