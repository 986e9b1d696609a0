"""Clients generated from ``openapi.yaml`` work, unmodified, in more than one language.

Three independent generators: openapi-generator's ``typescript-fetch`` (compiled with ``tsc --strict``, run
with node) and ``python``, and openapi-python-client. Each generated client runs the consumer flow of
``tests/integration/clients/`` against a real gateway process (with API-key authentication) over Tansu:
produce, then for a binary and a json instance create → subscribe → poll → commit → committed offsets
(the body-free forms of ``GET .../offsets``) → delete. Generated sources are cached under
``.cache/generated-clients/<hash of the contract, the flows and the tool versions>`` (git-ignored), so only
a changed contract pays the ~30 s of generating and compiling.
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
from service.embedded import EmbeddedBroker
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
            "include": ["**/*.ts"], "exclude": ["dist"]}


def _cache_key() -> str:
    h = hashlib.sha256(OPENAPI.read_bytes())
    for flow in sorted(FLOWS.iterdir()):
        h.update(flow.name.encode() + flow.read_bytes())
    h.update(Path(__file__).read_bytes())
    for dist in ("openapi-generator-cli", "openapi-python-client"):
        h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
    h.update((REPO / "tools" / "install-node-deps.sh").read_bytes())  # the pinned tsc version
    return h.hexdigest()[:16]


def _generate(out: Path) -> None:
    """Generate the three clients side by side (two JVMs and a Python process), then compile the TypeScript one."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # openapi-python-client runs ruff
    generator = str(BIN / "openapi-generator-cli")
    commands = {
        "ts": [generator, "generate", "-i", str(OPENAPI), "-g", "typescript-fetch", "-o", "ts"],
        "ogpy": [generator, "generate", "-i", str(OPENAPI), "-g", "python", "-o", "ogpy",
                 "--additional-properties=packageName=kcg_client"],
        "opc": [str(BIN / "openapi-python-client"), "generate", "--path", str(OPENAPI), "--output-path", "opc",
                "--config", str(FLOWS / "opc-config.yaml")],
    }
    with contextlib.ExitStack() as stack:
        jobs = {name: subprocess.Popen(cmd, cwd=out, env=env, stderr=subprocess.STDOUT,
                                       stdout=stack.enter_context(open(out / f"{name}.log", "wb")))
                for name, cmd in commands.items()}
        for name, job in jobs.items():
            assert job.wait(300) == 0, f"{commands[name][:3]} failed on openapi.yaml:\n" + (
                out / f"{name}.log").read_text(errors="replace")[-4000:]
    ts = out / "ts"
    shutil.copy(FLOWS / "flow.ts", ts / "flow.ts")
    (ts / "tsconfig.json").write_text(json.dumps(TSCONFIG))
    tsc = subprocess.run([str(node_tool("tsc")), "-p", "."], cwd=ts, capture_output=True, text=True, timeout=300,
                         env=NODE_ENV)
    assert tsc.returncode == 0, f"the generated TypeScript client does not compile:\n{tsc.stdout}{tsc.stderr}"
    for package in ("ogpy", "opc"):
        compiled = subprocess.run([sys.executable, "-m", "compileall", "-q", package], cwd=out, capture_output=True,
                                  text=True, timeout=120)
        assert compiled.returncode == 0, f"the generated {package} client does not compile:\n{compiled.stdout}"


@pytest.fixture(scope="module")
def clients() -> Path:
    """The generated (and compiled) clients: ``ts`` (with ``dist/flow.js``), ``ogpy`` and ``opc``."""
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
    """openapi-python-client (generated with clients/opc-config.yaml, see there): also reads committed offsets
    with a body on the GET, as Confluent clients do."""
    out = await _flow([sys.executable, str(FLOWS / "flow_opc.py")], _python_env(clients / "opc"), gw, kclient,
                      topic_name)
    assert "committedByBody" in out["binary"] and "committedByBody" in out["json"]


async def test_openapi_generator_python_client(clients: Path, gw: GatewayProcess, kclient: KafkaClient,
                                               topic_name: str) -> None:
    """openapi-generator python (pydantic models, urllib3): Accept is the first JSON type of the records
    answer, application/json, which means the instance's format."""
    await _flow([sys.executable, str(FLOWS / "flow_ogpy.py")], _python_env(clients / "ogpy"), gw, kclient,
                topic_name)


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
