"""The embedded Apache Kafka launcher's sans-io parts: its configuration file, cluster ids, where it finds the jars,
the settings that choose it, and that its version is the one tools/kafka/pom.xml installs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import trustme

from service.embedded.kafka import (
    KAFKA_VERSION,
    SINGLE_NODE_CONFIG,
    BrokerTls,
    EmbeddedKafka,
    cache_dir,
    find_kafka_lib,
    min_heap,
    new_cluster_id,
    pem_keystore,
    render_properties,
    start_problem,
    sweep_stale_dirs,
)
from service.embedded.tansu import EmbeddedBrokerError
from service.settings import Settings
from tests.conftest import REPO


def test_the_launcher_runs_the_version_the_pom_installs() -> None:
    pom = (REPO / "tools" / "kafka" / "pom.xml").read_text()
    m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    assert m and m.group(1) == KAFKA_VERSION
    # the slf4j 1.7 binding (without it the broker logs nothing) is part of what is installed
    assert "<artifactId>log4j-slf4j-impl</artifactId>" in pom


def test_cluster_ids_are_kafka_uuids() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid) and not cid.startswith("-"), cid


def test_properties_escape_what_java_reads_specially() -> None:
    text = render_properties({"a.b": "x", "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                              'PlainLoginModule required user_alice="a=b";', "k y": "C:\\dir\nnext"})
    assert text.splitlines() == [
        "a.b=x",
        'listener.name.sasl_plaintext.plain.sasl.jaas.config=PlainLoginModule required user_alice="a=b";',
        "k\\ y=C:\\\\dir\\nnext",
    ]


def test_server_properties_single_node_on_loopback() -> None:
    k = EmbeddedKafka(port=19092, overrides={"num.partitions": "3", "log.retention.ms": "1000"})
    k.workdir = Path("/nowhere")
    props = k.server_properties()
    assert props["listeners"] == f"PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:{k.controller_port}"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{k.controller_port}"
    assert props["process.roles"] == "broker,controller" and props["log.dirs"] == "/nowhere/data"
    assert k.controller_port != k.port and k.bootstrap == "127.0.0.1:19092"
    # one node: every internal topic has one replica
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "share.coordinator.state.topic.replication.factor"):
        assert props[key] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    # the gateway's embedded-broker session timeout (4 s) and the tests' (2 s) are allowed
    assert int(props["group.min.session.timeout.ms"]) <= 2000
    assert props["num.partitions"] == "3" and props["log.retention.ms"] == "1000"  # overrides win
    assert SINGLE_NODE_CONFIG["num.partitions"] == "1"


def test_min_heap() -> None:
    assert (min_heap("256m"), min_heap("1g"), min_heap("1m")) == ("128m", "1g", "1m")


def test_a_missing_install_names_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCG_KAFKA_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"
    with pytest.raises(EmbeddedBrokerError, match=r"tools/install-kafka\.sh"):
        find_kafka_lib()
    lib = tmp_path / "cache" / KAFKA_VERSION / "lib"
    lib.mkdir(parents=True)
    (lib / f"kafka_2.13-{KAFKA_VERSION}.jar").write_bytes(b"")
    assert find_kafka_lib() == lib
    assert find_kafka_lib(str(lib)) == lib
    with pytest.raises(EmbeddedBrokerError):
        find_kafka_lib(tmp_path)


def test_the_setting_chooses_the_embedded_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GATEWAY_EMBEDDED_BROKER", "GATEWAY_KAFKA_BOOTSTRAP", "GATEWAY_EMBEDDED_KAFKA_LIB",
                "GATEWAY_CONSUMER_LONG_POLL_FETCH_MAX_WAIT_MS"):
        monkeypatch.delenv(var, raising=False)
    assert Settings().embedded_broker == "tansu"
    monkeypatch.setenv("GATEWAY_EMBEDDED_BROKER", "kafka")
    s = Settings()
    assert s.embedded_broker == "kafka"
    # the brisk fetch wait is for Tansu (which answers a parked fetch only when its wait ends); Kafka's is kept
    assert Settings(embedded_broker="tansu").long_poll_fetch_wait_ms() == 10
    assert s.long_poll_fetch_wait_ms() is None
    monkeypatch.setenv("GATEWAY_EMBEDDED_BROKER", "redpanda")
    with pytest.raises(ValueError, match="embedded_broker"):
        Settings()


def test_the_gateway_refuses_to_start_on_a_missing_kafka_install(tmp_path: Path) -> None:
    missing = Settings(embedded_broker="kafka", embedded_kafka_lib=str(tmp_path))
    problem = start_problem(missing)
    assert problem is not None and "GATEWAY_EMBEDDED_BROKER=kafka" in problem and "install-kafka.sh" in problem
    assert start_problem(Settings(embedded_broker="tansu", embedded_kafka_lib=str(tmp_path))) is None
    # an external broker: nothing embedded to check
    assert start_problem(Settings(embedded_broker="kafka", embedded_kafka_lib=str(tmp_path),
                                  kafka_bootstrap="broker:9092")) is None


def test_sweep_deletes_only_directories_whose_owners_are_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, mine, fresh, other = (tmp_path / f"kcg-kafka-{n}" for n in ("dead", "mine", "fresh", "other"))
    for d in (dead, mine, fresh):
        (d / "data").mkdir(parents=True)
    other.mkdir()
    (dead / "owner.pid").write_text(f"{gone.pid} {gone.pid}\n")  # the gateway and its broker: both gone
    (mine / "owner.pid").write_text(f"{gone.pid} {os.getpid()}\n")  # one of them alive
    # `fresh` has no owner.pid yet (being created): left alone, as is a directory not named kcg-kafka-*
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "unrelated" / "owner.pid").write_text(f"{gone.pid}\n")
    assert sweep_stale_dirs(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and fresh.exists() and other.exists()
    assert (tmp_path / "unrelated").exists()


def test_sasl_and_tls_listeners_and_their_settings(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")  # traditional EC form
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    tls = BrokerTls(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"), str(tmp_path / "ca.pem"), "required")
    k = EmbeddedKafka(sasl_users={"alice": "a-secret"}, tls=tls)
    k.workdir = tmp_path
    props = k.server_properties()
    ports = {"PLAINTEXT": k.port, "SASL_PLAINTEXT": k.sasl_port, "SSL": k.ssl_port, "SASL_SSL": k.sasl_ssl_port}
    assert len(set(ports.values()) | {k.controller_port}) == 5
    assert props["advertised.listeners"] == ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items())
    assert props["listeners"] == props["advertised.listeners"] + f",CONTROLLER://127.0.0.1:{k.controller_port}"
    assert props["listener.security.protocol.map"] == (
        "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT")
    assert props["sasl.enabled.mechanisms"] == "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    for listener in ("sasl_plaintext", "sasl_ssl"):
        assert props[f"listener.name.{listener}.plain.sasl.jaas.config"] == (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="a-secret";')
        assert props[f"listener.name.{listener}.scram-sha-512.sasl.jaas.config"].endswith("ScramLoginModule required;")
    assert props["listener.name.ssl.ssl.client.auth"] == "required"
    assert (props["ssl.keystore.type"], props["ssl.truststore.type"]) == ("PEM", "PEM")
    assert k.format_arguments() == ["--add-scram", "SCRAM-SHA-256=[name=alice,password=a-secret]",
                                    "--add-scram", "SCRAM-SHA-512=[name=alice,password=a-secret]"]
    store = pem_keystore(tls)
    assert store.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, as Kafka's PEM key store wants
    assert store.count("-----BEGIN CERTIFICATE-----") == 1 and "EC PRIVATE KEY" not in store
    # without them: PLAINTEXT only, and asking for another listener says so
    plain = EmbeddedKafka()
    plain.workdir = tmp_path
    assert plain.server_properties()["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert "sasl.enabled.mechanisms" not in plain.server_properties() and plain.format_arguments() == []
    for attr in ("sasl_bootstrap", "ssl_bootstrap", "sasl_ssl_bootstrap"):
        with pytest.raises(EmbeddedBrokerError, match="no"):
            getattr(plain, attr)


@pytest.mark.parametrize("users", [{"eve": 'x"; user_admin="y'}, {"a=b": "pw"}, {"": "pw"}, {"bob": ""},
                                   {"bob": "a,password=b]"}])
def test_sasl_users_that_would_change_the_broker_configuration_are_refused(users: dict[str, str]) -> None:
    with pytest.raises(EmbeddedBrokerError) as info:
        EmbeddedKafka(sasl_users=users)
    for password in users.values():
        if password and "password" in str(info.value):
            assert password not in str(info.value)


def test_client_auth_values() -> None:
    with pytest.raises(EmbeddedBrokerError, match="client_auth"):
        EmbeddedKafka(tls=BrokerTls("c", "k", "ca", client_auth="maybe"))


def test_the_formatted_template_is_made_once_and_keyed_by_the_scram_users(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCG_KAFKA_CACHE", str(tmp_path / "cache"))
    lib = tmp_path / "cache" / KAFKA_VERSION / "lib"
    lib.mkdir(parents=True)
    (lib / f"kafka_2.13-{KAFKA_VERSION}.jar").write_bytes(b"")
    formats: list[list[str]] = []

    def fake_format(self: EmbeddedKafka, props_file: Path, timeout: float) -> None:
        props = props_file.read_text()
        data = Path(next(line for line in props.splitlines() if line.startswith("log.dirs=")).split("=", 1)[1])
        (data / "meta.properties").write_text(f"cluster.id={self.cluster_id}\n")
        formats.append(self.format_arguments())

    monkeypatch.setattr(EmbeddedKafka, "_format", fake_format)

    def template(**kw: object) -> tuple[Path, str]:
        k = EmbeddedKafka(**kw)  # type: ignore[arg-type]
        k.workdir = tmp_path / "w"
        k.workdir.mkdir(exist_ok=True)
        tpl = k._template(10)
        return tpl, (tpl / "cluster.id").read_text().strip()

    first, cid = template()
    again, cid2 = template()
    assert (again, cid2) == (first, cid) and len(formats) == 1  # formatted once
    assert (first / "data" / "meta.properties").read_text() == f"cluster.id={cid}\n"
    assert not (first / "server.properties").exists()
    scram, _ = template(sasl_users={"alice": "a-secret"})
    assert scram != first and len(formats) == 2 and formats[1][0] == "--add-scram"
    assert [p.name for p in first.parent.iterdir() if p.name.startswith("building-")] == []
    (lib.parent / "stamp").write_text("another pom\n")  # tools/install-kafka.sh resolved new jars
    fresh, _ = template()
    assert fresh != first and len(formats) == 3
