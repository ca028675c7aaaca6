"""ToolCalling: what a request's `tools`, `tool_choice` and `parallel_tool_calls` ask for, checked once.

    tool_choice   what the model may do                          how the answer is read
    "none"        answer in text; the tools are not offered       as text
    "auto"        answer, or call tools in its family's format    the format's parser (tool_parsers/)
    "required"    call one or more tools                          a JSON schema constrains the output to
                                                                  [{"name": ..., "parameters": ...}, ...]
    named         call that function                              a JSON schema constrains the output to
                                                                  its arguments object

The forced choices go through SamplingParams.structured_outputs, so their calls always parse (until
max_tokens cuts them). `parallel_tool_calls: false` allows one call (maxItems 1; the parser keeps the first).
A tool with `strict: true` never yields a call whose arguments break its schema: in "auto" such a call stays
content, forced calls are constrained by the schema anyway. Every problem is a ParamError naming the field.
Used by the chat endpoint and by the offline `LLM.chat` alike.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
import referencing.exceptions

from tokenmill.entrypoints.openai.protocol import ChatCompletionTool, NamedToolChoice
from tokenmill.entrypoints.openai.tool_parsers import (NamedToolParser, ParsedOutput, RequiredToolParser, ToolFormat,
                                                       ToolParser)
from tokenmill.sampling_params import ParamError, StructuredOutputsParams

MAX_TOOLS = 128  # OpenAI's limit
MAX_SCHEMA_DEPTH = 64  # objects and arrays in one tool's parameters schema (real ones nest a handful)
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class Tool:
    index: int  # in the request's tools
    name: str
    parameters: dict[str, Any]  # the arguments' JSON schema (no parameters: an empty object)
    is_strict: bool
    spec: dict[str, Any]  # the OpenAI tool object, as the chat template (or the fallback prompt) shows it


class ToolCalling:
    """One request's tools, choice and call limit; its parser and output constraint."""

    def __init__(self, tools: list[Tool], mode: Mode, named: str | None, is_parallel: bool,
                 tool_format: type[ToolFormat]) -> None:
        self.tools = {t.name: t for t in tools}
        self.mode = mode
        self.named = named  # the function a named tool_choice forces
        self.is_parallel = is_parallel
        self.format = tool_format  # the model family's format: auto's parser, call ids, the fallback prompt

    @classmethod
    def of(cls, tools: list[ChatCompletionTool] | None, tool_choice: str | NamedToolChoice | None,
           parallel_tool_calls: bool | None, tool_format: type[ToolFormat]) -> ToolCalling | None:
        """The request's tool calling, or None when it has none (no tools). Raises ParamError."""
        if tools is not None and len(tools) > MAX_TOOLS:
            raise ParamError("tools", f"tools: at most {MAX_TOOLS} tools, got {len(tools)}")
        if not tools:
            if tool_choice not in (None, "none", "auto"):  # with no tools, "auto" can only answer in text
                what = repr(tool_choice) if isinstance(tool_choice, str) else "naming a function"
                raise ParamError("tool_choice", f"tool_choice {what} needs tools: give the functions it may call")
            if parallel_tool_calls is not None:
                raise ParamError("parallel_tool_calls", "parallel_tool_calls needs tools")
            return None
        checked = [_check_tool(t, i) for i, t in enumerate(tools)]
        seen: set[str] = set()
        for i, t in enumerate(checked):
            if t.name in seen:
                raise ParamError(f"tools[{i}].function.name", f"tools[{i}].function.name: {t.name!r} is given twice")
            seen.add(t.name)
        mode: Mode
        named = None
        if isinstance(tool_choice, NamedToolChoice):
            named, mode = tool_choice.function.name, "named"
            if named not in seen:
                raise ParamError("tool_choice", f"tool_choice names the function {named!r}, which is not in tools "
                                                f"(they are {', '.join(sorted(seen))})")
        else:
            mode = tool_choice or "auto"  # type: ignore[assignment]
        return cls(checked, mode, named, parallel_tool_calls is not False, tool_format)

    # -- the prompt --------------------------------------------------------------------------------------
    def offered(self) -> list[dict[str, Any]] | None:
        """The tools the prompt shows the model (none with tool_choice "none": it is not to call any)."""
        return None if self.mode == "none" else [t.spec for t in self.tools.values()]

    # -- the output --------------------------------------------------------------------------------------
    def constraint(self) -> StructuredOutputsParams | None:
        """The JSON schema a forced choice puts on the output; None for "none" and "auto". One that does not
        compile is blamed on the named tool's parameters, or on `tools` for "required"."""
        if self.mode == "named":
            assert self.named is not None
            tool = self.tools[self.named]
            return StructuredOutputsParams(json=tool.parameters, source=f"tools[{tool.index}].function.parameters")
        if self.mode == "required":
            return StructuredOutputsParams(json=self.required_schema(), source="tools")
        return None

    def required_schema(self) -> dict[str, Any]:
        """vLLM's layout: an array (1 item at least; at most 1 without parallel calls) of objects holding a
        tool's name and arguments. Each tool's schema moves under the root's $defs, its local $refs with it."""
        defs: dict[str, Any] = {}
        branches = []
        for i, tool in enumerate(self.tools.values()):
            params = _relocated(tool.parameters, f"#/$defs/tool{i}")
            defs[f"tool{i}"] = {k: v for k, v in params.items() if k not in ("$schema", "$id")}
            branches.append({"type": "object", "properties": {"name": {"const": tool.name},
                                                              "parameters": {"$ref": f"#/$defs/tool{i}"}},
                             "required": ["name", "parameters"], "additionalProperties": False})
        items = branches[0] if len(branches) == 1 else {"anyOf": branches}
        schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1, "$defs": defs}
        if not self.is_parallel:
            schema["maxItems"] = 1
        return schema

    def parser(self) -> ToolParser:
        """What reads this request's answers ("none": nothing to read, the text is the content)."""
        if self.mode == "named":
            assert self.named is not None
            return NamedToolParser(self.named)
        max_calls = None if self.is_parallel else 1
        if self.mode == "required":
            return RequiredToolParser(self.accepts, max_calls)
        return self.format(self.accepts, max_calls, {n: t.parameters for n, t in self.tools.items()})

    def parse(self, text: str) -> ParsedOutput:
        """The answer's content and calls ("none": all content)."""
        if self.mode == "none":
            return ParsedOutput(text)
        return self.parser().parse(text)

    def accepts(self, name: str, arguments: Any) -> bool:
        """Whether a call the model wrote is one to report: a function offered, and, for a strict tool,
        arguments its schema validates."""
        tool = self.tools.get(name)
        if tool is None:
            return False
        if not tool.is_strict:
            return True
        try:
            return jsonschema.validators.validator_for(tool.parameters)(tool.parameters).is_valid(arguments)
        except (referencing.exceptions.Unresolvable, re.error, RecursionError):  # a $ref to nothing, a bad pattern
            return False


def _check_tool(tool: ChatCompletionTool, i: int) -> Tool:
    fn = tool.function
    field = f"tools[{i}].function"
    if not _NAME.fullmatch(fn.name):
        raise ParamError(f"{field}.name", f"{field}.name: {fn.name!r} is not a function name (1 to 64 letters, "
                                          "digits, '_' or '-')")
    params = fn.parameters if fn.parameters is not None else _NO_ARGUMENTS
    if _depth(params) > MAX_SCHEMA_DEPTH:  # jsonschema checks by recursion: a deep one would exhaust the stack
        raise ParamError(f"{field}.parameters", f"{field}.parameters nests objects and arrays more than "
                                                f"{MAX_SCHEMA_DEPTH} deep")
    try:
        jsonschema.validators.validator_for(params).check_schema(params)
    except RecursionError:
        raise ParamError(f"{field}.parameters", f"{field}.parameters is nested too deeply to check") from None
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        raise ParamError(f"{field}.parameters", f"{field}.parameters is not a valid JSON schema: {e.message}"
                                                + (f" (at {where})" if where else "")) from None
    if params.get("type", "object") != "object":
        raise ParamError(f"{field}.parameters", f"{field}.parameters must describe an object (the arguments), "
                                                f"not type {params.get('type')!r}")
    return Tool(i, fn.name, params, bool(fn.strict), tool.model_dump(exclude_none=True))


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in `value` (a scalar: 0), counted without recursion."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        v, d = todo.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is not None:
            deepest = max(deepest, d)
            todo.extend((c, d + 1) for c in children)
    return deepest


def _relocated(schema: Any, base: str) -> Any:
    """`schema` moved to `base` (a JSON pointer from the new root, "#/$defs/tool0"): its local $refs
    ("#...") point under `base` too, so its own $defs / definitions are found where they now are."""
    if isinstance(schema, dict):
        out = {k: _relocated(v, base) for k, v in schema.items()}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out["$ref"] = base + ref[1:]
        return out
    if isinstance(schema, list):
        return [_relocated(v, base) for v in schema]
    return schema


def arguments_value(arguments: Any) -> Any:
    """A history call's arguments for a chat template: templates expect the object, not its JSON text
    (transformers' convention); text that is not a JSON object, or a value already decoded, stays as it is."""
    if not isinstance(arguments, str):
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments
