"""Apache Kafka's own SASL and TLS listeners (the embedded launcher's ``sasl_users`` and ``tls``), reached with our
client: SASL/PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 over SASL_PLAINTEXT and SASL_SSL, TLS with server verification,
mutual TLS, and the refusals (a wrong password, an unknown user, an untrusted server, a missing client certificate).
Kafka only: Tansu has neither SASL nor TLS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trustme

from service.client.client import KafkaClient
from service.client.connection import BrokerConnection, ConnectionConfig, SaslConfig
from service.client.errors import AuthenticationError
from service.embedded.kafka import BrokerTls, EmbeddedKafka
from service.lib.tls import build_ssl_context

pytestmark = pytest.mark.integration
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("kafka-tls")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("gateway-client")
    paths = {"ca": d / "ca.pem", "server_cert": d / "server-cert.pem", "server_key": d / "server-key.pem",
             "client": d / "client.pem", "other_ca": d / "other-ca.pem"}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["server_cert"])
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(paths["server_cert"], append=True)
    server.private_key_pem.write_to_path(paths["server_key"])  # "BEGIN EC PRIVATE KEY": the launcher converts it
    client.private_key_and_cert_chain_pem.write_to_path(paths["client"])
    trustme.CA().cert_pem.write_to_path(paths["other_ca"])
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def secure_kafka(material: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """A broker of its own with every listener: PLAINTEXT, SASL_PLAINTEXT, SSL (client certificates required) and
    SASL_SSL."""
    tls = BrokerTls(certfile=material["server_cert"], keyfile=material["server_key"], cafile=material["ca"],
                    client_auth="required")
    k = EmbeddedKafka(sasl_users=USERS, tls=tls, log_file=tmp_path_factory.mktemp("kafka-sec") / "kafka.log")
    k.start()
    try:
        yield k
    finally:
        k.stop()


async def _metadata(address: str, config: ConnectionConfig) -> list[int]:
    client = KafkaClient(address, config)
    try:
        md = await client.refresh_metadata()
        return sorted(b.port for b in md.brokers.values())
    finally:
        await client.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_sasl_plaintext_every_mechanism(secure_kafka: EmbeddedKafka, mechanism: str) -> None:
    for user, password in USERS.items():
        cfg = ConnectionConfig(sasl=SaslConfig(mechanism, user, password))
        # the metadata a client gets on this listener advertises this listener
        assert await _metadata(secure_kafka.sasl_bootstrap, cfg) == [secure_kafka.sasl_port]
    host, port = secure_kafka.host, secure_kafka.sasl_port
    for user, password in (("alice", "bob-secret"), ("mallory", "alice-secret")):
        with pytest.raises(AuthenticationError) as info:
            await BrokerConnection.open(host, port, ConnectionConfig(sasl=SaslConfig(mechanism, user, password)))
        assert not info.value.retriable and password not in str(info.value)


async def test_tls_verifies_the_broker_and_mutual_tls_is_required(secure_kafka: EmbeddedKafka,
                                                                   material: dict[str, str]) -> None:
    host, port = secure_kafka.host, secure_kafka.ssl_port
    good = ConnectionConfig(ssl_context=build_ssl_context(cafile=material["ca"], certfile=material["client"]))
    assert await _metadata(secure_kafka.ssl_bootstrap, good) == [port]
    # a CA that did not sign the broker's certificate: the handshake fails on our side
    untrusted = ConnectionConfig(ssl_context=build_ssl_context(cafile=material["other_ca"],
                                                               certfile=material["client"]))
    with pytest.raises(AuthenticationError, match="TLS handshake"):
        await BrokerConnection.open(host, port, untrusted)
    # no client certificate on a listener that requires one: the broker refuses, in the handshake or (TLS 1.3)
    # with an alert on the first read after it: an authentication error either way, not a lost connection
    anonymous = ConnectionConfig(ssl_context=build_ssl_context(cafile=material["ca"]), connect_timeout=10,
                                 request_timeout=10)
    with pytest.raises(AuthenticationError):
        conn = await BrokerConnection.open(host, port, anonymous)
        await conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_sasl_ssl(secure_kafka: EmbeddedKafka, material: dict[str, str], mechanism: str) -> None:
    cfg = ConnectionConfig(ssl_context=build_ssl_context(cafile=material["ca"]),
                           sasl=SaslConfig(mechanism, "bob", "bob-secret"))
    assert await _metadata(secure_kafka.sasl_ssl_bootstrap, cfg) == [secure_kafka.sasl_ssl_port]
    bad = ConnectionConfig(ssl_context=build_ssl_context(cafile=material["ca"]),
                           sasl=SaslConfig(mechanism, "bob", "alice-secret"))
    with pytest.raises(AuthenticationError):
        await BrokerConnection.open(secure_kafka.host, secure_kafka.sasl_ssl_port, bad)
