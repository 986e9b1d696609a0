"""Failed-authentication limit, trusted proxies, and SCRAM's PBKDF2 (iteration cap, off the event loop)."""

from __future__ import annotations

import threading

import pytest

from api.auth import AuthFailureLimiter, TrustedProxies
from service.client import sasl
from service.client.sasl import (
    MAX_SCRAM_ITERATIONS,
    SaslAuthenticationError,
    ScramMechanism,
    respond_off_loop,
)
from service.tenants import TenantError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failed_authentications_per_address_and_minute() -> None:
    clock = FakeClock()
    limiter = AuthFailureLimiter(3, clock=clock, max_addresses=2)
    for _ in range(3):
        limiter.check("10.0.0.1")
        limiter.failed("10.0.0.1")
    with pytest.raises(TenantError) as info:
        limiter.check("10.0.0.1")
    assert info.value.status == 429 and info.value.error_code == 42901
    assert info.value.headers["Retry-After"] == "60"
    limiter.check("10.0.0.2")  # another address is not affected
    clock.now += 30
    with pytest.raises(TenantError) as info:
        limiter.check("10.0.0.1")
    assert info.value.headers["Retry-After"] == "30"
    clock.now += 30.5
    limiter.check("10.0.0.1")  # the window slid past the failures
    limiter.failed("a")
    limiter.failed("b")
    limiter.failed("c")
    assert len(limiter._failures) <= 2  # bounded memory
    AuthFailureLimiter(0).check("x")  # 0: no limit


def test_trusted_proxies() -> None:
    t = TrustedProxies("127.0.0.1, 10.0.0.0/8,::1")
    assert t.trusts("127.0.0.1") and t.trusts("10.2.3.4") and t.trusts("::1")
    assert not t.trusts("127.0.0.2") and not t.trusts("testclient") and not t.trusts(None)
    assert TrustedProxies("*").trusts("203.0.113.9")
    with pytest.raises(ValueError, match="not an address"):
        TrustedProxies("proxy.example")


def _scram() -> ScramMechanism:
    mech = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="abc")
    mech.initial_response()
    return mech


def test_scram_iteration_count_is_capped() -> None:
    mech = _scram()
    with pytest.raises(SaslAuthenticationError, match=f"more than {MAX_SCRAM_ITERATIONS} are refused"):
        mech.respond(b"r=abcS,s=QSXCR+Q6sek8bf92,i=100000000")
    assert _scram().respond(b"r=abcS,s=QSXCR+Q6sek8bf92,i=4096") is not None


async def test_scram_pbkdf2_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    real = sasl.scram_keys

    def spy(*args: object) -> tuple[bytes, bytes, bytes]:
        threads.append(threading.current_thread())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(sasl, "scram_keys", spy)
    token = await respond_off_loop(_scram(), b"r=abcS,s=QSXCR+Q6sek8bf92,i=4096")
    assert token is not None and token.startswith(b"c=biws,r=abcS,p=")
    assert threads and threads[0] is not threading.main_thread()
