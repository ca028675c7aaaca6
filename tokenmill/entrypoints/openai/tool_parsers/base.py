"""The tool-call parser interface, and the one rule that turns a parse into content and calls.

A parser reads a model's text and finds the tool calls written in its family's format. It is a pure function
of the text (no state between calls), so streaming can re-parse the text so far at every step and send only
what is new (streaming.py). For that, `parse(text, is_final=False)` reports only what more text cannot
change: a call once its closing marker (or its JSON's closing bracket) has arrived, content up to any text
that might still start a call. The invariant every parser keeps, and the tests check on token-sized chunks:

    parse(text[:k], is_final=False).content  is a prefix of  parse(text).content
    parse(text[:k], is_final=False).tool_calls  are the first calls of  parse(text).tool_calls
        (equal, except that the last one's arguments may be a prefix of the final arguments)

A call that does not parse (bad JSON, no name, a function not offered, arguments that break a strict tool's
schema) is not a call: its text stays in the content. Nothing a model writes raises.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

_JSON_SYNTAX = re.compile(r'\\.|["{}\[\]]', re.DOTALL)  # what json_end looks at: escapes, quotes, brackets
# (function name, decoded arguments) -> whether this is a call the request may get (ToolCalling's check)
CallCheck = Callable[[str, Any], bool]


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # the arguments object as JSON text (what OpenAI's `function.arguments` carries)


@dataclass(frozen=True)
class ParsedOutput:
    """A model's text split into what it says (`content`, "" if nothing) and the calls it makes, in order."""

    content: str
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class Call:
    """A call found in the text; `raw` is its text there (content again if the call is not kept)."""

    name: str
    arguments: str
    raw: str


class Pending:
    """The marker a scan ends with when the text stops inside what may still become a call (not final)."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING = Pending()

# What a parser's scan yields, in text order: content text, a Call, or PENDING (last, only while not final).
# Adjacent strings are one stretch of content.
Item = str | Call | Pending


class ToolParser(ABC):
    """Finds the tool calls in a model's text (`parse`)."""

    name: ClassVar[str]

    def __init__(self, accept: CallCheck | None = None, max_calls: int | None = None,
                 schemas: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """`accept`: which (name, arguments) are calls (default: any); `max_calls`: the calls kept, in order
        (parallel_tool_calls false: 1); later ones stay in the content. `schemas`: each offered function's
        parameters schema, for a format whose values are text to be typed by them (qwen3_coder)."""
        self.accept = accept
        self.max_calls = max_calls
        self.schemas: dict[str, Mapping[str, Any]] = dict(schemas or {})

    def parse(self, text: str, is_final: bool = True) -> ParsedOutput:
        """`text` as content and calls. Not final: only what more text cannot change (see the module doc)."""
        return assemble(self.scan(text, is_final), is_final, self.max_calls)

    @abstractmethod
    def scan(self, text: str, is_final: bool) -> list[Item]:
        """The text as items in order; PENDING last when not final and a call may still be forming."""

    # -- helpers for the families ------------------------------------------------------------------------
    def make_call(self, name: Any, arguments: Any, raw: str) -> Call | None:
        """A Call if `name` is a string and `arguments` a JSON object (or JSON text of one) that `accept`
        takes; else None (the text stays content)."""
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            return None
        if self.accept is not None and not self.accept(name, arguments):
            return None
        return Call(name, json.dumps(arguments, ensure_ascii=False), raw)


class ToolFormat(ToolParser):
    """A model family's tool-call format: its parser, and, for chat templates that do not render tools, how
    to write the tools, past calls and tool results into the prompt (the fallback)."""

    # False: the format's markers are special tokens, which must stay in the detokenized text
    skip_special_tokens: ClassVar[bool] = True

    @abstractmethod
    def format_instructions(self, tools: list[dict[str, Any]], is_parallel: bool) -> str:
        """A system-prompt text that offers `tools` (OpenAI tool objects) and says how to call them."""

    @abstractmethod
    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """Past calls (name, arguments value), written as the model would write them, for the history."""

    def render_tool_result(self, name: str | None, content: str) -> str:
        """A tool's result, as the next user turn carries it."""
        result = json.dumps({"name": name, "content": content}, ensure_ascii=False)
        return f"<tool_response>\n{result}\n</tool_response>"

    @staticmethod
    def new_call_id() -> str:
        """An id for a call this server reports (vLLM's form)."""
        return f"chatcmpl-tool-{uuid.uuid4().hex}"


def assemble(items: list[Item], is_final: bool, max_calls: int | None = None) -> ParsedOutput:
    """Content and calls from a scan. Calls past `max_calls` become content. With calls, each stretch of
    content loses the whitespace that touches a call, and empty stretches go; the stretches are joined by a
    newline. Without calls the content is the text as written. Not final, a trailing stretch also loses its
    trailing whitespace (a call may follow it); PENDING counts as a call for this."""
    kept: list[Item] = []
    num_calls = 0
    for item in items:
        if isinstance(item, Call):
            if max_calls is not None and num_calls >= max_calls:
                item = item.raw
            else:
                num_calls += 1
        if isinstance(item, str) and kept and isinstance(kept[-1], str):
            kept[-1] += item
        elif not isinstance(item, str) or item:
            kept.append(item)
    calls = [c for c in kept if isinstance(c, Call)]
    stretches: list[str] = []
    for i, item in enumerate(kept):
        if not isinstance(item, str):
            continue
        if calls and i > 0:  # something before it is a call (strings are merged, so kept[i - 1] is one)
            item = item.lstrip()
        is_last = i == len(kept) - 1
        if (not is_last and (calls or isinstance(kept[i + 1], Pending))) or (is_last and not is_final):
            item = item.rstrip()
        if item or not calls:
            stretches.append(item)
    content = "\n".join(s for s in stretches if s) if calls else "".join(stretches)
    return ParsedOutput(content, [ParsedToolCall(c.name, c.arguments) for c in calls])


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker` (held back while not final)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def json_end(text: str, start: int) -> int | None:
    """`text[start]` opens a JSON object or array: the index just past its closing bracket, or None if the
    text ends first. Brackets inside strings do not count; nothing else is checked (json.loads does).
    Streaming calls this on the text so far at every step, so it jumps from one bracket or quote to the next."""
    depth = 0
    in_string = False
    for m in _JSON_SYNTAX.finditer(text, start):
        token = m.group()
        if in_string:
            in_string = token != '"'  # an escape (backslash and its character) is one token
        elif token == '"':
            in_string = True
        elif token in "{[":
            depth += 1
        elif token in "}]":
            depth -= 1
            if depth == 0:
                return m.end()
    return None


def loads(text: str) -> Any:
    """json.loads, None when the text is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None
