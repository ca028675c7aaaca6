"""Tool calling through the openai client against the in-process server (the default model, whose ChatML
template renders no tools, so the fallback prompt and the hermes format are what it runs on), and offline.

The tiny model calls a tool in "auto" when the history shows it doing so (few-shot, greedy): a real call
read from its text. "required" and a named function are constrained by their JSON schema, so every call's
arguments validate, at temperature 0 and 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from app_server import AppServer

from tokenmill.config import EngineConfig
from tokenmill.sampling_params import SamplingParams

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                            "parameters": WEATHER_PARAMS}}
EVENT_PARAMS = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "day": {"type": "integer", "minimum": 1, "maximum": 31},
    "guests": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3}},
    "required": ["title", "day", "guests"], "additionalProperties": False}
EVENT = {"type": "function", "function": {"name": "add_event", "description": "Put an event in the calendar",
                                          "parameters": EVENT_PARAMS}}
LOOKBEHIND = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}}}}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "add_event": EVENT_PARAMS}
MODEL = "SmolLM2-135M-Instruct"
MAX_TOKENS = 80  # room for a call of either tool
ASK = [{"role": "user", "content": "What is the weather in Tokyo?"}]


def few_shot() -> list[dict[str, Any]]:
    """Three turns in which the assistant calls get_weather and then reports, then a fourth question."""
    messages: list[dict[str, Any]] = []
    for i, (city, weather) in enumerate([("Paris", "sunny"), ("Oslo", "snowing"), ("Rome", "warm")]):
        messages += [{"role": "user", "content": f"What is the weather in {city}?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"call{i}", "type": "function",
                          "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                     {"role": "tool", "tool_call_id": f"call{i}", "content": weather},
                     {"role": "assistant", "content": f"It is {weather} in {city}."}]
    return messages + ASK


@pytest.fixture(scope="module")
def server() -> Iterator[AppServer]:
    srv = AppServer(EngineConfig(max_model_len=1024, kv_cache_memory=64 * 2**20), log_requests=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: AppServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def stream_calls(client: openai.OpenAI, **kwargs: Any) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """A streamed answer's content, calls (deltas joined by index) and finish_reason, checking the shape:
    each call's first delta has its id, type and name, later ones only arguments."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content.append(choice.delta.content or "")
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function and d.function.name, d
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and d.function is not None and d.function.name is None, d
                calls[d.index]["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    assert sorted(calls) == list(range(len(calls)))
    return "".join(content) or None, [calls[i] for i in sorted(calls)], finish


def as_calls(message: Any) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]


def test_auto_reads_the_models_call(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": few_shot(), "tools": [WEATHER], "temperature": 0,
                              "max_tokens": 60}
    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = as_calls(choice.message)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Tokyo"})]
    assert calls[0]["id"].startswith("chatcmpl-tool-")
    content, streamed, finish = stream_calls(client, **kwargs)
    assert finish == "tool_calls" and content is None
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["name"], c["arguments"]) for c in calls]
    # the openai client's own stream helper assembles the same call from the deltas
    with client.chat.completions.stream(**kwargs) as s:
        final = s.get_final_completion()
    assert [(c["name"], c["arguments"]) for c in as_calls(final.choices[0].message)] == [
        (c["name"], c["arguments"]) for c in calls]


def test_round_trip(client: openai.OpenAI) -> None:
    """Call, tool result, answer: the answer message goes back as the openai client returns it."""
    messages: list[Any] = few_shot()
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0, max_tokens=60)
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    messages += [message, {"role": "tool", "tool_call_id": call.id, "content": "raining"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0,
                                            max_tokens=30)
    answer = second.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert answer.message.content and "raining" in answer.message.content


def test_none_reads_no_calls(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=few_shot(), tools=[WEATHER], tool_choice="none",
                                       temperature=0, max_tokens=40)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.content


def concurrently(client: openai.OpenAI, bodies: list[dict[str, Any]]) -> list[Any]:
    """The answers to `bodies`, sent at once (the engine batches them)."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: client.chat.completions.create(**body), bodies))


def cut_off_before_a_call(r: Any, temperature: float) -> bool:
    """A sampled answer whose first call max_tokens cut off (a sampled string may run long, which the grammar
    allows; which answer does depends on the batch at bf16): no calls, the partial call as content,
    finish_reason "length" after all MAX_TOKENS tokens. Greedy answers are held to fit."""
    choice = r.choices[0]
    if temperature == 0 or choice.message.tool_calls:
        return False
    content = choice.message.content or ""
    assert choice.finish_reason == "length" and r.usage.completion_tokens == MAX_TOKENS, choice
    assert content.lstrip().startswith("{") and '"name"' in content, choice
    return True


def test_required_always_calls_with_valid_arguments(client: openai.OpenAI) -> None:
    """Every answer has calls whose arguments validate, at temperature 0 and 1, with and without parallel
    calls. In parallel the tiny model may go on adding calls until max_tokens: the complete ones are the
    calls, the cut-off one content, and finish_reason is "length" (at temperature 1 that may be the first
    call: cut_off_before_a_call, for a few answers at most)."""
    prompts = ["What is the weather in Tokyo?", "Plan a dinner with Ann and Bo on the 12th.", "Hello!"]
    asks = [(prompt, temperature, parallel) for prompt in prompts for temperature in (0.0, 1.0)
            for parallel in (True, False)]
    answers = concurrently(client, [
        {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "tools": [WEATHER, EVENT],
         "tool_choice": "required", "parallel_tool_calls": parallel, "temperature": temperature, "seed": i,
         "max_tokens": MAX_TOKENS} for i, (prompt, temperature, parallel) in enumerate(asks)])
    cut = 0
    for (_, temperature, parallel), r in zip(asks, answers):
        if cut_off_before_a_call(r, temperature):
            cut += 1
            continue
        choice = r.choices[0]
        calls = as_calls(choice.message)
        assert calls, choice
        for c in calls:
            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
        if parallel and choice.finish_reason == "length":
            assert r.usage.completion_tokens == MAX_TOKENS
        else:
            assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        if not parallel:
            assert len(calls) == 1
    assert cut <= len(asks) // 4, f"{cut} of {len(asks)} answers cut off before their first call"


def test_named_function_always_calls_it_with_valid_arguments(client: openai.OpenAI) -> None:
    asks = [(name, prompt, temperature) for name, prompt in [("add_event", "Lunch with Ann tomorrow"),
                                                            ("get_weather", "Is it cold?"),
                                                            ("add_event", "Tell me a joke.")]
            for temperature in (0.0, 1.0)]
    answers = concurrently(client, [
        {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "tools": [WEATHER, EVENT],
         "tool_choice": {"type": "function", "function": {"name": name}}, "temperature": temperature, "seed": i,
         "max_tokens": MAX_TOKENS} for i, (name, prompt, temperature) in enumerate(asks)])
    cut = 0
    for (name, _, temperature), r in zip(asks, answers):
        if cut_off_before_a_call(r, temperature):
            cut += 1
            continue
        choice = r.choices[0]
        (call,) = as_calls(choice.message)
        # a forced function's answer stops with "stop", as OpenAI's and vLLM's do
        assert call["name"] == name and choice.finish_reason == "stop" and choice.message.content is None
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[name])
    assert cut <= len(asks) // 4, f"{cut} of {len(asks)} answers cut off before their first call"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add_event"}}])
def test_forced_stream_equals_whole(client: openai.OpenAI, choice: Any) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Dinner with Ann on the 3rd"}],
                              "tools": [WEATHER, EVENT], "tool_choice": choice, "temperature": 0,
                              "max_tokens": MAX_TOKENS}
    whole = client.chat.completions.create(**kwargs).choices[0]
    content, streamed, finish = stream_calls(client, **kwargs)
    want = "tool_calls" if choice == "required" else "stop"  # a named function: OpenAI's and vLLM's "stop"
    assert finish == whole.finish_reason == want and content == whole.message.content
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        (c["name"], c["arguments"]) for c in as_calls(whole.message)]


@pytest.mark.parametrize("extra, param, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice", "not in tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": 3}}}]},
     "tools[0].function.parameters", "not a valid JSON schema"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name",
     "function name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "given twice"),
    # a valid JSON schema whose pattern the grammar engine cannot compile (no look-behind in Rust's regex)
    ({"tools": [WEATHER, LOOKBEHIND], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tools[1].function.parameters", "does not compile"),
    ({"tools": [WEATHER, LOOKBEHIND], "tool_choice": "required"}, "tools", "does not compile"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", ""),
    ({"tool_choice": "sometimes"}, "tool_choice", ""),
    ({"use_beam_search": True, "n": 2, "temperature": 0}, "use_beam_search", "tools cannot be used"),
])
def test_bad_requests_are_400s(client: openai.OpenAI, extra: dict[str, Any], param: str, words: str) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "max_tokens": 5}
    body = {k: v for k, v in {**kwargs, **extra}.items() if v is not None}
    beams = {k: body.pop(k) for k in ("use_beam_search",) if k in body}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**body, extra_body=beams or None)
    err = e.value.body
    assert isinstance(err, dict) and err["param"] == param and words in err["message"], err


def test_offline_chat_with_tools() -> None:
    from tokenmill.entrypoints.llm import LLM

    llm = LLM(progress=False, max_model_len=1024, kv_cache_memory=48 * 2**20)
    params = SamplingParams(temperature=0, max_tokens=60)
    out = llm.chat(few_shot(), params, tools=[WEATHER])[0].outputs[0].text
    parsed = llm.parse_tool_calls(out, [WEATHER])
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("get_weather", {"city": "Tokyo"})]
    named = {"type": "function", "function": {"name": "add_event"}}
    out = llm.chat(ASK, params, tools=[WEATHER, EVENT], tool_choice=named)[0].outputs[0].text
    (call,) = llm.parse_tool_calls(out, [WEATHER, EVENT], tool_choice=named).tool_calls
    jsonschema.validate(json.loads(call.arguments), EVENT_PARAMS)


def test_tokenize_renders_the_tools(server: AppServer) -> None:
    """/tokenize with tools shows the prompt chat would run: here the fallback system prompt."""
    import httpx

    with_tools = httpx.post(f"{server.url}/tokenize", json={"messages": ASK, "tools": [WEATHER]}).json()["tokens"]
    plain = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}).json()["tokens"]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": with_tools}).json()["prompt"]
    assert len(with_tools) > len(plain) and '"name": "get_weather"' in text and "<tool_call>" in text
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "hi", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
