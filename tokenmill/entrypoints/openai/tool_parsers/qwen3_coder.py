"""Qwen3-Coder / Qwen3.5 (vLLM's `qwen3_coder`): each call is an XML-like block, one parameter per tag.

    Let me check.
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Their chat templates teach this (the `<function=NAME>` block inside `<tool_call>` tags). A parameter's value
is raw text, less one newline either side; it ends at `</parameter>` (or, as vLLM reads it, where the next
`<parameter=` or `</function>` starts). Values are typed by the request's schema for that parameter, as vLLM's
parser does: integer and number become numbers when they read as one, boolean `true` / `false` a bool, object
and array their JSON when it parses, `null` (any type) None; a string parameter, one the schema does not
describe, or a value that does not convert stays the text. A `<tool_call>` block may hold several functions;
a `<function=...>...</function>` block outside any `<tool_call>` counts too (vLLM reads those when a model
leaves the tags out). Text outside the blocks is content. A call is whole at `</tool_call>` (at the end of
the text, a block whose `</tool_call>` never came still counts if its functions are complete); a block cut
before its `</function>` (max_tokens) is no call, its text is content, as for the other formats.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from tokenmill.entrypoints.openai.tool_parsers.base import (PENDING, Call, CallCheck, Item, ToolFormat, held_back)

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_MARKERS = (START, FUNCTION)  # what starts a call in the text
_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
# the schema type names each conversion answers to (JSON Schema's, and the aliases vLLM's parser reads)
_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INTEGER_TYPES = ("int", "uint", "long", "short", "unsigned")  # prefixes
_NUMBER_TYPES = ("num", "float", "double")  # prefixes
_BOOLEAN_TYPES = {"boolean", "bool", "binary"}
_OBJECT_TYPES = ("object", "dict")  # prefixes
_ARRAY_TYPES = ("array", "arr", "list")  # prefixes

Schemas = Mapping[str, Mapping[str, Any]]  # function name -> its parameters' JSON schema


class Qwen3CoderToolParser(ToolFormat):
    name = "qwen3_coder"

    def __init__(self, accept: CallCheck | None = None, max_calls: int | None = None,
                 schemas: Schemas | None = None,
                 tools: list[dict[str, Any]] | None = None) -> None:
        """`schemas` (ToolCalling.parser passes them): function name -> parameters schema, which types the
        values; or `tools`, OpenAI tool objects to take them from; with neither, every value is text."""
        super().__init__(accept, max_calls, _schemas(tools) if tools is not None else schemas)

    def scan(self, text: str, is_final: bool) -> list[Item]:
        items: list[Item] = []
        pos = 0
        while True:
            found = [(i, m) for m in _MARKERS if (i := text.find(m, pos)) >= 0]
            if not found:
                tail = text[pos:]
                items.append(tail if is_final else tail[:len(tail) - max(held_back(tail, m) for m in _MARKERS)])
                return items
            start, marker = min(found)
            items.append(text[pos:start])
            if marker == START:
                end_marker, body_start = END, start + len(START)
            else:  # a function outside <tool_call> tags: it ends at its </function>, unless a <tool_call> comes first
                end_marker, body_start = FUNCTION_END, start
                opened = text.find(START, start)
                closed = text.find(FUNCTION_END, start)
                if opened >= 0 and (closed < 0 or opened < closed):
                    items.append(text[start:opened])
                    pos = opened
                    continue
            end = text.find(end_marker, body_start)
            if end < 0 and not is_final:
                items.append(PENDING)
                return items
            stop = len(text) if end < 0 else end + len(end_marker)
            raw = text[start:stop]
            body_end = len(text) if end < 0 else end if marker == START else stop
            calls = self._functions(text[body_start:body_end], raw)
            items.extend(calls if calls is not None else [raw])
            if end < 0:
                return items
            pos = stop

    def _functions(self, body: str, raw: str) -> list[Call] | None:
        """The calls `body` writes: one or more `<function=NAME>...</function>` blocks and whitespace, each a
        call `accept` takes; None if anything else is there (the block's text is then content)."""
        calls: list[Call] = []
        pos = 0
        while True:
            while pos < len(body) and body[pos].isspace():
                pos += 1
            if pos == len(body):
                break
            if not body.startswith(FUNCTION, pos):
                return None
            name_end = body.find(">", pos)
            end = body.find(FUNCTION_END, pos)
            if name_end < 0 or end < 0 or end < name_end:
                return None
            name = _tag_name(body[pos + len(FUNCTION):name_end])
            arguments = self._parameters(name, body[name_end + 1:end]) if name is not None else None
            call = self.make_call(name, arguments, body[pos:end + len(FUNCTION_END)]) if arguments is not None else None
            if call is None:
                return None
            calls.append(call)
            pos = end + len(FUNCTION_END)
        if len(calls) == 1:  # a block of one call: all of it goes back to the content if the call is not kept
            calls[0] = Call(calls[0].name, calls[0].arguments, raw)
        return calls or None

    def _parameters(self, function: str, body: str) -> dict[str, Any] | None:
        """The arguments in a function's body (between `<function=NAME>` and `</function>`), typed by its
        schema; None if the body is not parameter blocks and whitespace."""
        schema = self.schemas.get(function)
        properties = schema.get("properties") if schema is not None else None
        if not isinstance(properties, Mapping):
            properties = {}
        arguments: dict[str, Any] = {}
        pos = 0
        while True:
            while pos < len(body) and body[pos].isspace():
                pos += 1
            if pos == len(body):
                return arguments
            if not body.startswith(PARAMETER, pos):
                return None
            name_end = body.find(">", pos)
            name = _tag_name(body[pos + len(PARAMETER):name_end]) if name_end >= 0 else None
            if name is None:
                return None
            value_start = name_end + 1
            close = body.find(PARAMETER_END, value_start)
            following = body.find(PARAMETER, value_start)
            if close >= 0 and (following < 0 or close < following):
                value_end, pos = close, close + len(PARAMETER_END)
            elif following >= 0:  # no </parameter>: the value runs to the next parameter (vLLM reads it so)
                value_end = pos = following
            else:  # ... or to </function>
                value_end = pos = len(body)
            value = body[value_start:value_end]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            arguments[name] = convert(value, properties.get(name))

    def format_instructions(self, tools: list[dict[str, Any]], is_parallel: bool) -> str:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        how_many = ("You may make several calls, one <tool_call> block each." if is_parallel
                    else "Make at most one call per answer.")
        return ("You can call functions to answer. These are the functions, as JSON schemas, between <tools> "
                f"and </tools>:\n<tools>\n{listed}\n</tools>\n\nTo call a function, answer in this format, one "
                "<parameter> block per argument, its value as plain text (objects and arrays as JSON):\n"
                "<tool_call>\n<function=the_function_name>\n<parameter=the_first_argument>\nits value\n"
                "</parameter>\n<parameter=the_second_argument>\nits value, which may span\nseveral lines\n"
                f"</parameter>\n</function>\n</tool_call>\n{how_many} You may write your reasoning before the "
                "call, not after it. A function's result comes back in the next message, between <tool_response> "
                "and </tool_response>. If no function helps, answer in plain text.")

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """As Qwen's templates write them: strings as they are, other values as JSON (so they read back typed)."""
        def block(name: str, arguments: Any) -> str:
            params = arguments.items() if isinstance(arguments, Mapping) else []
            written = "".join(f"{PARAMETER}{k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                              f"\n{PARAMETER_END}\n" for k, v in params)
            return f"{START}\n{FUNCTION}{name}>\n{written}{FUNCTION_END}\n{END}"
        return "\n".join(block(n, a) for n, a in calls)


def convert(value: str, schema: Any) -> Any:
    """A parameter's text as the value its schema's type says (the module doc); the text when it says none
    or the text does not read as that type."""
    if value.strip().lower() == "null":
        return None
    if not isinstance(schema, Mapping):
        return value
    types = schema.get("type")
    if types is None:  # {"anyOf": [{"type": "integer"}, {"type": "string"}]} and the like
        types = [b.get("type") for key in ("anyOf", "oneOf") for b in schema.get(key) or []
                 if isinstance(b, Mapping) and isinstance(b.get("type"), str)]
    for t in types if isinstance(types, list) else [types]:  # the first of the types that the text reads as
        if not isinstance(t, str):
            continue
        converted = _as_type(value, t.strip().lower())
        if converted is not _NO:
            return converted
    return value


_NO = object()  # the text does not read as the type


def _as_type(value: str, t: str) -> Any:
    text = value.strip()
    if t in _STRING_TYPES:
        return value
    if t.startswith(_INTEGER_TYPES):
        if _INTEGER.fullmatch(text):
            return int(text)
        if _NUMBER.fullmatch(text) and math.isfinite(f := float(text)) and f.is_integer():  # 3.0, 1e3
            return int(f)
        return _NO
    if t.startswith(_NUMBER_TYPES):
        if _INTEGER.fullmatch(text):
            return int(text)
        if _NUMBER.fullmatch(text) and math.isfinite(f := float(text)):
            return f
        return _NO
    if t in _BOOLEAN_TYPES:
        return {"true": True, "false": False}.get(text.lower(), _NO)
    if t.startswith(_OBJECT_TYPES) or t.startswith(_ARRAY_TYPES):
        decoded = _json(text)
        wanted = dict if t.startswith(_OBJECT_TYPES) else list
        return decoded if isinstance(decoded, wanted) else _NO
    return _NO  # "null" (handled first), or a type this does not know


def _json(text: str) -> Any:
    """json.loads without NaN and Infinity (not JSON: the arguments must stay JSON text); _NO if not JSON."""
    def refuse(constant: str) -> Any:
        raise ValueError(constant)
    try:
        return json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        return _NO


def _tag_name(text: str) -> str | None:
    """The name in `<function=NAME>` / `<parameter=NAME>`, None if it is no name (empty, or spans lines or tags)."""
    name = text.strip()
    return name if name and not any(c in name for c in "<>\n") else None


def _schemas(tools: Schemas | list[dict[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Function name -> parameters schema, from such a mapping or from OpenAI tool objects."""
    if isinstance(tools, Mapping):
        return {n: s for n, s in tools.items() if isinstance(s, Mapping)}
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and isinstance(fn.get("parameters"), Mapping):
            out[fn["name"]] = fn["parameters"]
    return out

