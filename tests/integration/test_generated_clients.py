"""Clients generated from ``openapi.yaml`` work, unmodified, in more than one language.

Six generated clients: openapi-generator's ``typescript-fetch`` and ``typescript-axios`` (compiled with ``tsc
--strict``, run with node), ``python``, ``java`` (okhttp-gson, compiled by Maven; its dependencies come from
Maven Central into ``~/.m2``) and ``go`` (built by the Go toolchain), and openapi-python-client. Each generated
client runs the consumer flow of ``tests/integration/clients/`` against a real gateway process (with API-key
authentication) over Tansu: produce binary and json records (openapi-generator's clients with their one body
type, JsonProduceRequest, and the ``Content-Type`` parameter; openapi-python-client by the body's class), then for a
binary and a json instance create → subscribe → poll → commit → committed offsets (``GET .../offsets`` with a body,
query parameters or neither, as each client can) → delete. Generated and compiled sources are cached under
``.cache/generated-clients/<hash of the contract, the flows and the tool versions>`` (git-ignored), so only a changed
contract pays the generating and compiling (about 50 s on 2 cores; about 75 s when Maven fills an empty ``~/.m2``
first); with the cache the module takes about 20 s. A missing toolchain (node and npm, a JDK and Maven, Go) fails the
test: it is never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.node_tools import NODE_ENV, REPO, node_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

OPENAPI = REPO / "openapi.yaml"
FLOWS = Path(__file__).resolve().parent / "clients"
CACHE = REPO / ".cache" / "generated-clients"
BIN = Path(sys.executable).parent
API_KEY = "generated-clients-key-3Fq9"
RECORDS = 6
TSCONFIG = {"compilerOptions": {"target": "ES2022", "module": "commonjs", "lib": ["ES2022", "DOM"], "strict": True,
                                "noEmitOnError": True, "outDir": "dist", "skipLibCheck": False, "types": ["node"],
                                "typeRoots": [str(REPO / ".tools" / "node_modules" / "@types")]},
            "include": ["**/*.ts"], "exclude": ["dist", "node_modules"]}


#: The pinned axios of the typescript-axios client (its one runtime dependency), installed beside it.
AXIOS = "axios@1.21.1"
#: openapi-generator's clients, generated in one JVM (``openapi-generator-cli batch``): directory -> options.
OPENAPI_GENERATOR: dict[str, dict[str, Any]] = {
    "ts": {"generatorName": "typescript-fetch"},
    "tsaxios": {"generatorName": "typescript-axios"},
    "ogpy": {"generatorName": "python", "additionalProperties": {"packageName": "kcg_client"}},
    "java": {"generatorName": "java", "additionalProperties": {
        "invokerPackage": "kcg.client", "apiPackage": "kcg.client.api", "modelPackage": "kcg.client.model",
        "hideGenerationTimestamp": True}},
    "go": {"generatorName": "go", "gitUserId": "kcg", "gitRepoId": "client",
           "additionalProperties": {"packageName": "kcg"}},
}


def _tool(name: str) -> str:
    """A toolchain the generated clients need: its absence fails the test (it is part of the product's promise)."""
    path = shutil.which(name)
    assert path, (f"{name} is not installed: the generated clients need node and npm, a JDK with Maven "
                  "(tools/install-node-deps.sh installs them from Debian) and Go >= 1.23 (go.dev) on PATH")
    return path


def _version(cmd: list[str]) -> bytes:
    proc = subprocess.run(cmd, capture_output=True, timeout=60)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout!r}\n{proc.stderr!r}"
    return proc.stdout + proc.stderr


def _cache_key() -> str:
    h = hashlib.sha256(OPENAPI.read_bytes())
    for flow in sorted(FLOWS.iterdir()):
        h.update(flow.name.encode() + flow.read_bytes())
    h.update(Path(__file__).read_bytes())
    for dist in ("openapi-generator-cli", "openapi-python-client"):
        h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
    h.update((REPO / "tools" / "install-node-deps.sh").read_bytes())  # the pinned tsc version
    for cmd in ([_tool("javac"), "-version"], [_tool("mvn"), "-v"], [_tool("go"), "version"]):
        h.update(_version(cmd))
    return h.hexdigest()[:16]


def _run_all(out: Path, commands: dict[str, tuple[list[str], Path, dict[str, str]]], what: str) -> None:
    """Run the commands side by side (each logged to ``<name>.log``), asserting that every one succeeded."""
    with contextlib.ExitStack() as stack:
        jobs = {name: subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.STDOUT,
                                       stdout=stack.enter_context(open(out / f"{name}.log", "wb")))
                for name, (cmd, cwd, env) in commands.items()}
        for name, job in jobs.items():
            assert job.wait(600) == 0, f"{what} {name} failed ({commands[name][0][:4]}):\n" + (
                out / f"{name}.log").read_text(errors="replace")[-4000:]


def _generate(out: Path) -> None:
    """Generate the clients (openapi-generator's five in one JVM beside openapi-python-client), then compile
    each: tsc for the TypeScript ones (and axios installed), Maven for Java, the Go toolchain for Go."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # openapi-python-client runs ruff
    batch = []
    for name, options in OPENAPI_GENERATOR.items():
        config = out / f"{name}.openapi-generator.json"
        config.write_text(json.dumps({**options, "inputSpec": str(OPENAPI), "outputDir": str(out / name)}))
        batch.append(str(config))
    _run_all(out, {
        "openapi-generator": ([str(BIN / "openapi-generator-cli"), "batch", "--fail-fast", *batch], out, env),
        "opc": ([str(BIN / "openapi-python-client"), "generate", "--path", str(OPENAPI), "--output-path", "opc"],
                out, env),
    }, "generating")
    for ts, flow in (("ts", "flow.ts"), ("tsaxios", "flow-axios.ts")):
        shutil.copy(FLOWS / flow, out / ts / flow)
        (out / ts / "tsconfig.json").write_text(json.dumps(TSCONFIG))
    shutil.copy(FLOWS / "Flow.java", out / "java" / "src" / "main" / "java" / "Flow.java")
    (out / "go" / "flow").mkdir()
    shutil.copy(FLOWS / "flow.go", out / "go" / "flow" / "main.go")
    npm = [_tool("npm"), "install", "--no-save", "--no-audit", "--no-fund", "--ignore-scripts", AXIOS]
    _run_all(out, {
        "axios": (npm, out / "tsaxios", NODE_ENV),
        "mvn": ([_tool("mvn"), "-B", "-q", "-DskipTests", "compile", "dependency:build-classpath",
                 "-Dmdep.outputFile=classpath.txt"], out / "java", dict(os.environ)),
        "go-build": ([_tool("go"), "build", "-o", "flow-bin", "./flow"], out / "go", dict(os.environ)),
        "compileall": ([sys.executable, "-m", "compileall", "-q", "ogpy", "opc"], out, dict(os.environ)),
    }, "compiling")
    tsc = str(node_tool("tsc"))
    _run_all(out, {f"tsc-{ts}": ([tsc, "-p", "."], out / ts, NODE_ENV) for ts in ("ts", "tsaxios")},
             "compiling the TypeScript client")


@pytest.fixture(scope="module")
def clients() -> Path:
    """The generated (and compiled) clients: ``ts`` and ``tsaxios`` (with ``dist/``), ``ogpy``, ``opc``, ``java``
    (with ``target/classes`` and ``classpath.txt``) and ``go`` (with ``flow-bin``)."""
    root = CACHE / _cache_key()
    if not (root / "complete").exists():
        work = CACHE / f"{root.name}.tmp-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        _generate(work)
        (work / "complete").write_text("")
        shutil.rmtree(root, ignore_errors=True)
        work.rename(root)
        for stale in CACHE.iterdir():  # keep the cache to the current contract
            if stale != root:
                shutil.rmtree(stale, ignore_errors=True)
    return root


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("generated-clients")
    tenants = d / "tenants.yaml"
    tenants.write_text(yaml.safe_dump({"tenants": [
        {"id": "gen", "api_keys": ["sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()]}]}))
    g = GatewayProcess(tansu.bootstrap, env={"GATEWAY_TENANTS_FILE": str(tenants)}, log_file=d / "gateway.log")
    g.start()
    try:
        yield g
    finally:
        g.stop()


async def _flow(cmd: list[str], env: dict[str, str], gw: GatewayProcess, kclient: KafkaClient,
                topic: str) -> dict[str, Any]:
    await kclient.create_topics({topic: 2})
    args = [gw.url, API_KEY, topic, f"g-{topic}", str(RECORDS)]
    proc = await asyncio.to_thread(subprocess.run, cmd + args, capture_output=True, text=True, timeout=180,
                                   env=env, cwd=REPO)
    assert proc.returncode == 0, f"the client flow failed:\n{proc.stdout}\n{proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    _check(out, topic)
    return out


def _check(out: dict[str, Any], topic: str) -> None:
    assert len(out["produced"]) == RECORDS and all(isinstance(o, int) and o >= 0 for o in out["produced"])
    for fmt in ("binary", "json"):
        got = out[fmt]
        assert got["subscription"] == [topic]
        # the binary instance's base64 decoded by the flow, the json instance's embedded JSON as it came
        assert sorted(v["n"] for v in got["values"]) == list(range(RECORDS)), (fmt, got["values"])
        assert sorted(got["keys"]) == sorted(f"k{i}" for i in range(RECORDS)), (fmt, got["keys"])
        assert got["commitAnswer"] == []  # 200 with an empty array, as Confluent answers a commit
        expected = {p: o + 1 for p, o in got["last"].items()}  # what is stored: the record offset + 1
        assert sum(o + 1 for o in got["last"].values()) == RECORDS  # every record, each partition from 0
        for form in ("committedByBody", "committedByQuery", "committedAssigned"):
            if form in got:
                assert got[form] == expected, (fmt, form, got[form], expected)


def _python_env(package_dir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(package_dir)}


async def test_typescript_fetch_client(clients: Path, gw: GatewayProcess, kclient: KafkaClient,
                                       topic_name: str) -> None:
    """openapi-generator typescript-fetch, compiled by tsc (strict), run by node (its fetch: no body on a GET)."""
    out = await _flow(["node", str(clients / "ts" / "dist" / "flow.js")], NODE_ENV, gw, kclient, topic_name)
    assert "committedByBody" not in out["binary"]


async def test_openapi_python_client(clients: Path, gw: GatewayProcess, kclient: KafkaClient, topic_name: str) -> None:
    """openapi-python-client (default options): produces with the body's class choosing the media type, and
    also reads committed offsets with a body on the GET, as Confluent clients do."""
    out = await _flow([sys.executable, str(FLOWS / "flow_opc.py")], _python_env(clients / "opc"), gw, kclient,
                      topic_name)
    assert "committedByBody" in out["binary"] and "committedByBody" in out["json"]


async def test_openapi_generator_python_client(clients: Path, gw: GatewayProcess, kclient: KafkaClient,
                                               topic_name: str) -> None:
    """openapi-generator python (pydantic models, urllib3): Accept is the first JSON type of the records
    answer, application/json, which means the instance's format."""
    await _flow([sys.executable, str(FLOWS / "flow_ogpy.py")], _python_env(clients / "ogpy"), gw, kclient,
                topic_name)


async def test_typescript_axios_client(clients: Path, gw: GatewayProcess, kclient: KafkaClient,
                                       topic_name: str) -> None:
    """openapi-generator typescript-axios, compiled by tsc (strict), run by node: axios sends ``{}`` as the body
    of a GET whose optional body was left out, which the gateway takes as no body."""
    out = await _flow(["node", str(clients / "tsaxios" / "dist" / "flow-axios.js")], NODE_ENV, gw, kclient,
                      topic_name)
    assert "committedByBody" in out["binary"] and "committedAssigned" in out["binary"]


async def test_java_client(clients: Path, gw: GatewayProcess, kclient: KafkaClient, topic_name: str) -> None:
    """openapi-generator java (okhttp-gson), compiled by Maven, run by the JVM."""
    java = clients / "java"
    classpath = os.pathsep.join([str(java / "target" / "classes"), (java / "classpath.txt").read_text().strip()])
    await _flow([_tool("java"), "-cp", classpath, "Flow"], dict(os.environ), gw, kclient, topic_name)


async def test_go_client(clients: Path, gw: GatewayProcess, kclient: KafkaClient, topic_name: str) -> None:
    """openapi-generator go, built by the Go toolchain (the flow is a command of the generated module)."""
    await _flow([str(clients / "go" / "flow-bin")], dict(os.environ), gw, kclient, topic_name)


async def test_committed_offsets_forms(gw: GatewayProcess, kclient: KafkaClient, topic_name: str) -> None:
    """``GET .../offsets``: the partitions in a body (Confluent), as ``topic`` x ``partition`` query
    parameters, a filter of the assignment (only topics or only partitions), or the assignment."""
    await kclient.create_topics({topic_name: 3})
    group = f"g-forms-{topic_name}"
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/vnd.kafka.v2+json"}
    async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=30) as http:
        r = await http.post(f"/consumers/{group}", json={"name": "forms"})
        assert r.status_code == 200, r.text
        base = f"/consumers/{group}/instances/forms"
        r = await http.get(f"{base}/offsets")  # nothing assigned yet: nothing to report
        assert r.status_code == 200 and r.json() == {"offsets": []}, r.text
        parts = [{"topic": topic_name, "partition": p} for p in (0, 1)]
        assert (await http.post(f"{base}/assignments", json={"partitions": parts})).status_code == 204
        r = await http.post(f"{base}/offsets", json={"offsets": [{**parts[0], "offset": 4}, {**parts[1], "offset": 9}]})
        assert r.status_code == 200 and r.json() == [], r.text
        p0, p1 = {**parts[0], "offset": 5, "metadata": ""}, {**parts[1], "offset": 10, "metadata": ""}

        async def committed(query: str = "", body: Any = None) -> list[dict[str, Any]]:
            r = await http.request("GET", f"{base}/offsets{query}", json=body)
            assert r.status_code == 200, r.text
            return sorted(r.json()["offsets"], key=lambda o: o["partition"])

        assert await committed(body={"partitions": parts}) == [p0, p1]  # Confluent's body on a GET
        assert await committed(body={"partitions": parts[1:]}) == [p1]
        assert await committed() == [p0, p1]  # the assigned partitions
        assert await committed(body={}) == [p0, p1]  # an empty object is no body (typescript-axios sends it)
        assert await committed(f"?topic={topic_name}&partition=1", {}) == [p1]
        # every topic with every partition; partition 2 (not assigned, nothing committed) is left out
        assert await committed(f"?topic={topic_name}&partition=2&partition=1&partition=0") == [p0, p1]
        assert await committed(f"?topic={topic_name}&partition=1") == [p1]
        assert await committed(f"?topic={topic_name}") == [p0, p1]  # its assigned partitions
        assert await committed("?partition=0") == [p0]  # the assigned partitions numbered 0
        assert await committed("?topic=other-topic") == []
        assert await committed(f"?topic={topic_name}&partition=0", {"partitions": parts[1:]}) == [p0, p1]
        r = await http.get(f"{base}/offsets?topic={topic_name}&partition=-1")
        assert r.status_code == 422, r.text
        assert (await http.delete(base)).status_code == 204
