"""The README's "Quick start" and "Using it" shell blocks, run verbatim with bash against a gateway started
the way ``make run`` starts it (the ``consumer-gateway`` entry point, no settings: embedded Tansu broker,
defaults), so the README cannot drift from what the gateway does; and again with ``GATEWAY_EMBEDDED_BROKER=kafka``
(the embedded Apache Kafka the README offers as the other quick start).

Only two things differ from a user pasting the blocks: the ``make run`` / ``make test`` lines are not run
(the gateway is already started, on a free port), and the ``BASE=`` line names that port. ``curl`` is a
wrapper on ``PATH`` that adds a newline after each response body and reports each request's status on
stderr, so the test sees every step's HTTP status; the blocks run under ``set -euo pipefail``.
Checked: every command succeeds, every request answers 2xx, the consume steps print the produced records,
and every expected output the README shows (``# → ...`` comments; ``...`` elides) is in the output; and
the README's word that ``make run``'s gateway creates a missing topic on produce.
"""

from __future__ import annotations

import http.server
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import REPO
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
README = REPO / "README.md"
SECTIONS = ("Quick start", "Using it")
BASE_LINE = "BASE=http://127.0.0.1:8080"
NOT_RUN = ("make run", "make test")  # the gateway is started by the fixture; the suite is what runs this
FENCE = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.S | re.M)
HTTP_LINE = re.compile(r"^<<HTTP (\d{3}) (\S+) (\S+)>>$", re.M)


def section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def shell_blocks(text: str) -> list[str]:
    """The shell code blocks of the README's quick start and "Using it" sections, in order."""
    blocks = []
    for title in SECTIONS:
        found = FENCE.findall(section(text, title))
        assert found, f"no shell block in '## {title}'"
        blocks += found
    return blocks


def script_lines(blocks: list[str], port: int) -> list[str]:
    lines: list[str] = []
    skipped = []
    for block in blocks:
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if command in NOT_RUN:
                skipped.append(command)
                continue
            if command == BASE_LINE:
                line = f"BASE=http://127.0.0.1:{port}"
            lines.append(line)
    assert skipped == list(NOT_RUN), f"the quick start should show {NOT_RUN}: found {skipped}"
    assert f"BASE=http://127.0.0.1:{port}" in lines, f"no '{BASE_LINE}' line"
    return lines


def expected_outputs(blocks: list[str]) -> list[list[str]]:
    """The ``# → ...`` comments (continued on ``#    `` lines), each split into the fragments between
    ``...`` elisions."""
    out: list[str] = []
    for block in blocks:
        for line in block.splitlines():
            if "# → " in line:
                out.append(line.split("# → ", 1)[1].strip())
            elif line.startswith("#    ") and out:
                out[-1] += line[1:].strip()
    return [[f for f in e.split("...") if f] for e in out]


def make_run_recipe() -> list[str]:
    text = (REPO / "Makefile").read_text()
    m = re.search(r"^run:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, "Makefile has no run target"
    return [line.strip() for line in m.group(1).splitlines()]


#: `make run`'s recipe: the Kafka jars are installed first when GATEWAY_EMBEDDED_BROKER=kafka, then the entry point
MAKE_RUN = ['if [ "$${GATEWAY_EMBEDDED_BROKER:-tansu}" = kafka ] && [ -z "$${GATEWAY_KAFKA_BOOTSTRAP:-}" ]; then \\',
            "sh tools/install-kafka.sh > /dev/null; fi",
            "exec $(VENV)/bin/consumer-gateway"]


class MakeRunGateway(GatewayProcess):
    """The gateway as ``make run`` starts it: the ``consumer-gateway`` script of this venv with no
    ``GATEWAY_*`` settings (so the embedded Tansu broker and every default) but the port, and
    ``GATEWAY_EMBEDDED_BROKER=kafka`` when ``broker`` is "kafka"."""

    def __init__(self, log_file: Path, broker: str = "tansu") -> None:
        super().__init__("", log_file=log_file, base_env={})
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        self.env["GATEWAY_PORT"] = str(self.port)
        if broker == "kafka":
            self.env["GATEWAY_EMBEDDED_BROKER"] = "kafka"

    def launch(self) -> None:
        exe = Path(sys.executable).parent / "consumer-gateway"
        assert exe.exists(), f"{exe}: the project is not installed in this venv"
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen([str(exe)], env=self.env, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(params=["tansu", "kafka"])
def make_run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayProcess]:
    # `make run` is exactly the entry point with the Makefile's environment (and, for Kafka, its install step)
    assert make_run_recipe() == MAKE_RUN, make_run_recipe()
    if request.param == "kafka":
        done = subprocess.run(["sh", str(REPO / "tools" / "install-kafka.sh")], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
    with MakeRunGateway(tmp_path / "gateway.log", request.param) as g:
        started = (tmp_path / "gateway.log").read_text()
        assert ("embedded Apache Kafka ready" in started) == (request.param == "kafka"), started
        yield g


def curl_wrapper(directory: Path) -> Path:
    """A ``curl`` that prints a newline after each body and ``<<HTTP status method url>>`` on stderr."""
    real = shutil.which("curl")
    assert real, "curl is needed (make system-deps)"
    wrapper = directory / "curl"
    wrapper.write_text(f"#!/bin/sh\nexec {real} -w '\\n%{{stderr}}<<HTTP %{{http_code}} %{{method}} "
                       f"%{{url_effective}}>>\\n' \"$@\"\n")
    wrapper.chmod(0o755)
    return directory


def json_values(stdout: str) -> list[Any]:
    out = []
    for line in stdout.splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pass
    return out


def test_readme_blocks_run_verbatim_and_print_the_produced_records(make_run: GatewayProcess, tmp_path: Path) -> None:
    text = README.read_text()
    blocks = shell_blocks(text)
    script = "set -euo pipefail\n" + "\n".join(script_lines(blocks, make_run.port)) + "\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PATH"] = f"{curl_wrapper(tmp_path)}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    report = f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, report

    # every request answered 2xx, and the flow's steps all ran
    requests = HTTP_LINE.findall(done.stderr)
    assert requests and all(s.startswith("2") for s, _, _ in requests), report
    steps = [(m, re.sub(r"^http://127\.0\.0\.1:\d+", "", u)) for _, m, u in requests]
    for step in [("GET", "/v3/clusters"), ("POST", "/topics/orders"), ("POST", "/consumers/my-group"),
                 ("POST", "/consumers/my-group/instances/c1/subscription"),
                 ("GET", "/consumers/my-group/instances/c1/records?timeout=10000"),
                 ("POST", "/consumers/my-group/instances/c1/offsets"),
                 ("GET", "/consumers/my-group/instances/c1/offsets"),
                 ("DELETE", "/consumers/my-group/instances/c1")]:
        assert step in steps, (step, report)
    assert any(m == "POST" and u.startswith("/v3/clusters/") and u.endswith("/topics") for m, u in steps), report

    # the consume steps (poll, stream) print every produced record
    values = json_values(done.stdout)
    produced = [v for v in values if isinstance(v, dict) and "offsets" in v and "key_schema_id" in v]
    assert len(produced) == 2, report  # binary to orders, avro to payments
    sent = {(o["partition"], o["offset"]) for o in produced[0]["offsets"]}
    assert len(sent) == 2 and all(o["error_code"] is None for o in produced[0]["offsets"]), report
    polled = [r for v in values if isinstance(v, list) for r in v if isinstance(r, dict) and "topic" in r]
    streamed = [v for v in values if isinstance(v, dict) and v.get("topic") == "orders"]
    assert polled, f"the long poll printed no records\n{report}"
    consumed = {(r["partition"], r["offset"]): r["value"] for r in polled + streamed if r["topic"] == "orders"}
    assert sent <= set(consumed), report
    assert sorted(consumed.values()) == ["aGVsbG8=", "d29ybGQ="], report
    # the avro block: registered (an id), consumed back decoded by the embedded registry's schema
    assert isinstance(produced[1]["value_schema_id"], int) and produced[1]["key_schema_id"] is None, report
    payments = [r["value"] for r in polled if r["topic"] == "payments"]
    assert payments == [{"id": "p1", "amount": 9.5}, {"id": "p2", "amount": 12.25}], report
    assert ("POST", "/consumers/billing/instances/b1/subscription") in steps, report

    # and, as the README says after the block, make run's gateway creates a missing topic on produce
    r = httpx.post(f"{make_run.url}/topics/readme-new-topic", json={"records": [{"value": "eA=="}]},
                   headers={"Content-Type": "application/vnd.kafka.binary.v2+json"}, timeout=30)
    assert r.status_code == 200 and r.json()["offsets"][0]["error_code"] is None, r.text
    r = httpx.get(f"{make_run.url}/topics/readme-new-topic", timeout=30)
    assert r.status_code == 200 and len(r.json()["partitions"]) == 1, r.text  # GATEWAY_AUTO_CREATE_PARTITIONS

    # what the README says each command prints is what it printed
    position = 0
    for fragments in expected_outputs(blocks):
        for fragment in fragments:
            fragment = fragment.replace("127.0.0.1:8080", f"127.0.0.1:{make_run.port}")
            found = done.stdout.find(fragment, position)
            assert found >= 0, f"README's expected output {fragment!r} not printed (in order)\n{report}"
            position = found + len(fragment)


def readme_commands(blocks: list[str], needle: str) -> list[str]:
    """The README's shell commands (a line plus its ``\\`` and open-quote continuations) that contain ``needle``."""
    commands, pending = [], ""
    for block in blocks:
        for line in block.splitlines():
            pending = f"{pending}\n{line}" if pending else line
            if pending.endswith("\\"):
                continue
            try:
                shlex.split(pending, comments=True)
            except ValueError:  # an open quote: the command goes on
                continue
            if needle in pending:
                commands.append(pending)
            pending = ""
    return commands


def test_readme_registry_retry_prints_only_the_final_answer(tmp_path: Path) -> None:
    """The README's schema'd produce retries while ``make run``'s registry is still starting: run verbatim
    against a stand-in that answers 503/50307 + Retry-After twice, then 200, it prints the 200 body alone
    (CI once printed twelve 503 bodies glued to the answer) and exits 0; a stand-in that never gets ready
    makes it exit non-zero (under ``set -e`` the walkthrough stops there) without printing a partial answer."""
    commands = readme_commands(shell_blocks(README.read_text()), "$BASE/topics/payments")
    assert len(commands) == 1 and "--retry" in commands[0], commands

    class Starting(http.server.BaseHTTPRequestHandler):
        answers = [503, 503, 200]

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            body = (b'{"offsets":[{"partition":0,"offset":0,"error_code":null,"error":null}],"key_schema_id":null,'
                    b'"value_schema_id":1}' if status == 200 else
                    b'{"error_code":50307,"message":"the embedded schema registry is starting"}')
            self.send_response(status)
            if status == 503:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Type", "application/vnd.kafka.v2+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    def run(answers: list[int], max_time: str | None = None) -> subprocess.CompletedProcess[str]:
        Starting.answers = list(answers)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Starting)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        command = commands[0] if max_time is None else commands[0].replace("--retry-max-time 60",
                                                                            f"--retry-max-time {max_time}")
        try:
            return subprocess.run(["bash", "-c", f"set -euo pipefail\nBASE=http://127.0.0.1:{server.server_port}\n"
                                   f"{command}\n"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        finally:
            server.shutdown()
            server.server_close()

    done = run([503, 503, 200])
    assert done.returncode == 0, done
    assert orjson.loads(done.stdout)["value_schema_id"] == 1, done  # one JSON value: no 503 bodies before it
    assert "50307" not in done.stdout + done.stderr, done

    never = run([503], max_time="2")
    assert never.returncode != 0 and "50307" not in never.stdout, never
    assert "503" in never.stderr, never  # -S: curl says why it gave up
