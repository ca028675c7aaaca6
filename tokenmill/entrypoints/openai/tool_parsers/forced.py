"""Parsers for forced calls (`tool_choice` "required" or a named function), whose output a JSON schema
constrains (ToolCalling.constraint), so it parses unless max_tokens cut it short.

    required:  [{"name": "get_weather", "parameters": {"city": "Paris"}}, ...]   (vLLM's layout)
    named:     {"city": "Paris"}                                                  (the arguments alone)

A required answer's calls are reported one whole object at a time; what does not parse (a cut-off tail)
is content. A named answer is the arguments themselves, streamed as they come: cut short, they are the
text written so far (with finish_reason "length", as OpenAI does). Neither is a fallback-prompt format.
"""

from __future__ import annotations

from tokenmill.entrypoints.openai.tool_parsers.base import PENDING, Call, Item, ToolParser, json_end, loads


class RequiredToolParser(ToolParser):
    name = "required"

    def scan(self, text: str, is_final: bool) -> list[Item]:
        pos = len(text) - len(text.lstrip())
        if pos == len(text):
            return [] if not is_final else [text]
        if text[pos] != "[":
            return [text]
        pos += 1
        items: list[Item] = []
        while True:
            while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
                pos += 1
            if pos == len(text):
                return items + ([PENDING] if not is_final else [])
            if text[pos] == "]":
                items.append(text[pos + 1:])
                return items
            end = json_end(text, pos) if text[pos] == "{" else len(text)
            if end is None:
                return items + [PENDING if not is_final else text[pos:]]
            obj = loads(text[pos:end])
            call = self.make_call(obj.get("name"), obj.get("parameters"), text[pos:end]) if isinstance(obj, dict) else None
            if call is None:
                return items + [text[pos:]]
            items.append(call)
            pos = end


class NamedToolParser(ToolParser):
    name = "named"

    def __init__(self, function_name: str) -> None:
        super().__init__()
        self.function_name = function_name

    def scan(self, text: str, is_final: bool) -> list[Item]:
        return [Call(self.function_name, text, text)]
