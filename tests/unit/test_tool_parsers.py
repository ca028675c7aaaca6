"""Tool-call parsers on recorded-style model outputs of each family (written here as fixtures), malformed
ones included: the calls and content they give, and their streaming, fed token-sized chunks, joining to
exactly the non-streaming answer."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tokenmill.entrypoints.openai.tool_parsers import (TOOL_FORMATS, NamedToolParser, ParsedOutput, ParsedToolCall,
                                                       RequiredToolParser, ToolCallStream, ToolParser,
                                                       detect_tool_format)
from tokenmill.entrypoints.openai.tool_parsers.base import json_end

WEATHER = ParsedToolCall("get_weather", '{"city": "Paris"}')


def call(name: str, **arguments: Any) -> ParsedToolCall:
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


# (format, model text, expected content, expected calls)
CASES: list[tuple[str, str, str, list[ParsedToolCall]]] = [
    # Hermes / Qwen2.5 / Qwen3
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "", [WEATHER]),
    ("hermes", 'Let me check the weather for you.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris"}}\n</tool_call>', "Let me check the weather for you.", [WEATHER]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
               '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>', "",
     [WEATHER, call("get_time", timezone="Europe/Paris")]),
    ("hermes", "<think>\nThe user wants the weather, so I call the tool.\n</think>\n\n<tool_call>\n"
               '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "<think>\nThe user wants the weather, so I call the tool.\n</think>", [WEATHER]),
    ("hermes", '<tool_call>\n{"name": "translate", "arguments": {"text": "こんにちは", "to": "fr"}}\n</tool_call>', "",
     [call("translate", text="こんにちは", to="fr")]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>', "",
     [WEATHER]),  # arguments written as a JSON string
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [WEATHER]),  # EOS, no tag
    ("hermes", "The capital of France is Paris.", "The capital of France is Paris.", []),
    ("hermes", "  Paris is lovely.\n", "  Paris is lovely.\n", []),  # no call: the text exactly as written
    # malformed: the text comes back as content
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>', []),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', '<tool_call>\n{"name": '
               '"get_weather", "arguments": {"city": "Par', []),  # cut off by max_tokens
    ("hermes", "<tool_call>\nget_weather(city='Paris')\n</tool_call>",
     "<tool_call>\nget_weather(city='Paris')\n</tool_call>", []),
    ("hermes", 'Use the <tool_call> tag like this.', "Use the <tool_call> tag like this.", []),
    ("hermes", '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
     '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>', []),  # no name
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
               '{"name": "get_time", "arguments": [1, 2]}\n</tool_call>',
     '<tool_call>\n{"name": "get_time", "arguments": [1, 2]}\n</tool_call>', [WEATHER]),  # one good, one bad
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\nDone.', "Done.",
     [WEATHER]),
    # Llama 3.1 / 3.2 / 3.3 JSON
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [WEATHER]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [WEATHER]),
    ("llama3_json", 'I will look it up.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
     "I will look it up.", [WEATHER]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": '
                    '{"timezone": "Europe/Paris"}}', "", [WEATHER, call("get_time", timezone="Europe/Paris")]),
    ("llama3_json", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [WEATHER]),
    ("llama3_json", '\n\n{"name": "get_time", "parameters": {}}', "", [call("get_time")]),
    ("llama3_json", "The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),  # JSON that is not a call
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}',
     '{"name": "get_weather", "parameters": {"city": "Paris"}', []),  # cut off
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": Paris}}',
     '{"name": "get_weather", "parameters": {"city": Paris}}', []),  # not JSON
    # Mistral (v3 array, v11 name[ARGS]{...})
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [WEATHER]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
                '"arguments": {"timezone": "Europe/Paris"}}]', "", [WEATHER, call("get_time", timezone="Europe/Paris")]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [WEATHER]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"timezone": '
                '"Europe/Paris"}', "", [WEATHER, call("get_time", timezone="Europe/Paris")]),
    ("mistral", 'Sure, let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
     "Sure, let me check.", [WEATHER]),
    ("mistral", "Paris is the capital of France.", "Paris is the capital of France.", []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"]',
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"]', []),
    ("mistral", '[TOOL_CALLS] get the weather', '[TOOL_CALLS] get the weather', []),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": ', '[TOOL_CALLS]get_weather[ARGS]{"city": ', []),
    # gpt-oss (harmony messages; the reasoning is not content)
    ("openai", '<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
               'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}', "", [WEATHER]),
    ("openai", '<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant to=functions.get_weather'
               '<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>', "Let me check.", [WEATHER]),
    ("openai", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris.",
     "Paris.", []),
    ("openai", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa',
     '{"city": "Pa', []),  # cut off
]


def parser_for(name: str, **kwargs: Any) -> ToolParser:
    return TOOL_FORMATS[name](**kwargs)


@pytest.mark.parametrize("fmt, text, content, calls", CASES)
def test_parse(fmt: str, text: str, content: str, calls: list[ParsedToolCall]) -> None:
    assert parser_for(fmt).parse(text) == ParsedOutput(content, calls)


def streamed(parser: ToolParser, pieces: list[str]) -> tuple[str, list[ParsedToolCall], list[str]]:
    """Content, calls and ids a ToolCallStream sends for `pieces` (the last fed as final)."""
    ids = iter(f"id{i}" for i in range(100))
    stream = ToolCallStream(parser, lambda: next(ids))
    content = ""
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for k, piece in enumerate(pieces):
        news = stream.feed(piece, is_final=k == len(pieces) - 1)
        content += news.content
        for d in news.tool_calls:
            if d.id is not None:
                assert d.index == len(names) and d.name is not None  # a call's first piece names it
                names[d.index] = d.name
            arguments[d.index] = arguments.get(d.index, "") + d.arguments
    return content, [ParsedToolCall(names[i], arguments[i]) for i in sorted(names)], stream.ids


def token_pieces(text: str, seed: int) -> list[str]:
    """`text` in token-sized pieces: 1 to 6 characters, so markers and JSON split anywhere."""
    rng = random.Random(seed)
    pieces, pos = [], 0
    while pos < len(text):
        n = rng.randint(1, 6)
        pieces.append(text[pos:pos + n])
        pos += n
    return pieces + [""]  # the final output often brings no new text


@pytest.mark.parametrize("fmt, text, content, calls", CASES)
def test_stream_joins_to_the_whole(fmt: str, text: str, content: str, calls: list[ParsedToolCall]) -> None:
    parser = parser_for(fmt)
    whole = parser.parse(text)
    for seed in range(3):
        got_content, got_calls, ids = streamed(parser, token_pieces(text, seed))
        assert (got_content, got_calls) == (whole.content, whole.tool_calls)
        assert len(ids) == len(set(ids)) == len(calls)
    assert streamed(parser, list(text) + [""])[:2] == (whole.content, whole.tool_calls)  # a character at a time


@pytest.mark.parametrize("fmt, text, content, calls", CASES)
def test_partial_parses_only_grow(fmt: str, text: str, content: str, calls: list[ParsedToolCall]) -> None:
    """The invariant streaming rests on: every prefix's parse is settled, so the final parse extends it."""
    parser = parser_for(fmt)
    final = parser.parse(text)
    for k in range(len(text) + 1):
        part = parser.parse(text[:k], is_final=False)
        assert final.content.startswith(part.content), (k, part)
        assert len(part.tool_calls) <= len(final.tool_calls) and all(
            final.tool_calls[i].name == c.name and final.tool_calls[i].arguments.startswith(c.arguments)
            for i, c in enumerate(part.tool_calls)), (k, part)


def test_content_streams_before_the_call() -> None:
    """Content is sent as it comes, not held until the end; a call whole once its closing tag arrives."""
    stream = ToolCallStream(parser_for("hermes"), lambda: "id")
    assert stream.feed("Let me check").content == "Let me check"
    assert stream.feed(" the weather.\n<tool").content == " the weather."  # "<tool" may start a tag: held
    assert not stream.feed('_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_')
    news = stream.feed("call>")
    assert [(d.index, d.id, d.name, d.arguments) for d in news.tool_calls] == [(0, "id", "get_weather",
                                                                               '{"city": "Paris"}')]
    assert not stream.feed("", is_final=True)


def test_unknown_function_and_strict_arguments_stay_content() -> None:
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": 7}}\n</tool_call>\n'
            '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>')

    def accept(name: str, args: Any) -> bool:  # what ToolCalling.accepts decides: known name, valid arguments
        return name == "get_weather" and isinstance(args.get("city"), str)

    out = parser_for("hermes", accept=accept).parse(text)
    assert out.tool_calls == [] and out.content == text
    assert parser_for("hermes").parse(text).tool_calls == [call("get_weather", city=7), call("launch")]


def test_max_calls_keeps_the_first() -> None:
    text = ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}'
            '\n</tool_call>')
    out = parser_for("hermes", max_calls=1).parse(text)
    assert out.tool_calls == [call("a")]
    assert out.content == '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
    assert streamed(parser_for("hermes", max_calls=1), token_pieces(text, 0))[:2] == (out.content, out.tool_calls)


REQUIRED_CASES = [
    ('[{"name": "get_weather", "parameters": {"city": "Paris"}}]', "", [WEATHER]),
    ('[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]', "",
     [WEATHER, call("get_time")]),
    ('[{"name": "get_weather", "parameters": {"city": "Par', '{"name": "get_weather", "parameters": {"city": "Par',
     []),  # cut off by max_tokens
    ('[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_ti', '{"name": "get_ti', [WEATHER]),
    ("I can't call tools.", "I can't call tools.", []),
]


@pytest.mark.parametrize("text, content, calls", REQUIRED_CASES)
def test_required(text: str, content: str, calls: list[ParsedToolCall]) -> None:
    parser = RequiredToolParser()
    assert parser.parse(text) == ParsedOutput(content, calls)
    assert streamed(parser, token_pieces(text, 1))[:2] == (content, calls)


def test_named_streams_its_arguments_as_written() -> None:
    parser = NamedToolParser("get_weather")
    text = '{"city": "Paris", "unit": "celsius"}'
    assert parser.parse(text) == ParsedOutput("", [ParsedToolCall("get_weather", text)])
    ids = iter(["id0"])
    stream = ToolCallStream(parser, lambda: next(ids))
    first = stream.feed("")  # the call's header goes out before any argument text
    assert [(d.index, d.id, d.name, d.arguments) for d in first.tool_calls] == [(0, "id0", "get_weather", "")]
    pieces = token_pieces(text, 2)
    chunks = [stream.feed(p, is_final=i == len(pieces) - 1).tool_calls for i, p in enumerate(pieces)]
    assert all(d.id is None and d.index == 0 for c in chunks for d in c)
    assert "".join(d.arguments for c in chunks for d in c) == text
    assert sum(1 for c in chunks if c) > 3  # in pieces, not in one


@pytest.mark.parametrize("template, expected", [
    ("{% for m in messages %}<tool_call>{% endfor %}", "hermes"),
    ("{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "mistral"),
    ("<|start_header_id|>system<|end_header_id|>{% if tools %}{{ tools }}{% endif %}", "llama3_json"),
    ("{{ '<|python_tag|>' }}", "llama3_json"),
    ("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", "hermes"),
    ("{% for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>{% endfor %}",
     "openai"),
    (None, "hermes"),
])
def test_detect_tool_format(template: str | None, expected: str) -> None:
    assert detect_tool_format(template) == expected


def test_json_end() -> None:
    assert json_end('{"a": "}", "b": [1, {"c": 2}]} tail', 0) == 30
    assert json_end('{"a": "\\"}"', 0) is None
    assert json_end('[1, [2]]', 0) == 8


@pytest.mark.parametrize("fmt", sorted(TOOL_FORMATS))
def test_fallback_history_parses_back(fmt: str) -> None:
    """What the fallback prompt writes for past calls is what the parser reads back as those calls."""
    parser = parser_for(fmt)
    calls = [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})]
    out = parser.parse(TOOL_FORMATS[fmt]().render_calls(calls))
    assert out == ParsedOutput("", [call(n, **a) for n, a in calls])
    assert "get_weather" in TOOL_FORMATS[fmt]().format_instructions(
        [{"type": "function", "function": {"name": "get_weather"}}], is_parallel=True)
