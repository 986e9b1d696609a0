"""Topic patterns: tenant-safe matching (a topic filter on every match) and RE2 (no catastrophic backtracking)."""

from __future__ import annotations

import time

import pytest

from service.consumer.subscription import (
    InvalidPatternError,
    SubscriptionState,
    compile_topic_pattern,
)


def test_topic_filter_restricts_every_match_also_later_topics() -> None:
    s = SubscriptionState()
    s.topic_filter = lambda t: t.startswith("a-")
    s.subscribe_pattern(".*")
    assert s.match_pattern(["a-orders", "b-secret", "__consumer_offsets"])
    assert s.topics == {"a-orders"}
    # a topic created later: the allowed one joins, the forbidden one never does
    assert s.match_pattern(["a-orders", "b-secret", "a-new", "b-new"])
    assert s.topics == {"a-orders", "a-new"}
    s.unsubscribe()
    assert s.topic_filter is not None  # the tenant's restriction outlives a subscription


def test_catastrophic_pattern_is_linear() -> None:
    # Behavioural separation, not a benchmark: a backtracking engine needs ~2**100000 (then 1000 * 2**249)
    # steps for these non-matches and never returns; RE2 answers in milliseconds. The bounds only turn
    # "never" into a prompt failure and leave two orders of magnitude of slack for a loaded machine.
    rx = compile_topic_pattern(r"(\w|\w)*-x")
    started = time.perf_counter()
    assert rx.fullmatch("a" * 100_000) is None
    assert time.perf_counter() - started < 5.0
    s = SubscriptionState()
    s.subscribe_pattern(r"(\w|\w)*-x")
    started = time.perf_counter()
    s.match_pattern(["a" * 249] * 1000)
    assert time.perf_counter() - started < 5.0


@pytest.mark.parametrize(("pattern", "what"), [
    (r"(a)\1", "backreferences"), (r"(?=a)a", "lookahead"), (r"(?!a)b", "negative lookahead"),
    (r"(?<=a)b", "lookbehind"), (r"(?<!a)b", "negative lookbehind"), (r"(?>a)", "atomic group"),
    (r"a*+", "possessive quantifier"), (r"a{2}+", "possessive quantifier"),
])
def test_unsupported_constructs_are_named(pattern: str, what: str) -> None:
    with pytest.raises(InvalidPatternError, match=f"{what} (is|are) not supported"):
        compile_topic_pattern(pattern)


def test_java_syntax_that_re2_supports() -> None:
    cases = {r"orders\..*": "orders.eu", r"\Qa.b\E-\d+": "a.b-12", r"(?i)ORD.*": "orders", r"[a-z]{2,3}-\w+": "ab-x_1",
             r"(?<name>pay)ments": "payments", r"a|b-.*": "b-1", r"[[:alpha:]]+": "abc"}
    for pattern, topic in cases.items():
        assert compile_topic_pattern(pattern).fullmatch(topic) is not None, pattern
    assert compile_topic_pattern(r"orders").fullmatch("orders-2") is None  # whole-name match, as Java matches()
    with pytest.raises(InvalidPatternError, match="longer than"):
        compile_topic_pattern("a" * 1001)
    with pytest.raises(InvalidPatternError, match="missing \\)"):
        compile_topic_pattern("(")


@pytest.mark.parametrize(("pattern", "matches", "misses"), [
    # Java spellings RE2 writes differently: each matches what java.util.regex matches
    (r"\p{Lower}+-\p{Digit}", ["orders-1"], ["Orders-1", "orders-x"]),
    (r"[\p{Alpha}_]+", ["a_B"], ["a-b", "é"]),  # POSIX classes are ASCII-only in Java
    (r"\P{Digit}+", ["abc"], ["a1"]),
    (r"[^\p{Upper}]+", ["abc"], ["aBc"]),
    (r"\p{IsLatin}+", ["abc", "é"], ["αβ"]),
    (r"\p{javaLowerCase}+", ["ab"], ["aB"]),
    (r"\p{gc=Lu}\p{L}*", ["Orders"], ["orders"]),
    (r"\pL+", ["abc"], ["a1"]),
    (r"\u0041\u002e.*", ["A.x"], ["Ax"]),
    (r"\0101\x42", ["AB"], ["ab"]),
    (r"(?<kind>pay|bill)ments", ["payments"], ["ments"]),
    (r"(?idu)ORDERS", ["orders"], ["order"]),
    (r"a\Z", ["a"], ["ab"]),
    (r"[]a]+", ["]a"], ["b"]),
    (r"\QA.B\E\p{Digit}", ["A.B1"], ["AxB1"]),
])
def test_java_only_spellings_are_translated(pattern: str, matches: list[str], misses: list[str]) -> None:
    rx = compile_topic_pattern(pattern)
    for topic in matches:
        assert rx.fullmatch(topic) is not None, (pattern, topic)
    for topic in misses:
        assert rx.fullmatch(topic) is None, (pattern, topic)


@pytest.mark.parametrize(("pattern", "what"), [
    (r"[a-z&&[^aeiou]]+", "character class intersection"), (r"[a-c[x-z]]", "nested character class"),
    (r"\p{InGreek}", "Unicode block"), (r"(?U)\w+", "flag"), (r"(?x) a b", "flag"),
    (r"(?<n>a)\k<n>", "backreferences"), (r"\Ga", "\\\\G"), (r"\p{IsAlphabetic}", "Java property"),
])
def test_java_constructs_without_re2_equivalent_are_named(pattern: str, what: str) -> None:
    with pytest.raises(InvalidPatternError, match=what):
        compile_topic_pattern(pattern)
