"""Hermes / Qwen: each call is a JSON object between `<tool_call>` and `</tool_call>`.

    I'll look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The format of NousResearch's Hermes models, Qwen2.5 and Qwen3 (their chat templates say so), and the one
the fallback prompt teaches a template that renders no tools. Text outside the tags is content; a call
whose closing tag never came (the model stopped right after its JSON) still counts at the end if it parses.
"""

from __future__ import annotations

import json
from typing import Any

from tokenmill.entrypoints.openai.tool_parsers.base import PENDING, Item, ToolFormat, held_back, loads

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolFormat):
    name = "hermes"

    def scan(self, text: str, is_final: bool) -> list[Item]:
        items: list[Item] = []
        pos = 0
        while True:
            start = text.find(START, pos)
            if start < 0:
                tail = text[pos:]
                items.append(tail if is_final else tail[:len(tail) - held_back(tail, START)])
                return items
            items.append(text[pos:start])
            body_start = start + len(START)
            end = text.find(END, body_start)
            if end < 0 and not is_final:
                items.append(PENDING)
                return items
            stop = len(text) if end < 0 else end + len(END)
            raw = text[start:stop]
            obj = loads(text[body_start:len(text) if end < 0 else end])
            call = (self.make_call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})), raw)
                    if isinstance(obj, dict) else None)
            items.append(call or raw)
            if end < 0:
                return items
            pos = stop

    def format_instructions(self, tools: list[dict[str, Any]], is_parallel: bool) -> str:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        how_many = ("You may make several calls, one block each." if is_parallel
                    else "Make at most one call per answer.")
        return ("You can call functions to answer. These are the functions, as JSON schemas, between <tools> "
                f"and </tools>:\n<tools>\n{listed}\n</tools>\n\nTo call a function, answer with a JSON object "
                'holding its name and its arguments between <tool_call> and </tool_call>:\n<tool_call>\n'
                '{"name": "<the function name>", "arguments": {<the arguments>}}\n</tool_call>\n'
                f"{how_many} A function's result comes back in the next message, between <tool_response> and "
                "</tool_response>. If no function helps, answer in plain text.")

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "\n".join(f"{START}\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n{END}"
                         for n, a in calls)
