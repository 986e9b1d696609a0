"""Tenants file loading and validation, authentication (API keys, JWT), patterns, quotas, secret hygiene."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import shutil
import ssl
import textwrap
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from service.client.connection import ConnectionConfig
from service.tenants import (
    Quotas,
    Tenant,
    TenantConfigError,
    TenantError,
    TenantRegistry,
    hash_api_key,
)
from service.tenants.auth import JWT_REFUSED, JwtRefused

REPO = Path(__file__).resolve().parents[3]
DEFAULT_BOOTSTRAP = "gateway-kafka:9092"
DEFAULT_CONN = ConnectionConfig(client_id="gw", request_timeout=12.0)

KEY_A = "key-a-0123456789abcdef"
KEY_A2 = "key-a2-0123456789abcdef"
KEY_B = "key-b-0123456789abcdef"
HS_SECRET = "hs-secret-" + "s" * 40  # ≥ 32 bytes
OTHER_HS_SECRET = "other-secret-" + "o" * 40
SASL_PASSWORD = "kafka-pw-Zq9"
FILE_PASSWORD = "file-pw-Yx8"
ISS = "https://idp.example.com/"
H1, H2, H_AB = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "ab" * 32
AUD = "kafka-consumer-gateway"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def other_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def write(tmp_path: Path, text: str, name: str = "tenants.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(path: Path, clock: Any = time.monotonic) -> TenantRegistry:
    return TenantRegistry.from_file(path, default_bootstrap=DEFAULT_BOOTSTRAP, default_connection=DEFAULT_CONN,
                                    clock=clock)


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(TenantConfigError) as info:
        load(write(tmp_path, text))
    return str(info.value)


def token(key: Any, alg: str = "HS256", **claims: Any) -> str:
    payload: dict[str, Any] = {"iss": ISS, "aud": AUD, "exp": int(time.time()) + 300, "tenant": "a"}
    payload.update(claims)
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, key, algorithm=alg)


@pytest.fixture
def full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rsa_key: rsa.RSAPrivateKey) -> TenantRegistry:
    """Tenants a (API keys, global RS256 issuer), b (own HS256 issuer with claim 'org', own cluster),
    c (no credentials of its own; global issuer)."""
    monkeypatch.setenv("HS_SECRET", HS_SECRET)
    monkeypatch.setenv("KAFKA_PW", SASL_PASSWORD)
    (tmp_path / "idp.pem").write_text(public_pem(rsa_key))
    (tmp_path / "pw.txt").write_text(FILE_PASSWORD + "\n")
    return load(write(tmp_path, f"""
        jwt:
          issuers:
            - issuer: {ISS}
              audience: {AUD}
              algorithms: [RS256]
              public_key_file: idp.pem
        tenants:
          - id: a
            api_keys:
              - {hash_api_key(KEY_A)}
              - hash: {hash_api_key(KEY_A2).upper().replace("SHA256", "sha256")}
                name: second
            topics: ["a.*", "shared"]
            groups: ["a-*"]
          - id: b
            api_keys: [{hash_api_key(KEY_B)}]
            jwt:
              issuers:
                - issuer: {ISS}
                  audience: [other, {AUD}]
                  algorithms: [HS256]
                  secret_env: HS_SECRET
                  tenant_claim: org
            kafka:
              bootstrap: kafka-b:9093
              sasl: {{mechanism: SCRAM-SHA-256, username: bob, password_env: KAFKA_PW}}
            topics: ["re:b\\\\.(x|y)\\\\.v[0-9]+"]
          - id: c
            kafka:
              client_id: gw-c
            topics: []
            quotas: {{requests_per_second: 2, burst: 3}}
    """))


# -- loading -------------------------------------------------------------------------------------------------
def test_loaded_tenants(full: TenantRegistry) -> None:
    assert full.auth_required
    assert set(full.tenants) == {"a", "b", "c"}
    a, b, c = full.get("a"), full.get("b"), full.get("c")
    assert a.bootstrap == DEFAULT_BOOTSTRAP and a.connection_config is DEFAULT_CONN
    assert b.bootstrap == "kafka-b:9093"
    assert b.connection_config.sasl is not None
    assert b.connection_config.sasl.mechanism == "SCRAM-SHA-256"
    assert b.connection_config.sasl.username == "bob"
    assert b.connection_config.sasl.password == SASL_PASSWORD
    assert b.connection_config.ssl_context is None  # inferred SASL_PLAINTEXT
    assert b.connection_config.request_timeout == 12.0 and b.connection_config.client_id == "gw"
    # Only client_id given: the gateway's security settings are kept.
    assert c.connection_config.client_id == "gw-c" and c.bootstrap == DEFAULT_BOOTSTRAP
    assert c.quotas == Quotas(requests_per_second=2, burst=3)
    assert a.quotas == Quotas()
    with pytest.raises(KeyError):
        full.get("nope")
    assert "a" in full and "nope" not in full


def test_example_file_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rsa_key: rsa.RSAPrivateKey) -> None:
    trustme = pytest.importorskip("trustme")
    shutil.copy(REPO / "examples" / "tenants.yaml", tmp_path / "tenants.yaml")
    for d in ("jwt", "tls", "secrets"):
        (tmp_path / d).mkdir()
    (tmp_path / "jwt" / "idp-public.pem").write_text(public_pem(rsa_key))
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "tls" / "ca.pem"))
    (tmp_path / "secrets" / "team-b-kafka-password").write_text("pw-b\n")
    monkeypatch.setenv("TEAM_A_KAFKA_PASSWORD", "pw-a")
    monkeypatch.setenv("TEAM_B_JWT_SECRET", "x" * 32)
    reg = load(tmp_path / "tenants.yaml")
    a, b = reg.get("team-a"), reg.get("team-b")
    assert reg.authenticate({"X-API-Key": "example-key-team-a-ci"}) is a
    assert reg.authenticate({"Authorization": "Bearer example-key-team-a-dashboard"}) is a
    assert reg.authenticate({"X-API-Key": "example-key-team-b"}) is b
    assert a.quotas == Quotas(max_instances=10, max_concurrent_polls=20, requests_per_second=20, burst=200)
    assert b.quotas == Quotas(max_instances=None, max_concurrent_polls=20, requests_per_second=100, burst=200)
    assert isinstance(a.connection_config.ssl_context, ssl.SSLContext)
    assert a.connection_config.sasl is not None and a.connection_config.sasl.password == "pw-a"
    assert b.connection_config.sasl is not None and b.connection_config.sasl.password == "pw-b"
    assert b.connection_config.client_id == "gateway-team-b"
    assert b.allows_topic("team-b.orders.v2") and not b.allows_topic("team-b.orders.v2x")
    assert a.allows_topic("team-a.x") and a.allows_topic("shared.events") and not a.allows_topic("team-b.x")


def test_tls_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    reg = load(write(tmp_path, """
        tenants:
          - id: t
            api_keys: [H1]
            kafka:
              bootstrap: "SSL://k1:9093, k2:9093"
              tls: {cafile: ca.pem, check_hostname: false, server_hostname: kafka.internal}
    """.replace("H1", H1)))
    cfg = reg.get("t").connection_config
    assert isinstance(cfg.ssl_context, ssl.SSLContext)
    assert cfg.ssl_context.check_hostname is False
    assert cfg.ssl_server_hostname == "kafka.internal"
    assert cfg.sasl is None


def test_tls_missing_cafile(tmp_path: Path) -> None:
    msg = load_error(tmp_path, """
        tenants:
          - id: t
            kafka: {security_protocol: SSL, tls: {cafile: missing-ca.pem}}
    """)
    assert "tenant 't'" in msg and "TLS" in msg


@pytest.mark.parametrize(("text", "expected"), [
    ("tenants: []\n", "tenants: List should have at least 1 item"),
    ("tenants:\n  - id: a\nextra: 1\n", "extra: unknown field"),
    ("tenants:\n  - id: a\n  - id: b\n    topcs: [x]\n", "tenants[1] (id 'b').topcs: unknown field"),
    ("tenants:\n  - id: a\n    kafka: {sasl: {mechanism: PLAIN, username: u, pasword_env: X}}\n",
     "tenants[0] (id 'a').kafka.sasl.pasword_env: unknown field"),
    ("tenants:\n  - id: a\n    kafka: {sasl: {mechanism: PLAIN, username: u}}\n",
     "one of password_env, password_file is required"),
    ("tenants:\n  - id: a\n    kafka: {sasl: {mechanism: GSSAPI, username: u, password_env: X}}\n",
     "tenants[0] (id 'a').kafka.sasl.mechanism"),
    ("tenants:\n  - id: a\n"
     "    kafka: {security_protocol: SSL, sasl: {mechanism: PLAIN, username: u, password_env: X}}\n",
     "needs security_protocol SASL_PLAINTEXT or SASL_SSL"),
    ("tenants:\n  - id: a\n    kafka: {security_protocol: SASL_SSL}\n", "needs a sasl section"),
    ("tenants:\n  - id: a\n    kafka: {security_protocol: PLAINTEXT, tls: {}}\n", "a tls section needs"),
    ("tenants:\n  - id: a\n    kafka: {bootstrap: nohostport}\n", "is not host:port"),
    ("tenants:\n  - id: a\n    api_keys: [md5:abc]\n", "tenants[0] (id 'a').api_keys[0].hash"),
    ("tenants:\n  - id: 'a b'\n", "tenants[0] (id 'a b').id: String should match pattern"),
    ("tenants:\n  - id: a\n    topics: ['re:(unclosed']\n", "is not a valid regular expression"),
    ("tenants:\n  - id: a\n    quotas: {requests_per_second: 0}\n", "quotas.requests_per_second"),
    ("tenants:\n  - id: a\n    quotas: {max_instances: -1}\n", "quotas.max_instances"),
    ("tenants:\n  - id: a\n  - id: a\n", "duplicate tenant id 'a'"),
    (f"tenants:\n  - id: a\n    api_keys: [{H_AB}]\n  - id: b\n    api_keys: [{H_AB.upper().replace('SHA', 'sha')}]\n",
     "the same API key hash is listed for tenants 'a' and 'b'"),
    (f"tenants:\n  - id: a\n    api_keys: [{H_AB}, {H_AB}]\n",
     "listed twice for tenant 'a'"),
    ("tenants:\n  - id: a\n    id: b\n", "duplicate key 'id'"),
    ("tenants: [\n", "is not valid YAML at line"),
    ("- just a list\n", "must be a YAML mapping"),
    ("version: 2\ntenants:\n  - id: a\n", "version"),
    ("jwt:\n  issuers:\n    - {issuer: i, audience: a, algorithms: [HS256, RS256], secret_env: S}\n"
     "tenants:\n  - id: a\n",
     "do not mix HMAC"),
    ("jwt:\n  issuers:\n    - {issuer: i, audience: a, algorithms: [HS256], public_key: x}\ntenants:\n  - id: a\n",
     "one of secret_env, secret_file is required"),
    ("jwt:\n  issuers:\n    - {issuer: i, audience: a, algorithms: [RS256], secret_env: S, public_key: x}\n"
     "tenants:\n  - id: a\n", "not a secret"),
    ("jwt:\n  issuers:\n    - {issuer: i, audience: [], algorithms: [RS256], public_key: x}\ntenants:\n  - id: a\n",
     "audience must be"),
    ("jwt:\n  issuers:\n    - {issuer: i, audience: a, algorithms: [none], public_key: x}\ntenants:\n  - id: a\n",
     "jwt.issuers[0].algorithms[0]"),
    ("jwt:\n  leeway_seconds: 3600\ntenants:\n  - id: a\n", "jwt.leeway_seconds"),
])
def test_validation_errors(tmp_path: Path, text: str, expected: str) -> None:
    msg = load_error(tmp_path, text)
    assert expected in msg
    assert str(tmp_path / "tenants.yaml") in msg


def test_inline_secret_is_refused_without_echoing_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    msg = load_error(tmp_path, """
        tenants:
          - id: a
            kafka: {sasl: {mechanism: PLAIN, username: u, password: hunter2-inline}}
    """)
    assert "kafka.sasl.password: unknown field" in msg
    assert "hunter2-inline" not in msg and "hunter2-inline" not in caplog.text


def test_missing_file_and_secret_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TenantConfigError, match="cannot read tenants file"):
        load(tmp_path / "absent.yaml")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    msg = load_error(tmp_path, """
        tenants:
          - id: a
            kafka: {sasl: {mechanism: PLAIN, username: u, password_env: NOT_SET_ANYWHERE}}
    """)
    assert "tenant 'a'" in msg and "NOT_SET_ANYWHERE is not set" in msg
    msg = load_error(tmp_path, """
        tenants:
          - id: a
            kafka: {sasl: {mechanism: PLAIN, username: u, password_file: nope.txt}}
    """)
    assert "cannot read secret file" in msg and str(tmp_path / "nope.txt") in msg
    (tmp_path / "empty.txt").write_text("\n")
    msg = load_error(tmp_path, """
        tenants:
          - id: a
            kafka: {sasl: {mechanism: PLAIN, username: u, password_file: empty.txt}}
    """)
    assert "is empty" in msg


def test_password_file_and_key_file_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pw").write_text(FILE_PASSWORD + "\r\n")
    reg = load(write(tmp_path, """
        tenants:
          - id: a
            api_keys: [H1]
            kafka: {sasl: {mechanism: PLAIN, username: u, password_file: pw}}
    """.replace("H1", H1)))
    sasl = reg.get("a").connection_config.sasl
    assert sasl is not None and sasl.password == FILE_PASSWORD
    monkeypatch.setenv("SHORT", "too-short")
    msg = load_error(tmp_path, """
        jwt:
          issuers: [{issuer: i, audience: a, algorithms: [HS256], secret_env: SHORT}]
        tenants: [{id: a}]
    """)
    assert "shorter than 32 bytes" in msg and "too-short" not in msg
    msg = load_error(tmp_path, """
        jwt:
          issuers: [{issuer: i, audience: a, algorithms: [RS256], public_key: not-a-pem}]
        tenants: [{id: a}]
    """)
    assert "not a PEM public key" in msg
    ec_pem = public_pem(ec.generate_private_key(ec.SECP256R1()))
    (tmp_path / "ec.pem").write_text(ec_pem)
    msg = load_error(tmp_path, """
        jwt:
          issuers: [{issuer: i, audience: a, algorithms: [RS256], public_key_file: ec.pem}]
        tenants: [{id: a}]
    """)
    assert "does not fit RS256" in msg


def test_tenant_without_credentials_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    load(write(tmp_path, "tenants: [{id: lonely}]\n"))
    assert any("'lonely' has no API keys" in r.getMessage() for r in caplog.records)


# -- API keys ------------------------------------------------------------------------------------------------
def test_api_key_bearer_and_header(full: TenantRegistry) -> None:
    a, b = full.get("a"), full.get("b")
    assert full.authenticate({"Authorization": f"Bearer {KEY_A}"}) is a
    assert full.authenticate({"authorization": f"bearer   {KEY_A2}  "}) is a
    assert full.authenticate({"X-API-Key": KEY_B}) is b
    assert full.authenticate({"x-api-key": KEY_A}) is a
    # Another scheme (say a proxy's Basic auth) beside X-API-Key: the API key decides.
    assert full.authenticate({"Authorization": "Basic dXNlcjpwdw==", "X-API-Key": KEY_B}) is b


@pytest.mark.parametrize(("headers", "fragment"), [
    ({}, "authentication required"),
    ({"Authorization": "Bearer wrong-key-123"}, "invalid API key"),
    ({"X-API-Key": "wrong-key-123"}, "invalid API key"),
    ({"X-API-Key": f"{KEY_A}x"}, "invalid API key"),
    ({"X-API-Key": ""}, "the API key is empty"),
    ({"Authorization": "Bearer "}, "the bearer token is empty"),
    ({"Authorization": "Basic wrong-key-123"}, "unsupported Authorization scheme"),
    ({"Authorization": f"Bearer {KEY_A}", "X-API-Key": KEY_A}, "not both"),
    ({"Authorization": "Bearer wrong.key.123"}, "invalid JWT"),
])
def test_api_key_failures(full: TenantRegistry, headers: dict[str, str], fragment: str) -> None:
    with pytest.raises(TenantError) as info:
        full.authenticate(headers)
    err = info.value
    assert (err.status, err.error_code) == (401, 40101)
    assert fragment in err.message
    assert "wrong" not in err.message and KEY_A not in err.message and "dXNl" not in err.message
    assert err.headers["WWW-Authenticate"].startswith("Bearer")


def test_api_key_comparison_is_over_hashes(full: TenantRegistry) -> None:
    # The stored hash itself is not a key.
    with pytest.raises(TenantError):
        full.authenticate({"X-API-Key": hash_api_key(KEY_A)})
    assert hash_api_key(KEY_A) == "sha256:" + hashlib.sha256(KEY_A.encode()).hexdigest()


# -- JWT ---------------------------------------------------------------------------------------------------
def test_jwt_rs256_and_hs256(full: TenantRegistry, rsa_key: rsa.RSAPrivateKey) -> None:
    assert full.authenticate({"Authorization": f"Bearer {token(rsa_key, 'RS256')}"}) is full.get("a")
    assert full.authenticate({"Authorization": f"Bearer {token(rsa_key, 'RS256', tenant='c')}"}) is full.get("c")
    hs = token(HS_SECRET, org="b", tenant=None)
    assert full.authenticate({"Authorization": f"Bearer {hs}"}) is full.get("b")
    # Audience given as a list on the token: one match is enough.
    hs2 = token(HS_SECRET, org="b", tenant=None, aud=["x", "other"])
    assert full.authenticate({"Authorization": f"Bearer {hs2}"}) is full.get("b")


def _jwt_failure(reg: TenantRegistry, tok: str) -> str:
    with pytest.raises(TenantError) as info:
        reg.authenticate({"Authorization": f"Bearer {tok}"})
    assert (info.value.status, info.value.error_code) == (401, 40101)
    assert tok not in info.value.message and tok.split(".")[2] not in info.value.message
    # one answer for every refused JWT (no probing which issuers and tenants exist); the reason is only logged
    assert info.value.message == JWT_REFUSED and isinstance(info.value, JwtRefused)
    return info.value.reason


def test_jwt_failures(full: TenantRegistry, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey) -> None:
    now = int(time.time())
    cases = {
        "issuer is not trusted": token(rsa_key, "RS256", iss="https://evil.example.com/"),
        "has no 'iss' claim": token(rsa_key, "RS256", iss=None),
        "audience is not accepted": token(rsa_key, "RS256", aud="someone-else"),
        "has expired": token(rsa_key, "RS256", exp=now - 60),
        "signature is invalid": token(other_rsa_key, "RS256"),
        "missing a required claim": token(rsa_key, "RS256", exp=None),
        "not valid yet": token(rsa_key, "RS256", nbf=now + 600),
        # Tenant claim: unknown tenant, missing, not a string.
        "'tenant' does not name a tenant": token(rsa_key, "RS256", tenant="zzz"),
        "does not name a tenant that accepts": token(rsa_key, "RS256", tenant=None),
        "does not name a tenant that accepts this issuer": token(rsa_key, "RS256", tenant=["a"]),
    }
    for fragment, tok in cases.items():
        assert fragment in _jwt_failure(full, tok), fragment
    # HS256 for tenant b: wrong secret, wrong algorithm for b's issuer entry.
    assert "signature is invalid" in _jwt_failure(full, token(OTHER_HS_SECRET, org="b", tenant=None))
    assert "algorithm is not accepted" in _jwt_failure(full, token(HS_SECRET * 2, "HS512", org="b", tenant=None))
    # b does not accept the global RS256 issuer: a valid global token naming b fails.
    assert "does not name a tenant that accepts" in _jwt_failure(full, token(rsa_key, "RS256", tenant="b"))
    # a does not accept b's HS256 issuer.
    assert "does not name a tenant that accepts" in _jwt_failure(full, token(HS_SECRET, org="a", tenant=None))
    # Algorithm confusion: the RS256 public key used as an HMAC secret.
    signing_input = b".".join(
        base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=")
        for part in ({"alg": "HS256", "typ": "JWT"}, {"iss": ISS, "aud": AUD, "exp": now + 300, "tenant": "a"})
    )
    mac = hmac.new(public_pem(rsa_key).encode(), signing_input, hashlib.sha256).digest()
    confused = (signing_input + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()
    assert "algorithm is not accepted" in _jwt_failure(full, confused)
    # alg=none: the empty signature part makes it look like an API key, which is refused.
    unsigned = jwt.encode({"iss": ISS, "aud": AUD, "exp": now + 300, "tenant": "a"}, None, algorithm="none")
    with pytest.raises(TenantError, match="invalid API key"):
        full.authenticate({"Authorization": f"Bearer {unsigned}"})
    # Garbage between the dots.
    assert "malformed JWT" in _jwt_failure(full, "eyJhbGciOi.eyJpc3Mi.c2ln")


def test_jwt_leeway_and_key_rotation(tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
                                     other_rsa_key: rsa.RSAPrivateKey) -> None:
    pem1 = json.dumps(public_pem(rsa_key))  # a JSON string is a YAML double-quoted scalar
    (tmp_path / "old.pem").write_text(public_pem(other_rsa_key))
    reg = load(write(tmp_path, f"""
        jwt:
          leeway_seconds: 30
          tenant_claim: tid
          issuers:
            - issuer: {ISS}
              audience: {AUD}
              algorithms: [RS256, PS256]
              public_key: {pem1}
            - issuer: {ISS}
              audience: {AUD}
              algorithms: [RS256]
              public_key_file: old.pem
        tenants: [{{id: t}}]
    """))
    t = reg.get("t")
    now = int(time.time())
    assert reg.authenticate({"Authorization": f"Bearer {token(rsa_key, 'RS256', tenant=None, tid='t')}"}) is t
    assert reg.authenticate({"Authorization": f"Bearer {token(rsa_key, 'PS256', tenant=None, tid='t')}"}) is t
    assert reg.authenticate({"Authorization": f"Bearer {token(other_rsa_key, 'RS256', tenant=None, tid='t')}"}) is t
    # Expired 10 s ago: inside the 30 s leeway.
    assert reg.authenticate(
        {"Authorization": f"Bearer {token(rsa_key, 'RS256', tenant=None, tid='t', exp=now - 10)}"}) is t
    # Expired 120 s ago, verified by the second key: "expired" wins over the first key's signature failure.
    old = token(other_rsa_key, "RS256", tenant=None, tid="t", exp=now - 120)
    assert "has expired" in _jwt_failure(reg, old)
    # PS256 is accepted by the first entry only; signed with the second key it fails.
    assert "signature is invalid" in _jwt_failure(reg, token(other_rsa_key, "PS256", tenant=None, tid="t"))


# -- patterns ----------------------------------------------------------------------------------------------
def test_topic_and_group_patterns(full: TenantRegistry) -> None:
    a, b, c = full.get("a"), full.get("b"), full.get("c")
    assert a.allows_topic("a.orders") and a.allows_topic("a.x.y") and a.allows_topic("shared")
    assert not a.allows_topic("A.orders") and not a.allows_topic("b.orders") and not a.allows_topic("shared2")
    assert a.allows_group("a-workers") and not a.allows_group("b-workers")
    assert b.allows_topic("b.x.v1") and b.allows_topic("b.y.v22")
    assert not b.allows_topic("b.z.v1") and not b.allows_topic("b.x.v1.extra") and not b.allows_topic("bxx.v1")
    assert b.allows_group("anything")  # groups not configured: all allowed
    assert not c.allows_topic("anything")  # topics: [] allows none
    assert a.topic_patterns == ("a.*", "shared") and b.group_patterns is None
    a.require_topic("a.t")
    with pytest.raises(TenantError) as info:
        a.require_topic("b.t")
    assert (info.value.status, info.value.error_code) == (403, 40301)
    with pytest.raises(TenantError) as info:
        a.require_group("b-g")
    assert (info.value.status, info.value.error_code) == (403, 40301)


# -- quotas ----------------------------------------------------------------------------------------------
def test_token_bucket_with_fake_clock() -> None:
    clock = FakeClock()
    t = Tenant("t", "k:9092", ConnectionConfig(), Quotas(requests_per_second=2, burst=3), clock=clock)
    for _ in range(3):
        t.check_rate()
    with pytest.raises(TenantError) as info:
        t.check_rate()
    err = info.value
    assert (err.status, err.error_code, err.retry_after) == (429, 42901, 1)
    assert err.headers == {"Retry-After": "1"}
    clock.now += 0.25  # half a token
    with pytest.raises(TenantError):
        t.check_rate()
    clock.now += 0.25  # a whole token now
    t.check_rate()
    with pytest.raises(TenantError):
        t.check_rate()
    clock.now += 100  # refills to the burst size, not beyond
    for _ in range(3):
        t.check_rate()
    with pytest.raises(TenantError):
        t.check_rate()


def test_token_bucket_defaults_and_slow_rates() -> None:
    clock = FakeClock()
    slow = Tenant("s", "k:9092", ConnectionConfig(), Quotas(requests_per_second=0.2), clock=clock)
    slow.check_rate()  # burst defaults to ceil(rps) = 1
    with pytest.raises(TenantError) as info:
        slow.check_rate()
    assert info.value.retry_after == 5
    fast = Tenant("f", "k:9092", ConnectionConfig(), Quotas(requests_per_second=2.5), clock=clock)
    for _ in range(3):
        fast.check_rate()
    with pytest.raises(TenantError):
        fast.check_rate()
    unlimited = Tenant("u", "k:9092", ConnectionConfig(), clock=clock)
    for _ in range(1000):
        unlimited.check_rate()


def test_tenants_have_separate_buckets(full: TenantRegistry) -> None:
    c, a = full.get("c"), full.get("a")
    for _ in range(3):
        c.check_rate()
    with pytest.raises(TenantError):
        c.check_rate()
    a.check_rate()  # a has no limit and its own state


async def test_concurrent_poll_limit() -> None:
    t = Tenant("t", "k:9092", ConnectionConfig(), Quotas(max_concurrent_polls=2))
    both_inside = asyncio.Event()
    release = asyncio.Event()

    async def poll() -> None:
        async with t.poll_slot():
            if t.active_polls == 2:
                both_inside.set()
            await release.wait()

    tasks = [asyncio.create_task(poll()) for _ in range(2)]
    await asyncio.wait_for(both_inside.wait(), 5)
    with pytest.raises(TenantError) as info:
        async with t.poll_slot():
            pass
    assert (info.value.status, info.value.error_code, info.value.retry_after) == (429, 42901, 1)
    assert t.active_polls == 2
    release.set()
    await asyncio.gather(*tasks)
    assert t.active_polls == 0
    # An exception inside the slot releases it.
    with pytest.raises(RuntimeError):
        async with t.poll_slot():
            raise RuntimeError("boom")
    assert t.active_polls == 0
    async with t.poll_slot(), t.poll_slot():
        assert t.active_polls == 2


async def test_unlimited_polls() -> None:
    t = Tenant("t", "k:9092", ConnectionConfig())
    async with t.poll_slot(), t.poll_slot(), t.poll_slot():
        assert t.active_polls == 3


def test_instance_quota() -> None:
    t = Tenant("t", "k:9092", ConnectionConfig(), Quotas(max_instances=2))
    t.check_instance_quota(0)
    t.check_instance_quota(1)
    with pytest.raises(TenantError) as info:
        t.check_instance_quota(2)
    assert (info.value.status, info.value.error_code) == (429, 42901)
    Tenant("u", "k:9092", ConnectionConfig()).check_instance_quota(10**6)


def test_defaults_quotas_merge(tmp_path: Path) -> None:
    reg = load(write(tmp_path, """
        defaults:
          quotas: {max_instances: 5, max_concurrent_polls: 3, requests_per_second: 10}
        tenants:
          - {id: a, api_keys: [H1]}
          - {id: b, api_keys: [H2], quotas: {max_instances: null, burst: 50}}
    """.replace("H1", H1).replace("H2", H2)))
    assert reg.get("a").quotas == Quotas(5, 3, 10, None)
    assert reg.get("b").quotas == Quotas(None, 3, 10, 50)


# -- secrets ------------------------------------------------------------------------------------------------
def test_no_secret_in_repr_errors_or_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          rsa_key: rsa.RSAPrivateKey, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("HS_SECRET", HS_SECRET)
    monkeypatch.setenv("KAFKA_PW", SASL_PASSWORD)
    (tmp_path / "pw.txt").write_text(FILE_PASSWORD)
    reg = load(write(tmp_path, f"""
        jwt:
          issuers: [{{issuer: {ISS}, audience: {AUD}, algorithms: [HS256], secret_env: HS_SECRET}}]
        tenants:
          - id: a
            api_keys: [{hash_api_key(KEY_A)}]
            kafka: {{sasl: {{mechanism: PLAIN, username: alice, password_env: KAFKA_PW}}}}
          - id: b
            kafka:
              security_protocol: SASL_SSL
              sasl: {{mechanism: SCRAM-SHA-512, username: bob, password_file: pw.txt}}
    """))
    good = token(HS_SECRET)
    assert reg.authenticate({"Authorization": f"Bearer {good}"}) is reg.get("a")
    errors: list[TenantError] = []
    for headers in ({"X-API-Key": KEY_A + "!"}, {"Authorization": f"Bearer {good[:-4]}AAAA"},
                    {"Authorization": f"Bearer {token(OTHER_HS_SECRET)}"}):
        with pytest.raises(TenantError) as info:
            reg.authenticate(headers)
        errors.append(info.value)
    texts = [repr(reg), str(reg)]
    for t in reg.tenants.values():
        texts += [repr(t), str(t), repr(t.connection_config), str(t.connection_config)]
    for e in errors:
        texts += [repr(e), str(e), e.message, str(e.headers)]
    texts += [r.getMessage() for r in caplog.records]
    texts += [repr(issuer) for issuers in reg._jwt_by_issuer.values() for issuer in issuers]
    blob = "\n".join(texts)
    for secret in (HS_SECRET, SASL_PASSWORD, FILE_PASSWORD, KEY_A, good, OTHER_HS_SECRET):
        assert secret not in blob
    assert "alice" in blob  # the usernames do show: the check above is not vacuous
    assert any("loaded 2 tenant(s)" in r.getMessage() for r in caplog.records)


# -- no tenants file ------------------------------------------------------------------------------------------
def test_single_default(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="service.tenants")
    conn = ConnectionConfig(client_id="x")
    reg = TenantRegistry.single_default(bootstrap="embedded:1234", connection=conn)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "WITHOUT authentication" in warnings[0].getMessage()
    assert "embedded:1234" in warnings[0].getMessage()
    assert not reg.auth_required
    t = reg.get("default")
    assert list(reg.tenants) == ["default"]
    assert t.bootstrap == "embedded:1234" and t.connection_config is conn
    assert reg.authenticate({}) is t
    assert reg.authenticate({"X-API-Key": "whatever"}) is t
    assert t.allows_topic("x") and t.allows_group("y")
    t.check_rate()
    caplog.clear()
    reg.authenticate({})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_tenant_error_shape() -> None:
    err = TenantError(403, 40301, "nope")
    assert str(err) == "nope" and err.headers == {} and err.retry_after is None
    assert repr(err) == "TenantError(403, 40301, 'nope')"
