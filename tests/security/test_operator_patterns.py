"""The operator's ``re:`` patterns in the tenants file run on RE2. A catastrophic-backtracking
pattern (``re:(a+)+$``) against a long ``aaaa…b`` topic name is answered at once (a backtracking engine would hold
the event loop for ages, stalling every tenant), other tenants keep being served during the attack, and a construct
RE2 lacks is refused when the gateway starts, with a config error naming it."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
KEY_RX, KEY_OTHER = "operator-patterns-key-regex-1", "operator-patterns-key-other-2"
EVIL = "a" * 60 + "b"  # (a+)+$ takes ~2**60 steps on a backtracking engine to find that this does not match


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: rx
    api_keys: ["{sha(KEY_RX)}"]
    topics: ["re:(a+)+$", "re:ok-(x|y)-.*"]
    groups: ["re:(g+)+$", "rx-*"]
  - id: other
    api_keys: ["{sha(KEY_OTHER)}"]
    topics: ["op-*"]
"""


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("operator-patterns")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    with GatewayProcess(tansu.bootstrap, log_file=d / "gw.log", env={"GATEWAY_TENANTS_FILE": str(f)}) as g:
        yield g


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_catastrophic_operator_pattern_answers_at_once(gw: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
        async def attack() -> list[httpx.Response]:
            return [
                await http.get(f"/topics/{EVIL}", headers=auth(KEY_RX)),
                await http.get(f"/topics/{EVIL}/partitions/0/records", params={"offset": 0},
                               headers={**auth(KEY_RX), "Accept": BIN}),
                await http.post(f"/topics/{EVIL}", json={"records": [{"value": "eA=="}]},
                                headers={**auth(KEY_RX), "Content-Type": BIN}),
                await http.post(f"/consumers/{'g' * 60}x", json={}, headers={**auth(KEY_RX), "Content-Type": V2}),
            ]

        async def other_tenant() -> list[int]:
            out = []
            for _ in range(5):
                out.append((await http.get("/topics", headers=auth(KEY_OTHER))).status_code)
            return out

        started = time.monotonic()
        answers, others = await asyncio.gather(attack(), other_tenant())
        assert time.monotonic() - started < 3, "a backtracking match held the event loop"
        for r in answers:
            assert r.status_code == 403 and r.json()["error_code"] == 40301, r.text
        assert others == [200] * 5
        # the tenant's patterns still allow what they should
        r = await http.get(f"/topics/aaaa-{uuid.uuid4().hex[:4]}", headers=auth(KEY_RX))
        assert r.status_code == 403, r.text
        r = await http.get(f"/topics/ok-x-{uuid.uuid4().hex[:8]}", headers=auth(KEY_RX))
        assert r.status_code == 404 and r.json()["error_code"] == 40401, r.text  # allowed, and does not exist


@pytest.mark.parametrize(("pattern", "what"), [("re:(?=orders).*", "lookahead is not supported"),
                                               (r"re:(o)\1", "backreferences are not supported"),
                                               ("re:o++", "possessive quantifier is not supported")])
def test_constructs_re2_lacks_stop_the_gateway_at_startup(tansu: EmbeddedBroker, tmp_path: Path, pattern: str,
                                                          what: str) -> None:
    f = tmp_path / "tenants.yaml"
    f.write_text(f"tenants:\n  - id: bad\n    api_keys: ['{sha(KEY_RX)}']\n    topics: ['{pattern}']\n")
    log = tmp_path / "gw.log"
    g = GatewayProcess(tansu.bootstrap, log_file=log, env={"GATEWAY_TENANTS_FILE": str(f)})
    with pytest.raises(RuntimeError, match="did not start"):
        g.start()
    g.stop()
    text = log.read_text()
    assert what in text and "tenants[0] (id 'bad').topics" in text, text[-2000:]


def test_a_bad_denied_topics_setting_stops_the_gateway(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    log = tmp_path / "gw.log"
    g = GatewayProcess(tansu.bootstrap, log_file=log, env={"GATEWAY_DENIED_TOPICS": "audit-*,re:(?<=x)y"})
    with pytest.raises(RuntimeError, match="did not start"):
        g.start()
    g.stop()
    text = log.read_text()
    assert "GATEWAY_DENIED_TOPICS" in text and "lookbehind is not supported" in text, text[-2000:]
