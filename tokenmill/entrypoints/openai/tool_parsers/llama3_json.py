"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the answer is the call, a JSON object with `name` and `parameters`.

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

Meta's templates ask for an answer that is only the JSON; some models put `<|python_tag|>` before it, and
several calls come separated by `;`. So calls start where the answer starts with `{`, or after
`<|python_tag|>` (text before the tag is content). A model that answers in plain text, or whose first object
is not a call, gets content. `arguments` is accepted for `parameters`. `<|python_tag|>` is a special token,
so this format keeps special tokens in the text.
"""

from __future__ import annotations

import json
from typing import Any

from tokenmill.entrypoints.openai.tool_parsers.base import PENDING, Item, ToolFormat, held_back, json_end, loads

TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolFormat):
    name = "llama3_json"
    skip_special_tokens = False

    def scan(self, text: str, is_final: bool) -> list[Item]:
        tag = text.find(TAG)
        first = len(text) - len(text.lstrip())
        if first < len(text) and text[first] == "{" and (tag < 0 or first < tag):
            return self._calls(text, first, [text[:first]], is_final)
        if tag < 0:
            return [text if is_final else text[:len(text) - held_back(text, TAG)]]
        return self._calls(text, tag + len(TAG), [text[:tag]], is_final)

    def _calls(self, text: str, pos: int, items: list[Item], is_final: bool) -> list[Item]:
        """Objects from `pos` on, separated by `;` and whitespace, while each is a call; then content."""
        while True:
            while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
                pos += 1
            if pos == len(text):
                return items
            if text[pos] != "{":
                items.append(text[pos:])
                return items
            end = json_end(text, pos)
            if end is None:
                items.append(PENDING if not is_final else text[pos:])
                return items
            obj = loads(text[pos:end])
            call = None
            if isinstance(obj, dict):
                call = self.make_call(obj.get("name"), obj.get("parameters", obj.get("arguments", {})), text[pos:end])
            if call is None:
                items.append(text[pos:])
                return items
            items.append(call)
            pos = end

    def format_instructions(self, tools: list[dict[str, Any]], is_parallel: bool) -> str:
        listed = "\n\n".join(json.dumps(t, ensure_ascii=False, indent=4) for t in tools)
        how_many = ("For several calls, separate the objects with '; '." if is_parallel
                    else "Make at most one call per answer.")
        return ("You can call functions to answer. To call one, answer with nothing but a JSON object of the form "
                '{"name": <the function name>, "parameters": <an object of argument names and values>}. '
                f"{how_many} Do not use variables. If no function helps, answer in plain text.\n\n"
                f"These are the functions:\n\n{listed}")

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
