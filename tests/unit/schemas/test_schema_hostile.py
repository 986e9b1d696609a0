"""Hostile JSON Schemas, Protobuf payloads and values, sans-io: ``pattern`` / ``patternProperties`` run on
RE2 (ECMA-262 syntax translated, what RE2 cannot run refused at compile naming the schema path), every
``$ref`` resolves at compile, subschema and value depth are bounded, and a Protobuf payload that cannot be
rendered is that record's error."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import re2
from google.protobuf import any_pb2, descriptor_pb2, struct_pb2

from service.schemas.codecs import Codecs, DecodeError, SchemaError
from service.schemas.ecma_regex import EcmaRegexError, compile_pattern, ecma_to_re2
from service.schemas.jsonschema_format import (
    JsonSchemaCodec,
    JsonSchemaDecodeError,
    JsonSchemaSchemaError,
    value_depth,
)
from service.schemas.protobuf import ProtobufCodec, ProtobufDecodeError, ProtobufEncodeError

F = descriptor_pb2.FieldDescriptorProto


# -- ECMA-262 -> RE2 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("pattern", "matches", "misses"), [
    ("^[a-z]{2,3}$", ["ab", "abc"], ["a", "abcd", "ab\n"]),  # $ is the end of the text (Python's re: also before \n)
    ("a.c", ["abc", "a\u00e9c"], ["a\nc", "a\rc", "a\u2028c"]),
    ("^\\s$", [" ", "\t", "\u00a0", "\u3000", "\ufeff", "\x0b"], ["a", "\u200b"]),
    ("^\\S+$", ["ab"], ["a b"]),
    ("^[\\s\\d]+$", ["1 2"], ["a"]),
    ("^[\\s\\S]*$", ["a\nb", "", "\u00a0\u2028"], []),  # JavaScript's "any character" idiom
    ("^[a\\S]$", ["a", "b"], [" ", "\u00a0", "ab"]),
    ("^\\d+$", ["123"], ["\u0661"]),  # ASCII digits only in ECMA-262 (Python's re: any Unicode digit)
    ("^\\u00e9$", ["\u00e9"], ["e"]),
    ("^\\uD83D\\uDE00$", ["\U0001f600"], ["\u00e9"]),
    ("^\\u{1F600}$", ["\U0001f600"], ["x"]),
    ("^\\x41\\cJ\\0$", ["A\n\x00"], ["A"]),
    ("^\\p{Letter}+$", ["\u00e9t\u00e9"], ["a1"]),
    ("^\\p{Lu}\\P{Lu}$", ["Ab"], ["AB"]),
    ("^\\p{Script=Greek}$", ["\u03b1"], ["a"]),
    ("^\\p{General_Category=Decimal_Number}$", ["7"], ["x"]),
    ("^[^]$", ["\n"], ["", "ab"]),
    ("a[]", [], ["a", "a]"]),
    ("^(?<year>\\d{4})-(?:\\d\\d)$", ["2024-01"], ["24-01"]),
    ("^a\\/b\\.c\\-$", ["a/b.c-"], ["a/bxc-"]),
    ("^[\\b]$", ["\x08"], ["b"]),
    ("\\bword\\b", ["a word here"], ["swords"]),
    ("^[a\\-z]$", ["-"], ["b"]),
    ("^[[]$", ["["], ["a"]),
    ("^\\$\\^$", ["$^"], [""]),
    ("colou?r", ["color", "xcolourx"], ["colr"]),
])
def test_ecma_patterns_run_on_re2(pattern: str, matches: list[str], misses: list[str]) -> None:
    regex = compile_pattern(pattern)
    for text in matches:
        assert regex.search(text) is not None, (pattern, text)
    for text in misses:
        assert regex.search(text) is None, (pattern, text)


@pytest.mark.parametrize(("pattern", "named"), [
    ("(a)\\1", "backreference"), ("(?<n>a)\\k<n>", "named backreference"), ("a(?=b)", "lookahead"),
    ("a(?!b)", "negative lookahead"), ("(?<=a)b", "lookbehind"), ("(?<!a)b", "negative lookbehind"),
    ("\\a", "\\a is not an ECMA-262 escape"), ("\\z", "\\z is not"), ("\\Qx\\E", "\\Q is not"), ("\\A", "\\A is not"),
    ("[a", "not closed"), ("a\\", "end with a backslash"), ("\\u12", "four hex digits"),
    ("\\uD800", "lone surrogate"), ("\\p{Greek}", "\\p{Greek}"), ("\\p{Nope=X}", "\\p{Nope=X}"),
    ("(?i)a", "'(?'"), ("[^\\S]", "negated character class"), ("a{1001}", "repetition"), ("a**", "repetition operator"),
    ("(", "missing"),
    ("x" * 10_001, "longer than"),
])
def test_patterns_re2_cannot_run_are_refused(pattern: str, named: str) -> None:
    with pytest.raises(EcmaRegexError, match=None) as info:
        compile_pattern(pattern)
    assert named in str(info.value)


def test_translation_is_plain_text() -> None:
    assert ecma_to_re2("^a.b$") == "^a[^\\n\\r\\x{2028}\\x{2029}]b$"
    assert ecma_to_re2("(?<y>x)") == "(?P<y>x)"
    re2.compile(ecma_to_re2("[\\s]"))  # the class form of \s is valid inside a class


# -- JSON Schema: patterns -------------------------------------------------------------------------------------
REDOS = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}},
         "patternProperties": {"^(b+)+$": {"type": "integer"}}}


def test_catastrophic_pattern_validates_in_linear_time() -> None:
    codec = JsonSchemaCodec(json.dumps(REDOS))
    started = time.perf_counter()
    error = codec.errors({"name": "a" * 5000 + "!", "b" * 5000 + "!": "x"})
    elapsed = time.perf_counter() - started
    assert error is not None and error.path == "$.name" and "does not match" in error.reason
    assert elapsed < 1.0  # Python's re takes ~1.3 s at 25 characters, x2 per character
    assert codec.errors({"name": "aaa", "bbb": 1}) is None
    assert codec.errors({"bbb": "x"}).path == "$.bbb"  # type: ignore[union-attr]
    lone = codec.errors({"name": "\ud83d"})  # not UTF-8: an error of the value, not an exception
    assert lone is not None and "lone surrogate" in lone.reason


@pytest.mark.parametrize(("schema", "where"), [
    ({"properties": {"name": {"type": "string", "pattern": "(a)\\1"}}}, "#/properties/name/pattern"),
    ({"patternProperties": {"^(?=x)": {}}}, "#/patternProperties/^(?=x)"),
    ({"items": [{}, {"pattern": "(?<!a)b"}]}, "#/items/1/pattern"),
    ({"definitions": {"a/b~c": {"pattern": "\\Z"}}}, "#/definitions/a~1b~0c/pattern"),
    ({"$schema": "https://json-schema.org/draft/2020-12/schema",
      "$defs": {"x": {"not": {"pattern": "(x)\\1"}}}}, "#/$defs/x/not/pattern"),
])
def test_schema_with_a_pattern_re2_cannot_run_is_refused_naming_its_path(schema: Any, where: str) -> None:
    with pytest.raises(JsonSchemaSchemaError) as info:
        JsonSchemaCodec(json.dumps(schema))
    assert str(info.value).startswith(f"{where}: ")
    assert "RE2" in str(info.value) or "ECMA-262" in str(info.value)


def test_patterns_in_values_are_not_keywords() -> None:
    # "pattern" as a property name, and inside const/enum, is no pattern keyword: nothing is refused
    codec = JsonSchemaCodec(json.dumps({"properties": {"pattern": {"type": "string"}},
                                        "enum": [{"pattern": "(a)\\1"}], "const": {"pattern": "(?=x)"}}))
    assert codec.errors({"pattern": "(a)\\1"}) is not None  # not the const


def test_referenced_schema_patterns_are_checked_and_run_on_re2() -> None:
    refs = {"name.json": json.dumps({"type": "string", "pattern": "^\\p{Lu}(a+)+$"})}
    codec = JsonSchemaCodec(json.dumps({"properties": {"n": {"$ref": "name.json"}}}), references=refs)
    assert codec.errors({"n": "Aaa"}) is None
    assert codec.errors({"n": "A" + "a" * 3000 + "!"}).path == "$.n"  # type: ignore[union-attr]
    with pytest.raises(JsonSchemaSchemaError, match=r"^reference 'bad\.json' #/pattern: lookahead"):
        JsonSchemaCodec(json.dumps({"$ref": "bad.json"}), references={"bad.json": '{"pattern": "(?=a)"}'})


def test_check_schema_reads_patterns_as_ecma() -> None:
    # Python's re refuses \p{L}; the metaschema's "regex" format is checked with RE2's ECMA-262 reading
    codec = JsonSchemaCodec(json.dumps({"type": "string", "pattern": "^\\p{L}+$"}))
    assert codec.errors("\u00e9t\u00e9") is None and codec.errors("1") is not None


# -- JSON Schema: every keyword that matches a schema pattern runs it on RE2 ------------------------------------
D7, D2019, D2020 = ("http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2019-09/schema",
                    "https://json-schema.org/draft/2020-12/schema")
SLOW = "^(a|aa)+$"  # Python's re: ~2**(n/1.4) steps on "a" * n + "!" (seconds at 40 characters)
SLOW_KEY = "a" * 40 + "!"


@pytest.fixture
def no_python_re(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's ``re`` inside the jsonschema library fails the test: no schema pattern may reach it."""
    import jsonschema._format
    import jsonschema._keywords
    import jsonschema._legacy_keywords
    import jsonschema._utils

    class NoRe:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"jsonschema ran re.{name} on a schema's pattern")

    for module in (jsonschema._keywords, jsonschema._utils, jsonschema._legacy_keywords, jsonschema._format):
        monkeypatch.setattr(module, "re", NoRe())


@pytest.mark.parametrize(("schema", "evil", "where", "fragment", "good"), [
    ({"type": "object", "patternProperties": {SLOW: {"type": "integer"}}, "additionalProperties": False},
     {SLOW_KEY: 1}, "$", "does not match any of the regexes", {"aaaa": 1}),
    ({"type": "object", "patternProperties": {SLOW: {}}, "additionalProperties": {"type": "integer"}},
     {SLOW_KEY: "x"}, f'$["{SLOW_KEY}"]', "is not of type", {"aa": "x"}),
    ({"$schema": D2020, "type": "object", "patternProperties": {SLOW: {}}, "unevaluatedProperties": False},
     {SLOW_KEY: 1}, "$", "Unevaluated properties are not allowed", {"aaa": 1}),
    ({"$schema": D2019, "type": "object", "patternProperties": {SLOW: {}}, "unevaluatedProperties": False},
     {SLOW_KEY: 1}, "$", "Unevaluated properties are not allowed", {"aaa": 1}),
    ({"$schema": D2020, "allOf": [{"patternProperties": {SLOW: {}}}], "unevaluatedProperties": {"type": "integer"}},
     {SLOW_KEY: "x"}, "$", "unevaluated and invalid", {"aaa": "x"}),
    ({"type": "object", "propertyNames": {"pattern": SLOW}}, {SLOW_KEY: 1}, "$", "does not match", {"aa": 1}),
    ({"$schema": D2020, "propertyNames": {"pattern": SLOW}}, {SLOW_KEY: 1}, "$", "does not match", {"aa": 1}),
])
def test_keywords_that_match_patterns_run_them_on_re2(no_python_re: None, schema: Any, evil: Any, where: str,
                                                      fragment: str, good: Any) -> None:
    """additionalProperties and unevaluatedProperties (which match names against patternProperties) and
    propertyNames.pattern: a pattern that takes seconds under Python's re never reaches it."""
    codec = JsonSchemaCodec(json.dumps(schema))
    started = time.perf_counter()
    error = codec.errors(evil)
    long_error = codec.errors({"a" * 5000 + "!": "x"})
    assert time.perf_counter() - started < 2.0  # linear: 5,000 characters at once
    assert error is not None and error.path == where and fragment in error.reason, error
    assert long_error is not None
    assert codec.errors(good) is None


def test_format_regex_never_compiles_with_python_re(no_python_re: None) -> None:
    codec = JsonSchemaCodec(json.dumps({"type": "string", "format": "regex", "pattern": "^(a+)+$"}))
    assert codec.errors("(a|aa)+") is not None and codec.errors("aaa") is None  # format: an annotation here
    with pytest.raises(JsonSchemaSchemaError):  # in a schema, "pattern" is format regex: read as ECMA on RE2
        JsonSchemaCodec(json.dumps({"pattern": "(?<=a)"}))


_BENIGN = [
    {"properties": {"id": {}}, "patternProperties": {"^x_": {"type": "integer"}, "^y": {}},
     "additionalProperties": False},
    {"properties": {"id": {}}, "patternProperties": {"^x_": {}}, "additionalProperties": {"type": "string"}},
    {"properties": {"id": {}}, "additionalProperties": False},
    {"allOf": [{"properties": {"id": {}}}, {"patternProperties": {"^x_": {"type": "integer"}}}],
     "anyOf": [{"patternProperties": {"^y": {}}}, {"required": ["zz"]}],
     "if": {"required": ["id"]}, "then": {"patternProperties": {"z$": {}}}, "else": {"properties": {"q": {}}},
     "dependentSchemas": {"id": {"patternProperties": {"^w": {}}}}, "unevaluatedProperties": False},
    {"$defs": {"p": {"patternProperties": {"^x_": {}}}}, "$ref": "#/$defs/p",
     "additionalProperties": {"type": "integer"}, "unevaluatedProperties": {"type": "string"}},
    {"properties": {"a": {"type": "integer"}}, "unevaluatedProperties": {"type": "integer"}},
    {"propertyNames": {"pattern": "^[a-z_]+$"}, "oneOf": [{"patternProperties": {"^x": {}}}, {}],
     "unevaluatedProperties": True},
]
_INSTANCES = [{}, {"id": 1}, {"x_1": 1}, {"x_1": "s"}, {"y": None, "x_2": 2}, {"id": 1, "zz": 3, "q": "w"},
              {"other": "s"}, {"other": 1, "wz": 2, "A": 3}, {"id": 1, "w1": [], "x_3": 3}, [1], "s"]


@pytest.mark.parametrize("draft", [D7, D2019, D2020])
@pytest.mark.parametrize("schema", _BENIGN)
def test_re2_keywords_give_the_jsonschema_librarys_verdicts_and_messages(draft: str, schema: Any) -> None:
    from jsonschema import validators

    from service.schemas.jsonschema_format import _re2_validator

    full = {"$schema": draft, **schema}
    stock = validators.validator_for(full)
    ours, theirs = _re2_validator(stock)(full), stock(full)
    for instance in _INSTANCES:
        got = sorted((list(e.absolute_path), e.message) for e in ours.iter_errors(instance))
        want = sorted((list(e.absolute_path), e.message) for e in theirs.iter_errors(instance))
        assert got == want, (schema, instance)


# -- JSON Schema: $ref -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("schema", "where", "ref"), [
    ({"properties": {"a": {"$ref": "#/definitions/missing"}}}, "#/properties/a/$ref", "#/definitions/missing"),
    ({"$ref": "other.json"}, "#/$ref", "other.json"),
    ({"allOf": [{"$ref": "https://example.com/s.json"}]}, "#/allOf/0/$ref", "https://example.com/s.json"),
    ({"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": "#nope"}, "#/$ref", "#nope"),
])
def test_unresolvable_ref_is_a_schema_error_naming_it(schema: Any, where: str, ref: str) -> None:
    with pytest.raises(JsonSchemaSchemaError) as info:
        JsonSchemaCodec(json.dumps(schema))
    assert str(info.value).startswith(f"{where}: the $ref {ref!r} does not resolve")


def test_resolvable_refs_still_work() -> None:
    ok = [
        ({"definitions": {"s": {"type": "string"}}, "properties": {"p": {"$ref": "#/definitions/s"}}}, None),
        ({"$id": "http://x/root.json", "definitions": {"a": {"$id": "a.json", "type": "string"}},
          "properties": {"p": {"$ref": "a.json"}}}, None),
        ({"$schema": "https://json-schema.org/draft/2020-12/schema",
          "$defs": {"a": {"$anchor": "A", "type": "string"}}, "properties": {"p": {"$ref": "#A"}}}, None),
        ({"properties": {"p": {"$ref": "lib.json#/definitions/s"}}}, {"lib.json": '{"definitions": {"s": '
                                                                                   '{"type": "string"}}}'}),
        # the drafts' metaschemas resolve (bundled with jsonschema, as the validator resolves them)
        ({"properties": {"p": {"anyOf": [{"$ref": "http://json-schema.org/draft-07/schema#"},
                                         {"type": "string"}]}}}, None),
    ]
    for schema, refs in ok:
        codec = JsonSchemaCodec(json.dumps(schema), references=refs)
        assert codec.errors({"p": "x"}) is None
        assert codec.errors({"p": 1}) is not None


def test_ref_cycle_is_the_values_error_not_a_crash() -> None:
    codec = JsonSchemaCodec(json.dumps({"definitions": {"a": {"$ref": "#/definitions/b"},
                                                        "b": {"$ref": "#/definitions/a"}},
                                        "$ref": "#/definitions/a"}))
    error = codec.errors(1)
    assert error is not None and "recurses" in error.reason


def test_codecs_turn_an_unresolvable_ref_into_a_schema_error_and_decode_errors() -> None:
    codecs = Codecs()
    with pytest.raises(SchemaError, match=r"#/\$ref: the \$ref 'x.json' does not resolve"):
        codecs.encode("jsonschema", '{"$ref": "x.json"}', 1)
    out = codecs.decode_many("jsonschema", 7, '{"$ref": "x.json"}', [b"1", b"2"])
    assert all(isinstance(d, DecodeError) and "x.json" in d.message for d in out)


# -- depth -----------------------------------------------------------------------------------------------------
def _deep_schema(levels: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"a": s}}
    return s


def _deep_value(levels: int, leaf: Any = 1) -> Any:
    v = leaf
    for _ in range(levels):
        v = {"a": v}
    return v


def test_subschema_depth_is_bounded_before_anything_recurses() -> None:
    JsonSchemaCodec(json.dumps(_deep_schema(64)))
    with pytest.raises(JsonSchemaSchemaError, match="subschemas nested deeper than 64 levels"):
        JsonSchemaCodec(json.dumps(_deep_schema(65)))
    with pytest.raises(JsonSchemaSchemaError, match="nested deeper than 440 levels"):  # not a RecursionError
        JsonSchemaCodec('{"properties":{"a":' * 450 + "{}" + "}}" * 450, max_depth=440)
    with pytest.raises(JsonSchemaSchemaError, match="subschemas nested deeper than 8 levels"):
        JsonSchemaCodec(json.dumps(_deep_schema(9)), max_depth=8)


def test_value_depth_is_bounded_on_encode_and_decode() -> None:
    recursive = json.dumps({"type": "object", "properties": {"a": {"$ref": "#"}}})
    codec = JsonSchemaCodec(recursive, validate_on_decode=True)
    assert codec.errors(_deep_value(63, {})) is None
    error = codec.errors(_deep_value(64, {}))
    assert error is not None and error.path == "$" and "deeper than 64 levels" in error.reason
    deep = b'{"a":' * 900 + b"1" + b"}" * 900
    assert isinstance(codec.decode_many([deep])[0], JsonSchemaDecodeError)
    with pytest.raises(JsonSchemaDecodeError, match="deeper than 64"):
        codec.decode(deep)
    plain = JsonSchemaCodec(recursive)  # no validation on decode: the depth is still bounded
    out = plain.decode_many([deep, b'{"a": {}}', b"[" * 64 + b"]" * 64, b"[" * 65 + b"]" * 65])
    assert isinstance(out[0], JsonSchemaDecodeError) and out[1] == {"a": {}}
    assert not isinstance(out[2], JsonSchemaDecodeError) and isinstance(out[3], JsonSchemaDecodeError)
    assert value_depth([[[]]], 2) is True and value_depth([[[]]], 3) is False and value_depth(5, 0) is False


# -- Protobuf --------------------------------------------------------------------------------------------------
def _recursive_proto() -> ProtobufCodec:
    f = descriptor_pb2.FileDescriptorProto(name="n.proto", syntax="proto3",
                                           dependency=["google/protobuf/struct.proto", "google/protobuf/any.proto"])
    m = f.message_type.add(name="N")
    m.field.add(name="n", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".N")
    m.field.add(name="v", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.Value")
    m.field.add(name="a", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.Any")
    return ProtobufCodec(f)


def _nested_wire(levels: int) -> bytes:
    b = b""
    for _ in range(levels):
        n, size = len(b), bytearray()
        while True:
            size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                break
        b = b"\x0a" + bytes(size) + b
    return b


def test_protobuf_deep_messages_are_record_errors() -> None:
    codec = _recursive_proto()
    assert codec.decode(_nested_wire(63)) is not None  # 64 messages: 64 levels of objects
    out = codec.decode_many([_nested_wire(64), _nested_wire(20_000), _nested_wire(3)])
    assert isinstance(out[0], ProtobufDecodeError) and "deeper than 64 levels" in str(out[0])
    assert isinstance(out[1], ProtobufDecodeError)  # protobuf's own parser stops at 100
    assert not isinstance(out[2], ProtobufDecodeError)
    def nested(levels: int) -> dict[str, Any]:
        v: dict[str, Any] = {}
        for _ in range(levels):
            v = {"n": v}
        return v

    assert codec.encode(nested(63))
    with pytest.raises(ProtobufEncodeError, match="deeper than 64 levels"):
        codec.encode(nested(64))


def test_protobuf_payloads_without_a_json_form_are_record_errors() -> None:
    codec = _recursive_proto()
    nan = struct_pb2.Value(number_value=float("nan")).SerializeToString()
    unknown_any = any_pb2.Any(type_url="type.googleapis.com/nope.X", value=b"\x01").SerializeToString()
    out = codec.decode_many([b"\x12" + bytes([len(nan)]) + nan, b"\x1a" + bytes([len(unknown_any)]) + unknown_any])
    assert [type(x) for x in out] == [ProtobufDecodeError, ProtobufDecodeError]
    assert "NaN" in str(out[0]) and "nope.X" in str(out[1])


# -- json format: produce side ---------------------------------------------------------------------------------
def test_json_values_past_the_render_depth_are_refused_not_a_recursion() -> None:
    from api.produce_common import JSON_MAX_DEPTH, JsonTooDeep, json_bytes, loads_exact

    assert json_bytes([[]]) == b"[[]]"
    ok = orjson_loads(b"[" * JSON_MAX_DEPTH + b"]" * JSON_MAX_DEPTH)
    assert json_bytes(ok) == b"[" * JSON_MAX_DEPTH + b"]" * JSON_MAX_DEPTH  # past orjson's 254: the stdlib
    too_deep = orjson_loads(b"[" * (JSON_MAX_DEPTH + 1) + b"]" * (JSON_MAX_DEPTH + 1))
    with pytest.raises(JsonTooDeep):
        json_bytes(too_deep)
    with pytest.raises(JsonTooDeep):  # orjson's 1000 levels would exhaust the stdlib's recursion
        loads_exact(b"[" * 1000 + b"123456789012345678901234567890" + b"]" * 1000)
    assert loads_exact(b"[123456789012345678901234567890]") == [123456789012345678901234567890]


def orjson_loads(b: bytes) -> Any:
    import orjson

    return orjson.loads(b)


# -- typed range reads -----------------------------------------------------------------------------------------
def test_typed_jsonschema_reader_refuses_a_schema_that_did_not_compile() -> None:
    from service.schemas.arrow import decode_column
    from service.schemas.arrow_types import ArrowMappingError
    from service.schemas.formats import ResolvedSchema
    from service.schemas.registry import Schema
    from service.schemas.wire import frame

    text = json.dumps({"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}})
    try:
        Codecs().codec("jsonschema", 5, text)
        raise AssertionError("compiled")
    except SchemaError as exc:
        codec: Any = exc
    bad = ResolvedSchema(5, "JSON", Schema(text, "JSON"), {}, codec)
    col = decode_column("jsonschema", [frame(5, b'{"a": 1}')], {5: bad}.get)  # the row's error
    assert col.errors[0] is not None and "#/properties/a/$ref" in col.errors[0]
    with pytest.raises(ArrowMappingError, match=r"#/properties/a/\$ref"):  # pinned: a 422 of the read, not a 500
        decode_column("jsonschema", [frame(5, b'{"a": 1}')], {5: bad}.get, reader_id=5)


def test_protobuf_depth_walk_only_for_types_that_can_nest_past_the_limit() -> None:
    f = descriptor_pb2.FileDescriptorProto(name="s.proto", package="p", syntax="proto3",
                                           dependency=["google/protobuf/timestamp.proto"])
    leaf = f.message_type.add(name="Leaf")
    leaf.field.add(name="xs", number=1, type=F.TYPE_INT32, label=F.LABEL_REPEATED)
    flat = f.message_type.add(name="Flat")
    flat.field.add(name="leaves", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".p.Leaf")
    flat.field.add(name="at", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                   type_name=".google.protobuf.Timestamp")
    shallow = ProtobufCodec(f)
    assert shallow._may_nest_past_limit(shallow.message_class([1]).DESCRIPTOR) is False  # 4 levels at most
    assert ProtobufCodec(f, max_depth=8)._may_nest_past_limit(shallow.message_class([1]).DESCRIPTOR) is False
    recursive = _recursive_proto()
    assert recursive._may_nest_past_limit(recursive.message_class([0]).DESCRIPTOR) is True


def test_schema_max_depth_setting_reaches_every_codec() -> None:
    from pydantic import ValidationError as SettingsError

    from service.schemas.formats import SchemaService
    from service.schemas.registry import RegistryConfig
    from service.settings import Settings

    assert Settings(kafka_bootstrap="x:1").schema_max_depth == 64
    for bad in (7, 1001):
        with pytest.raises(SettingsError):
            Settings(kafka_bootstrap="x:1", schema_max_depth=bad)
    service = SchemaService(RegistryConfig("http://127.0.0.1:1"), max_depth=9)
    codecs = service.resolver(None, "jsonschema").codecs
    assert codecs.max_depth == 9
    with pytest.raises(SchemaError, match="deeper than 9 levels"):
        codecs.codec("jsonschema", None, json.dumps(_deep_schema(10)))
    assert codecs.codec("protobuf", None, _recursive_proto()._fdp).max_depth == 9
