"""The protocol-level test broker (tests/fakes/broker), driven with raw asyncio streams and our own frames."""

from __future__ import annotations

import asyncio
import struct
import uuid
from typing import Any

import pytest

from service.client.sasl import create_mechanism
from service.protocol import error_codes as EC
from service.protocol import frames
from service.protocol import messages as M
from service.protocol.messages import ApiKey
from tests.fakes.broker import BrokerHandlerError, HandlerRegistry, RequestContext, TestCluster, default_registry

ReqTopic = M.struct("MetadataRequest", "MetadataRequestTopic")
IO_TIMEOUT = 5.0


class RawClient:
    """The bare minimum of a Kafka client: frames in, frames out, one connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.corr = 0
        self.sent_sizes: list[int] = []

    @classmethod
    async def connect(cls, address: tuple[str, int]) -> RawClient:
        reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer)

    def send(self, req: Any, version: int, client_id: str | None = "raw-test") -> int:
        self.corr += 1
        frame = frames.encode_request(req, version, self.corr, client_id)
        self.sent_sizes.append(len(frame))
        self.writer.write(frame)
        return self.corr

    def send_raw(self, frame: bytes) -> None:
        self.writer.write(frame)

    async def recv(self, api_key: int, version: int, corr: int | None = None) -> Any:
        payload = await self.recv_payload()
        if corr is not None:
            assert frames.response_correlation_id(payload) == corr
        return frames.decode_response(api_key, version, payload)

    async def recv_payload(self) -> bytes:
        head = await asyncio.wait_for(self.reader.readexactly(4), IO_TIMEOUT)
        (size,) = struct.unpack(">i", head)
        return await asyncio.wait_for(self.reader.readexactly(size), IO_TIMEOUT)

    async def request(self, req: Any, version: int) -> Any:
        corr = self.send(req, version)
        return await self.recv(frames.api_key_of(req), version, corr)

    async def assert_closed(self) -> None:
        """The broker closed the connection (EOF) without sending anything more."""
        data = await asyncio.wait_for(self.reader.read(), IO_TIMEOUT)
        assert data == b""
        await self.close()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


def raw_request(api_key: int, version: int, corr: int, body: bytes = b"", client_id: str = "x") -> bytes:
    """A request frame with header v1 (non-flexible) for keys/versions our codecs cannot encode."""
    cid = client_id.encode()
    payload = struct.pack(">hhih", api_key, version, corr, len(cid)) + cid + body
    return struct.pack(">i", len(payload)) + payload


def with_version(frame: bytes, version: int) -> bytes:
    """The same frame claiming another api version."""
    return frame[:6] + struct.pack(">h", version) + frame[8:]


async def client_for(cluster: TestCluster, node_id: int | None = None) -> RawClient:
    node = node_id if node_id is not None else cluster.node_ids[0]
    return await RawClient.connect(cluster.broker(node).address)


def metadata_request(version: int, names: list[str] | None) -> Any:
    topics = None if names is None else [ReqTopic(name=n) for n in names]
    return M.MetadataRequest(topics=topics, allow_auto_topic_creation=False)


# -- ApiVersions -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
async def test_api_versions_all_versions(version: int) -> None:
    async with TestCluster() as cluster:
        c = await client_for(cluster)
        resp = await c.request(M.ApiVersionsRequest(client_software_name="raw", client_software_version="1.0"), version)
        assert resp.error_code == 0
        got = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        for key in (ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            assert got[key] == M.REQUESTS[key].schema.versions
        assert set(got) == set(cluster.registry.keys())
        await c.close()


async def test_api_versions_invalid_software_name() -> None:
    async with TestCluster() as cluster:
        c = await client_for(cluster)
        resp = await c.request(M.ApiVersionsRequest(client_software_name="-bad", client_software_version="1"), 3)
        assert resp.error_code == EC.BY_NAME["INVALID_REQUEST"]
        await c.close()


@pytest.mark.parametrize("version", [5, 127])
async def test_api_versions_too_new_gets_v0_unsupported_version(version: int) -> None:
    async with TestCluster() as cluster:
        c = await client_for(cluster)
        frame = frames.encode_request(M.ApiVersionsRequest(client_software_name="a", client_software_version="1"),
                                      4, 7, "cid")
        c.send_raw(with_version(frame, version))
        payload = await c.recv_payload()
        resp = frames.decode_response(ApiKey.API_VERSIONS, 0, payload)
        assert frames.response_correlation_id(payload) == 7
        assert resp.error_code == EC.UNSUPPORTED_VERSION
        assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(ApiKey.API_VERSIONS, 0, 4)]
        # the connection stays usable: retry with a supported version
        assert (await c.request(M.ApiVersionsRequest(), 2)).error_code == 0
        await c.close()


async def test_api_versions_overrides_cluster_and_broker() -> None:
    async with TestCluster(2, api_versions={ApiKey.METADATA: (0, 5), ApiKey.SASL_AUTHENTICATE: None}) as cluster:
        cluster.set_api_versions({ApiKey.API_VERSIONS: (0, 2)}, node_id=1)
        c0, c1 = await client_for(cluster, 0), await client_for(cluster, 1)
        got0 = {k.api_key: (k.min_version, k.max_version)
                for k in (await c0.request(M.ApiVersionsRequest(), 2)).api_keys}
        assert got0[ApiKey.METADATA] == (0, 5)  # advertised as overridden
        assert ApiKey.SASL_AUTHENTICATE not in got0
        # a version above the advertised range closes the connection
        c0.send(metadata_request(6, None), 6)
        await c0.assert_closed()
        # broker 1: its own override replaces the cluster's for ApiVersions only
        c1.send_raw(with_version(frames.encode_request(M.ApiVersionsRequest(), 3, 1, None), 3))
        resp = frames.decode_response(ApiKey.API_VERSIONS, 0, await c1.recv_payload())
        assert resp.error_code == EC.UNSUPPORTED_VERSION
        assert [(k.min_version, k.max_version) for k in resp.api_keys] == [(0, 2)]
        got1 = {k.api_key: (k.min_version, k.max_version)
                for k in (await c1.request(M.ApiVersionsRequest(), 2)).api_keys}
        assert got1[ApiKey.METADATA] == (0, 5)
        assert got1[ApiKey.API_VERSIONS] == (0, 2)
        await c1.close()


async def test_advertise_all_codecs() -> None:
    async with TestCluster(advertise_all_codecs=True, api_versions={ApiKey.FETCH: (4, 12)}) as cluster:
        c = await client_for(cluster)
        got = {k.api_key: (k.min_version, k.max_version) for k in (await c.request(M.ApiVersionsRequest(), 0)).api_keys}
        assert set(got) == set(M.REQUESTS)
        assert got[ApiKey.FETCH] == (4, 12)
        assert got[ApiKey.JOIN_GROUP] == M.REQUESTS[ApiKey.JOIN_GROUP].schema.versions
        c.send(M.HeartbeatRequest(group_id="g", generation_id=1, member_id="m"), 0)  # no handler
        await c.assert_closed()


# -- unknown keys, versions, garbage ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "frame",
    [
        raw_request(99, 0, 1),  # unknown api key
        raw_request(ApiKey.FETCH, 12, 1),  # known codec, no handler, not advertised
        raw_request(ApiKey.METADATA, 0, 1, b"\x00\x00\x00\x00"),  # below our codec range
        with_version(frames.encode_request(M.MetadataRequest(topics=None), 12, 1, None), 13),  # above
        raw_request(ApiKey.METADATA, 1, 1, b"\x00\x00"),  # body does not decode
        struct.pack(">i", 3) + b"\x00\x03\x00",  # header does not decode
        struct.pack(">i", -5),  # negative size
    ],
)
async def test_invalid_requests_close_the_connection(frame: bytes) -> None:
    async with TestCluster() as cluster:
        c = await client_for(cluster)
        c.send_raw(frame)
        await c.assert_closed()
        if len(frame) > 8:
            [entry] = cluster.requests()
            assert entry.outcome == "closed"
            assert entry.request is None


# -- Metadata ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [1, 9, 12])
async def test_metadata_versions(version: int) -> None:
    async with TestCluster(3, topics={"alpha": 4, "beta": 1}, cluster_id="test-cluster-id",
                           racks={0: "r0"}) as cluster:
        c = await client_for(cluster, 1)
        resp = await c.request(metadata_request(version, None), version)
        assert [(b.node_id, b.host, b.port) for b in resp.brokers] == [
            (n, "127.0.0.1", cluster.broker(n).port) for n in (0, 1, 2)
        ]
        assert resp.brokers[0].rack == "r0" and resp.brokers[1].rack is None
        assert resp.controller_id == 0
        assert resp.cluster_id == (None if version < 2 else "test-cluster-id")
        assert [t.name for t in resp.topics] == ["alpha", "beta"]
        alpha = resp.topics[0]
        assert alpha.error_code == 0
        assert alpha.topic_id == (cluster.topic("alpha").topic_id if version >= 10 else uuid.UUID(int=0))
        assert [p.partition_index for p in alpha.partitions] == [0, 1, 2, 3]
        assert [p.leader_id for p in alpha.partitions] == [0, 1, 2, 0]  # spread over brokers
        assert alpha.partitions[1].replica_nodes == [1, 2, 0]
        assert alpha.partitions[1].isr_nodes == [1, 2, 0]
        assert all(p.leader_epoch == (0 if version >= 7 else -1) for p in alpha.partitions)

        resp = await c.request(metadata_request(version, ["beta", "missing", "beta"]), version)
        assert [(t.name, t.error_code) for t in resp.topics] == [("beta", 0),
                                                                 ("missing", EC.UNKNOWN_TOPIC_OR_PARTITION)]
        assert resp.topics[1].partitions == []

        resp = await c.request(metadata_request(version, []), version)
        assert resp.topics == [] and len(resp.brokers) == 3
        await c.close()


async def test_metadata_by_topic_id_v12() -> None:
    tid = uuid.uuid4()
    async with TestCluster(topics={"a": 2}) as cluster:
        cluster.create_topic("b", 1, topic_id=tid)
        unknown = uuid.uuid4()
        c = await client_for(cluster)
        req = M.MetadataRequest(topics=[ReqTopic(topic_id=tid, name=None), ReqTopic(topic_id=unknown, name=None)])
        resp = await c.request(req, 12)
        assert [(t.name, t.topic_id, t.error_code) for t in resp.topics] == [
            ("b", tid, 0), (None, unknown, EC.UNKNOWN_TOPIC_ID)]
        await c.close()


async def test_metadata_invalid_name_and_auto_create() -> None:
    async with TestCluster(2, auto_create_topics=True, default_partitions=3) as cluster:
        c = await client_for(cluster)
        req = M.MetadataRequest(topics=[ReqTopic(name="bad/name"), ReqTopic(name="fresh")],
                                allow_auto_topic_creation=True)
        resp = await c.request(req, 9)
        assert [(t.name, t.error_code, len(t.partitions)) for t in resp.topics] == [("bad/name", 17, 0),
                                                                                    ("fresh", 0, 3)]
        assert "fresh" in cluster.state.topics
        resp = await c.request(metadata_request(9, ["other"]), 9)  # allow_auto_topic_creation=False
        assert resp.topics[0].error_code == EC.UNKNOWN_TOPIC_OR_PARTITION
        await c.close()


async def test_move_leader_bumps_epoch() -> None:
    async with TestCluster(3, topics={"t": 2}) as cluster:
        assert cluster.leaders("t") == {0: 0, 1: 1}
        p = cluster.move_leader("t", 0, to=2)
        assert (p.leader, p.leader_epoch) == (2, 1)
        cluster.move_leader("t", 0, to=2)  # same leader: epoch only
        c = await client_for(cluster)
        resp = await c.request(metadata_request(9, ["t"]), 9)
        part = resp.topics[0].partitions[0]
        assert (part.leader_id, part.leader_epoch) == (2, 2)
        assert resp.topics[0].partitions[1].leader_epoch == 0
        assert cluster.move_leader("t", 1).leader == 2  # default: next replica
        await c.close()


async def test_stop_and_restart_broker_same_port() -> None:
    async with TestCluster(3, topics={"t": 3}) as cluster:
        port1 = cluster.broker(1).port
        c1 = await client_for(cluster, 1)
        assert (await c1.request(M.ApiVersionsRequest(), 0)).error_code == 0

        changed = await cluster.stop_broker(1)
        assert changed == [("t", 1)]
        await c1.assert_closed()
        with pytest.raises(OSError):
            await RawClient.connect(("127.0.0.1", port1))

        c0 = await client_for(cluster, 0)
        resp = await c0.request(metadata_request(9, ["t"]), 9)
        assert [b.node_id for b in resp.brokers] == [0, 2]
        p1 = resp.topics[0].partitions[1]
        assert (p1.leader_id, p1.leader_epoch) == (2, 1)  # failed over to the next in-sync replica
        assert p1.isr_nodes == [2, 0] and p1.offline_replicas == [1]

        await cluster.start_broker(1)
        assert cluster.broker(1).port == port1
        c1 = await client_for(cluster, 1)
        resp = await c1.request(metadata_request(9, ["t"]), 9)
        assert [b.node_id for b in resp.brokers] == [0, 1, 2]
        assert resp.topics[0].partitions[1].leader_id == 2  # no automatic preferred-leader election
        assert resp.topics[0].partitions[1].isr_nodes == [1, 2, 0]
        await c0.close()
        await c1.close()


async def test_stop_broker_without_failover_leaves_partition_leaderless() -> None:
    async with TestCluster(2, topics={"t": 2}, replication_factor=1) as cluster:
        await cluster.stop_broker(1, failover=False)
        c = await client_for(cluster, 0)
        resp = await c.request(metadata_request(9, ["t"]), 9)
        p = resp.topics[0].partitions[1]
        assert (p.error_code, p.leader_id, p.offline_replicas, p.isr_nodes) == (EC.LEADER_NOT_AVAILABLE, -1, [1], [])
        await cluster.start_broker(1)
        resp = await c.request(metadata_request(9, ["t"]), 9)
        assert (resp.topics[0].partitions[1].leader_id, resp.topics[0].partitions[1].error_code) == (1, 0)
        await c.close()


async def test_controller_moves_when_controller_stops() -> None:
    async with TestCluster(2, controller_id=1) as cluster:
        c = await client_for(cluster, 0)
        assert (await c.request(metadata_request(1, None), 1)).controller_id == 1
        await cluster.stop_broker(1)
        assert (await c.request(metadata_request(1, None), 1)).controller_id == 0
        await c.close()


# -- SASL --------------------------------------------------------------------------------------------------------------
USERS = {"alice": "alice-secret", "bob,=x": "b0b"}
ALL_MECHS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


async def sasl_exchange(c: RawClient, mechanism: str, user: str, password: str, auth_version: int = 2) -> Any:
    """Handshake v1 + SaslAuthenticate rounds; returns the last SaslAuthenticate response."""
    mech = create_mechanism(mechanism, user, password)
    hs = await c.request(M.SaslHandshakeRequest(mechanism=mechanism), 1)
    assert hs.error_code == 0
    assert hs.mechanisms == ALL_MECHS
    token: bytes | None = mech.initial_response()
    resp = None
    while token is not None:
        resp = await c.request(M.SaslAuthenticateRequest(auth_bytes=token), auth_version)
        if resp.error_code:
            return resp
        token = mech.respond(resp.auth_bytes)
    assert mech.complete
    return resp


@pytest.mark.parametrize("mechanism", ALL_MECHS)
@pytest.mark.parametrize("user", sorted(USERS))
async def test_sasl_success(mechanism: str, user: str) -> None:
    async with TestCluster(sasl_mechanisms=ALL_MECHS, users=USERS, topics={"t": 1}) as cluster:
        c = await client_for(cluster)
        hello = M.ApiVersionsRequest(client_software_name="raw", client_software_version="1")
        assert (await c.request(hello, 3)).error_code == 0  # allowed before auth
        resp = await sasl_exchange(c, mechanism, user, USERS[user])
        assert resp.error_code == 0
        meta = await c.request(metadata_request(12, ["t"]), 12)
        assert meta.topics[0].error_code == 0
        conn = cluster.connections()[0]
        assert conn.sasl.principal == user
        # SASL requests after authentication are illegal but do not close the connection
        again = await c.request(M.SaslHandshakeRequest(mechanism=mechanism), 1)
        assert again.error_code == EC.ILLEGAL_SASL_STATE
        assert cluster.api_keys() == [ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE] + [ApiKey.SASL_AUTHENTICATE] * (
            1 if mechanism == "PLAIN" else 2) + [ApiKey.METADATA, ApiKey.SASL_HANDSHAKE]
        await c.close()


@pytest.mark.parametrize("auth_version", [0, 1, 2])
@pytest.mark.parametrize("mechanism", ALL_MECHS)
async def test_sasl_wrong_password_fails_and_closes(mechanism: str, auth_version: int) -> None:
    async with TestCluster(sasl_mechanisms=ALL_MECHS, users=USERS) as cluster:
        c = await client_for(cluster)
        resp = await sasl_exchange(c, mechanism, "alice", "not-the-password", auth_version)
        assert resp.error_code == EC.SASL_AUTHENTICATION_FAILED
        assert resp.error_message and "authentication failed" in resp.error_message
        assert "not-the-password" not in resp.error_message and "alice-secret" not in resp.error_message
        await c.assert_closed()
        assert cluster.requests(ApiKey.SASL_AUTHENTICATE)[-1].outcome == "answered"


@pytest.mark.parametrize("mechanism", ALL_MECHS)
async def test_sasl_unknown_user(mechanism: str) -> None:
    async with TestCluster(sasl_mechanisms=ALL_MECHS, users=USERS) as cluster:
        c = await client_for(cluster)
        resp = await sasl_exchange(c, mechanism, "mallory", "x")
        assert resp.error_code == EC.SASL_AUTHENTICATION_FAILED
        await c.assert_closed()


async def test_sasl_scram_low_iterations_rejected_by_client() -> None:
    from service.client.sasl import SaslAuthenticationError

    async with TestCluster(sasl_mechanisms=ALL_MECHS) as cluster:
        cluster.add_user("weak", "pw", iterations=1000)
        c = await client_for(cluster)
        with pytest.raises(SaslAuthenticationError, match="1000 iterations"):
            await sasl_exchange(c, "SCRAM-SHA-256", "weak", "pw")
        await c.close()


async def test_sasl_unsupported_mechanism() -> None:
    async with TestCluster(sasl_mechanisms=["SCRAM-SHA-512"], users=USERS) as cluster:
        c = await client_for(cluster)
        hs = await c.request(M.SaslHandshakeRequest(mechanism="PLAIN"), 1)
        assert (hs.error_code, hs.mechanisms) == (EC.UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-512"])
        await c.assert_closed()


@pytest.mark.parametrize("api_key_first", ["metadata", "authenticate", "api_versions_twice"])
async def test_sasl_requests_before_authentication_close(api_key_first: str) -> None:
    async with TestCluster(sasl_mechanisms=ALL_MECHS, users=USERS) as cluster:
        c = await client_for(cluster)
        if api_key_first == "metadata":
            c.send(metadata_request(9, None), 9)
        elif api_key_first == "authenticate":
            c.send(M.SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret"), 2)
        else:
            assert (await c.request(M.ApiVersionsRequest(), 2)).error_code == 0
            c.send(M.ApiVersionsRequest(), 2)
        await c.assert_closed()
        assert cluster.requests()[-1].outcome == "closed"


async def test_sasl_metadata_between_handshake_and_authenticate_closes() -> None:
    async with TestCluster(sasl_mechanisms=ALL_MECHS, users=USERS) as cluster:
        c = await client_for(cluster)
        assert (await c.request(M.SaslHandshakeRequest(mechanism="PLAIN"), 1)).error_code == 0
        c.send(metadata_request(9, None), 9)
        await c.assert_closed()


@pytest.mark.parametrize("mechanism", ALL_MECHS)
async def test_sasl_handshake_v0_raw_tokens(mechanism: str) -> None:
    async with TestCluster(sasl_mechanisms=ALL_MECHS, users=USERS, topics={"t": 1}) as cluster:
        c = await client_for(cluster)
        assert (await c.request(M.SaslHandshakeRequest(mechanism=mechanism), 0)).error_code == 0
        mech = create_mechanism(mechanism, "alice", "alice-secret")
        token: bytes | None = mech.initial_response()
        while token is not None:
            c.send_raw(struct.pack(">i", len(token)) + token)
            token = mech.respond(await c.recv_payload())
        assert mech.complete
        assert (await c.request(metadata_request(9, ["t"]), 9)).topics[0].error_code == 0
        await c.close()


async def test_sasl_requests_on_plaintext_broker() -> None:
    async with TestCluster() as cluster:
        c = await client_for(cluster)
        assert (await c.request(M.SaslHandshakeRequest(mechanism="PLAIN"), 1)).error_code == EC.ILLEGAL_SASL_STATE
        resp = await c.request(M.SaslAuthenticateRequest(auth_bytes=b"x"), 1)
        assert resp.error_code == EC.ILLEGAL_SASL_STATE
        assert (await c.request(metadata_request(1, None), 1)).topics == []
        await c.close()


# -- faults ---------------------------------------------------------------------------------------------------------
async def test_drop_connection_fault() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        fault = cluster.drop_connection(ApiKey.METADATA, count=2)
        for _ in range(2):
            c = await client_for(cluster)
            assert (await c.request(M.ApiVersionsRequest(), 2)).error_code == 0  # other keys unaffected
            c.send(metadata_request(9, None), 9)
            await c.assert_closed()
        assert (fault.applied, fault.active) == (2, False)
        c = await client_for(cluster)
        assert (await c.request(metadata_request(9, ["t"]), 9)).topics[0].error_code == 0
        assert [e.outcome for e in cluster.requests(ApiKey.METADATA)] == ["dropped", "dropped", "answered"]
        await c.close()


async def test_faults_per_broker_and_cluster_wide() -> None:
    async with TestCluster(2) as cluster:
        cluster.drop_connection(ApiKey.API_VERSIONS, node_id=1)
        c0 = await client_for(cluster, 0)
        assert (await c0.request(M.ApiVersionsRequest(), 0)).error_code == 0
        c1 = await client_for(cluster, 1)
        c1.send(M.ApiVersionsRequest(), 0)
        await c1.assert_closed()
        cluster.error(ApiKey.API_VERSIONS, EC.UNSUPPORTED_VERSION, count=1)  # cluster-wide: the next one anywhere
        c1 = await client_for(cluster, 1)
        assert (await c1.request(M.ApiVersionsRequest(), 0)).error_code == EC.UNSUPPORTED_VERSION
        assert (await c0.request(M.ApiVersionsRequest(), 0)).error_code == 0
        await c0.close()
        await c1.close()


async def test_delay_fault_seconds() -> None:
    async with TestCluster() as cluster:
        fault = cluster.delay(ApiKey.METADATA, 0.2)
        c = await client_for(cluster)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await c.request(metadata_request(1, None), 1)
        assert loop.time() - start >= 0.2
        assert (fault.applied, fault.active) == (1, False)  # count=1: used up, the next one is prompt
        await c.request(metadata_request(1, None), 1)
        await c.close()


async def test_delay_fault_until_event_holds_later_requests_in_order() -> None:
    async with TestCluster() as cluster:
        release = asyncio.Event()
        cluster.delay(ApiKey.METADATA, until=release)
        c = await client_for(cluster)
        corr1 = c.send(metadata_request(1, None), 1)
        corr2 = c.send(M.ApiVersionsRequest(), 0)
        [entry] = await cluster.wait_for_requests(ApiKey.METADATA)
        assert entry.outcome == "pending"  # held by the fault
        release.set()
        await c.recv(ApiKey.METADATA, 1, corr1)
        await c.recv(ApiKey.API_VERSIONS, 0, corr2)
        answered = await cluster.wait_for_requests(where=lambda e: e.outcome == "answered", count=2)
        assert [e.api_key for e in answered] == [ApiKey.METADATA, ApiKey.API_VERSIONS]
        await c.close()


async def test_delay_forever_then_close_connections() -> None:
    async with TestCluster(2) as cluster:
        cluster.delay(ApiKey.METADATA)  # never answered
        c = await client_for(cluster, 0)
        other = await client_for(cluster, 1)
        assert (await other.request(M.ApiVersionsRequest(), 0)).error_code == 0
        c.send(metadata_request(1, None), 1)
        await cluster.wait_for_requests(ApiKey.METADATA)
        assert len(cluster.connections()) == 2
        assert await cluster.close_connections() == 2
        await c.assert_closed()
        await other.assert_closed()
        assert cluster.requests(ApiKey.METADATA)[0].outcome == "aborted"
        assert cluster.connections() == []


async def test_error_fault_metadata_all_levels_and_depth() -> None:
    async with TestCluster(topics={"t": 2}) as cluster:
        cluster.error(ApiKey.METADATA, EC.LEADER_NOT_AVAILABLE)
        cluster.error(ApiKey.METADATA, EC.NOT_LEADER_OR_FOLLOWER, depth=2, when=lambda h, r: h.api_version == 12)
        c = await client_for(cluster)
        resp = await c.request(metadata_request(9, ["t"]), 9)
        assert resp.topics[0].error_code == EC.LEADER_NOT_AVAILABLE
        assert [p.error_code for p in resp.topics[0].partitions] == [EC.LEADER_NOT_AVAILABLE] * 2
        resp = await c.request(metadata_request(9, ["t"]), 9)  # the predicate does not match v9
        assert resp.topics[0].error_code == 0
        resp = await c.request(metadata_request(12, ["t"]), 12)
        assert resp.topics[0].error_code == 0
        assert [p.error_code for p in resp.topics[0].partitions] == [EC.NOT_LEADER_OR_FOLLOWER] * 2
        assert [e.outcome for e in cluster.requests(ApiKey.METADATA)] == ["error-injected", "answered",
                                                                          "error-injected"]
        await c.close()


async def test_error_fault_on_sasl_authenticate_closes() -> None:
    async with TestCluster(sasl_mechanisms=ALL_MECHS, users=USERS) as cluster:
        cluster.error(ApiKey.SASL_AUTHENTICATE, EC.SASL_AUTHENTICATION_FAILED)
        c = await client_for(cluster)
        resp = await sasl_exchange(c, "PLAIN", "alice", "alice-secret")
        assert resp.error_code == EC.SASL_AUTHENTICATION_FAILED
        await c.assert_closed()
        c = await client_for(cluster)  # the fault is used up
        assert (await sasl_exchange(c, "PLAIN", "alice", "alice-secret")).error_code == 0
        await c.close()


# -- request log ----------------------------------------------------------------------------------------------------
async def test_request_log_sequence_and_sizes() -> None:
    async with TestCluster(2, topics={"t": 1}) as cluster:
        c = await client_for(cluster, 1)
        await c.request(M.ApiVersionsRequest(client_software_name="raw", client_software_version="1"), 3)
        mark = cluster.log.mark()
        await c.request(metadata_request(12, ["t"]), 12)
        await c.request(metadata_request(4, None), 4)
        log = cluster.requests()
        assert [(e.node_id, e.api_key, e.api_version) for e in log] == [
            (1, ApiKey.API_VERSIONS, 3), (1, ApiKey.METADATA, 12), (1, ApiKey.METADATA, 4)]
        assert [e.frame_size for e in log] == c.sent_sizes
        assert [e.size + 4 for e in log] == c.sent_sizes
        assert log[0].client_id == "raw-test" and log[0].request.client_software_name == "raw"
        assert log[1].request.topics[0].name == "t"
        assert log[2].request.topics is None
        assert [e.correlation_id for e in log] == [1, 2, 3]
        assert len({e.connection_id for e in log}) == 1
        assert cluster.requests(since=mark) == log[1:]
        assert cluster.requests(ApiKey.METADATA, node_id=0) == []
        assert log[1].response.topics[0].name == "t"
        assert "Metadata v12" in repr(log[1])
        await c.close()


async def test_wait_for_requests_times_out() -> None:
    async with TestCluster() as cluster:
        with pytest.raises(TimeoutError):
            await cluster.wait_for_requests(ApiKey.METADATA, timeout=0.05)


# -- extension points -----------------------------------------------------------------------------------------------
async def test_custom_handler_and_handler_crash() -> None:
    registry = default_registry().copy()

    async def heartbeat(ctx: RequestContext, req: Any) -> Any:
        if req.group_id == "boom":
            raise RuntimeError("handler bug")
        return M.HeartbeatResponse(error_code=EC.REBALANCE_IN_PROGRESS)

    registry.register(ApiKey.HEARTBEAT, heartbeat, versions=(0, 3))
    cluster = TestCluster(registry=registry)
    with pytest.raises(BrokerHandlerError):
        async with cluster:
            c = await client_for(cluster)
            got = {k.api_key: (k.min_version, k.max_version)
                   for k in (await c.request(M.ApiVersionsRequest(), 0)).api_keys}
            assert got[ApiKey.HEARTBEAT] == (0, 3)
            hb = M.HeartbeatRequest(group_id="g", generation_id=1, member_id="m")
            assert (await c.request(hb, 3)).error_code == EC.REBALANCE_IN_PROGRESS
            c.send(M.HeartbeatRequest(group_id="boom", generation_id=1, member_id="m"), 3)
            await c.assert_closed()
    assert isinstance(cluster.errors[0], RuntimeError)


def test_registry_rejects_bad_ranges() -> None:
    reg = HandlerRegistry()

    async def h(ctx: RequestContext, req: Any) -> Any:
        return None

    with pytest.raises(ValueError):
        reg.register(ApiKey.METADATA, h, versions=(0, 12))  # codec starts at v1
    with pytest.raises(ValueError):
        reg.register(999, h)


async def test_cluster_construction_errors() -> None:
    with pytest.raises(ValueError):
        TestCluster(0)
    with pytest.raises(ValueError):
        TestCluster(2, node_ids=[1, 1])
    with pytest.raises(ValueError):
        TestCluster(sasl_mechanisms=["GSSAPI"])
    cluster = TestCluster(3, node_ids=[10, 20, 30], topics={"x": 3})
    assert cluster.leaders("x") == {0: 10, 1: 20, 2: 30}
    with pytest.raises(ValueError):
        cluster.create_topic("x", 1)
    async with cluster:
        assert cluster.bootstrap_servers == ",".join(f"127.0.0.1:{cluster.broker(n).port}" for n in (10, 20, 30))
        assert all(b.running for b in cluster.brokers.values())
    assert not any(b.running for b in cluster.brokers.values())


# -- server-side SCRAM against RFC 7677, and third-party clients ----------------------------------------------------
def test_scram_server_rfc7677_vector() -> None:
    import base64

    from tests.fakes.broker.sasl_server import CredentialStore, ScramServer

    store = CredentialStore()
    store.add_user("user", "pencil", iterations=4096, salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = ScramServer(store, "SCRAM-SHA-256", nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = server.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.username == "user"


@pytest.mark.parametrize("mechanism", ALL_MECHS)
async def test_third_party_clients_authenticate_and_read_metadata(mechanism: str) -> None:
    """librdkafka and kafka-python, independent implementations, accept the broker's SASL and Metadata."""
    ck = pytest.importorskip("confluent_kafka.admin")
    kafka = pytest.importorskip("kafka")
    async with TestCluster(3, topics={"t": 3}, sasl_mechanisms=ALL_MECHS, users=USERS) as cluster:
        servers = cluster.bootstrap_servers

        def with_librdkafka() -> dict[int, int]:
            admin = ck.AdminClient({"bootstrap.servers": servers, "security.protocol": "SASL_PLAINTEXT",
                                    "sasl.mechanism": mechanism, "sasl.username": "alice",
                                    "sasl.password": USERS["alice"]})
            md = admin.list_topics(timeout=10)
            return {p.id: p.leader for p in md.topics["t"].partitions.values()}

        def with_kafka_python() -> set[int] | None:
            consumer = kafka.KafkaConsumer(bootstrap_servers=servers, security_protocol="SASL_PLAINTEXT",
                                           sasl_mechanism=mechanism, sasl_plain_username="alice",
                                           sasl_plain_password=USERS["alice"], request_timeout_ms=10000)
            try:
                return consumer.partitions_for_topic("t")
            finally:
                consumer.close()

        assert await asyncio.to_thread(with_librdkafka) == {0: 0, 1: 1, 2: 2}
        assert await asyncio.to_thread(with_kafka_python) == {0, 1, 2}
        assert {e.api_key for e in cluster.requests()} >= {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE,
                                                           ApiKey.SASL_AUTHENTICATE, ApiKey.METADATA}
