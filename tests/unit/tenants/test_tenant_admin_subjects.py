"""Topic administration and schema subjects of a tenant (sans-io): the tenants-file fields ``admin_topics``,
``admin_topic_configs`` and ``subjects``, the checks built on them, the partitions cap and config allow-list,
the subject a schema text is registered under and the cached subjects of a schema id."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from service.client.connection import ConnectionConfig
from service.cluster.topic_admin import ConfigNotAllowed, TooManyPartitions, check_configs_allowed, check_partitions_cap
from service.schemas.produce import RECORD_NAME, TOPIC_NAME, TOPIC_RECORD_NAME, SchemaSpec
from service.schemas.registry import SchemaNotFound, parse_id_versions
from service.schemas.subjects import (
    REFUSED_TTL_S,
    IdSubjects,
    SubjectForbidden,
    require_spec_subject,
    spec_subject,
)
from service.settings import Settings
from service.tenants import Tenant, TenantConfigError, TenantError, TenantRegistry
from service.tenants.config import default_subjects

CONN = ConnectionConfig(client_id="gw")


def load(tmp_path: Path, text: str) -> TenantRegistry:
    path = tmp_path / "tenants.yaml"
    path.write_text(textwrap.dedent(text))
    return TenantRegistry.from_file(path, default_bootstrap="k:9092", default_connection=CONN)


FILE = """
version: 1
tenants:
  - id: a
    api_keys: ["sha256:{h1}"]
    topics: ["a.*", "shared"]
    admin_topics: ["a.*"]
    admin_topic_configs: ["retention.ms"]
  - id: b
    api_keys: ["sha256:{h2}"]
    topics: ["b.*", "shared"]
  - id: c
    api_keys: ["sha256:{h3}"]
    subjects: ["com.acme.*", "re:c\\\\.x\\\\..*"]
    schema_registry: {{url: "http://own-registry:8081"}}
  - id: d
    api_keys: ["sha256:{h4}"]
    schema_registry: {{url: "http://own-registry:8081"}}
""".format(h1="1" * 64, h2="2" * 64, h3="3" * 64, h4="4" * 64)


# -- topic administration ---------------------------------------------------------------------------------
def test_a_tenants_file_tenant_administers_only_its_admin_topics(tmp_path: Path) -> None:
    reg = load(tmp_path, FILE)
    a, b = reg.get("a"), reg.get("b")
    a.require_topic_admin("a.orders")
    assert a.allows_topic_admin("a.orders") and not a.allows_topic_admin("shared")
    with pytest.raises(TenantError) as info:
        a.require_topic_admin("shared")  # readable, not administrable
    assert (info.value.status, info.value.error_code) == (403, 40303)
    with pytest.raises(TenantError) as info:
        b.require_topic_admin("shared")  # no admin_topics: nothing
    assert (info.value.status, info.value.error_code) == (403, 40303)
    with pytest.raises(TenantError) as info:
        a.require_topic_admin("b.x")  # not even readable: the read refusal first
    assert info.value.error_code == 40301
    with pytest.raises(TenantError) as info:
        a.require_topic_admin("__consumer_offsets")
    assert info.value.error_code == 40301
    assert a.admin_topic_configs == ("retention.ms",) and b.admin_topic_configs is None


def test_open_mode_keeps_administration_and_subjects_open() -> None:
    reg = TenantRegistry.single_default(bootstrap="k:9092", connection=CONN)
    t = next(iter(reg.tenants.values()))
    t.require_topic_admin("anything")
    assert t.admin_topic_patterns is None and t.subject_patterns is None
    assert t.allows_subject("com.other.Thing")
    with pytest.raises(TenantError):
        t.require_topic_admin("__consumer_offsets")  # the deny-list still applies


@pytest.mark.parametrize("field, value, needle", [
    ("admin_topics", '["re:(a"]', "admin_topics"),
    ("admin_topic_configs", '["Retention MS"]', "not a topic config name"),
    ("subjects", '[""]', "empty pattern"),
])
def test_bad_new_fields_are_refused_naming_them(tmp_path: Path, field: str, value: str, needle: str) -> None:
    text = f"""
    version: 1
    tenants:
      - id: a
        api_keys: ["sha256:{'1' * 64}"]
        {field}: {value}
    """
    with pytest.raises(TenantConfigError) as info:
        load(tmp_path, text)
    assert needle in str(info.value) and field in str(info.value)


def test_partitions_cap() -> None:
    check_partitions_cap(1000, 1000)
    check_partitions_cap(-1, 1000)
    with pytest.raises(TooManyPartitions) as info:
        check_partitions_cap(2**31 - 1, 1000)
    assert (info.value.status, info.value.error_code) == (422, 42213)
    assert "1000" in info.value.message


def test_config_allow_list_names_the_refused_config() -> None:
    allowed = Settings().topic_configs_allowed_set()
    assert "retention.ms" in allowed and "segment.bytes" not in allowed and "flush.messages" not in allowed
    check_configs_allowed(["retention.ms", "cleanup.policy"], allowed)
    with pytest.raises(ConfigNotAllowed) as info:
        check_configs_allowed(["retention.ms", "segment.bytes"], allowed)
    assert (info.value.status, info.value.error_code) == (422, 42214)
    assert "'segment.bytes'" in info.value.message
    check_configs_allowed(["segment.bytes"], frozenset({"*"}))
    with pytest.raises(ConfigNotAllowed):
        check_configs_allowed(["retention.ms"], frozenset())


# -- subjects -----------------------------------------------------------------------------------------------
def test_default_subjects() -> None:
    assert default_subjects("a", None, own_registry=False) == ("a.*",)
    assert default_subjects("a", None, own_registry=True) is None
    assert default_subjects("a", ["x.*"], own_registry=True) == ("x.*",)


def test_subjects_of_a_tenant(tmp_path: Path) -> None:
    reg = load(tmp_path, FILE)
    a, c, d = reg.get("a"), reg.get("c"), reg.get("d")
    # topic-derived: <topic>-key/-value (TopicNameStrategy), <topic>-<record name> (TopicRecordNameStrategy)
    assert a.allows_subject("a.orders-value") and a.allows_subject("a.orders-key")
    assert a.allows_subject("shared-value") and a.allows_subject("a.orders-com.acme.Order")
    assert not a.allows_subject("b.orders-value")
    # record names: the tenant's namespace by default
    assert a.allows_subject("a.Order") and a.allows_subject("a.ns.Order")
    assert not a.allows_subject("b.Order") and not a.allows_subject("com.acme.Order")
    # the last '-' splits: a record name with a '-' cannot reach another topic's subject
    assert not a.allows_subject("shared-x-value") and not a.allows_subject("value") and not a.allows_subject("-value")
    with pytest.raises(TenantError) as info:
        a.require_subject("b.Order")
    assert (info.value.status, info.value.error_code) == (403, 40304)
    # explicit patterns (globs and re:) plus every topic-derived subject (c has no topic patterns: all topics)
    assert c.allows_subject("com.acme.Order") and c.allows_subject("c.x.Y") and not c.allows_subject("org.Z")
    assert c.allows_subject("anything-value")
    assert d.subject_patterns is None and d.allows_subject("org.Z")  # its own registry: no restriction


def test_a_tenant_topic_prefix_of_another_does_not_take_its_subjects() -> None:
    a = Tenant("a", "k:9092", CONN, topics=["orders"], subjects=["a.*"])
    assert a.allows_subject("orders-value") and a.allows_subject("orders-com.acme.Order")
    assert not a.allows_subject("orders-eu-value")  # tenant b's topic orders-eu


class FakeCodecs:
    """Codecs whose schemas all have the record name given."""

    def __init__(self, name: str | None) -> None:
        self.name = name

    def codec(self, fmt: str, schema_id: Any, text: str) -> Any:
        return type("C", (), {"record_name": self.name})()


@pytest.mark.parametrize("strategy, name, expected", [
    (TOPIC_NAME, "x.R", "t-value"), (RECORD_NAME, "x.R", "x.R"), (TOPIC_RECORD_NAME, "x.R", "t-x.R")])
def test_spec_subject_per_strategy(strategy: str, name: str, expected: str) -> None:
    spec = SchemaSpec("value", schema='{"type":"record"}')
    assert spec_subject(FakeCodecs(name), "avro", spec, "t", strategy) == expected


def test_parse_id_versions() -> None:
    assert parse_id_versions(b'[{"subject":"s","version":1},{"subject":"t","version":3}]') == [("s", 1), ("t", 3)]
    with pytest.raises(Exception, match="unexpected"):
        parse_id_versions(b'{"subject":"s"}')


class FakeRegistry:
    def __init__(self, subjects: dict[int, list[str]]) -> None:
        self.subjects = subjects
        self.asked: list[int] = []

    async def get_id_versions(self, schema_id: int) -> list[tuple[str, int]]:
        self.asked.append(schema_id)
        if schema_id not in self.subjects:
            raise SchemaNotFound(404, 40403, "Schema not found")
        return [(s, 1) for s in self.subjects[schema_id]]


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_id_subjects_cache_and_refusal_refresh() -> None:
    reg = FakeRegistry({1: ["a.Order"], 2: ["b.Order"], 4: []})
    clock = Clock()
    ids = IdSubjects(reg, clock=clock)  # type: ignore[arg-type]
    mine = lambda s: s.startswith("a.")  # noqa: E731
    assert await ids.allowed(1, mine) and await ids.allowed(1, mine)
    assert not await ids.allowed(2, mine) and not await ids.allowed(2, mine)
    assert reg.asked == [1, 2]  # cached, a refusal too (for a while)
    reg.subjects[2].append("a.Order2")  # the same schema registered under a subject of a's since
    clock.now += REFUSED_TTL_S + 1
    assert await ids.allowed(2, mine)
    assert reg.asked == [1, 2, 2]
    for unknown in (3, 4, 3, 4):  # Confluent's 404 and Karapace's []: remembered for a while too
        with pytest.raises(SchemaNotFound):
            await ids.allowed(unknown, mine)
    assert reg.asked == [1, 2, 2, 3, 4]


class FakeResolver:
    def __init__(self, registry: FakeRegistry, name: str | None) -> None:
        self.client = registry
        self.codecs = FakeCodecs(name)


async def test_require_spec_subject_names_no_foreign_subject() -> None:
    registry = FakeRegistry({7: ["b.Secret"]})
    resolver = FakeResolver(registry, "b.Secret")
    mine = Tenant("a", "k:9092", CONN, topics=["a.*"], subjects=["a.*"]).allows_subject
    with pytest.raises(SubjectForbidden) as info:
        await require_spec_subject(resolver, "avro", SchemaSpec("value", schema_id=7), "a.t", RECORD_NAME, mine)
    assert "b.Secret" not in info.value.message and "7" in info.value.message
    with pytest.raises(SubjectForbidden) as info:
        await require_spec_subject(resolver, "avro", SchemaSpec("value", schema="{}"), "a.t", RECORD_NAME, mine)
    assert "'b.Secret'" in info.value.message  # the subject its own text makes
    await require_spec_subject(resolver, "avro", SchemaSpec("value", schema="{}"), "a.t", TOPIC_NAME, mine)
    with pytest.raises(SchemaNotFound) as nf:
        await require_spec_subject(resolver, "avro", SchemaSpec("key", schema_id=99), "a.t", TOPIC_NAME, mine)
    assert nf.value.error_code == 40403 and "key_schema_id 99" in nf.value.message


# -- consuming ------------------------------------------------------------------------------------------------
class FakeInner:
    """A resolver that knows ids 1 and 2 and decodes a payload to its schema id."""

    def __init__(self, registry: FakeRegistry) -> None:
        self.client = registry
        self.codecs = FakeCodecs(None)
        self.avro_rendering = "confluent"
        self.prepared: list[set[int]] = []

    async def prepare(self, ids: Any) -> None:
        self.prepared.append(set(ids))

    def cached(self, sid: int) -> Any:
        return f"resolved-{sid}" if sid in (1, 2) else None

    def avro_program(self, sid: int, rendering: str | None = None) -> Any:
        return f"program-{sid}"

    def decode(self, fmt: str, payloads: Any, *, rendering: str | None = None) -> list[Any]:
        return [None if p is None else ("value-of", int.from_bytes(p[1:5], "big")) for p in payloads]


def framed(sid: int) -> bytes:
    return b"\x00" + sid.to_bytes(4, "big") + b"\x02s"


async def test_tenant_view_makes_foreign_ids_per_record_errors() -> None:
    from service.schemas.codecs import DecodeError
    from service.schemas.subjects import TenantSchemas, tenant_view

    inner = FakeInner(FakeRegistry({1: ["a.Order"], 2: ["b.Secret"]}))
    a = Tenant("a", "k:9092", CONN, topics=["a.*"], subjects=["a.*"])
    view = tenant_view(inner, a)
    assert tenant_view(inner, a) is view  # one per tenant and resolver
    assert tenant_view(inner, Tenant("open", "k:9092", CONN)) is inner  # no subject patterns: the resolver
    payloads = [framed(1), None, framed(2), framed(3), b"not framed"]
    await view.prepare(view.schema_ids(payloads))
    assert inner.prepared == [{1, 2, 3}]
    assert view.cached(1) == "resolved-1" and view.cached(2) is None and view.cached(3) is None
    assert view.avro_program(1) == "program-1" and view.avro_program(2) is None
    out = view.decode("avro", payloads)
    assert out[0] == ("value-of", 1) and out[1] is None and out[3] == ("value-of", 3) and out[4][0] == "value-of"
    assert isinstance(out[2], DecodeError) and out[2].message == "schema id 2 is not readable by this tenant"
    assert await view.decode_all("avro", [framed(1)]) == [("value-of", 1)]
    # an id seen by no prepare of this view is not readable either (the safe side)
    other = tenant_view(inner, Tenant("c", "k:9092", CONN, topics=["c.*"], subjects=["b.*"]))
    assert isinstance(other.decode("avro", [framed(1)])[0], DecodeError)
    assert TenantSchemas(type("S", (), {"resolver": lambda self, c, f: inner})(), a).resolver(None, "avro") is view


def test_missing_topic_says_when_admin_topics_kept_it_from_being_created() -> None:
    from api.produce_common import missing_topic

    on, off = Settings(auto_create_topics=True), Settings(auto_create_topics=False)
    a = Tenant("a", "k:9092", CONN, topics=["a.*"], admin_topics=["a.auto.*"])
    assert "admin_topics" in missing_topic(on, "a.x", a)
    assert missing_topic(on, "a.auto.x", a) == "topic 'a.auto.x' not found"  # it could be created: another cause
    assert missing_topic(off, "a.x", a) == "topic 'a.x' not found"
    assert missing_topic(on, "a.x", Tenant("open", "k:9092", CONN)) == "topic 'a.x' not found"
