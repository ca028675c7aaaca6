"""StructuredOutputsParams -> the grammar text llguidance compiles (no compilation here).

JSON is written with ", " and ": " between items and no other whitespace by default: a small model given
free whitespace may spend its whole budget on newlines; `whitespace_pattern` opens it up (a regex for the
whitespace allowed between JSON tokens), `disable_any_whitespace` closes it to "," and ":".
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
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=json_options(spec))  # type: ignore[arg-type]
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
