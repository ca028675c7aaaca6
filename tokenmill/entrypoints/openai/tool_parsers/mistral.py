"""Mistral: calls follow the `[TOOL_CALLS]` token, in either of its two layouts.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]      (v3 tokenizers: a JSON array)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}  (v11 and later: name, args)

Text before the first `[TOOL_CALLS]` is content. `[TOOL_CALLS]` and `[ARGS]` are special tokens, so this
format keeps special tokens in the text. Mistral's templates accept only call ids of 9 letters and digits,
so the calls this server reports get such ids.
"""

from __future__ import annotations

import json
import random
import re
import string
from typing import Any

from tokenmill.entrypoints.openai.tool_parsers.base import (PENDING, Call, Item, ToolFormat, held_back, json_end,
                                                            loads)

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID_ALPHABET = string.ascii_letters + string.digits


class MistralToolParser(ToolFormat):
    name = "mistral"
    skip_special_tokens = False

    def scan(self, text: str, is_final: bool) -> list[Item]:
        items: list[Item] = []
        pos = 0
        while True:
            start = text.find(MARKER, pos)
            if start < 0:
                tail = text[pos:]
                items.append(tail if is_final else tail[:len(tail) - held_back(tail, MARKER)])
                return items
            items.append(text[pos:start])
            found = self._region(text, start, is_final)
            if found is None:
                items.append(PENDING)
                return items
            calls, end = found
            items.extend(calls if calls is not None else [text[start:end]])
            pos = end

    def _region(self, text: str, start: int, is_final: bool) -> tuple[list[Call] | None, int] | None:
        """The calls after the marker at `start` (None: it is not a call) and where they end; None while
        the region is incomplete and more text may come."""
        pos = start + len(MARKER)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos < len(text) and text[pos] == "[":  # v3: one JSON array of {name, arguments}
            end = json_end(text, pos)
            if end is None:
                return None if not is_final else (None, len(text))
            objs = loads(text[pos:end])
            if not isinstance(objs, list) or not objs:
                return None, end
            calls = [self.make_call(o.get("name"), o.get("arguments", {}), json.dumps(o, ensure_ascii=False))
                     if isinstance(o, dict) else None for o in objs]
            return (None if None in calls else calls), end  # type: ignore[return-value]
        name = _NAME.match(text, pos)  # v11: name[ARGS]{...}
        assert name is not None  # the pattern matches the empty string
        after = name.end()
        if not is_final and ARGS.startswith(text[after:after + len(ARGS)]) and len(text) - after < len(ARGS):
            return None  # the text ends in the name or in what may be [ARGS]
        body = after + len(ARGS)
        while body < len(text) and text[body].isspace():
            body += 1
        if not name.group() or not text.startswith(ARGS, after):
            return None, pos  # not a call: the marker alone is content, scanning goes on after it
        if body == len(text):
            return None if not is_final else (None, len(text))
        if text[body] != "{":
            return None, pos
        end = json_end(text, body)
        if end is None:
            return None if not is_final else (None, len(text))
        call = self.make_call(name.group(), loads(text[body:end]), text[start:end])
        return ([call] if call is not None else None), end

    def format_instructions(self, tools: list[dict[str, Any]], is_parallel: bool) -> str:
        listed = json.dumps(tools, ensure_ascii=False)
        how_many = "You may call several functions in one list." if is_parallel else "Call at most one function."
        return (f"You can call functions to answer. These are the functions: {listed}\n\nTo call functions, answer "
                f'with {MARKER} followed by a JSON list of calls: {MARKER}[{{"name": "<the function name>", '
                f'"arguments": {{<the arguments>}}}}]. {how_many} If no function helps, answer in plain text.')

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return MARKER + json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)

    def render_tool_result(self, name: str | None, content: str) -> str:
        return f"[TOOL_RESULTS]{json.dumps({'name': name, 'content': content}, ensure_ascii=False)}[/TOOL_RESULTS]"

    @staticmethod
    def new_call_id() -> str:
        return "".join(random.choices(_ID_ALPHABET, k=9))
