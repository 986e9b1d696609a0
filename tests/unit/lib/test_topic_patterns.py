"""Operator patterns on RE2 (globs and ``re:``), the operator's deny-list of internal topics, Kafka's topic-name
rules (pure: no sockets)."""

from __future__ import annotations

import fnmatch
import time
from pathlib import Path

import pytest

from service.client.connection import ConnectionConfig
from service.cluster.topics import TopicNotFound, is_legal_topic_name, require_legal_topic_name
from service.tenants import (
    DEFAULT_DENIED_TOPICS,
    PatternError,
    Tenant,
    TenantConfigError,
    TenantError,
    TenantRegistry,
    TopicDenyList,
    compile_pattern,
)
from service.tenants.patterns import glob_to_re2

CONN = ConnectionConfig()
SLOW_NAME = "a" * 240 + "b"  # (a+)+$ needs ~2**240 steps on a backtracking engine to fail on this


def tenant(topics: list[str] | None = None, denied: TopicDenyList | None = None) -> Tenant:
    if denied is None:
        return Tenant("t", "k:9092", CONN, topics=topics)
    return Tenant("t", "k:9092", CONN, topics=topics, denied_topics=denied)


# -- globs and regexes ----------------------------------------------------------------------------------------
GLOBS = ["a.*", "shared", "*", "a?c", "[ab]x", "[!ab]x", "[a-c]*", "x[", "x[]", "x[]]", "[!]]", "a+b", "(a)",
         "a$", "^a", "a|b", "{a}", "a\\b", "[\\]", "[^a]", "é*", "__*", "_confluent*"]
NAMES = ["a.b", "a.x.y", "shared", "shared2", "abc", "a.c", "ax", "bx", "cx", "x[", "x[]", "x]", "]", "a+b", "(a)",
         "a$", "^a", "a|b", "{a}", "a\\b", "\\", "^", "éé", "__consumer_offsets", "_confluent-metrics", "", "a\nb",
         "b"]


@pytest.mark.parametrize("glob", GLOBS)
def test_globs_match_as_fnmatch_does(glob: str) -> None:
    rx = compile_pattern(glob)
    for name in NAMES:
        assert (rx.fullmatch(name) is not None) == fnmatch.fnmatchcase(name, glob), (glob, name, glob_to_re2(glob))


def test_regex_patterns_run_on_re2_in_linear_time() -> None:
    rx = compile_pattern("re:(a+)+$")
    started = time.monotonic()
    assert rx.fullmatch(SLOW_NAME) is None
    assert rx.fullmatch("a" * 240) is not None
    assert time.monotonic() - started < 0.5
    assert compile_pattern(r"re:b\.(x|y)\.v[0-9]+").fullmatch("b.x.v22") is not None
    assert compile_pattern("re:(?P<n>ab)c").fullmatch("abc") is not None


@pytest.mark.parametrize(("pattern", "what"), [
    ("re:(?=a).*", "lookahead"), ("re:(?!a).*", "negative lookahead"), ("re:(?<=a)b", "lookbehind"),
    (r"re:(a)\1", "backreferences"), ("re:a++", "possessive quantifier"), ("re:(?>a)", "atomic group"),
    (r"re:a\Z", "\\z"), ("re:(unclosed", "missing )"), ("[z-a]", "invalid character class range"),
])
def test_constructs_re2_lacks_are_refused(pattern: str, what: str) -> None:
    with pytest.raises(PatternError) as info:
        compile_pattern(pattern)
    assert what in str(info.value)


def test_tenants_file_refuses_what_re2_cannot_run(tmp_path: Path) -> None:
    f = tmp_path / "tenants.yaml"
    f.write_text("tenants:\n  - id: a\n    topics: ['re:(?=x).*']\n")
    with pytest.raises(TenantConfigError) as info:
        TenantRegistry.from_file(f, default_bootstrap="k:9092", default_connection=CONN)
    message = str(info.value)
    assert "tenants[0] (id 'a').topics" in message and "lookahead is not supported" in message
    f.write_text("tenants:\n  - id: a\n    topics: ['re:(a+)+$']\n    groups: ['re:g-(x|y)']\n")
    t = TenantRegistry.from_file(f, default_bootstrap="k:9092", default_connection=CONN).get("a")
    started = time.monotonic()
    assert not t.allows_topic(SLOW_NAME) and t.allows_topic("aaa")
    assert time.monotonic() - started < 0.5
    assert t.allows_group("g-x") and not t.allows_group("g-z")


# -- the operator's deny-list --------------------------------------------------------------------------------
def test_default_deny_list() -> None:
    assert DEFAULT_DENIED_TOPICS == ("__*", "_schemas", "_confluent*")
    d = TopicDenyList()
    for name in ("__consumer_offsets", "__transaction_state", "__", "_schemas", "_confluent", "_confluent-metrics"):
        assert d.denies(name), name
    for name in ("orders", "_schemas2", "schemas", "a__b", "_other", "confluent", "_"):
        assert not d.denies(name), name
    assert d.rule_for("__consumer_offsets") == "__*" and d.rule_for("_schemas") == "_schemas"


def test_setting_extends_or_replaces_the_defaults() -> None:
    d = TopicDenyList.from_setting(" gw-internal-* , re:audit\\.(x|y) ,")
    assert d.patterns == ("__*", "_schemas", "_confluent*", "gw-internal-*", "re:audit\\.(x|y)")
    assert d.denies("gw-internal-1") and d.denies("audit.x") and d.denies("_schemas") and not d.denies("audit.z")
    only = TopicDenyList.from_setting("secret", defaults=False)
    assert only.patterns == ("secret",) and only.denies("secret") and not only.denies("_schemas")
    assert TopicDenyList.from_setting("", defaults=False).patterns == ()
    assert TopicDenyList.from_setting(None).patterns == DEFAULT_DENIED_TOPICS
    with pytest.raises(PatternError) as info:
        TopicDenyList.from_setting("ok,re:(?=x)")
    assert "GATEWAY_DENIED_TOPICS" in str(info.value) and "lookahead" in str(info.value)


@pytest.mark.parametrize("topics", [None, ["*"], ["re:.*"], ["_schemas", "__consumer_offsets", "orders"]])
def test_deny_list_wins_over_every_tenant_pattern(topics: list[str] | None) -> None:
    t = tenant(topics)
    for name in ("__consumer_offsets", "_schemas", "_confluent-command"):
        assert not t.allows_topic(name)
        with pytest.raises(TenantError) as info:
            t.require_topic(name)
        err = info.value
        assert (err.status, err.error_code) == (403, 40301)
        assert "internal topic" in err.message and name in err.message
    assert t.allows_topic("orders")
    t.require_topic("orders")


def test_tenant_patterns_still_apply_after_the_deny_list() -> None:
    t = tenant(["a-*"])
    with pytest.raises(TenantError) as info:
        t.require_topic("b-1")
    assert "not allowed for tenant" in info.value.message and "internal" not in info.value.message
    open_t = tenant(None, TopicDenyList(()))
    assert open_t.allows_topic("_schemas")  # an operator who switched the defaults off
    custom = tenant(None, TopicDenyList(["secret-*"]))
    assert not custom.allows_topic("secret-1") and custom.allows_topic("_schemas")


def test_registries_pass_the_deny_list_to_every_tenant(tmp_path: Path) -> None:
    denied = TopicDenyList(["x-*"])
    reg = TenantRegistry.single_default(bootstrap="k:9092", connection=CONN, denied_topics=denied)
    assert not reg.get("default").allows_topic("x-1") and reg.get("default").allows_topic("_schemas")
    assert not TenantRegistry.single_default(bootstrap="k:9092", connection=CONN).get("default").allows_topic(
        "__consumer_offsets")
    f = tmp_path / "tenants.yaml"
    f.write_text("tenants:\n  - id: a\n  - id: b\n    topics: ['*']\n")
    reg = TenantRegistry.from_file(f, default_bootstrap="k:9092", default_connection=CONN, denied_topics=denied)
    assert not reg.get("a").allows_topic("x-1") and not reg.get("b").allows_topic("x-1")
    assert reg.get("b").allows_topic("y")


# -- Kafka's topic-name rules -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "legal"), [
    ("orders", True), ("a.b_c-D9", True), ("x" * 249, True), ("...", True), ("._", True),
    (".", False), ("..", False), ("", False), ("x" * 250, False), ("a b", False), ("a[b]", False), ("é", False),
    ("a/b", False), ("a\n", False),
])
def test_legal_topic_names(name: str, legal: bool) -> None:
    assert is_legal_topic_name(name) is legal
    if legal:
        require_legal_topic_name(name)
    else:
        with pytest.raises(TopicNotFound) as info:
            require_legal_topic_name(name)
        assert (info.value.status, info.value.error_code) == (404, 40401)
        assert "not a legal Kafka topic name" in str(info.value)
