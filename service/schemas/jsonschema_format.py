"""JSON Schema payloads: the payload is JSON text, the schema a JSON Schema. Sans-io.

Decode parses with orjson (and, when asked, validates: Karapace's REST proxy validates on consume, Confluent's
JSON Schema deserializer does not by default); encode validates the value, then serializes it compactly.
Validation errors name the path of the offending value, ``$.items[2].price``, like the Avro codec.

Schemas without ``$schema`` are read as draft-07 (Confluent's default); a ``$schema`` naming another draft
selects it. Schema references (the registry's ``references``: name -> schema) resolve through ``$ref``.

Hostile schemas and values (every check names the schema path, ``#/properties/name/pattern``):

* ``pattern`` and ``patternProperties`` are ECMA-262 regular expressions run on RE2 (linear time,
  :mod:`service.schemas.ecma_regex`), never on Python's backtracking ``re`` -- also where
  ``additionalProperties`` and ``unevaluatedProperties`` match names against ``patternProperties``; a
  pattern RE2 cannot run (backreferences, lookaround) is refused when the schema compiles;
* every ``$ref`` must resolve (in the schema or its references) when the schema compiles;
* subschemas nest at most ``max_depth`` levels (GATEWAY_SCHEMA_MAX_DEPTH), and a value (encoded, or
  decoded, validated or not) at most ``max_depth`` levels of arrays and objects; a ``$ref`` cycle that
  never reaches a value is an error of the value it was validating, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any

import orjson
from jsonschema import Draft7Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT7, lookup_recursive_ref, specification_with

from service.schemas.ecma_regex import EcmaRegexError, compile_pattern
from service.schemas.errors import CodecDecodeError, CodecEncodeError, CodecSchemaError

#: GATEWAY_SCHEMA_MAX_DEPTH's default: nesting of subschemas, and of arrays/objects in a validated value
DEFAULT_MAX_DEPTH = 64


class JsonSchemaSchemaError(CodecSchemaError):
    """The schema is not a valid JSON Schema (or not JSON)."""


class JsonSchemaEncodeError(CodecEncodeError):
    """A value does not validate; ``path`` names it (``$`` is the root)."""


class JsonSchemaDecodeError(CodecDecodeError):
    """A payload is not JSON, or (when validating) does not validate."""


def _load(schema: str | bytes | Mapping[str, Any] | bool) -> Any:
    if isinstance(schema, (str, bytes)):
        try:
            return orjson.loads(schema)
        except orjson.JSONDecodeError as exc:
            raise JsonSchemaSchemaError(f"schema is not JSON: {exc}") from None
    return schema


def json_path(parts: Iterable[str | int]) -> str:
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "a").isalnum():
            out += f".{part}"
        else:
            out += f"[{orjson.dumps(part).decode()}]"
    return out


def _pointer(path: Iterable[str | int]) -> str:
    """A JSON pointer as a URI fragment: ``#/properties/a~1b/pattern``."""
    out = "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)
    return out if len(out) <= 300 else out[:150] + "…" + out[-150:]


def value_depth(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects deeper than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, (list, tuple)):
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in v if isinstance(child, (dict, list, tuple)))
    return False


# -- keywords that run patterns on RE2 --------------------------------------------------------------------------
def _re2_pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string") or not isinstance(pattern, str):
        return
    try:
        regex = compile_pattern(pattern)
    except EcmaRegexError as exc:  # a pattern compile did not see (e.g. reached through an unknown keyword)
        yield ValidationError(f"the pattern {pattern!r} cannot run: {exc}")
        return
    try:
        found = regex.search(instance)
    except UnicodeEncodeError:  # a lone surrogate: not text RE2 (UTF-8) can read
        yield ValidationError(f"{instance!r} is not valid Unicode text (a lone surrogate)")
        return
    if found is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _re2_pattern_properties(validator: Any, pattern_properties: Any, instance: Any,
                            schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object") or not isinstance(pattern_properties, dict):
        return
    for pattern, subschema in pattern_properties.items():
        try:
            regex = compile_pattern(pattern)
        except EcmaRegexError as exc:
            yield ValidationError(f"the pattern {pattern!r} cannot run: {exc}")
            continue
        for k, v in instance.items():
            try:
                found = regex.search(k)
            except UnicodeEncodeError:
                yield ValidationError(f"the property name {k!r} is not valid Unicode text (a lone surrogate)")
                continue
            if found is not None:
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _matches_a_pattern(patterns: Any, key: str) -> bool:
    """Whether a property name matches one of a ``patternProperties``' patterns (on RE2; a pattern RE2
    cannot run, or a name that is not valid Unicode, matches nothing: ``patternProperties`` reports those)."""
    if not isinstance(patterns, dict):
        return False
    for pattern in patterns:
        try:
            if compile_pattern(pattern).search(key) is not None:
                return True
        except (EcmaRegexError, UnicodeEncodeError, TypeError):
            continue
    return False


def _re2_additional_properties(validator: Any, additional: Any, instance: Any,
                               schema: Any) -> Iterator[ValidationError]:
    """``additionalProperties``: the properties neither named by ``properties`` nor matched by a pattern of
    ``patternProperties`` (on RE2) hold to it; the messages are the jsonschema library's."""
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [k for k in instance if k not in named and not _matches_a_pattern(patterns, k)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            names = ", ".join(repr(k) for k in sorted(extras))
            yield ValidationError(f"{names} {verb} not match any of the regexes: "
                                  f"{', '.join(repr(p) for p in sorted(patterns))}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({_extras(sorted(extras, key=str))} "
                                  f"unexpected)")


def _extras(names: list[Any]) -> str:
    verb = "was" if len(names) == 1 else "were"
    return f"{', '.join(repr(n) for n in names)} {verb}"


def _valid_under(validator: Any, instance: Any, subschema: Any) -> bool:
    return next(validator.descend(instance, subschema), None) is None


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any, legacy: bool) -> set[str]:
    """The property names of ``instance`` that ``schema`` (and what it applies in place: ``$ref``, ``allOf``,
    ``if``...) evaluates, as the jsonschema library finds them for ``unevaluatedProperties`` (``legacy``: its
    draft 2019-09 variant), with the ``patternProperties`` patterns on RE2."""
    if not isinstance(schema, dict):
        return set()
    keys: set[str] = set()

    def into(resolved: Any) -> None:
        keys.update(_evaluated_keys(validator.evolve(schema=resolved.contents, _resolver=resolved.resolver),
                                    instance, resolved.contents, legacy))

    ref = schema.get("$ref")
    if ref is not None:
        into(validator._resolver.lookup(ref))
    if legacy:
        if "$recursiveRef" in schema:
            into(lookup_recursive_ref(validator._resolver))
        for keyword in ("properties", "additionalProperties", "unevaluatedProperties"):
            value = schema.get(keyword)
            if value is True:
                keys.update(instance)
            elif isinstance(value, dict):
                keys.update(k for k in value if k in instance)
    else:
        if schema.get("$dynamicRef") is not None:
            into(validator._resolver.lookup(schema["$dynamicRef"]))
        if isinstance(schema.get("properties"), dict):
            keys.update(schema["properties"].keys() & instance.keys())
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            sub = schema.get(keyword)
            if sub is not None:
                keys.update(k for k, v in instance.items() if _valid_under(validator, v, sub))
    if "patternProperties" in schema:
        keys.update(k for k in instance if _matches_a_pattern(schema["patternProperties"], k))
    for name, sub in (schema.get("dependentSchemas") or {}).items():
        if name in instance:
            keys.update(_evaluated_keys(validator, instance, sub, legacy))
    for keyword in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(keyword, []):
            if _valid_under(validator, instance, sub):
                keys.update(_evaluated_keys(validator, instance, sub, legacy))
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys.update(_evaluated_keys(validator, instance, schema["if"], legacy))
            if "then" in schema:
                keys.update(_evaluated_keys(validator, instance, schema["then"], legacy))
        elif "else" in schema:
            keys.update(_evaluated_keys(validator, instance, schema["else"], legacy))
    return keys


def _re2_unevaluated_properties(legacy: bool) -> Any:
    """``unevaluatedProperties`` (``legacy``: draft 2019-09's) with :func:`_evaluated_keys`; the messages are
    the jsonschema library's."""

    def keyword(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated_keys(validator, instance, schema, legacy)
        bad = [k for k in instance if k not in evaluated
               and next(validator.descend(instance[k], unevaluated, path=k, schema_path=k), None) is not None]
        if not bad:
            return
        if unevaluated is False:
            yield ValidationError(f"Unevaluated properties are not allowed ({_extras(sorted(bad, key=str))} "
                                  f"unexpected)")
        else:
            yield ValidationError(f"Unevaluated properties are not valid under the given schema "
                                  f"({_extras(bad)} unevaluated and invalid)")
    return keyword


@cache
def _re2_validator(cls: Any) -> Any:
    """The draft's validator class with every keyword that matches a schema's patterns on RE2 (one per
    draft): ``pattern``, ``patternProperties``, and ``additionalProperties`` / ``unevaluatedProperties``,
    which the jsonschema library otherwise matches against ``patternProperties`` with Python's ``re``
    (``propertyNames`` applies ``pattern``; ``format: regex`` is only checked on schemas, by
    :func:`_meta_format_checker`)."""
    replaced = {"pattern": _re2_pattern, "patternProperties": _re2_pattern_properties,
                "additionalProperties": _re2_additional_properties}
    if "unevaluatedProperties" in cls.VALIDATORS:
        replaced["unevaluatedProperties"] = _re2_unevaluated_properties(legacy=cls.META_SCHEMA.get("$schema", "")
                                                                        .endswith("2019-09/schema"))
    return validators.extend(cls, replaced)


def _is_regex(value: object) -> bool:
    if isinstance(value, str):
        compile_pattern(value)
    return True


@cache
def _meta_format_checker(cls: Any) -> FormatChecker:
    """The draft's format checker for ``check_schema``, its ``regex`` format checked as ECMA-262 on RE2."""
    meta = validators.validator_for(cls.META_SCHEMA, default=cls)
    checker = FormatChecker(())
    checker.checkers = {**meta.FORMAT_CHECKER.checkers, "regex": (_is_regex, (EcmaRegexError,))}
    return checker


# subschema keywords (every draft's): one subschema, a list of them, a map name -> subschema
_SUB_ONE = ("additionalProperties", "additionalItems", "items", "contains", "propertyNames", "if", "then",
            "else", "not", "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_SUB_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUB_MAP = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies")


def _check_document(root: Any, where: str, resolver: Any, spec: Any, max_depth: int) -> None:
    """Refuse (JsonSchemaSchemaError naming the schema path) subschemas nested deeper than ``max_depth``,
    a pattern RE2 cannot run and a ``$ref`` that does not resolve. Iterative: a deep schema cannot
    overflow the stack here."""
    stack: list[tuple[Any, tuple[str | int, ...], Any, int]] = [(root, (), resolver, 0)]
    while stack:
        node, path, res, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        if depth > max_depth:
            raise JsonSchemaSchemaError(f"{where}{_pointer(path)}: subschemas nested deeper than {max_depth} "
                                        f"levels (GATEWAY_SCHEMA_MAX_DEPTH)")
        try:
            res = res.in_subresource(spec.create_resource(node))
        except Exception:  # an $id that is not a string: check_schema names it
            pass
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            try:
                compile_pattern(pattern)
            except EcmaRegexError as exc:
                raise JsonSchemaSchemaError(f"{where}{_pointer((*path, 'pattern'))}: {exc}") from None
        ref = node.get("$ref")
        if isinstance(ref, str):
            try:
                res.lookup(ref)
            except Unresolvable:
                raise JsonSchemaSchemaError(f"{where}{_pointer((*path, '$ref'))}: the $ref {ref!r} does not "
                                            f"resolve (not in the schema nor in its references)") from None
            except Exception as exc:  # e.g. a malformed URI
                raise JsonSchemaSchemaError(f"{where}{_pointer((*path, '$ref'))}: the $ref {ref!r} does not "
                                            f"resolve: {exc}") from None
        for key in _SUB_ONE:
            sub = node.get(key)
            if isinstance(sub, dict):
                stack.append((sub, (*path, key), res, depth + 1))
        for key in _SUB_LIST:
            subs = node.get(key)
            if isinstance(subs, list):
                stack.extend((sub, (*path, key, i), res, depth + 1) for i, sub in enumerate(subs))
        for key in _SUB_MAP:
            subs = node.get(key)
            if not isinstance(subs, dict):
                continue
            for name, sub in subs.items():
                if key == "patternProperties":
                    try:
                        compile_pattern(name)
                    except EcmaRegexError as exc:
                        raise JsonSchemaSchemaError(f"{where}{_pointer((*path, key, name))}: {exc}") from None
                stack.append((sub, (*path, key, name), res, depth + 1))


class JsonSchemaCodec:
    """One schema compiled once into a validator."""

    format = "jsonschema"

    def __init__(
        self,
        schema: str | bytes | Mapping[str, Any] | bool,
        *,
        references: Mapping[str, str | bytes | Mapping[str, Any]] | None = None,
        validate_on_decode: bool = False,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        loaded = _load(schema)
        cls = validators.validator_for(loaded, default=Draft7Validator) if isinstance(loaded, dict) else Draft7Validator
        self.max_depth = max_depth
        registry: Registry = Registry()
        loaded_refs: dict[str, Resource[Any]] = {}
        for name, ref_schema in (references or {}).items():
            try:
                resource = Resource.from_contents(_load(ref_schema), default_specification=DRAFT7)
            except JsonSchemaSchemaError:
                raise
            except Exception as exc:  # e.g. an unknown $schema in a reference
                raise JsonSchemaSchemaError(f"reference {name!r}: {exc}") from None
            loaded_refs[name] = resource
            registry = registry.with_resource(name, resource)
        spec = specification_with(cls.META_SCHEMA.get("$id", ""), default=DRAFT7)
        try:
            root = spec.create_resource(loaded)
        except Exception as exc:  # e.g. an $id that is not a string
            raise JsonSchemaSchemaError(f"not a valid JSON Schema: {exc}") from None
        # before check_schema: that one recurses (a deep schema would exhaust the stack there). $refs resolve
        # as the validator resolves them: the references, and the drafts' metaschemas (bundled, no network)
        known = SPECIFICATIONS.combine(registry)
        _check_document(loaded, "", known.resolver_with_root(root), spec, max_depth)
        for name, resource in loaded_refs.items():
            _check_document(resource.contents, f"reference {name!r} ", known.resolver(base_uri=name),
                            resource._specification, max_depth)
        try:
            # the stubs omit check_schema's format_checker (jsonschema >= 4.5 has it)
            cls.check_schema(loaded, format_checker=_meta_format_checker(cls))  # type: ignore[call-arg]
        except SchemaError as exc:
            where = _pointer(exc.absolute_path)
            raise JsonSchemaSchemaError(f"not a valid JSON Schema: {where}: {exc.message}") from None
        except RecursionError:
            raise JsonSchemaSchemaError("not a valid JSON Schema: nested too deeply") from None
        self._validator = _re2_validator(cls)(loaded, registry=registry)
        self.validate_on_decode = validate_on_decode
        self.record_name = loaded.get("title") if isinstance(loaded, dict) else None  # RecordNameStrategy

    def errors(self, value: Any) -> JsonSchemaEncodeError | None:
        if value_depth(value, self.max_depth):
            return JsonSchemaEncodeError("$", f"arrays and objects nested deeper than {self.max_depth} levels "
                                              f"(GATEWAY_SCHEMA_MAX_DEPTH)")
        try:
            error: ValidationError | None = best_match(self._validator.iter_errors(value))
        except RecursionError:  # a $ref cycle that never descends into the value
            return JsonSchemaEncodeError("$", "the schema recurses without end ($ref cycle)")
        except Unresolvable as exc:  # a $ref compile could not see (e.g. $dynamicRef)
            return JsonSchemaEncodeError("$", f"a $ref of the schema does not resolve: {exc}")
        if error is None:
            return None
        return JsonSchemaEncodeError(json_path(error.absolute_path), error.message)

    def validate(self, value: Any) -> None:
        error = self.errors(value)
        if error is not None:
            raise error

    def encode(self, value: Any) -> bytes:
        self.validate(value)
        try:
            return orjson.dumps(value)
        except TypeError as exc:  # e.g. an integer beyond 64 bits
            raise JsonSchemaEncodeError("$", str(exc)) from None

    def _too_deep(self, payload: bytes | bytearray | memoryview, value: Any) -> JsonSchemaDecodeError | None:
        """Nested past ``max_depth`` (also without validation: the answer must stay renderable); a value that
        deep takes at least two bytes per level, so short payloads are not walked."""
        if len(payload) > 2 * self.max_depth and value_depth(value, self.max_depth):
            return JsonSchemaDecodeError(f"arrays and objects nested deeper than {self.max_depth} levels "
                                         f"(GATEWAY_SCHEMA_MAX_DEPTH)")
        return None

    def decode(self, payload: bytes | bytearray | memoryview) -> Any:
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise JsonSchemaDecodeError(f"not valid JSON: {exc}") from None
        deep = self._too_deep(payload, value)
        if deep is not None:
            raise deep
        if self.validate_on_decode:
            error = self.errors(value)
            if error is not None:
                raise JsonSchemaDecodeError(f"does not match the schema: {error}")
        return value

    def decode_many(self, payloads: Iterable[bytes | bytearray | memoryview]) -> list[Any]:
        out: list[Any] = []
        append = out.append
        loads = orjson.loads
        validate = self.validate_on_decode
        for payload in payloads:
            try:
                value = loads(payload)
            except orjson.JSONDecodeError as exc:
                append(JsonSchemaDecodeError(f"not valid JSON: {exc}"))
                continue
            deep = self._too_deep(payload, value)
            if deep is not None:
                append(deep)
                continue
            if validate:
                error = self.errors(value)
                if error is not None:
                    append(JsonSchemaDecodeError(f"does not match the schema: {error}"))
                    continue
            append(value)
        return out
