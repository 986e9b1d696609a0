"""The connection layer against the protocol-level test broker: SASL, TLS, faults, timeouts, fail-over.

Tansu has no SASL, no TLS and no fault injection, so these behaviours are checked against
``tests.fakes.broker.TestCluster``, which speaks the real wire protocol with Apache Kafka's semantics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from types import SimpleNamespace

import pytest
import trustme

from service.client.client import KafkaClient
from service.client.connection import BrokerConnection, ConnectionConfig, ManagedConnection, SaslConfig
from service.client.errors import (
    AuthenticationError,
    BrokerResponseError,
    FrameTooLargeError,
    KafkaConnectionError,
    NoBrokersAvailableError,
    NoCommonVersionError,
    RequestTimeoutError,
)
from service.embedded.tansu import free_port
from service.lib.tls import build_ssl_context
from service.protocol import error_codes as EC
from service.protocol import messages as M
from tests.fakes.broker import TestCluster

MetaTopic = M.struct("MetadataRequest", "MetadataRequestTopic")
USERS = {"alice": "alice-secret", "bob": "b0b"}


def meta(*topics: str) -> object:
    return M.MetadataRequest(topics=[MetaTopic(name=t) for t in topics])


# -- SASL --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_success(mechanism: str) -> None:
    async with TestCluster(topics={"t": 2}, sasl_mechanisms=[mechanism], users=USERS) as cluster:
        host, port = cluster.addresses[0]
        cfg = ConnectionConfig(sasl=SaslConfig(mechanism, "alice", "alice-secret"))
        conn = await BrokerConnection.open(host, port, cfg)
        try:
            resp = await conn.send(meta("t"))
            assert [t.name for t in resp.topics] == ["t"]
            auths = cluster.requests(M.ApiKey.SASL_AUTHENTICATE)
            assert len(auths) == (1 if mechanism == "PLAIN" else 2)
            assert [e.api_key for e in cluster.requests()][:2] == [M.ApiKey.API_VERSIONS, M.ApiKey.SASL_HANDSHAKE]
        finally:
            await conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_wrong_password_is_a_clear_auth_error(mechanism: str) -> None:
    async with TestCluster(sasl_mechanisms=[mechanism], users=USERS) as cluster:
        host, port = cluster.addresses[0]
        cfg = ConnectionConfig(sasl=SaslConfig(mechanism, "alice", "not-the-password"))
        with pytest.raises(AuthenticationError) as info:
            await BrokerConnection.open(host, port, cfg)
        text = str(info.value)
        assert mechanism in text and "alice" in text and "failed" in text
        assert "not-the-password" not in text and not info.value.retriable


async def test_sasl_unsupported_mechanism_lists_enabled_ones() -> None:
    async with TestCluster(sasl_mechanisms=["SCRAM-SHA-512"], users=USERS) as cluster:
        host, port = cluster.addresses[0]
        cfg = ConnectionConfig(sasl=SaslConfig("PLAIN", "alice", "alice-secret"))
        with pytest.raises(AuthenticationError, match=r"does not enable SASL mechanism PLAIN; enabled: SCRAM-SHA-512"):
            await BrokerConnection.open(host, port, cfg)


async def test_sasl_unknown_user() -> None:
    async with TestCluster(sasl_mechanisms=["SCRAM-SHA-256"], users=USERS) as cluster:
        host, port = cluster.addresses[0]
        with pytest.raises(AuthenticationError):
            await BrokerConnection.open(host, port, ConnectionConfig(sasl=SaslConfig("SCRAM-SHA-256", "mallory", "x")))


async def test_managed_connection_does_not_retry_auth_failures_forever() -> None:
    async with TestCluster(sasl_mechanisms=["PLAIN"], users=USERS) as cluster:
        host, port = cluster.addresses[0]
        mc = ManagedConnection(host, port, ConnectionConfig(sasl=SaslConfig("PLAIN", "bob", "wrong")))
        for _ in range(2):
            with pytest.raises(AuthenticationError):
                await mc.send(meta())
        assert mc.backoff.failures == 2
        await mc.close()


# -- TLS ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("tls")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("gateway-client")
    paths = {"ca": d / "ca.pem", "server": d / "server.pem", "client": d / "client.pem"}
    ca.cert_pem.write_to_path(paths["ca"])
    server.private_key_and_cert_chain_pem.write_to_path(paths["server"])
    client.private_key_and_cert_chain_pem.write_to_path(paths["client"])
    return {k: str(v) for k, v in paths.items()}


def server_context(material: dict[str, str], require_client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(material["server"])
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(material["ca"])
    return ctx


async def test_tls_with_ca_file(tls_material: dict[str, str]) -> None:
    async with TestCluster(topics={"t": 1}, ssl_context=server_context(tls_material, False)) as cluster:
        host, port = cluster.addresses[0]
        cfg = ConnectionConfig(ssl_context=build_ssl_context(cafile=tls_material["ca"]))
        conn = await BrokerConnection.open(host, port, cfg)
        try:
            assert (await conn.send(meta("t"))).topics[0].name == "t"
        finally:
            await conn.close()


async def test_tls_untrusted_server_fails_clearly(tls_material: dict[str, str]) -> None:
    async with TestCluster(ssl_context=server_context(tls_material, False)) as cluster:
        host, port = cluster.addresses[0]
        cfg = ConnectionConfig(ssl_context=build_ssl_context())  # system CAs do not know our test CA
        with pytest.raises(AuthenticationError, match="TLS handshake"):
            await BrokerConnection.open(host, port, cfg)


async def test_mutual_tls_with_client_certificate(tls_material: dict[str, str]) -> None:
    async with TestCluster(topics={"t": 1}, ssl_context=server_context(tls_material, True)) as cluster:
        host, port = cluster.addresses[0]
        good = build_ssl_context(cafile=tls_material["ca"], certfile=tls_material["client"])
        conn = await BrokerConnection.open(host, port, ConnectionConfig(ssl_context=good))
        await conn.send(meta("t"))
        await conn.close()
        no_cert = build_ssl_context(cafile=tls_material["ca"])
        with pytest.raises((AuthenticationError, KafkaConnectionError)):
            c2 = await BrokerConnection.open(host, port, ConnectionConfig(ssl_context=no_cert))
            await c2.send(meta("t"))


async def test_sasl_over_tls(tls_material: dict[str, str]) -> None:
    async with TestCluster(topics={"t": 1}, sasl_mechanisms=["SCRAM-SHA-512"], users=USERS,
                           ssl_context=server_context(tls_material, False)) as cluster:
        host, port = cluster.addresses[0]
        cfg = ConnectionConfig(ssl_context=build_ssl_context(cafile=tls_material["ca"]),
                               sasl=SaslConfig("SCRAM-SHA-512", "bob", "b0b"))
        conn = await BrokerConnection.open(host, port, cfg)
        assert (await conn.send(meta("t"))).topics[0].error_code == 0
        await conn.close()


# -- pipelining, drops and timeouts -------------------------------------------------------------------
async def test_pipelined_requests_are_matched_by_correlation_id() -> None:
    async with TestCluster(topics={"a": 1, "b": 2, "c": 3}) as cluster:
        host, port = cluster.addresses[0]
        conn = await BrokerConnection.open(host, port, ConnectionConfig())
        try:
            # the broker answers the first one late: responses still reach the right waiters
            cluster.delay(M.ApiKey.METADATA, 0.2, count=1)
            results = await asyncio.gather(*(conn.send(meta(t)) for t in "abc" * 5))
            assert [r.topics[0].name for r in results] == list("abc" * 5)
            assert [len(r.topics[0].partitions) for r in results[:3]] == [1, 2, 3]
        finally:
            await conn.close()


async def test_connection_drop_fails_every_pending_request_fast() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        host, port = cluster.addresses[0]
        conn = await BrokerConnection.open(host, port, ConnectionConfig(request_timeout=30))
        release = asyncio.Event()
        cluster.delay(M.ApiKey.METADATA, until=release, count=1)
        pending = [asyncio.create_task(conn.send(meta("t"))) for _ in range(3)]
        # Like Kafka, the broker reads the next request of a connection only after answering the
        # previous one: one request is held, all three are in flight on our side.
        await cluster.wait_for_requests(M.ApiKey.METADATA, count=1)
        assert conn.in_flight == 3
        loop = asyncio.get_running_loop()
        started = loop.time()
        await cluster.close_connections()
        results = await asyncio.gather(*pending, return_exceptions=True)
        assert loop.time() - started < 2.0  # not the 30 s request timeout
        assert all(isinstance(r, KafkaConnectionError) and r.retriable for r in results)
        with pytest.raises(KafkaConnectionError):
            await conn.send(meta("t"))
        release.set()


async def test_drop_on_receipt_then_managed_reconnect() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        host, port = cluster.addresses[0]
        mc = ManagedConnection(host, port, ConnectionConfig())
        cluster.drop_connection(M.ApiKey.METADATA, count=1)
        with pytest.raises(KafkaConnectionError) as info:
            await mc.send(meta("t"))
        assert info.value.retriable
        resp = await mc.send(meta("t"))  # a fresh connection
        assert resp.topics[0].name == "t" and mc.reconnects == 1
        await mc.close()


async def test_request_timeout_is_retriable_and_connection_survives() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        host, port = cluster.addresses[0]
        conn = await BrokerConnection.open(host, port, ConnectionConfig(request_timeout=0.2))
        release = asyncio.Event()
        cluster.delay(M.ApiKey.METADATA, until=release, count=1)
        with pytest.raises(RequestTimeoutError, match=r"timed out after 0\.2s") as info:
            await conn.send(meta("t"))
        assert info.value.retriable
        release.set()  # the late response is discarded; the next request is answered normally
        assert (await conn.send(meta("t"), timeout=5)).topics[0].name == "t"
        await conn.close()


async def test_frame_size_guard() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        host, port = cluster.addresses[0]
        conn = await BrokerConnection.open(host, port, ConnectionConfig())
        conn.config = dataclasses.replace(conn.config, max_frame_bytes=64)  # after the handshake
        with pytest.raises(FrameTooLargeError, match="guard 64"):
            await conn.send(meta("t"))
        await conn.close()


async def test_connect_refused_is_retriable() -> None:
    with pytest.raises(KafkaConnectionError) as info:
        await BrokerConnection.open("127.0.0.1", free_port(), ConnectionConfig(connect_timeout=2))
    assert info.value.retriable


# -- version negotiation ------------------------------------------------------------------------------
async def test_negotiation_uses_highest_common_version() -> None:
    async with TestCluster(topics={"t": 1}, api_versions={M.ApiKey.METADATA: (0, 5)}) as cluster:
        host, port = cluster.addresses[0]
        conn = await BrokerConnection.open(host, port, ConnectionConfig())
        assert conn.version_for(M.ApiKey.METADATA) == 5
        await conn.send(meta("t"))
        assert cluster.requests(M.ApiKey.METADATA)[-1].api_version == 5
        await conn.close()


async def test_no_common_version_is_a_clear_error() -> None:
    # an old broker: Fetch only up to v3 (pre-0.11 message format era)
    async with TestCluster(api_versions={M.ApiKey.FETCH: (0, 3), M.ApiKey.JOIN_GROUP: None}) as cluster:
        host, port = cluster.addresses[0]
        conn = await BrokerConnection.open(host, port, ConnectionConfig())
        with pytest.raises(NoCommonVersionError, match=r"Fetch: broker supports v0-v3, this gateway implements v4-v17"):
            conn.version_for(M.ApiKey.FETCH)
        with pytest.raises(NoCommonVersionError, match=r"does not support JoinGroup"):
            await conn.send(M.JoinGroupRequest(group_id="g"))
        await conn.close()


async def test_api_versions_fallback_when_broker_is_older() -> None:
    async with TestCluster(api_versions={M.ApiKey.API_VERSIONS: (0, 2)}) as cluster:
        host, port = cluster.addresses[0]
        conn = await BrokerConnection.open(host, port, ConnectionConfig())
        versions = [e.api_version for e in cluster.requests(M.ApiKey.API_VERSIONS)]
        assert versions == [4, 2]  # rejected with UNSUPPORTED_VERSION, then retried at the broker's max
        assert conn.versions is not None and conn.versions.version(M.ApiKey.API_VERSIONS) == 2
        await conn.close()


# -- cluster client: bootstrap fail-over, metadata refresh ------------------------------------------------
async def test_bootstrap_fails_over_to_the_next_address() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        host, port = cluster.addresses[0]
        client = KafkaClient(f"127.0.0.1:{free_port()},{host}:{port}")
        try:
            md = await client.refresh_metadata(["t"])
            assert md.leader("t", 0) == cluster.node_ids[0]
        finally:
            await client.close()


async def test_no_reachable_bootstrap() -> None:
    client = KafkaClient(f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}")
    with pytest.raises(NoBrokersAvailableError, match="no broker reachable"):
        await client.refresh_metadata()
    await client.close()


async def test_metadata_follows_a_leader_move_and_a_broker_failure() -> None:
    async with TestCluster(3, topics={"t": 3}) as cluster:
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            md = await client.refresh_metadata(["t"])
            before = {p: md.leader("t", p) for p in range(3)}
            assert len(set(before.values())) == 3
            cluster.move_leader("t", 0)
            # a NOT_LEADER_OR_FOLLOWER answer marks the topic stale; the refresh picks the new leader
            client.handle_error_code(6, "t")
            assert client.metadata.needs_refresh
            await client.ensure_metadata(["t"])
            assert md.leader("t", 0) != before[0]
            assert md.leader_epoch("t", 0) >= 1
            victim = before[1]
            await cluster.stop_broker(victim)
            client.invalidate()
            await client.refresh_metadata(["t"])
            assert md.leader("t", 1) != victim
            with pytest.raises(KafkaConnectionError):
                await client.connection(victim).send(meta("t"))
            conn = await client.leader_connection("t", 1)
            assert (await conn.send(meta("t"))).topics[0].name == "t"
        finally:
            await client.close()


async def test_leader_connection_for_unknown_topic() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            with pytest.raises(BrokerResponseError, match="UNKNOWN_TOPIC_OR_PARTITION"):
                await client.leader_connection("missing", 0)
        finally:
            await client.close()


async def test_consumer_poll_surfaces_a_sasl_failure() -> None:
    """A consumer whose credentials the broker rejects gets the authentication error from poll()."""
    from service.consumer.consumer import Consumer, ConsumerConfig

    async with TestCluster(topics={"t": 1}, sasl_mechanisms=["PLAIN"], users=USERS) as cluster:
        client = KafkaClient(cluster.bootstrap_servers,
                             ConnectionConfig(sasl=SaslConfig("PLAIN", "alice", "wrong-password")))
        c = Consumer(client, ConsumerConfig(group_id="g", session_timeout_ms=2000, heartbeat_interval_ms=300))
        try:
            with pytest.raises(AuthenticationError, match="alice"):
                await c.subscribe(["t"])  # fails at once: metadata needs an authenticated connection
            started = asyncio.get_running_loop().time()
            with pytest.raises(AuthenticationError, match="alice"):
                await c.poll(timeout=10)  # a later poll reports it too, without waiting out its timeout
            assert asyncio.get_running_loop().time() - started < 5
        finally:
            await c.close()
            await client.close()


# -- leased connections (held requests) ---------------------------------------------------------------
async def test_lease_pool_follows_concurrency_and_reaps_idle_connections() -> None:
    """Many concurrent held requests each get their own connection; afterwards they are all kept for
    reuse (no connect + ApiVersions per request), and closed once unused for the pool's TTL."""
    async with TestCluster(topics={"t": 1}) as cluster:
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            await client.refresh_metadata(["t"])
            node = next(iter(client.metadata.brokers))

            answered = 0
            all_answered = asyncio.Event()

            async def held() -> None:
                nonlocal answered
                async with client.lease(node) as mc:
                    await mc.send(meta("t"))
                    answered += 1
                    if answered == 40:
                        all_answered.set()
                    await gate.wait()

            gate = asyncio.Event()
            tasks = [asyncio.create_task(held()) for _ in range(40)]
            await asyncio.wait_for(all_answered.wait(), 10)  # 40 requests held at once: 40 connections
            assert client.leased == 40
            versions_before = len(cluster.requests(M.ApiKey.API_VERSIONS))
            gate.set()
            await asyncio.gather(*tasks)
            assert client.pooled_connections() == 40
            # reuse: 40 more held requests open no connection (no ApiVersions)
            gate = asyncio.Event()
            gate.set()
            await asyncio.gather(*(held() for _ in range(40)))
            assert len(cluster.requests(M.ApiKey.API_VERSIONS)) == versions_before
            # unused for the TTL: the scheduled reaper closes them (their return times made old here)
            assert client._reaper is not None
            pooled = [mc for _, mc in client._idle[node]]
            client._idle[node] = [(t - 100, mc) for t, mc in client._idle[node][:30]] + client._idle[node][30:]
            client._reap_idle()
            assert client.pooled_connections() == 10 and client._reaper is not None
            await asyncio.gather(*client._closing)
            assert sum(mc.current is None for mc in pooled) == 30
            async with client.lease(node) as mc:  # and a new lease still works
                assert (await mc.send(meta("t"))).topics[0].name == "t"
        finally:
            await client.close()


async def test_api_versions_answer_is_decoded_once() -> None:
    from service.client import connection as C

    async with TestCluster(topics={"t": 1}) as cluster:
        C._NEGOTIATED.clear()
        host, port = cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
        a = await BrokerConnection.open(host, int(port), ConnectionConfig())
        b = await BrokerConnection.open(host, int(port), ConnectionConfig())
        try:
            assert a.versions is b.versions and len(C._NEGOTIATED) == 1
        finally:
            await a.close()
            await b.close()


async def test_create_topics_returns_once_the_metadata_lists_the_topic() -> None:
    """Apache Kafka's brokers learn of a created topic a moment after CreateTopics answers; until then Metadata says
    UNKNOWN_TOPIC_OR_PARTITION (an assign right after create_topics failed so on Kafka 4.4). create_topics waits."""
    async with TestCluster() as cluster:
        client = KafkaClient(cluster.bootstrap_servers)
        orig_send = client.send

        async def send(node: int, req: object, *args: object, **kw: object) -> object:
            if not isinstance(req, M.CreateTopicsRequest):
                return await orig_send(node, req, *args, **kw)  # type: ignore[arg-type]
            for t in req.topics:  # the test broker has no CreateTopics: the topic appears in its state
                cluster.create_topic(t.name, t.num_partitions)
            return SimpleNamespace(topics=[SimpleNamespace(name=t.name, error_code=0, error_message=None)
                                           for t in req.topics])

        client.send = send  # type: ignore[method-assign]
        client.send_any = lambda req, *a, **kw: send(0, req, *a, **kw)  # type: ignore[method-assign]
        try:
            await client.ensure_metadata()
            lagging = cluster.error(M.ApiKey.METADATA, EC.UNKNOWN_TOPIC_OR_PARTITION, count=3, depth=1,
                                    when=lambda _h, req: any(t.name == "fresh" for t in req.topics or ()))
            await client.create_topics({"fresh": 2})
            assert lagging.applied == 3
            assert client.metadata.topic_error("fresh") == 0 and client.metadata.partitions("fresh") == [0, 1]
        finally:
            await client.close()
