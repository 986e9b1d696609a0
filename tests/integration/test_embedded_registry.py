"""`make run`'s embedded Schema Registry (service/embedded/registry.py): the gateway process, started as `make
run` starts it (no GATEWAY_KAFKA_BOOTSTRAP: embedded Tansu, or Apache Kafka), also starts Karapace from
../shared/registry in the background. It serves at once: schema'd requests answer 503/50307 + Retry-After while the
registry starts, then Avro records produced by confluent-kafka's AvroSerializer against the logged registry URL come
back decoded. SIGTERM stops the registry with the gateway. GATEWAY_EMBEDDED_REGISTRY=false (or a launcher that fails)
leaves the gateway serving with schema'd formats answering 422/42211; =true without a launcher refuses to start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from service.embedded.registry import DEFAULT_LAUNCHER
from service.embedded.tansu import free_port
from tests.integration.gateway_proc import children, cmdline

pytestmark = pytest.mark.integration

V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
AVRO_ACCEPT = {"Accept": "application/vnd.kafka.avro.v2+json"}
USER = json.dumps({"type": "record", "name": "User", "namespace": "kcg.embedded",
                   "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]})
READY_LINE = re.compile(r"embedded schema registry \(Karapace\) ready: (http://127\.0\.0\.1:\d+)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


class MakeRun:
    """``python -m gateway`` with no GATEWAY_* setting but these (so: the embedded broker and, unless
    told otherwise, the embedded registry), its output in a file."""

    def __init__(self, log: Path, **settings: str) -> None:
        self.port = free_port()
        self.broker_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update({"GATEWAY_PORT": str(self.port), "GATEWAY_EMBEDDED_BROKER_PORT": str(self.broker_port),
                    "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "2000", "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": "300",
                    **settings})
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdout=out,
                                         stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + 60  # an embedded Apache Kafka starts in 3-6 s, Tansu in one
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.05)  # waiting for an external process to bind its port

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (m := pattern.search(self.output())) is None:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.1)  # an external process writing its log
        return m

    def registry_pids(self) -> list[int]:
        return [p for p in children(self.proc.pid) if "registry/start" in cmdline(p) or "karapace" in cmdline(p)]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[list[MakeRun]]:
    started: list[MakeRun] = []
    yield started
    for g in started:
        g.stop()


def _need_launcher() -> None:
    if not DEFAULT_LAUNCHER.is_file():
        pytest.skip(f"no schema registry launcher at {DEFAULT_LAUNCHER} (../shared is absent)")


@pytest.mark.parametrize("embedded_broker", ["tansu", "kafka"])
def test_make_run_starts_a_registry_serves_avro_and_stops_it(make_run: list[MakeRun], tmp_path: Path,
                                                            embedded_broker: str) -> None:
    """``make run`` and ``GATEWAY_EMBEDDED_BROKER=kafka make run``: Karapace keeps its schemas on the embedded
    broker, whichever it is."""
    _need_launcher()
    gw = MakeRun(tmp_path / "gateway.log", GATEWAY_EMBEDDED_BROKER=embedded_broker)
    make_run.append(gw)
    gw.wait_healthy()
    bootstrap = f"127.0.0.1:{gw.broker_port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic("users", 1, 1)]).values():
        f.result(10)
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        # the gateway serves before the registry is up: an avro instance can be created at once
        r = http.post("/consumers/g", json={"name": "c", "format": "avro", "auto.offset.reset": "earliest"},
                      headers=V2)
        assert r.status_code == 200, r.text
        base = "/consumers/g/instances/c"
        r = http.post(f"{base}/subscription", json={"topics": ["users"]}, headers=V2)
        assert r.status_code == 204, r.text
        early = http.get(f"{base}/records", params={"timeout": 0}, headers=AVRO_ACCEPT)
        # a warm start takes ~5 s: until the registry takes writes, schema'd reads are retryable 503s
        assert early.status_code == 503 or READY_LINE.search(gw.output()), early.text
        if early.status_code == 503:
            assert early.json()["error_code"] == 50307, early.text
            assert "embedded schema registry" in early.json()["message"]
            assert int(early.headers["Retry-After"]) >= 1

        url = gw.wait_for(READY_LINE, 60).group(1)  # one line names the registry's URL
        pids = gw.registry_pids()
        assert pids, "the registry should be a child of the gateway"
        assert httpx.get(f"{url}/subjects", timeout=5).status_code == 200

        # a record serialized by confluent-kafka against the embedded registry, on the embedded broker
        ser = AvroSerializer(SchemaRegistryClient({"url": url}), USER)
        value = ser({"name": "ada", "age": 36}, SerializationContext("users", MessageField.VALUE))
        assert value is not None and value[0] == 0
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce("users", value=value)
        assert producer.flush(10) == 0

        deadline = time.monotonic() + 20
        records: list[dict[str, object]] = []
        while not records:
            r = http.get(f"{base}/records", params={"timeout": 1000}, headers=AVRO_ACCEPT)
            assert r.status_code == 200, r.text
            records = r.json()
            assert records or time.monotonic() < deadline, "no record within 20 s"
        assert records[0]["value"] == {"name": "ada", "age": 36}

    assert gw.stop() == 0, gw.output()
    assert "embedded broker stopped" in gw.output()
    assert not any(_alive(p) for p in pids), "the registry outlived the gateway"


def test_embedded_registry_off_schema_formats_name_the_setting(make_run: list[MakeRun], tmp_path: Path) -> None:
    gw = MakeRun(tmp_path / "gateway.log", GATEWAY_EMBEDDED_REGISTRY="false")
    make_run.append(gw)
    gw.wait_healthy()
    r = httpx.post(f"{gw.url}/consumers/g", json={"name": "c", "format": "avro"}, headers=V2, timeout=10)
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == 42211 and "GATEWAY_SCHEMA_REGISTRY_URL" in r.json()["message"]
    assert not gw.registry_pids()
    assert "embedded schema registry" not in gw.output()
    assert gw.stop() == 0


def test_a_failing_launcher_is_logged_and_the_gateway_keeps_serving(make_run: list[MakeRun], tmp_path: Path) -> None:
    """A launcher that installs but whose registry exits: its error is logged, schema'd formats answer
    422/42211, binary ones still work."""
    venv = tmp_path / "venv"
    venv.mkdir()
    launcher = tmp_path / "start"
    launcher.write_text(
        "import sys\n"
        f"if '--install-only' in sys.argv:\n    print({str(venv)!r})\n    sys.exit(0)\n"
        "print('fake registry: cannot reach the broker', file=sys.stderr)\n"
        "sys.exit(3)\n")
    gw = MakeRun(tmp_path / "gateway.log", GATEWAY_REGISTRY_LAUNCHER=str(launcher))
    make_run.append(gw)
    gw.wait_healthy()
    gw.wait_for(re.compile(r"embedded schema registry did not start"), 15)
    out = gw.output()
    assert "exited with code 3" in out and "fake registry: cannot reach the broker" in out, out
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        r = http.post("/consumers/g", json={"name": "c", "format": "avro"}, headers=V2)
        assert r.status_code == 422 and r.json()["error_code"] == 42211, r.text
        r = http.post("/consumers/g", json={"name": "b", "format": "binary"}, headers=V2)
        assert r.status_code == 200, r.text
    assert gw.stop() == 0


def test_required_registry_without_launcher_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_EMBEDDED_REGISTRY": "true", "GATEWAY_REGISTRY_LAUNCHER": str(tmp_path / "missing"),
                "GATEWAY_PORT": str(free_port())})
    run = subprocess.run([sys.executable, "-m", "gateway"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "GATEWAY_EMBEDDED_REGISTRY=true" in run.stderr and str(tmp_path / "missing") in run.stderr
