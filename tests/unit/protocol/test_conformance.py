"""Conformance of our declarative schemas (service/protocol/definitions.py) with Apache Kafka's JSON schemas.

For every message in ``ALL_SCHEMAS`` and every version in its range, the fields present in that version
(name, type, nullability, tag, default, nested structs; in order) must equal what Kafka's JSON schema says
for the same version; so must the message's flexible versions, kind and API key, and Kafka's validVersions
must cover our range. The ``ignorable`` flag is compared where it has an effect (see ``diff_ignorable``). Comparing *per
version* (instead of comparing the raw version strings) means a schema change in a version we implement makes the test
fail, while changes in versions we don't implement (newer Kafka releases) don't.

Sources: the Kafka 4.3 schemas bundled in the kafka-python wheel (required), the Kafka 4.4 schemas inside the
``kafka-clients`` jar that tools/install-kafka.sh installs (when installed; the only source of the share-group
messages, which the wheel lacks), and, if present, the Kafka 4.0-dev schemas in the ``shared/kafka-protocol/message``
directory next to the repository. Every message we implement must be found in at least one available source: a
message no source has fails the suite rather than going unchecked. Nothing from the JSON files is copied into the
repository; they are read at test time.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from service.embedded.kafka import KAFKA_VERSION, cache_dir
from service.protocol.definitions import ALL_SCHEMAS
from service.protocol.dsl import PRIMITIVES, F, MessageSchema, _default_value, in_range, parse_versions

# -- locating and loading Kafka's JSON schemas -----------------------------------------------------


def _kafka_python_schema_dir() -> Path:
    """kafka-python 3.x bundles Kafka's message JSON files as package data (kafka/protocol/schemas/resources).

    Located with ``find_spec`` so that ``import kafka`` (which builds every message class) isn't needed.
    """
    spec = importlib.util.find_spec("kafka")
    if spec is None or spec.origin is None:  # pragma: no cover - kafka-python is a test dependency
        raise RuntimeError("kafka-python is not installed")
    return Path(spec.origin).parent / "protocol" / "schemas" / "resources"


REPO_ROOT = Path(__file__).resolve().parents[3]
SOURCES: dict[str, Path] = {
    "kafka-4.3": _kafka_python_schema_dir(),
    # A sibling ``shared`` directory of the repository root (Kafka 4.0-dev message definitions).
    "kafka-4.0-dev": REPO_ROOT.parent / "shared" / "kafka-protocol" / "message",
}
# Schema sets read straight out of a jar (``common/message/*.json`` inside it), when the jar is installed.
JAR_SOURCES: dict[str, Path] = {
    f"kafka-clients-{KAFKA_VERSION}": cache_dir() / KAFKA_VERSION / "lib" / f"kafka-clients-{KAFKA_VERSION}.jar",
}
_JAR_DIR = "common/message/"


@cache
def _jar_names(source: str) -> frozenset[str]:
    with zipfile.ZipFile(JAR_SOURCES[source]) as jar:
        return frozenset(n[len(_JAR_DIR):-5] for n in jar.namelist()
                         if n.startswith(_JAR_DIR) and n.endswith(".json"))


def available_sources() -> list[str]:
    """The schema sets present on this machine: the wheel's always, the jar and the sibling set when there."""
    out = [source for source, path in SOURCES.items() if source == "kafka-4.3" or path.is_dir()]
    out += [source for source, jar in JAR_SOURCES.items() if jar.is_file()]
    return out


# Messages a set has only in a form that Kafka has since withdrawn or not yet finished: the 4.0-dev set carries
# the early-access share-group protocol (v0, removed in Kafka 4.1), which no version we implement matches, and the
# consumer group protocol before its v1 was stable (ConsumerGroupHeartbeat v1 unstable, ConsumerGroupDescribe v0
# only); the 4.4 jar is their source.
WITHDRAWN: dict[str, tuple[str, ...]] = {
    "kafka-4.0-dev": ("ShareGroupHeartbeat", "ShareGroupDescribe", "ShareFetch", "ShareAcknowledge",
                      "ConsumerGroupHeartbeat", "ConsumerGroupDescribe"),
}
# Fields a newer set renames without changing the wire (source, message, Kafka's new name -> the name we keep).
RENAMED: dict[tuple[str, str, str], str] = {
    (f"kafka-clients-{KAFKA_VERSION}", "TxnOffsetCommitRequest", "GenerationIdOrMemberEpoch"): "GenerationId",
}


def source_has(source: str, name: str) -> bool:
    if name.removesuffix("Request").removesuffix("Response") in WITHDRAWN.get(source, ()):
        return False
    if source in JAR_SOURCES:
        return name in _jar_names(source)
    return (SOURCES[source] / f"{name}.json").is_file()

# A JSON string (kept) or a // line comment or /* block comment */ (dropped). Matching strings first
# keeps "http://..." inside a string intact.
_JSON_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/', re.S)


def strip_json_comments(text: str) -> str:
    return _JSON_TOKEN.sub(lambda m: m.group(0) if m.group(0).startswith('"') else "", text)


@cache
def _load_cached(source: str, name: str) -> dict[str, Any]:
    if source in JAR_SOURCES:
        with zipfile.ZipFile(JAR_SOURCES[source]) as jar:
            text = jar.read(f"{_JAR_DIR}{name}.json").decode("utf-8")
    else:
        text = (SOURCES[source] / f"{name}.json").read_text(encoding="utf-8")
    kjson = json.loads(strip_json_comments(text))
    for (src, message, theirs), ours in RENAMED.items():
        if (src, message) == (source, name):
            _rename_field(kjson["fields"], theirs, ours)
    return kjson


def _rename_field(fields: list[dict[str, Any]], theirs: str, ours: str) -> None:
    for f in fields:
        if f["name"] == theirs:
            f["name"] = ours
        _rename_field(f.get("fields", []), theirs, ours)


def load_kafka_json(source: str, name: str) -> dict[str, Any]:
    """A private deep copy, so a test that mutates it cannot affect others."""
    return copy.deepcopy(_load_cached(source, name))


def camel_to_snake(name: str) -> str:
    """Kafka's CamelCase field names to our snake_case ones.

    ``ZkMigrationReady`` → ``zk_migration_ready``, ``V3AndBelowTopics`` → ``v3_and_below_topics``,
    ``ResultsByTopicV3AndBelow`` → ``results_by_topic_v3_and_below``, ``KRaftVersion`` → ``k_raft_version``.
    """
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


# -- per-version views of a field list -------------------------------------------------------------


@dataclass(frozen=True)
class FieldView:
    """What one field looks like in one version: everything that affects the wire or decoded values."""

    name: str
    type: str
    nullable: bool
    tag: int | None  # only when the field is tagged in this version
    default: str  # repr() of the decoded default value (so "-1" and -1 compare equal)
    field_flexible: str | None  # field-level flexibleVersions override (our DSL has none)
    fields: tuple[FieldView, ...] | None  # struct types: the nested view in this version


def _is_struct_type(type_: str) -> bool:
    elem = type_[2:] if type_.startswith("[]") else type_
    return elem not in PRIMITIVES


def _elem(type_: str) -> str:
    return type_[2:] if type_.startswith("[]") else type_


def _default_repr(name: str, type_: str, versions: str, default: Any) -> str:
    try:
        return repr(_default_value(F(name, type_, versions, default=default)))
    except (ValueError, TypeError) as exc:  # an unparsable default is itself a finding
        return f"<invalid default {default!r}: {exc}>"


def kafka_view(jfields: list[dict[str, Any]], v: int, common: dict[str, list[dict[str, Any]]],
               problems: list[str], path: str) -> tuple[FieldView, ...]:
    out = []
    for jf in jfields:
        if not in_range(parse_versions(jf["versions"]), v):
            continue
        t = jf["type"]
        name = camel_to_snake(jf["name"])
        children = None
        if _is_struct_type(t):
            sub = jf.get("fields")
            if sub is None:
                sub = common.get(_elem(t))
            if sub is None:
                problems.append(f"{path}.{name}: kafka struct {_elem(t)} has no definition")
                sub = []
            children = kafka_view(sub, v, common, problems, f"{path}.{name}")
        tag = jf.get("tag")
        tagged = tag is not None and in_range(parse_versions(jf.get("taggedVersions")), v)
        out.append(FieldView(
            name=name,
            type=t,
            nullable=in_range(parse_versions(jf.get("nullableVersions")), v),
            tag=int(tag) if tagged else None,
            default=_default_repr(name, t, jf["versions"], jf.get("default")),
            field_flexible=jf.get("flexibleVersions"),
            fields=children,
        ))
    return tuple(out)


def _collect_struct_defs(fields: tuple[F, ...], into: dict[str, tuple[F, ...]]) -> None:
    for f in fields:
        if f.is_struct and f.fields:
            into.setdefault(f.element_type, f.fields)
            _collect_struct_defs(f.fields, into)


def our_view(fields: tuple[F, ...], v: int, structs: dict[str, tuple[F, ...]], problems: list[str],
             path: str) -> tuple[FieldView, ...]:
    out = []
    for f in fields:
        if not f.present(v):
            continue
        children = None
        if f.is_struct:
            sub = f.fields or structs.get(f.element_type)
            if sub is None:
                problems.append(f"{path}.{f.name}: our struct {f.element_type} has no definition")
                sub = ()
            children = our_view(sub, v, structs, problems, f"{path}.{f.name}")
        out.append(FieldView(
            name=f.name,
            type=f.type,
            nullable=f.nullable_in(v),
            tag=f.tag if f.tagged_in(v) else None,
            default=_default_repr(f.name, f.type, f.versions, f.default),
            field_flexible=None,
            fields=children,
        ))
    return tuple(out)


_ATTRS = ("type", "nullable", "tag", "default", "field_flexible")


def diff_views(ours: tuple[FieldView, ...], theirs: tuple[FieldView, ...], path: str) -> list[str]:
    on, tn = [f.name for f in ours], [f.name for f in theirs]
    if on != tn:
        return [f"{path}: fields {on} != kafka {tn}"]
    problems = []
    for o, t in zip(ours, theirs, strict=True):
        for attr in _ATTRS:
            ov, tv = getattr(o, attr), getattr(t, attr)
            if ov != tv:
                problems.append(f"{path}.{o.name}: {attr} {ov!r} != kafka {tv!r}")
        if o.fields is not None or t.fields is not None:
            problems += diff_views(o.fields or (), t.fields or (), f"{path}.{o.name}")
    return problems


def diff_ignorable(fields: tuple[F, ...], jfields: list[dict[str, Any]], versions: list[int],
                   structs: dict[str, tuple[F, ...]], common: dict[str, list[dict[str, Any]]],
                   path: str) -> list[str]:
    """``ignorable`` only matters in a version where the field is *absent*: Kafka refuses to write a non-default
    value there unless the field is ignorable. So compare the flag for fields that are absent in at least one
    of our versions (in which their parent is present). Kafka flips the flag of a field that a later release
    drops (e.g. topic names once topic ids arrive), which must not matter while we implement older versions only.
    """
    problems = []
    by_name = {camel_to_snake(j["name"]): j for j in jfields}
    for f in fields:
        jf = by_name.get(f.name)
        if jf is None:
            continue  # a missing field is reported by the per-version views
        absent = [v for v in versions if not f.present(v)]
        kign = bool(jf.get("ignorable", False))
        if absent and f.ignorable != kign:
            problems.append(f"{path}.{f.name}: ignorable {f.ignorable} != kafka {kign} "
                            f"(matters in v{absent[0]}-v{absent[-1]})")
        if f.is_struct:
            sub = f.fields or structs.get(f.element_type, ())
            jsub = jf.get("fields") or common.get(_elem(jf["type"]), [])
            present = [v for v in versions if f.present(v)]
            problems += diff_ignorable(sub, jsub, present, structs, common, f"{path}.{f.name}")
    return problems


def compare_message(schema: MessageSchema, kjson: dict[str, Any]) -> list[str]:
    """Every difference between our schema and Kafka's JSON, version by version (empty = conformant)."""
    problems: list[str] = []
    name = schema.name
    if kjson.get("name") != name:
        problems.append(f"{name}: kafka name {kjson.get('name')!r}")
    if kjson.get("type") != schema.kind:
        problems.append(f"{name}: kind {schema.kind!r} != kafka type {kjson.get('type')!r}")
    if kjson.get("apiKey") != schema.api_key:
        problems.append(f"{name}: api key {schema.api_key!r} != kafka {kjson.get('apiKey')!r}")
    lo, hi = schema.versions
    valid = parse_versions(kjson.get("validVersions"))
    if valid is None or not (valid[0] <= lo and hi <= valid[1]):
        problems.append(f"{name}: our versions {lo}-{hi} not covered by kafka validVersions "
                        f"{kjson.get('validVersions')!r}")
    elif kjson.get("latestVersionUnstable") and hi >= valid[1]:
        problems.append(f"{name}: we implement v{hi}, which kafka marks as unstable")
    common = {s["name"]: s["fields"] for s in kjson.get("commonStructs", [])}
    structs: dict[str, tuple[F, ...]] = {}
    _collect_struct_defs(schema.fields, structs)
    kflex = parse_versions(kjson.get("flexibleVersions"))
    for v in range(lo, hi + 1):
        path = f"{name} v{v}"
        if schema.is_flexible(v) != in_range(kflex, v):
            problems.append(f"{path}: flexible {schema.is_flexible(v)} != kafka {in_range(kflex, v)}")
        theirs = kafka_view(kjson.get("fields", []), v, common, problems, path)
        ours = our_view(schema.fields, v, structs, problems, path)
        problems += diff_views(ours, theirs, path)
    problems += diff_ignorable(schema.fields, kjson.get("fields", []), list(range(lo, hi + 1)), structs, common,
                               name)
    return problems


# -- the conformance tests ---------------------------------------------------------------------------


def _conformance_params() -> list[Any]:
    """(schema, source) pairs to compare: every available set that has the message. The bundled 4.3 set is
    always there; the jar and the 4.0-dev set of the workplace (``../shared/kafka-protocol/message``) only where
    installed. An absent optional set, or a message a set lacks (the share-group messages are newer than some
    sets), is left out of the parametrisation rather than reported as skipped tests (a skip is not a pass);
    ``test_every_message_has_a_kafka_schema`` makes sure nothing is left out entirely."""
    return [pytest.param(schema, source, id=f"{schema.name}-{source}")
            for schema in ALL_SCHEMAS for source in available_sources() if source_has(source, schema.name)]


def test_kafka_43_schemas_are_available() -> None:
    # The bundled set is mandatory: if kafka-python stops shipping it, fail loudly instead of skipping.
    assert (SOURCES["kafka-4.3"] / "FetchRequest.json").is_file(), SOURCES["kafka-4.3"]


def orphans() -> list[str]:
    """Our messages that no available schema set defines."""
    sources = available_sources()
    return [s.name for s in ALL_SCHEMAS if not any(source_has(src, s.name) for src in sources)]


def test_every_message_has_a_kafka_schema() -> None:
    # A message that no available set defines would go unchecked: that is a failure, not a skip (install the
    # kafka-clients jar with tools/install-kafka.sh for the messages the kafka-python wheel lacks).
    assert orphans() == [], (f"no Kafka schema found for {orphans()} in {available_sources()} "
                             f"(jars: {list(JAR_SOURCES.values())})")


def test_a_missing_jar_leaves_the_share_messages_orphaned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(JAR_SOURCES, f"kafka-clients-{KAFKA_VERSION}", tmp_path / "absent.jar")
    assert "ShareFetchRequest" in orphans()
    assert "FetchRequest" not in orphans()


def test_renames_name_existing_fields() -> None:
    for (source, message, theirs), _ours in RENAMED.items():
        if source not in available_sources():
            continue
        with zipfile.ZipFile(JAR_SOURCES[source]) as jar:
            raw = strip_json_comments(jar.read(f"{_JAR_DIR}{message}.json").decode())
        assert f'"{theirs}"' in raw, (source, message, theirs)


def test_the_jar_provides_the_share_group_messages() -> None:
    # The share-group messages exist in the 4.4 jar (and not in the wheel's 4.3 set): the jar is their source.
    source = f"kafka-clients-{KAFKA_VERSION}"
    assert source in available_sources(), f"{JAR_SOURCES[source]} is missing: run tools/install-kafka.sh"
    share = [s.name for s in ALL_SCHEMAS if "Share" in s.name]
    assert len(share) == 14, share
    assert all(source_has(source, name) for name in share)


@pytest.mark.parametrize(("schema", "source"), _conformance_params())
def test_schema_conforms_to_kafka(source: str, schema: MessageSchema) -> None:
    kjson = load_kafka_json(source, schema.name)
    problems = compare_message(schema, kjson)
    assert problems == [], "\n".join(problems)


def test_all_schemas_have_unique_names_and_keys() -> None:
    names = [s.name for s in ALL_SCHEMAS]
    assert len(names) == len(set(names))
    keys = [(s.api_key, s.kind) for s in ALL_SCHEMAS if s.api_key is not None]
    assert len(keys) == len(set(keys))


# -- the comparison itself must be able to fail ------------------------------------------------------


def test_camel_to_snake() -> None:
    assert camel_to_snake("ZkMigrationReady") == "zk_migration_ready"
    assert camel_to_snake("V3AndBelowTopics") == "v3_and_below_topics"
    assert camel_to_snake("ResultsByTopicV3AndBelow") == "results_by_topic_v3_and_below"
    assert camel_to_snake("KRaftVersion") == "k_raft_version"
    assert camel_to_snake("ThrottleTimeMs") == "throttle_time_ms"
    assert camel_to_snake("Enable2Pc") == "enable2_pc"
    assert camel_to_snake("TopicId") == "topic_id"


def test_strip_json_comments_keeps_strings() -> None:
    text = '// header\n{ "a": "http://x//y", // trailing\n  /* block */ "b": 1 }\n'
    assert json.loads(strip_json_comments(text)) == {"a": "http://x//y", "b": 1}


def _schema(name: str) -> MessageSchema:
    return next(s for s in ALL_SCHEMAS if s.name == name)


def _jfield(kjson: dict[str, Any], dotted: str) -> dict[str, Any]:
    """The JSON field at a CamelCase dotted path, e.g. ``Responses.Partitions.Records``."""
    fields = kjson["fields"]
    found: dict[str, Any] = {}
    for part in dotted.split("."):
        found = next(f for f in fields if f["name"] == part)
        fields = found.get("fields", [])
    return found


FETCH_RESP = _schema("FetchResponse")


def _fetch_resp_json() -> dict[str, Any]:
    return load_kafka_json("kafka-4.3", "FetchResponse")


def test_comparison_accepts_unmodified_json() -> None:
    assert compare_message(FETCH_RESP, _fetch_resp_json()) == []


def test_comparison_detects_version_range_change_only_in_that_version() -> None:
    kj = _fetch_resp_json()
    _jfield(kj, "Responses.Partitions.LastStableOffset")["versions"] = "5+"  # was 4+
    problems = compare_message(FETCH_RESP, kj)
    assert problems, "a field removed from v4 must be reported"
    assert all(p.startswith("FetchResponse v4") for p in problems), problems


@pytest.mark.parametrize(
    ("field", "key", "value", "expect"),
    [
        ("Responses.Partitions.HighWatermark", "name", "HighWaterMarkX", "fields"),
        ("Responses.Partitions.HighWatermark", "type", "int32", "type"),
        ("Responses.Partitions.Records", "nullableVersions", "16+", "nullable"),
        ("Responses.Partitions.DivergingEpoch", "tag", 5, "tag"),
        ("Responses.Partitions.DivergingEpoch", "taggedVersions", "13+", "tag"),
        ("Responses.Partitions.DivergingEpoch.Epoch", "type", "int64", "type"),
        ("Responses.Partitions.PreferredReadReplica", "default", "0", "default"),
        ("Responses.Partitions.AbortedTransactions", "type", "[]AbortedTxn", "type"),
        ("ErrorCode", "ignorable", False, "ignorable"),  # absent in v4-v6, where the flag matters
        ("SessionId", "flexibleVersions", "12+", "field_flexible"),
    ],
)
def test_comparison_detects_field_mutations(field: str, key: str, value: Any, expect: str) -> None:
    kj = _fetch_resp_json()
    _jfield(kj, field)[key] = value
    problems = compare_message(FETCH_RESP, kj)
    assert problems, f"mutating {field}.{key} must be reported"
    assert any(expect in p for p in problems), problems


def test_comparison_detects_new_field_in_implemented_version() -> None:
    kj = _fetch_resp_json()
    kj["fields"].insert(1, {"name": "NewThing", "type": "int32", "versions": "17+"})
    problems = compare_message(FETCH_RESP, kj)
    assert problems == [
        "FetchResponse v17: fields ['throttle_time_ms', 'error_code', 'session_id', 'responses', 'node_endpoints'] "
        "!= kafka ['throttle_time_ms', 'new_thing', 'error_code', 'session_id', 'responses', 'node_endpoints']"
    ]


def test_comparison_ignores_changes_in_versions_we_do_not_implement() -> None:
    kj = _fetch_resp_json()
    kj["fields"].insert(1, {"name": "FutureThing", "type": "int32", "versions": "99+"})
    _jfield(kj, "Responses.Partitions.Records")["nullableVersions"] = "0-50"  # same for v4-v17
    # present in all of v4-v17, so the flag has no effect there:
    _jfield(kj, "Responses.Partitions.LastStableOffset")["ignorable"] = False
    _jfield(kj, "ThrottleTimeMs")["ignorable"] = False
    assert compare_message(FETCH_RESP, kj) == []
    # ... whereas Topic is absent in v13-v17, where a non-ignorable topic name could not be written:
    _jfield(kj, "Responses.Topic")["ignorable"] = False
    assert compare_message(FETCH_RESP, kj) == [
        "FetchResponse.responses.topic: ignorable True != kafka False (matters in v13-v17)"
    ]


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("flexibleVersions", "13+", "FetchResponse v12: flexible True != kafka False"),
        ("apiKey", 99, "api key 1 != kafka 99"),
        ("validVersions", "4-16", "not covered by kafka validVersions"),
        ("validVersions", "5-18", "not covered by kafka validVersions"),
        ("type", "request", "kind 'response' != kafka type 'request'"),
    ],
)
def test_comparison_detects_message_level_mutations(key: str, value: Any, expect: str) -> None:
    kj = _fetch_resp_json()
    kj[key] = value
    problems = compare_message(FETCH_RESP, kj)
    assert any(expect in p for p in problems), problems


def test_comparison_detects_unstable_latest_version() -> None:
    kj = _fetch_resp_json()
    kj["validVersions"] = "4-17"
    kj["latestVersionUnstable"] = True
    assert compare_message(FETCH_RESP, kj) == ["FetchResponse: we implement v17, which kafka marks as unstable"]


def test_comparison_resolves_and_checks_common_structs() -> None:
    schema = _schema("AddPartitionsToTxnRequest")
    kj = load_kafka_json("kafka-4.3", "AddPartitionsToTxnRequest")
    assert kj.get("commonStructs"), "this test needs a message that uses commonStructs"
    assert compare_message(schema, kj) == []
    common = next(s for s in kj["commonStructs"] if s["name"] == "AddPartitionsToTxnTopic")
    next(f for f in common["fields"] if f["name"] == "Partitions")["type"] = "[]int64"
    problems = compare_message(schema, kj)
    assert any("v3_and_below_topics.partitions: type '[]int32' != kafka '[]int64'" in p for p in problems), problems
    del kj["commonStructs"]
    problems = compare_message(schema, kj)
    assert any("has no definition" in p for p in problems), problems
