"""A refused JWT gets one generic 401 whatever failed, so an outsider cannot probe which
issuers and tenants exist (unknown issuer vs. unknown tenant vs. bad signature answered alike); the reason
is in the gateway's log only. A real gateway process with a tenants file, over real sockets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
ISS = "https://idp.example.com/"
AUD = "kafka-gateway"
SECRET = "jwt-test-secret-" + "x" * 40
TENANTS = f"""
version: 1
jwt:
  issuers:
    - issuer: {ISS}
      audience: {AUD}
      algorithms: [HS256]
      secret_env: JWT_TEST_SECRET
tenants:
  - id: secret-tenant
"""


def token(secret: str = SECRET, **claims: object) -> str:
    base: dict[str, object] = {"iss": ISS, "aud": AUD, "exp": int(time.time()) + 300, "tenant": "secret-tenant"}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, secret, algorithm="HS256")


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("jwt")
    (d / "tenants.yaml").write_text(TENANTS)
    g = GatewayProcess(tansu.bootstrap, log_file=d / "gw.log",
                       env={"GATEWAY_TENANTS_FILE": str(d / "tenants.yaml"), "JWT_TEST_SECRET": SECRET,
                            "GATEWAY_LOG_LEVEL": "info", "GATEWAY_AUTH_FAILURES_PER_MINUTE": "0"})
    g.start()
    try:
        yield g
    finally:
        g.stop()


def test_refused_jwts_are_indistinguishable(gw: GatewayProcess) -> None:
    probes = {
        "JWT issuer is not trusted": token(iss="https://unknown-idp.example.com/"),
        "does not name a tenant": token(tenant="no-such-tenant"),
        "signature is invalid": token(secret="another-secret-" + "y" * 40),
        "audience is not accepted": token(aud="other"),
        "has expired": token(exp=int(time.time()) - 3600),
        "has no 'iss' claim": token(iss=None),
        "malformed JWT": "eyJhbGciOi.eyJpc3Mi.c2ln",
    }
    answers = set()
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        for tok in probes.values():
            r = c.get("/topics", headers={"Authorization": f"Bearer {tok}"})
            assert r.status_code == 401, r.text
            answers.add((r.status_code, r.text, r.headers.get("www-authenticate")))
            # the rightful holder keeps being served between the probes
            assert c.get("/topics", headers={"Authorization": f"Bearer {token()}"}).status_code == 200
    assert len(answers) == 1, answers  # one answer for every reason
    body = orjson_loads(next(iter(answers))[1])
    assert body["error_code"] == 40101
    for word in ("issuer", "tenant", "signature", "audience", "expired", "secret-tenant", "idp"):
        assert word not in body["message"].lower(), body
    # the operator still learns why, from the log
    log = Path(gw.log_file or "").read_text()
    for reason in probes:
        assert reason in log, reason


def orjson_loads(text: str) -> dict[str, object]:
    import orjson

    doc = orjson.loads(text)
    assert isinstance(doc, dict)
    return doc
