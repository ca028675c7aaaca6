"""ToolCalling (a request's tools checked, the forced choices' JSON schemas, which calls count) and
ToolPrompt (tools through a template that renders them, or the fallback prompt for one that does not)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pydantic
import pytest

from tokenmill.entrypoints.openai.protocol import ChatCompletionTool, NamedToolChoice
from tokenmill.entrypoints.openai.tool_calling import ToolCalling
from tokenmill.entrypoints.openai.tool_parsers import TOOL_FORMATS, ParsedToolCall
from tokenmill.entrypoints.openai.tool_prompt import ToolPrompt
from tokenmill.sampling_params import ParamError
from tokenmill.tokenizer.chat_template import render_chat_template

HERMES = TOOL_FORMATS["hermes"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: an empty arguments object


class Address(pydantic.BaseModel):
    street: str
    city: str


class Person(pydantic.BaseModel):  # pydantic's schema puts Address under $defs with a #/$defs/ $ref
    name: str
    home: Address
    past: list[Address]


def calling(tools: list[dict[str, Any]], choice: Any = None, parallel: bool | None = None) -> ToolCalling:
    named = NamedToolChoice.model_validate(choice) if isinstance(choice, dict) else choice
    result = ToolCalling.of([ChatCompletionTool.model_validate(t) for t in tools], named, parallel, HERMES)
    assert result is not None
    return result


def test_modes_and_constraints() -> None:
    assert calling([WEATHER]).mode == "auto" and calling([WEATHER]).constraint() is None
    assert calling([WEATHER], "none").constraint() is None and calling([WEATHER], "none").offered() is None
    named = calling([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    assert named.mode == "named" and named.constraint().json == WEATHER["function"]["parameters"]  # type: ignore
    assert calling([TIME], {"type": "function", "function": {"name": "get_time"}}).constraint().json == {  # type: ignore
        "type": "object", "properties": {}, "additionalProperties": False}
    assert ToolCalling.of(None, None, None, HERMES) is None and ToolCalling.of([], "none", None, HERMES) is None


def test_required_schema_takes_exactly_calls_of_the_tools() -> None:
    person = openai.pydantic_function_tool(Person)  # what the openai client sends for a pydantic model: $defs
    schema = calling([WEATHER, TIME, person], "required").required_schema()
    jsonschema.validators.validator_for(schema).check_schema(schema)
    home = {"street": "1 Main St", "city": "Paris"}
    good = [[{"name": "get_weather", "parameters": {"city": "Paris"}}],
            [{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Oslo",
                                                                                           "unit": "celsius"}}],
            [{"name": "Person", "parameters": {"name": "Ann", "home": home, "past": [home]}}]]
    bad = [[], [{"name": "get_weather"}], [{"name": "get_weather", "parameters": {}}],
           [{"name": "get_weather", "parameters": {"city": "Paris", "wind": 3}}],
           [{"name": "get_time", "parameters": {"x": 1}}], [{"name": "launch", "parameters": {}}],
           [{"name": "Person", "parameters": {"name": "Ann", "home": {"street": "x"}, "past": []}}],
           [{"name": "get_time", "parameters": {}, "extra": 1}]]
    for value in good:
        jsonschema.validate(value, schema)
    for value in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, schema)
    single = calling([WEATHER], "required", parallel=False).required_schema()
    assert single["maxItems"] == 1 and single["minItems"] == 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good[1], calling([WEATHER, TIME], "required", parallel=False).required_schema())


@pytest.mark.parametrize("tools, choice, field, words", [
    ([WEATHER, WEATHER], None, "tools[1].function.name", "given twice"),
    ([{"type": "function", "function": {"name": "get weather"}}], None, "tools[0].function.name", "function name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "strng"}}}}}], None, "tools[0].function.parameters", "not a valid JSON schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], None,
     "tools[0].function.parameters", "must describe an object"),
    ([WEATHER], {"type": "function", "function": {"name": "launch"}}, "tool_choice", "not in tools"),
    ([WEATHER] * 129, None, "tools", "at most 128"),
])
def test_bad_tools(tools: list[dict[str, Any]], choice: Any, field: str, words: str) -> None:
    with pytest.raises(ParamError) as e:
        calling(tools, choice)
    assert e.value.field == field and words in e.value.message


def test_deep_schema_is_refused_not_a_crash() -> None:
    params: dict[str, Any] = {"type": "object"}
    inner = params
    for _ in range(200):
        inner["properties"] = {"a": {"type": "object"}}
        inner = inner["properties"]["a"]
    with pytest.raises(ParamError, match="more than 64 deep"):
        calling([{"type": "function", "function": {"name": "f", "parameters": params}}])


def test_choice_without_tools() -> None:
    with pytest.raises(ParamError) as e:
        ToolCalling.of(None, "required", None, HERMES)
    assert e.value.field == "tool_choice" and "'required' needs tools" in e.value.message
    assert ToolCalling.of(None, "auto", None, HERMES) is None  # nothing to call: an answer in text
    with pytest.raises(ParamError) as e:
        ToolCalling.of(None, None, False, HERMES)
    assert e.value.field == "parallel_tool_calls"


def test_strict_tools_keep_only_valid_calls() -> None:
    strict = json.loads(json.dumps(WEATHER))
    strict["function"]["strict"] = True
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>'
    assert calling([strict]).parse(text).tool_calls == [] and calling([strict]).parse(text).content == text
    assert calling([WEATHER]).parse(text).tool_calls == [ParsedToolCall("get_weather", '{"town": "Paris"}')]
    assert calling([WEATHER]).parse(text.replace("get_weather", "launch")).tool_calls == []  # not offered
    assert calling([WEATHER], "none").parse(text).content == text


# -- ToolPrompt --------------------------------------------------------------------------------------------
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_LIKE = ("{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
             "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
             "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': "
             "c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class FakeTokenizer:
    """The one method ToolPrompt asks of a Tokenizer: the real renderer over a given template."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        return render_chat_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    tools=tools)


HISTORY = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "snow"},
]


def test_template_that_renders_tools_gets_them() -> None:
    prompt = ToolPrompt(FakeTokenizer(QWEN_LIKE))  # type: ignore[arg-type]
    assert prompt.renders_tools and prompt.format is HERMES  # detected from <tool_call>
    messages, tools = prompt.prepare(HISTORY, calling([WEATHER]))
    assert tools == [WEATHER] and messages[2:] == HISTORY[2:]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # an object, for templates
    assert HISTORY[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # the input is untouched
    assert prompt.prepare(HISTORY, calling([WEATHER], "none"))[1] is None  # "none": the tools are not offered


def test_fallback_for_a_template_without_tools(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="tokenmill.server"):
        prompt = ToolPrompt(FakeTokenizer(CHATML))  # type: ignore[arg-type]
    assert not prompt.renders_tools and prompt.format is HERMES
    assert "does not render tools" in caplog.text
    messages, tools = prompt.prepare([{"role": "system", "content": "Be brief."}, *HISTORY], calling([WEATHER]))
    assert tools is None
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]  # both results in one turn
    system = messages[0]["content"]
    assert system.startswith("Be brief.\n\n") and '"name": "get_weather"' in system and "<tool_call>" in system
    assert HERMES().parse(messages[2]["content"]).tool_calls == [ParsedToolCall("get_weather", '{"city": "Paris"}'),
                                                                ParsedToolCall("get_weather", '{"city": "Oslo"}')]
    results = messages[3]["content"]
    assert results.count("<tool_response>") == 2 and '"content": "sunny"' in results and "get_weather" in results
    text = render_chat_template(CHATML, messages, add_generation_prompt=True)
    assert "<tools>" in text and "snow" in text
    first, _ = prompt.prepare(HISTORY[:1], calling([WEATHER]))
    assert first[0]["role"] == "system" and first[1] == HISTORY[0]  # a system message of its own when none


def test_explicit_parser_teaches_its_own_format() -> None:
    prompt = ToolPrompt(FakeTokenizer(CHATML), "llama3_json")  # type: ignore[arg-type]
    messages, _ = prompt.prepare(HISTORY, calling([WEATHER]))
    assert '"parameters"' in messages[0]["content"] and messages[2]["content"].startswith('{"name": "get_weather"')
    with pytest.raises(ValueError, match="unknown tool call parser"):
        ToolPrompt(FakeTokenizer(CHATML), "pythonic")  # type: ignore[arg-type]
