"""api.openapi.to_openapi_30: FastAPI's OpenAPI 3.1 schemas become 3.0.3 ones client generators handle."""

from __future__ import annotations

from typing import Any

from api.openapi import to_openapi_30


def _convert(schema: dict[str, Any], components: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = {"openapi": "3.1.0", "info": {"title": "t", "version": "1", "license": {"name": "x", "identifier": "MIT"}},
           "paths": {"/p": {"post": {"parameters": [{"name": "q", "in": "query", "schema": schema}],
                                     "requestBody": {"content": {"application/json": {"schema": schema}}},
                                     "responses": {"200": {"description": "ok",
                                                           "content": {"application/json": {"schema": schema}}}}}}},
           "components": {"schemas": {"S": schema, **(components or {})}}}
    out = to_openapi_30(doc)
    assert out["openapi"] == "3.0.3" and "identifier" not in out["info"]["license"]
    return out


def test_null_alternatives_become_nullable() -> None:
    out = _convert({"anyOf": [{"type": "integer", "maximum": 5}, {"type": "null"}], "title": "X"})
    assert out["components"]["schemas"]["S"] == {"title": "X", "type": "integer", "maximum": 5, "nullable": True}
    # an optional query parameter is absent, never null
    assert out["paths"]["/p"]["post"]["parameters"][0]["schema"] == {"title": "X", "type": "integer", "maximum": 5}


def test_type_lists_and_several_alternatives() -> None:
    s = _convert({"type": ["string", "null"], "contentEncoding": "base64"})["components"]["schemas"]["S"]
    assert s == {"type": "string", "format": "byte", "nullable": True}
    s = _convert({"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[0-9]+$"}, {"type": "null"}]})
    assert s["components"]["schemas"]["S"] == {"anyOf": [{"type": "integer", "nullable": True},
                                                         {"type": "string", "pattern": "^[0-9]+$", "nullable": True}]}
    s = _convert({"type": ["integer", "string"]})["components"]["schemas"]["S"]
    assert s == {"anyOf": [{"type": "integer"}, {"type": "string"}]}


def test_nullable_reference_gets_the_referenced_type() -> None:
    out = _convert({"anyOf": [{"$ref": "#/components/schemas/M"}, {"type": "null"}], "title": "Body"},
                   {"M": {"type": "object", "properties": {"a": {"type": "string"}}}})
    assert out["components"]["schemas"]["S"] == {"allOf": [{"$ref": "#/components/schemas/M"}], "title": "Body",
                                                 "type": "object", "nullable": True}
    body = out["paths"]["/p"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "title" not in body and body["nullable"] is True  # no model named "Body"


def test_31_only_keywords() -> None:
    s = _convert({"type": "object", "properties": {
        "c": {"const": "x"}, "e": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
        "x": {"type": "string", "examples": ["a", "b"]}, "r": {"$ref": "#/components/schemas/S", "description": "d"},
        "n": {"type": ["string", "null"], "enum": ["a"]},
        "any": {"anyOf": [{}, {"type": "null"}]}}})["components"]["schemas"]["S"]["properties"]
    assert s["c"] == {"enum": ["x"]}
    assert s["e"] == {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 10,
                      "exclusiveMaximum": True}
    assert s["x"] == {"type": "string", "example": "a"}
    assert s["r"] == {"allOf": [{"$ref": "#/components/schemas/S"}], "description": "d"}  # 3.0 ignores $ref siblings
    assert s["n"] == {"type": "string", "enum": ["a", None], "nullable": True}
    assert s["any"] == {}  # an untyped schema admits null already
