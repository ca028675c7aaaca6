"""StructuredOutputsParams -> the grammar text llguidance compiles (no compilation here).

JSON is written with ", " and ": " between items and no other whitespace by default: a small model given
free whitespace may spend its whole budget on newlines; `whitespace_pattern` opens it up (a regex for the
whitespace allowed between JSON tokens), `disable_any_whitespace` closes it to "," and ":".

An object schema that declares `properties` and says nothing of `additionalProperties` gets only those
properties (as vLLM's default backend, xgrammar, and OpenAI's strict mode treat it; plain JSON Schema would
allow any other key, and a small model then invents keys until its budget runs out). A schema that says
`"additionalProperties": true` (or a schema for them) keeps them; an object without declared properties
stays open; the members of an allOf are left open (closing each would forbid the others' properties).
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from tokenmill.sampling_params import ParamError, StructuredOutputsParams

# what each kind of constraint is called in an error message
WHAT = {"json": "the JSON schema", "json_object": "the JSON object grammar", "regex": "the regex",
        "choice": "the choice", "grammar": "the grammar"}


def json_options(spec: StructuredOutputsParams) -> dict[str, Any]:
    """llguidance's JSON compile options for spec's whitespace settings."""
    if spec.whitespace_pattern is not None:
        return {"item_separator": ",", "key_separator": ":", "whitespace_flexible": True,
                "whitespace_pattern": spec.whitespace_pattern}
    if spec.disable_any_whitespace:
        return {"item_separator": ",", "key_separator": ":", "whitespace_flexible": False}
    return {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
_SUBSCHEMAS = ("items", "additionalItems", "contains", "not", "if", "then", "else", "additionalProperties",
               "propertyNames", "unevaluatedItems")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")


def closed_objects(schema: Any, close: bool = True) -> Any:
    """A copy of `schema` with `"additionalProperties": false` on every object schema that declares
    properties and leaves additionalProperties (and patternProperties, unevaluatedProperties) unsaid."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(v) for v in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(v, close=False) for v in out["allOf"]]
    if (close and isinstance(out.get("properties"), dict) and out["properties"]
            and not {"additionalProperties", "patternProperties", "unevaluatedProperties"} & out.keys()):
        out["additionalProperties"] = False
    return out


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for spec. Raises ParamError for input that is not even the right kind of
    thing (a schema that is not JSON, a choice that is not strings); compile errors come later, from the
    matcher (manager.py)."""
    if spec.json is not None or spec.json_object:
        schema: Any = {"type": "object"} if spec.json_object else spec.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ParamError(spec.source, f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ParamError(spec.source, f"a JSON schema must be an object, got {type(schema).__name__}")
        try:
            closed, options = closed_objects(schema), json_options(spec)
            return llguidance.LLMatcher.grammar_from_json_schema(closed, defaults=options)  # type: ignore[arg-type]
        except ValueError as e:
            raise ParamError(spec.source, f"invalid JSON schema: {e}") from None
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        # Lark string literals take JSON's escapes
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
    assert spec.grammar is not None
    try:
        return llguidance.grammar_from("grammar", spec.grammar)  # Lark as it is; GBNF / EBNF converted
    except ValueError as e:
        raise ParamError(spec.source, f"invalid grammar: {e}") from None
