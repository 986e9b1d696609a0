"""api/hosts.py: Host header parsing and the GATEWAY_ALLOWED_HOSTS matcher."""

from __future__ import annotations

import pytest

from api.hosts import AllowedHosts, default_allowed_hosts, parse_host


@pytest.mark.parametrize(("value", "parsed"), [
    ("localhost", ("localhost", None)), ("LocalHost:8080", ("localhost", 8080)), ("127.0.0.1:1", ("127.0.0.1", 1)),
    ("[::1]:80", ("[::1]", 80)), ("[0:0::1]", ("[::1]", None)), ("gw.example.com.", ("gw.example.com", None)),
])
def test_parse_host(value: str, parsed: tuple[str, int | None]) -> None:
    assert parse_host(value) == parsed


@pytest.mark.parametrize("value", ["", "a b", "a/b", "user@host", "host:99999", "host:", "[::1", "[zz::1]",
                                   "javascript:alert(1)", "a\nb", "-bad.example", "x" * 301, "h:1:2", "a..b"])
def test_parse_host_refuses(value: str) -> None:
    assert parse_host(value) is None


def test_allowed_hosts() -> None:
    a = AllowedHosts.from_setting("localhost, 127.0.0.1:8080,[::1],.corp.example,::2")
    assert a.allows("localhost:1234") and a.allows("LOCALHOST") and a.allows("127.0.0.1:8080")
    assert not a.allows("127.0.0.1:8081") and not a.allows("127.0.0.1")
    assert a.allows("[::1]:9") and a.allows("[::2]") and a.allows("corp.example") and a.allows("x.y.corp.example:1")
    assert not a.allows("evilcorp.example") and not a.allows("localhost.attacker.example") and not a.allows(None)
    assert AllowedHosts.from_setting("*").allows("anything")
    with pytest.raises(ValueError):
        AllowedHosts.from_setting("http://x")


def test_default_allowed_hosts() -> None:
    assert default_allowed_hosts("127.0.0.1") == "127.0.0.1,localhost,[::1]"
    assert default_allowed_hosts("0.0.0.0", ["http://10.0.0.5:8080", "https://gw.example.com/base"]) == \
        "localhost,127.0.0.1,[::1],10.0.0.5,gw.example.com"
    assert default_allowed_hosts("::") == "localhost,127.0.0.1,[::1]"


def test_remembered_verdicts_are_the_same_and_bounded() -> None:
    from api import hosts
    allowed = AllowedHosts.from_setting("gw.example.com,.corp.example,10.0.0.1:8082")
    values = ["gw.example.com", "GW.example.com.:1", "a.corp.example", "corp.example", "evil.example", "10.0.0.1:8082",
              "10.0.0.1:8083", "bad host", "[::1]"]
    first = [allowed.allows(v) for v in values]
    assert first == [True, True, True, True, False, True, False, False, False]
    assert [allowed.allows(v) for v in values] == first  # answered from memory the second time
    for i in range(hosts._SEEN_MAX + 10):
        assert not allowed.allows(f"h{i}.other.example")
    assert len(allowed._seen) <= hosts._SEEN_MAX
    assert [allowed.allows(v) for v in values] == first
