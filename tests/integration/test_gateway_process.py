"""`make run`'s process: the gateway starts an embedded Tansu, serves /healthz and /metrics, and
stops the broker on SIGTERM/SIGINT without leaving an orphan process; SIGTERM is bounded in time even
with open streams and a broker that does not answer."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.embedded.kafka import sweep_stale_dirs
from service.embedded.tansu import EmbeddedBroker, free_port
from service.instances.registry import HARD_CLOSE_GRACE_S
from tests.integration.gateway_proc import GatewayProcess, children

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_gateway_process_with_embedded_broker(sig: signal.Signals) -> None:
    port = free_port()
    broker_port = free_port()
    env = {**os.environ, "GATEWAY_PORT": str(port), "GATEWAY_EMBEDDED_BROKER_PORT": str(broker_port),
           "GATEWAY_LOG_LEVEL": "warning", "GATEWAY_EMBEDDED_REGISTRY": "false"}  # (its own test covers it)
    env.pop("GATEWAY_KAFKA_BOOTSTRAP", None)
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the broker is up and the address printed
        assert re.search(rf"bootstrap address: 127\.0\.0\.1:{broker_port}", line), line
        lines = [proc.stdout.readline() for _ in range(2)]  # the no-tenants warning, then the URL
        assert any(f"http://127.0.0.1:{port}" in ln for ln in lines), lines
        assert any("WITHOUT authentication" in ln for ln in lines), lines
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # waiting for an external process to bind its port
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["brokers"] == {"default": 1}
        m = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert m.status_code == 200 and "kcg_build_info" in m.text
        kids = children(proc.pid)
        assert kids, "the embedded broker should be a child process"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert "embedded broker stopped" in out
        assert not any(_alive(k) for k in kids), "the embedded broker outlived the gateway"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_embedded_broker_dies_with_a_killed_gateway() -> None:
    """Even kill -9 of the gateway leaves no broker behind (PR_SET_PDEATHSIG)."""
    port = free_port()
    env = {**os.environ, "GATEWAY_PORT": str(port), "GATEWAY_LOG_LEVEL": "warning",
           "GATEWAY_EMBEDDED_REGISTRY": "false"}
    env.pop("GATEWAY_KAFKA_BOOTSTRAP", None)
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        assert "bootstrap address" in proc.stdout.readline()
        kids = children(proc.pid)
        assert kids
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)  # the kernel delivers the parent-death signal asynchronously
        assert not any(_alive(k) for k in kids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_gateway_on_embedded_kafka_stops_it_and_deletes_its_data() -> None:
    """GATEWAY_EMBEDDED_BROKER=kafka: the gateway starts Apache Kafka (a child JVM), serves on it, and on SIGTERM
    stops it and deletes its directory; after a kill -9 of the gateway the JVM dies too (PR_SET_PDEATHSIG) and the
    directory it could not delete is swept by the next embedded Kafka's start."""
    def start() -> tuple[subprocess.Popen[str], int, list[int], Path]:
        port = free_port()
        env = {**os.environ, "GATEWAY_PORT": str(port), "GATEWAY_LOG_LEVEL": "warning",
               "GATEWAY_EMBEDDED_BROKER": "kafka", "GATEWAY_EMBEDDED_REGISTRY": "false"}
        env.pop("GATEWAY_KAFKA_BOOTSTRAP", None)
        proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]  # "starting...", then "ready in ... log ..."
        m = re.search(r"embedded Apache Kafka ready in [\d.]+ s \(pid (\d+), log (/\S+)/kafka\.log\); "
                      r"Kafka bootstrap address: 127\.0\.0\.1:\d+", lines[1])
        assert m, lines
        assert children(proc.pid) == [int(m.group(1))]
        return proc, port, [int(m.group(1))], Path(m.group(2))

    proc, port, kids, workdir = start()
    try:
        assert (workdir / "data" / "meta.properties").is_file()
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)  # waiting for an external process to bind its port
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
        assert ready.status_code == 200 and ready.json()["brokers"] == {"default": 1}, ready.text
        cluster = httpx.get(f"http://127.0.0.1:{port}/v3/clusters", timeout=30).json()["data"][0]["cluster_id"]
        assert cluster in (workdir / "data" / "meta.properties").read_text()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "embedded broker stopped" in out
        assert not any(_alive(k) for k in kids), "the embedded Kafka outlived the gateway"
        assert not workdir.exists(), "the embedded Kafka's data outlived the gateway"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    proc, port, kids, workdir = start()
    try:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)  # the kernel delivers the parent-death signal asynchronously; Kafka then shuts down
        assert not any(_alive(k) for k in kids), "the embedded Kafka outlived a killed gateway"
        assert workdir.exists()  # nobody was left to delete it
        assert workdir in sweep_stale_dirs()  # what the next EmbeddedKafka.start() does first
        assert not workdir.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_sigterm_with_an_open_stream_and_a_silent_broker_exits_within_the_shutdown_timeout(
        tmp_path: Path) -> None:
    """SIGTERM while a client streams records and the broker has stopped answering (SIGSTOP): the open
    stream is cut after GATEWAY_SHUTDOWN_TIMEOUT_S, the instance's close (final commit, LeaveGroup) is
    given up after the same deadline, and the process exits, saying so."""
    timeout_s = 1
    broker = EmbeddedBroker(log_file=tmp_path / "tansu.log")
    broker.start()
    gw = GatewayProcess(broker.bootstrap, env={"GATEWAY_SHUTDOWN_TIMEOUT_S": str(timeout_s)},
                        log_file=tmp_path / "gateway.log")
    frozen = False
    try:
        kc = KafkaClient(broker.bootstrap)
        try:
            await kc.create_topics({"t": 1})
        finally:
            await kc.close()
        gw.start()
        h = {"Content-Type": "application/vnd.kafka.v2+json"}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            r = await http.post("/consumers/g", json={"name": "c1", "auto.offset.reset": "earliest"}, headers=h)
            assert r.status_code == 200, r.text
            base = f"/consumers/g/instances/{r.json()['instance_id']}"
            assert (await http.post(f"{base}/subscription", json={"topics": ["t"]}, headers=h)).status_code == 204
            p = CKProducer({"bootstrap.servers": broker.bootstrap})
            p.produce("t", value=b"one")
            assert p.flush(10) == 0
            async with http.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as resp:
                lines = resp.aiter_lines()
                assert json.loads(await anext(lines))["offset"] == 0  # assigned, consumed, streaming on
                assert broker.proc is not None
                os.kill(broker.proc.pid, signal.SIGSTOP)  # the broker stops answering (connections stay open)
                frozen = True
                started = time.monotonic()
                assert gw.proc is not None
                gw.proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(gw.proc.wait, 20)
                elapsed = time.monotonic() - started
        print(f"SIGTERM to exit: {elapsed:.2f} s")
        assert code == 0
        # at most: the open stream's grace, the instances' deadline, the hard close (1 s), process exit
        assert elapsed < 2 * timeout_s + HARD_CLOSE_GRACE_S + 1.5, elapsed
        log = (tmp_path / "gateway.log").read_text()
        assert "1 of 1 consumer instances did not close cleanly within the 1.0 s shutdown timeout" in log, log
    finally:
        gw.stop()
        if frozen:
            broker.kill()  # SIGKILL works on a stopped process; a SIGTERM would wait for SIGCONT
        broker.stop()
