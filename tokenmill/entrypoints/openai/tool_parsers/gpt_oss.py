"""gpt-oss (vLLM's `openai` parser): calls are harmony messages to `functions.NAME` (harmony.py reads them).

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The chat endpoints read a harmony model's answers with harmony.py directly (reasoning, content and calls in
one pass); this class is the format as the rest of tool calling sees it: chosen by `--tool-call-parser openai`
or detected from a harmony template, and a parser of a whole text for `ToolCalling.parse` (the offline
`LLM.parse_tool_calls`), whose content is the answer's content channels (the reasoning is not content).
The markers are special tokens, so this format keeps special tokens in the text.
"""

from __future__ import annotations

import json
from typing import Any

from tokenmill.entrypoints.openai.harmony import CALL, FUNCTIONS, HarmonyStream
from tokenmill.entrypoints.openai.tool_parsers.base import PENDING, Call, Item, ToolFormat


class GptOssToolParser(ToolFormat):
    name = "openai"
    skip_special_tokens = False

    def scan(self, text: str, is_final: bool) -> list[Item]:
        stream = HarmonyStream(lambda name, arguments: self.accept is None or self.accept(name, arguments),
                               self.max_calls)
        found = stream.feed(text, is_final)
        items: list[Item] = [found.content, *(Call(c.name, c.arguments, c.arguments) for c in found.tool_calls)]
        if not is_final and stream.kind == "call":  # a call being written
            items.append(PENDING)
        return items

    def format_instructions(self, tools: list[dict[str, Any]], is_parallel: bool) -> str:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        how_many = "You may make several calls, one message each." if is_parallel else "Make at most one call."
        return ("You can call functions to answer. These are the functions, as JSON schemas:\n"
                f"{listed}\n\nTo call one, write a message to it on the commentary channel, its arguments as a JSON "
                f"object: <|start|>assistant<|channel|>commentary to={FUNCTIONS}<the function name> "
                f"<|constrain|>json<|message|>{{<the arguments>}}{CALL}\n{how_many} If no function helps, answer "
                "in plain text.")

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "".join(f"<|start|>assistant<|channel|>commentary to={FUNCTIONS}{name} <|constrain|>json<|message|>"
                       f"{json.dumps(arguments, ensure_ascii=False)}{CALL}" for name, arguments in calls)
