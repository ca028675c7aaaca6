"""Tool calling on Ollama's /api/chat through the `ollama` client, against the session's shared `tokenmill serve`
(the default model, whose ChatML template renders no tools: the fallback prompt and the hermes format).

As in test_server_tool_calling.py, the tiny model calls get_weather when the history shows it doing so
(few-shot, greedy): a real call read from its text, answered in Ollama's shape (arguments an object). The
history's calls and tool results (Ollama's `tool_name`) render as they do for /v1, so the same greedy tokens
come back from both endpoints.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from conftest import API_KEY
from server_process import ServerProcess
from test_server_tool_calling import few_shot as few_shot_openai  # the same conversation in OpenAI's shape

ollama = pytest.importorskip("ollama")

MODEL = "SmolLM2-135M-Instruct"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
OPTIONS = {"temperature": 0, "num_predict": 60}
CITIES = [("Paris", "sunny"), ("Oslo", "snowing"), ("Rome", "warm")]


def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
      city: the city's name
    """
    return dict(CITIES).get(city, "unknown")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "the city's name"}}}}}


def few_shot_ollama() -> list[dict[str, Any]]:
    """Three turns in which the assistant calls get_weather and reports, then a fourth question (Ollama's shape)."""
    messages: list[dict[str, Any]] = []
    for city, weather in CITIES:
        messages += [{"role": "user", "content": f"What is the weather in {city}?"},
                     {"role": "assistant", "content": "",
                      "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}]},
                     {"role": "tool", "content": weather, "tool_name": "get_weather"},
                     {"role": "assistant", "content": f"It is {weather} in {city}."}]
    return messages + [{"role": "user", "content": "What is the weather in Tokyo?"}]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    return ollama.Client(host=server.url, headers=HEADERS)


def test_a_call_comes_back_parsed(server: ServerProcess, client: Any) -> None:
    r = client.chat(model=MODEL, messages=few_shot_ollama(), tools=[get_weather], options=OPTIONS)
    calls = r.message.tool_calls
    assert calls is not None and len(calls) == 1, r.message
    assert calls[0].function.name == "get_weather" and calls[0].function.arguments == {"city": "Tokyo"}
    assert "<tool_call>" not in r.message.content and r.done_reason == "stop"

    # the same tokens as /v1 gives for the same conversation: the history rendered alike on both
    ref = httpx.post(f"{server.url}/v1/chat/completions", headers=HEADERS, timeout=120, json={
        "model": MODEL, "messages": few_shot_openai(), "tools": [WEATHER], "temperature": 0, "max_tokens": 60}).json()
    message = ref["choices"][0]["message"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
        [("get_weather", {"city": "Tokyo"})]
    assert r.eval_count == ref["usage"]["completion_tokens"] and r.prompt_eval_count == ref["usage"]["prompt_tokens"]

    # streamed: the call's text never goes out as content; the call is in the done object
    parts = list(client.chat(model=MODEL, messages=few_shot_ollama(), tools=[WEATHER], options=OPTIONS, stream=True))
    assert parts[-1].done and all(not p.message.tool_calls for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == r.message.content
    assert [(c.function.name, c.function.arguments) for c in parts[-1].message.tool_calls] == \
        [("get_weather", {"city": "Tokyo"})]


def test_a_tool_result_in_the_history_renders(server: ServerProcess, client: Any) -> None:
    """The model's call answered by a tool message: the next turn reads the result (it reports it)."""
    messages = few_shot_ollama()
    first = client.chat(model=MODEL, messages=messages, tools=[get_weather], options=OPTIONS)
    messages += [first.message.model_dump(exclude_none=True),
                 {"role": "tool", "content": "raining", "tool_name": "get_weather"}]
    r = client.chat(model=MODEL, messages=messages, tools=[get_weather], options=OPTIONS)
    assert not r.message.tool_calls and "raining" in r.message.content, r.message
    # an OpenAI-style client's tool message also names the call it answers: taken, as Ollama takes it
    with_id = messages[:-1] + [{**messages[-1], "tool_call_id": "call_1"}]
    assert "raining" in client.chat(model=MODEL, messages=with_id, tools=[get_weather], options=OPTIONS).message.content
    # the prompt is the one /v1 renders for the same conversation (the result in the fallback's
    # tool_response turn, with its tool's name)
    openai_messages = few_shot_openai() + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": c.function.name,
                                                         "arguments": json.dumps(c.function.arguments)}}
            for c in first.message.tool_calls or []]},
        {"role": "tool", "tool_call_id": "t", "content": "raining"}]
    tokens = httpx.post(f"{server.url}/tokenize", headers=HEADERS, timeout=60,
                        json={"model": MODEL, "messages": openai_messages, "tools": [WEATHER]}).json()
    assert r.prompt_eval_count == tokens["count"]


def test_bad_tools_are_400s(client: Any) -> None:
    for tools, words in (([{"type": "function", "function": {"name": "bad name!"}}], "is not a function name"),
                         ([{"type": "function", "function": {"description": "no name"}}], "tools[0]"),
                         ([WEATHER, WEATHER], "is given twice")):
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], tools=tools)
        assert e.value.status_code == 400 and words in e.value.error, e.value.error
