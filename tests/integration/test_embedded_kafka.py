"""The embedded Apache Kafka launcher (service/embedded/kafka.py) and its installer (tools/install-kafka.sh), for
real: a broker of its own is formatted, started, answers ApiVersions and Metadata with our own client, is stopped
by SIGTERM (and by SIGKILL when it does not stop) and leaves no directory behind; the installer reuses its cache
and fails loudly when Maven cannot resolve the broker."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.connection import BrokerConnection, ConnectionConfig
from service.embedded.kafka import KAFKA_VERSION, EmbeddedKafka, cache_dir, probe
from service.protocol import messages as M
from tests.conftest import REPO

pytestmark = pytest.mark.integration
INSTALL = REPO / "tools" / "install-kafka.sh"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_launcher_starts_answers_api_versions_stops_and_deletes_its_data(tmp_path: Path) -> None:
    k = EmbeddedKafka(log_file=tmp_path / "kafka.log")
    k.start()
    try:
        print(f"embedded Kafka ready in {k.startup_s:.1f} s (format {k.format_s:.1f} s, broker {k.ready_s:.1f} s)")
        pid, workdir = k.pid, k.workdir
        assert pid is not None and _alive(pid) and workdir is not None
        assert (k.data_dir / "meta.properties").is_file()
        assert f"cluster.id={k.cluster_id}" in (k.data_dir / "meta.properties").read_text()
        assert k.startup_s >= k.format_s > 0 and k.ready_s > 0
        conn = await BrokerConnection.open(k.host, k.port, ConnectionConfig())
        try:
            assert conn.versions is not None
            assert conn.version_for(M.ApiKey.FETCH) >= 12  # topic ids, fetch sessions: a real 4.x broker
            assert conn.version_for(M.ApiKey.API_VERSIONS) >= 3
        finally:
            await conn.close()
        assert await probe(k.bootstrap) == k.cluster_id  # Metadata: our cluster, one broker
        # the broker logs through the slf4j binding the pom adds (a broker without it is silent)
        assert "Kafka Server started" in (tmp_path / "kafka.log").read_text()
        proc = k.proc
        assert proc is not None
        k.stop()
        assert proc.returncode is not None and not _alive(pid)
        assert proc.returncode in (0, 143, -signal.SIGTERM), proc.returncode  # SIGTERM, not SIGKILL
        assert not workdir.exists(), "the data directory outlived the broker"
        assert not _listening(k.port)
    finally:
        k.stop()


def test_a_broker_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    k = EmbeddedKafka(log_file=tmp_path / "kafka.log", template=False)  # formatted anew (its own cluster id)
    cluster_id = k.cluster_id
    k.start()
    try:
        proc, workdir = k.proc, k.workdir
        assert proc is not None and workdir is not None
        assert k.cluster_id == cluster_id and f"cluster.id={cluster_id}" in (k.data_dir / "meta.properties").read_text()
        os.kill(proc.pid, signal.SIGSTOP)  # a hung JVM: SIGTERM is not acted on
        k.stop(grace=1.0)
        assert proc.returncode == -signal.SIGKILL
        assert not workdir.exists()
    finally:
        k.kill()


def test_install_reuses_its_cache() -> None:
    done = subprocess.run(["sh", str(INSTALL)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lib = Path(done.stdout.strip())
    assert lib == cache_dir() / KAFKA_VERSION / "lib"
    jars = sorted(p.name for p in lib.iterdir())
    assert f"kafka_2.13-{KAFKA_VERSION}.jar" in jars and f"kafka-clients-{KAFKA_VERSION}.jar" in jars
    # exactly one slf4j-api, 1.7 (Kafka's), and the 1.7 binding: a mismatch gives a silent broker
    assert [j for j in jars if j.startswith("slf4j-api-")] == ["slf4j-api-1.7.36.jar"]
    assert [j for j in jars if j.startswith("log4j-slf4j")] and not [j for j in jars if j.startswith("log4j-slf4j2")]
    assert not [j for j in jars if j.startswith(("kafka-tools-4", "connect-", "jetty-"))], jars
    assert "resolving" not in done.stderr  # stamped: nothing resolved again
    assert not (REPO / "tools" / "kafka" / "target").exists(), "Maven wrote into the repository"


def test_install_resolves_again_when_the_pom_changes(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text((REPO / "tools" / "kafka" / "pom.xml").read_text())
    env = {**os.environ, "KCG_KAFKA_POM": str(pom), "KCG_KAFKA_CACHE": str(tmp_path / "cache")}

    def install() -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["sh", str(INSTALL)], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(tmp_path / "cache" / KAFKA_VERSION / "lib")
        return done

    assert "resolving" in install().stderr  # an empty cache
    assert "resolving" not in install().stderr  # the same pom: reused
    (tmp_path / "cache" / KAFKA_VERSION / "lib" / "stale.jar").write_bytes(b"")
    pom.write_text(pom.read_text().replace("</project>", "<!-- changed -->\n</project>"))
    assert "resolving" in install().stderr  # a changed pom: resolved again, into a fresh directory
    assert not (tmp_path / "cache" / KAFKA_VERSION / "lib" / "stale.jar").exists()


def test_install_fails_loudly_when_maven_cannot_resolve(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text((REPO / "tools" / "kafka" / "pom.xml").read_text().replace(
        f"<kafka.version>{KAFKA_VERSION}</kafka.version>", "<kafka.version>0.0.0-not-released</kafka.version>"))
    env = {**os.environ, "KCG_KAFKA_POM": str(pom), "KCG_KAFKA_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(["sh", str(INSTALL)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done
    assert "Maven could not resolve org.apache.kafka:kafka_2.13:0.0.0-not-released" in done.stderr, done.stderr
    assert "Could not resolve dependencies" in done.stderr and "0.0.0-not-released" in done.stderr.split("mvn.log:")[1]
    assert done.stdout == ""
    assert not (tmp_path / "cache" / "0.0.0-not-released" / "lib").exists()


def test_a_killed_broker_restarts_on_its_data(tmp_path: Path) -> None:
    """kill(keep_data=True) then start(): the same directory, ports and cluster, every acknowledged record there."""
    k = EmbeddedKafka(log_file=tmp_path / "kafka.log")
    k.start()
    try:
        workdir, cluster_id, port = k.workdir, k.cluster_id, k.port
        p = CKProducer({"bootstrap.servers": k.bootstrap, "acks": "all", "linger.ms": 2})
        acked: list[int] = []
        for i in range(50):
            p.produce("restart-me", value=b"r%d" % i,
                      on_delivery=lambda err, msg: acked.append(msg.offset()) if err is None else None)
        assert p.flush(30) == 0 and sorted(acked) == list(range(50))
        del p  # (its reconnection attempts would only clutter the output)
        old = k.proc
        assert old is not None
        k.kill(keep_data=True)
        assert old.returncode == -signal.SIGKILL and workdir is not None and workdir.exists()
        k.start()
        assert (k.workdir, k.cluster_id, k.port) == (workdir, cluster_id, port) and k.pid != old.pid
        print(f"restarted on its data in {k.startup_s:.1f} s")
        c = CKConsumer({"bootstrap.servers": k.bootstrap, "group.id": "restart-check", "enable.auto.commit": False})
        try:
            c.assign([CKTopicPartition("restart-me", 0, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < 50 and time.monotonic() < deadline:
                got += [m.value() for m in c.consume(100, 0.5) if m.error() is None]
        finally:
            c.close()
        assert got == [b"r%d" % i for i in range(50)]
        k.stop()
        assert not workdir.exists()  # the constructor's keep_data (False) applies to a plain stop
    finally:
        k.kill()
