"""The top-level Dockerfile: hadolint-clean, builds only from files that exist in the (.dockerignore'd)
build context, multi-stage with a non-root runtime, and starts the package's console script.

No image is built here (no Docker engine): the checks read the Dockerfile.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@dataclass
class Instruction:
    keyword: str
    flags: dict[str, str]
    args: str
    line: int


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages). Handles comments, line continuations and --flags."""
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # comment lines inside a continuation are dropped
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append((start, buf + line))
        buf = ""
    assert not buf, "Dockerfile ends inside a line continuation"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for n, line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        flags: dict[str, str] = {}
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            rest = rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            assert keyword == "ARG", f"line {n}: only ARG may come before the first FROM"
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, flags, rest, n))
    return global_args, stages


def resolve(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


GLOBAL_ARGS, STAGES = parse_dockerfile(DOCKERFILE.read_text())
FINAL = STAGES[-1]


def exec_form(instruction: Instruction) -> list[str]:
    args = instruction.args
    if instruction.keyword == "HEALTHCHECK":
        assert args.startswith("CMD "), f"line {instruction.line}: HEALTHCHECK CMD expected"
        args = args[4:].strip()
    assert args.startswith("["), f"line {instruction.line}: {instruction.keyword} is not in exec (JSON) form"
    value = json.loads(args)
    assert isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    return value


# --- .dockerignore (Docker's semantics: the last matching pattern wins; a pattern matching a parent
# directory matches everything under it) ----------------------------------------------------------------

def _glob_re(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):  # "**/x" also matches "x"
                out = out[:-2] + "(?:.*/)?"
                i += 1
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + r"\Z")


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip().strip("/")
        rules.append((negate, _glob_re(pattern)))
    return rules


def in_build_context(rel: str) -> bool:
    parts = Path(rel).parts
    candidates = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    included = True
    for negate, rx in dockerignore_rules():
        if any(rx.match(c) for c in candidates):
            included = negate
    return included


def context_files(source: str) -> list[str]:
    """Files of the build context a COPY source names (a file, a directory or a glob)."""
    hits = sorted(ROOT.glob(source.rstrip("/"))) if any(ch in source for ch in "*?[") else [ROOT / source]
    files: list[str] = []
    for hit in hits:
        if not hit.exists():
            continue
        paths = [p for p in hit.rglob("*") if p.is_file()] if hit.is_dir() else [hit]
        files += [p.relative_to(ROOT).as_posix() for p in paths]
    return [f for f in files if in_build_context(f)]


# --- hadolint ------------------------------------------------------------------------------------

def hadolint_bin() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint not found: it comes with the test extra (hadolint-bin)"
    return found


def hadolint(path: Path) -> list[dict]:
    proc = subprocess.run([hadolint_bin(), "--no-color", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout.strip(), f"hadolint printed nothing (exit {proc.returncode}): {proc.stderr}"
    return json.loads(proc.stdout)


def test_hadolint_reports_nothing() -> None:
    findings = hadolint(DOCKERFILE)
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings)


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint above can fail: the same binary flags the usual mistakes."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y gcc\nADD . /app\nCMD python -m app\n")
    codes = {f["code"] for f in hadolint(bad)}
    assert {"DL3006", "DL3008", "DL3020", "DL3025"} <= codes, codes


# --- structure -------------------------------------------------------------------------------------

def test_multi_stage_slim_runtime_with_tagged_images() -> None:
    assert len(STAGES) >= 2, "expected a build stage and a runtime stage"
    for stage in STAGES:
        image = resolve(stage.image, GLOBAL_ARGS)
        assert ":" in image and not image.endswith(":latest"), f"untagged or :latest base image {image}"
        assert image.startswith("python:3.11"), f"{image}: the project targets Python 3.11"
    assert "-slim" in resolve(FINAL.image, GLOBAL_ARGS), "the runtime stage should be a slim image"
    build_names = {s.name for s in STAGES[:-1]}
    froms = [i.flags["from"] for i in FINAL.all("COPY") if "from" in i.flags]
    assert froms and set(froms) <= build_names, "the runtime stage copies its install from the build stage"
    # no compiler or sources in the runtime stage: it only copies from the build stage
    assert all("from" in i.flags for i in FINAL.all("COPY")), "the runtime stage copies files from the context"
    assert not FINAL.all("ADD")
    assert not any(re.search(r"\b(apt-get|apk|gcc)\b", i.args) for i in FINAL.all("RUN"))


def test_only_runtime_dependencies_are_installed() -> None:
    text = " ".join(i.args for s in STAGES for i in s.all("RUN"))
    for extra in PYPROJECT["project"]["optional-dependencies"]:
        assert f"[{extra}" not in text and f"{extra}]" not in text, f"the {extra!r} extra must not be installed"
    assert "pip install -e" not in text and "--editable" not in text
    build = " ".join(i.args for s in STAGES[:-1] for i in s.all("RUN"))
    assert re.search(r"pip wheel\b.*--wheel-dir /wheels", build), "the build stage builds the project's wheel"


def test_the_c_accelerator_is_built_and_checked() -> None:
    """The hatch hook compiles service/protocol/_crecords.c into the wheel unless KCG_NO_CEXT is set; a
    failed compile only warns, so the image build imports the module to fail loudly instead."""
    everything = DOCKERFILE.read_text()
    assert "KCG_NO_CEXT" not in everything
    runtime_runs = " ".join(i.args for i in FINAL.all("RUN"))
    assert "service.protocol._crecords" in runtime_runs and "service.schemas._cavro" in runtime_runs
    hook = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]["path"]
    sources = {src for s in STAGES for i in s.all("COPY") if "from" not in i.flags for src in shlex.split(i.args)[:-1]}
    assert hook in sources and "service/" in sources


def test_production_server_stack_is_present() -> None:
    runtime_runs = " ".join(i.args for i in FINAL.all("RUN"))
    assert "uvloop" in runtime_runs and "httptools" in runtime_runs


def test_every_copied_file_exists_in_the_build_context() -> None:
    copies = [i for s in STAGES for i in s.all("COPY") + s.all("ADD") if "from" not in i.flags]
    assert copies
    for ins in copies:
        parts = exec_form(ins) if ins.args.startswith("[") else shlex.split(ins.args)
        sources, dest = parts[:-1], parts[-1]
        assert sources and dest
        for src in sources:
            assert not src.startswith(("/", "..")), f"line {ins.line}: {src} is outside the build context"
            assert context_files(src), (f"line {ins.line}: COPY {src}: no such file in the build context "
                                        "(missing, or excluded by .dockerignore)")


def test_the_build_context_has_what_the_wheel_needs() -> None:
    """Everything pyproject.toml's wheel build reads is copied and not .dockerignored."""
    copied = {src.rstrip("/") for s in STAGES for i in s.all("COPY") if "from" not in i.flags
              for src in shlex.split(i.args)[:-1]}
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"],
              PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]["path"],
              *PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]}
    assert needed <= copied, f"not copied: {needed - copied}"
    assert in_build_context("service/protocol/_crecords.c") and in_build_context("service/schemas/_cavro.c")
    assert in_build_context("gateway/main.py")


def test_dockerignore_keeps_local_state_out() -> None:
    for path in (".venv/bin/python", ".git/HEAD", "tests/unit/protocol/test_records.py", "bench/codec.py",
                 "service/protocol/_crecords.cpython-311-x86_64-linux-gnu.so",
                 "service/__pycache__/main.cpython-311.pyc",
                 "api/__pycache__/app.cpython-311.pyc", ".hypothesis/x", "helm/kafka-consumer-gateway/Chart.yaml",
                 ".pytest_cache/v"):
        assert not in_build_context(path), f"{path} would be sent to the Docker daemon"
    assert in_build_context("pyproject.toml") and in_build_context("sink/cli.py")


def test_entrypoint_is_the_console_script_in_exec_form() -> None:
    entrypoints = FINAL.all("ENTRYPOINT")
    assert len(entrypoints) == 1
    argv = exec_form(entrypoints[0])
    scripts = PYPROJECT["project"]["scripts"]
    assert argv[0] in scripts, f"{argv[0]} is not a console script of pyproject.toml ({sorted(scripts)})"
    assert scripts[argv[0]] == "gateway.main:main"
    for cmd in FINAL.all("CMD"):  # arguments only, and in exec form (no shell between PID 1 and signals)
        exec_form(cmd)
    stop = FINAL.all("STOPSIGNAL")
    assert not stop or stop[-1].args in ("SIGTERM", "15"), "the gateway drains on SIGTERM"


def test_healthcheck_probes_healthz_without_curl() -> None:
    checks = FINAL.all("HEALTHCHECK")
    assert len(checks) == 1
    argv = exec_form(checks[0])
    assert argv[0] == "python" and "/healthz" in " ".join(argv)
    assert checks[0].flags.get("timeout") and checks[0].flags.get("interval")


def test_runs_as_a_non_root_user_with_production_settings() -> None:
    users = FINAL.all("USER")
    assert users, "the runtime stage needs a USER"
    user = resolve(users[-1].args, GLOBAL_ARGS).split(":")[0]
    assert user not in ("root", "0") and user.isdigit() and int(user) >= 10000, (
        f"USER {user}: use a numeric non-root uid (runAsNonRoot can only verify numeric ids)")
    assert any(f"--uid {user}" in i.args for i in FINAL.all("RUN")), "the uid should exist in /etc/passwd"
    env = " ".join(i.args for i in FINAL.all("ENV"))
    assert "GATEWAY_HOST=0.0.0.0" in env
    assert "GATEWAY_KAFKA_BOOTSTRAP" not in env
    port = re.search(r"GATEWAY_PORT=(\d+)", env)
    exposed = {p.split("/")[0] for i in FINAL.all("EXPOSE") for p in i.args.split()}
    assert port and exposed == {port.group(1)}
