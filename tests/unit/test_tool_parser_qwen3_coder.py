"""The qwen3_coder tool-call format (Qwen3-Coder, Qwen3.5): calls as `<tool_call><function=NAME><parameter=K>`
blocks, values typed by the request's schemas; its streaming, fed 1, 3 and 7 characters at a time, joining to
the non-streaming answer with no marker in the content; a cut-off call; detection from the real templates."""

from __future__ import annotations

import json
import tarfile
from typing import Any

import pytest

from tokenmill.entrypoints.openai.protocol import ChatCompletionTool
from tokenmill.entrypoints.openai.tool_calling import ToolCalling
from tokenmill.entrypoints.openai.tool_parsers import (TOOL_FORMATS, ParsedOutput, ParsedToolCall, ToolCallStream,
                                                       ToolParser, detect_tool_format, tool_format)
from tokenmill.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser, convert

MARKERS = ("<tool_call", "</tool_call", "<function", "</function", "<parameter", "</parameter")


def tool(name: str, **properties: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object",
                                                                          "properties": properties}}}


TOOLS = [
    tool("get_weather", city={"type": "string"}, days={"type": "integer"}),
    tool("get_time", timezone={"type": "string"}),
    tool("configure", count={"type": "integer"}, ratio={"type": "number"}, enabled={"type": "boolean"},
         options={"type": "object"}, tags={"type": "array", "items": {"type": "string"}}, zip={"type": "string"},
         limit={"type": ["integer", "null"]}, either={"anyOf": [{"type": "number"}, {"type": "string"}]}),
    tool("write_file", path={"type": "string"}, content={"type": "string"}),
]


def block(name: str, **values: str) -> str:
    """A call as the templates teach it: each value on its own lines."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def call(name: str, **arguments: Any) -> ParsedToolCall:
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


def parser(**kwargs: Any) -> ToolParser:
    return Qwen3CoderToolParser(tools=TOOLS, **kwargs)


WEATHER = block("get_weather", city="Paris", days="3")
CODE = 'if a < b and c<d:\n    print("<div>x</div>")\n    return a<<2  # <parameter is not a tag here'

# (model text, expected content, expected calls): answers that are calls, or text, as the models write them
CASES: list[tuple[str, str, list[ParsedToolCall]]] = [
    (WEATHER, "", [call("get_weather", city="Paris", days=3)]),  # single call
    (f"{WEATHER}\n{block('get_time', timezone='Europe/Paris')}", "",
     [call("get_weather", city="Paris", days=3), call("get_time", timezone="Europe/Paris")]),  # two calls
    (f"I'll check the weather in Paris for you.\n\n{WEATHER}", "I'll check the weather in Paris for you.",
     [call("get_weather", city="Paris", days=3)]),  # content before the call
    (f"<think>\nThe user wants the weather.\n</think>\n\n{WEATHER}", "<think>\nThe user wants the weather.\n</think>",
     [call("get_weather", city="Paris", days=3)]),  # reasoning left in the text (no reasoning parser)
    (block("configure", count="42", ratio="0.75", enabled="true", options='{"depth": 2, "mode": "fast"}',
           tags='["a", "b"]', zip="01234", limit="null", either="2.5"), "",
     [call("configure", count=42, ratio=0.75, enabled=True, options={"depth": 2, "mode": "fast"}, tags=["a", "b"],
           zip="01234", limit=None, either=2.5)]),  # typed by the schema
    (block("write_file", path="notes.md", content="# Title\n\nfirst line\n  indented line\n"), "",
     [call("write_file", path="notes.md", content="# Title\n\nfirst line\n  indented line\n")]),  # multi-line
    (block("write_file", path="a.py", content=CODE), "", [call("write_file", path="a.py", content=CODE)]),  # `<`
    ('<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n</function>\n</tool_call>',
     "", [call("get_weather", city="São Paulo")]),
    ("<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "", [call("get_time")]),  # no arguments
    (f"{WEATHER}\nDone.", "Done.", [call("get_weather", city="Paris", days=3)]),  # text after: content too
    # no </parameter> before the next parameter or </function>: read as vLLM reads it
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2\n</function>\n</tool_call>",
     "", [call("get_weather", city="Paris", days=2)]),
    # several functions in one block; a function outside any <tool_call> (vLLM reads both)
    ("<tool_call>\n<function=get_time>\n</function>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
     "</function>\n</tool_call>", "", [call("get_time"), call("get_weather", city="Rome")]),
    ("Checking.\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>", "Checking.",
     [call("get_weather", city="Oslo")]),
    (f"{WEATHER[:-len('</tool_call>')]}", "", [call("get_weather", city="Paris", days=3)]),  # EOS before </tool_call>
    # no call: the text exactly as written
    ("The capital of France is Paris.", "The capital of France is Paris.", []),
    ("  x < y and y > z, so <b>bold</b>\n", "  x < y and y > z, so <b>bold</b>\n", []),
    ("Use the <tool_call> tag like this.", "Use the <tool_call> tag like this.", []),
    (f"Write <function=name> to call.\n{WEATHER}", "Write <function=name> to call.",
     [call("get_weather", city="Paris", days=3)]),  # the format in prose, then a call
    # cut off by max_tokens inside the call: no call, its text is content (as hermes's cut-off JSON is)
    (f"Let me look.\n\n{WEATHER[:60]}", f"Let me look.\n\n{WEATHER[:60]}", []),
    # malformed: the block comes back as content
    ("<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>",
     "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>", []),  # a value outside a parameter
    ("<tool_call>\n<function=>\n</function>\n</tool_call>", "<tool_call>\n<function=>\n</function>\n</tool_call>", []),
    ("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", []),  # hermes JSON is not this format
]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_parse(text: str, content: str, calls: list[ParsedToolCall]) -> None:
    assert parser().parse(text) == ParsedOutput(content, calls)


def streamed(p: ToolParser, text: str, size: int) -> tuple[str, list[ParsedToolCall], list[str]]:
    """Content, calls and ids a ToolCallStream sends for `text` fed `size` characters at a time, then an empty
    final piece; each content delta checked for marker text (a well-formed answer's never has any)."""
    ids = iter(f"id{i}" for i in range(100))
    stream = ToolCallStream(p, lambda: next(ids))
    pieces = [text[i:i + size] for i in range(0, len(text), size)] + [""]
    content, deltas = "", []
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for k, piece in enumerate(pieces):
        news = stream.feed(piece, is_final=k == len(pieces) - 1)
        content += news.content
        deltas.append(news.content)
        for d in news.tool_calls:
            if d.id is not None:
                assert d.index == len(names) and d.name is not None
                names[d.index] = d.name
            arguments[d.index] = arguments.get(d.index, "") + d.arguments
    return content, [ParsedToolCall(names[i], arguments[i]) for i in sorted(names)], deltas


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("text, content, calls", CASES)
def test_stream_joins_to_the_whole(text: str, content: str, calls: list[ParsedToolCall], size: int) -> None:
    whole = parser().parse(text)
    got_content, got_calls, deltas = streamed(parser(), text, size)
    assert (got_content, got_calls) == (whole.content, whole.tool_calls) == (content, calls)
    if calls and not any(m in content for m in MARKERS):  # no piece of a call's markers reaches the content
        assert not any(m in d for d in deltas for m in MARKERS) and not any(m in got_content for m in MARKERS)


@pytest.mark.parametrize("text, content, calls", CASES)
def test_partial_parses_only_grow(text: str, content: str, calls: list[ParsedToolCall]) -> None:
    """Streaming's invariant (base.py): each prefix's parse is settled, so the final parse extends it."""
    p = parser()
    final = p.parse(text)
    for k in range(len(text) + 1):
        part = p.parse(text[:k], is_final=False)
        assert final.content.startswith(part.content), (k, part)
        assert part.tool_calls == final.tool_calls[:len(part.tool_calls)], (k, part)


def test_content_streams_before_the_call() -> None:
    stream = ToolCallStream(parser(), lambda: "id")
    assert stream.feed("Let me check").content == "Let me check"
    assert stream.feed(" the weather.\n<tool").content == " the weather."  # "<tool" may start a tag: held
    assert not stream.feed("_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n")
    news = stream.feed("</tool_call>")
    assert [(d.index, d.id, d.name, d.arguments) for d in news.tool_calls] == [(0, "id", "get_weather",
                                                                               '{"city": "Paris"}')]
    assert not stream.feed("", is_final=True)


def test_a_call_cut_off_midway() -> None:
    """max_tokens stops the model inside a call: while streaming nothing of it is sent; at the end it is no
    call, and its text comes back as content (finish_reason "length" says why), as for the other formats."""
    text = "I'll look it up.\n" + block("write_file", path="a.py", content=CODE)
    for cut in (len("I'll look it up.\n<tool_"), text.index("<parameter=content>") + 5, text.index("</function>")):
        partial = text[:cut]
        assert parser().parse(partial, is_final=False) == ParsedOutput("I'll look it up.")
        assert parser().parse(partial) == ParsedOutput(partial)
        for size in (1, 3, 7):
            content, calls, deltas = streamed(parser(), partial, size)
            assert (content, calls) == (partial, [])
            assert "".join(deltas[:-1]) == "I'll look it up."  # the call's text only with the final piece
    # a complete first call and a cut second one: the first is a call, the second's text content
    two = WEATHER + "\n" + block("get_time", timezone="UTC")[:30]
    assert parser().parse(two) == ParsedOutput(block("get_time", timezone="UTC")[:30],
                                               [call("get_weather", city="Paris", days=3)])


@pytest.mark.parametrize("value, schema, expected", [
    ("42", {"type": "integer"}, 42),
    ("-7", {"type": "integer"}, -7),
    ("3.0", {"type": "integer"}, 3),
    ("3.5", {"type": "integer"}, "3.5"),  # not an integer: the text
    ("many", {"type": "integer"}, "many"),
    ("0.25", {"type": "number"}, 0.25),
    ("12", {"type": "number"}, 12),
    ("1e3", {"type": "number"}, 1000.0),
    ("NaN", {"type": "number"}, "NaN"),  # not JSON
    ("True", {"type": "boolean"}, True),
    ("false", {"type": "boolean"}, False),
    ("yes", {"type": "boolean"}, "yes"),
    ('{"a": [1, 2]}', {"type": "object"}, {"a": [1, 2]}),
    ("{'a': 1}", {"type": "object"}, "{'a': 1}"),  # not JSON
    ("[1, 2]", {"type": "object"}, "[1, 2]"),  # JSON, but not an object
    ("[1, 2]", {"type": "array"}, [1, 2]),
    ("12345", {"type": "string"}, "12345"),  # looks like a number, but the schema says string
    ("true", {"type": "string"}, "true"),
    ("[1]", {"type": "string"}, "[1]"),
    ("null", {"type": "string"}, None),  # as vLLM reads it
    ("null", None, None),
    ("42", None, "42"),  # a parameter the schema does not describe
    ("42", {"description": "no type"}, "42"),
    ("42", {"type": ["integer", "null"]}, 42),
    ("4x", {"type": ["integer", "string"]}, "4x"),
    ("2", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 2),
    ("  7 ", {"type": "integer"}, 7),
    ("  spaced  ", {"type": "string"}, "  spaced  "),
])
def test_convert(value: str, schema: Any, expected: Any) -> None:
    got = convert(value, schema)
    assert got == expected and type(got) is type(expected)


def test_values_lose_one_newline_either_side() -> None:
    text = ("<tool_call>\n<function=write_file>\n<parameter=content>\n\n\nbody\n\n\n</parameter>\n</function>\n"
            "</tool_call>")
    assert parser().parse(text).tool_calls == [call("write_file", content="\n\nbody\n\n")]
    text = "<tool_call><function=write_file><parameter=content>inline</parameter></function></tool_call>"
    assert parser().parse(text).tool_calls == [call("write_file", content="inline")]


def test_without_schemas_every_value_is_text() -> None:
    """No tools given (and no ToolCalling behind `accept`): values stay strings, as vLLM leaves them."""
    assert Qwen3CoderToolParser().parse(WEATHER).tool_calls == [call("get_weather", city="Paris", days="3")]
    schemas = {"get_weather": {"type": "object", "properties": {"days": {"type": "integer"}}}}
    assert Qwen3CoderToolParser(tools=schemas).parse(WEATHER).tool_calls == [call("get_weather", city="Paris",
                                                                                  days=3)]


def test_through_the_requests_tool_calling() -> None:
    """The chat endpoint's path: ToolCalling builds the format with its `accepts` and the values are typed by
    the request's schemas; a strict tool's schema then validates the typed arguments."""
    strict = json.loads(json.dumps(TOOLS[0]))
    strict["function"]["strict"] = True
    strict["function"]["parameters"].update(required=["city", "days"], additionalProperties=False)
    tools = [ChatCompletionTool.model_validate(t) for t in [strict, *TOOLS[1:]]]
    calling = ToolCalling.of(tools, "auto", None, tool_format("qwen3_coder"))
    assert calling is not None
    text = f"Sure.\n{WEATHER}\n{block('launch', target='moon')}"
    out = calling.parse(text)
    # get_weather's days is an integer, so the strict schema accepts it; launch is not offered: content
    assert out == ParsedOutput(f"Sure.\n{block('launch', target='moon')}", [call("get_weather", city="Paris", days=3)])
    assert streamed(calling.parser(), text, 3)[:2] == (out.content, out.tool_calls)
    bad = block("get_weather", city="Paris", days="soon")  # stays "soon": the strict schema refuses the call
    assert calling.parse(bad) == ParsedOutput(bad)
    one = ToolCalling.of(tools, "auto", False, tool_format("qwen3_coder"))  # parallel_tool_calls false
    assert one is not None
    two = f"{WEATHER}\n{block('get_time', timezone='UTC')}"
    assert one.parse(two) == ParsedOutput(block("get_time", timezone="UTC"), [call("get_weather", city="Paris",
                                                                                     days=3)])


def test_history_calls_read_back_typed() -> None:
    """The fallback prompt writes past calls as the templates do; the parser reads them back, types and all."""
    fmt = TOOL_FORMATS["qwen3_coder"]
    calls: list[tuple[str, dict[str, Any]]] = [
        ("configure", {"count": 2, "ratio": 0.5, "enabled": False, "options": {"k": [1]}, "tags": ["x"], "zip": "007"}),
        ("write_file", {"path": "a.py", "content": CODE})]
    written = fmt().render_calls(calls)
    assert parser().parse(written) == ParsedOutput("", [call(n, **a) for n, a in calls])
    instructions = fmt().format_instructions(TOOLS, is_parallel=False)
    assert "get_weather" in instructions and "<function=" in instructions and "at most one" in instructions


def _real_template(name: str) -> str:
    """A chat template llama.cpp ships (models/templates/), read from the llama-cpp-python sdist that the
    native build keeps (tokenmill.native.ggml_build); the test skips where that was never downloaded."""
    from tokenmill.native.compile import cache_dir
    from tokenmill.native.ggml_build import SDIST

    path = cache_dir() / "ggml" / SDIST
    if not path.exists():
        pytest.skip(f"no {SDIST} in {path.parent} (python -m tokenmill.native.build downloads it)")
    with tarfile.open(path, "r:gz") as tf:
        for member in tf:
            if member.name.endswith(f"/models/templates/{name}"):
                f = tf.extractfile(member)
                assert f is not None
                return f.read().decode()
    pytest.fail(f"{name} is not in {path}")


def test_detect_on_the_real_templates() -> None:
    assert detect_tool_format(_real_template("Qwen3.5-4B.jinja")) == "qwen3_coder"
    assert detect_tool_format(_real_template("Qwen3-Coder.jinja")) == "qwen3_coder"
    assert detect_tool_format(_real_template("Qwen-Qwen3-0.6B.jinja")) == "hermes"  # Qwen3's JSON calls
    assert detect_tool_format(_real_template("Qwen-Qwen2.5-7B-Instruct.jinja")) == "hermes"


@pytest.mark.parametrize("template, expected", [
    # Qwen3.5's instruction, as its template writes it
    ("{{- '\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n"
     "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>' }}",
     "qwen3_coder"),
    ('{{- "<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>" }}',
     "hermes"),  # Qwen3's (hermes JSON)
    ("{% for m in messages %}<tool_call>{% endfor %}", "hermes"),
    ("{{ '<function=' }}", "hermes"),  # <function= without <tool_call>: nothing says qwen3_coder
])
def test_detect_tool_format(template: str, expected: str) -> None:
    assert detect_tool_format(template) == expected
