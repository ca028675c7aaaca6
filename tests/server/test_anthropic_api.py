"""Anthropic's Messages API (/v1/messages) through Anthropic's own client against a real server (with an API key,
sent as Anthropic's x-api-key): the same answer as chat completions for the same conversation, whole and
streamed (the events in order, their deltas adding up), stop reasons, tools both ways, count_tokens, and errors
in Anthropic's shape that name what is not done here."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import jsonschema
import openai
import pytest
from conftest import API_KEY
from server_process import ServerProcess

MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0}  # the API's older sampling field (this SDK no longer types it)
QUESTION = "What is the capital of France?"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)


def chat(server: ServerProcess, messages: list[dict], **kw) -> openai.types.chat.ChatCompletion:
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    return c.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def test_a_message_is_the_chat_answer(server: ServerProcess, client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, system="Answer briefly.",
                               messages=[{"role": "user", "content": QUESTION}])
    want = chat(server, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
                max_tokens=24)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == want.choices[0].message.content
    assert m.stop_reason == ("max_tokens" if want.choices[0].finish_reason == "length" else "end_turn")
    assert m.usage.input_tokens == want.usage.prompt_tokens and m.usage.output_tokens == want.usage.completion_tokens
    # content blocks and a multi-turn history render as the same chat
    m = client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=[
        {"role": "user", "content": [{"type": "text", "text": "My name is Ada."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello Ada!"}]},
        {"role": "user", "content": "What is my name?"}])
    want = chat(server, [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada!"},
                         {"role": "user", "content": "What is my name?"}], max_tokens=16)
    assert m.content[0].text == want.choices[0].message.content


def test_stop_reasons(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Write a long story about a dragon."}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 4
    whole = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": QUESTION}])
    word = whole.content[0].text.split()[2]  # a word the answer holds: it stops right before it
    m = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, stop_sequences=[word],
                               messages=[{"role": "user", "content": QUESTION}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert word not in m.content[0].text


def test_streamed_events(client: anthropic.Anthropic) -> None:
    kw: dict = dict(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": QUESTION}])
    whole = client.messages.create(**kw)
    events = list(client.messages.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[0].message.usage.input_tokens == whole.usage.input_tokens
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text
    assert events[-2].delta.stop_reason == whole.stop_reason and events[-2].usage.output_tokens == whole.usage.output_tokens
    # the SDK's own stream helper accumulates the same message
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason


def test_tools_both_ways(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"}, messages=ask)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    with client.messages.stream(model=MODEL, max_tokens=64, extra_body=GREEDY, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}, messages=ask) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.content[0].input == uses[0].input
    # the call and its result sent back
    back = [*ask, {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                                     "input": uses[0].input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 24 C"}]}]
    m = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, tools=[WEATHER], messages=back)
    assert m.content
    counted = client.messages.count_tokens(model=MODEL, messages=back, tools=[WEATHER])
    assert counted.input_tokens == client.messages.create(model=MODEL, max_tokens=1, tools=[WEATHER],
                                                          messages=back).usage.input_tokens


def test_output_config_format(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    m = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY,
                               output_config={"format": {"type": "json_schema", "schema": schema}},
                               messages=[{"role": "user", "content": "Name a city and its country as JSON."}])
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_errors_in_anthropics_shape(server: ServerProcess, client: anthropic.Anthropic) -> None:
    for kw, says in ((dict(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                      "messages[0].content[0]"),
                     (dict(messages=[{"role": "user", "content": "hi"}], tools=[{"type": "web_search_20250305",
                                                                                 "name": "web_search"}]),
                      "only client tools"),
                     (dict(messages=[]), "messages must not be empty"),
                     (dict(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                                   "content": [{"type": "image", "source": {}}]}]}]),
                      "only text is supported in a tool_result"),
                     (dict(messages=[{"role": "user", "content": "hi"}], max_tokens=9000), "maximum context length")):
        args = {"model": MODEL, "max_tokens": 8, **kw}
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**args)
        assert says in str(e.value), (kw, str(e.value))
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    # the key: Anthropic's header or a Bearer token; a wrong one is Anthropic's authentication_error
    r = httpx.post(f"{server.url}/v1/messages", headers={"x-api-key": "wrong"},
                   json={"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(f"{server.url}/v1/messages", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    # x-api-key stays refused elsewhere (OpenAI's routes take the Bearer token only)
    r = httpx.get(f"{server.url}/v1/models", headers={"x-api-key": API_KEY})
    assert r.status_code == 401
    assert json.loads(httpx.post(f"{server.url}/v1/messages", headers={"x-api-key": API_KEY},
                                 json={"max_tokens": 1}).text)["error"]["type"] == "invalid_request_error"


def test_a_final_assistant_turn_is_a_prefill(server: ServerProcess, client: anthropic.Anthropic) -> None:
    """As Anthropic takes it: the answer continues the final assistant text and holds only what follows (chat's
    continue_final_message)."""
    turns = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "The capital of France"}]
    m = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=turns)
    want = chat(server, turns, max_tokens=8, extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert m.content[0].text == want.choices[0].message.content and not m.content[0].text.startswith("The capital")
    assert client.messages.count_tokens(model=MODEL, messages=turns).input_tokens == m.usage.input_tokens


def test_a_client_that_hangs_up_mid_stream_leaves_nothing_running(server: ServerProcess) -> None:
    from tokenmill.benchmarks.soak import server_gauges

    with httpx.Client(base_url=server.url, headers={"x-api-key": API_KEY}, timeout=60) as http:
        body = {"model": MODEL, "max_tokens": 400, "stream": True, "temperature": 0,
                "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}
        with http.stream("POST", "/v1/messages", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            seen = [next(lines) for _ in range(30)]
            assert any("text_delta" in line for line in seen)
        deadline = time.monotonic() + 10
        auth = {"Authorization": f"Bearer {API_KEY}"}
        while True:
            gauges = server_gauges(http.get("/metrics", headers=auth).text)
            if gauges["num_requests_running"] == 0 and gauges["kv_cache_usage_perc"] == 0:
                break
            assert time.monotonic() < deadline, gauges
            time.sleep(0.05)


# -- thinking blocks (--reasoning-parser): a template that opens a <think> block when enable_thinking is set
THINKING_TEMPLATE = ("{% for m in messages %}### {{ m.role }}\n"
                     "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
                     "{{ m.content }}\n{% endfor %}"
                     "{% if add_generation_prompt %}### assistant\n{% if enable_thinking %}<think>\n{% endif %}"
                     "{% endif %}")


def test_thinking_blocks() -> None:
    from asgi_app import call

    from tokenmill.entrypoints.anthropic import router as anthropic_router
    from tokenmill.entrypoints.openai import router as openai_router
    from tokenmill.entrypoints.server import app as server_app
    from tokenmill.entrypoints.server.config import ServerConfig

    # the anthropic router on an app of its own, with the reasoning parser on
    from tokenmill.config import EngineConfig
    from tokenmill.engine.async_engine import AsyncEngine
    from tokenmill.engine.llm_engine import LLMEngine

    async_engine = AsyncEngine(LLMEngine(EngineConfig(max_model_len=256, kv_cache_memory=32 * 2**20, dtype="float32",
                                                      quantization="dequantize", chat_template=THINKING_TEMPLATE),
                                         progress=False))
    try:
        app = server_app.build_app(async_engine, ServerConfig(log_requests=False, reasoning_parser="deepseek_r1"),
                                   routers=[openai_router.build_router, anthropic_router.build_router])
        body = {"max_tokens": 12, "temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 1024},
                "messages": [{"role": "user", "content": "What is two plus two?"}]}
        whole = call(app, "POST", "/v1/messages", body).json()
        chat = call(app, "POST", "/v1/chat/completions", {
            "messages": body["messages"], "chat_template_kwargs": {"enable_thinking": True}, "max_tokens": 12,
            "temperature": 0}).json()["choices"][0]["message"]
        assert chat["reasoning_content"] and not chat.get("content")
        assert whole["content"] == [{"type": "thinking", "thinking": chat["reasoning_content"], "signature": ""}]
        assert whole["stop_reason"] == "max_tokens"
        text = call(app, "POST", "/v1/messages", {**body, "stream": True}).text
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        assert events[1]["type"] == "ping" and events[2]["content_block"]["type"] == "thinking"
        deltas = "".join(e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta")
        assert deltas == chat["reasoning_content"]
        # disabled: no block opened, the answer is text
        off = call(app, "POST", "/v1/messages", {**body, "thinking": {"type": "disabled"}}).json()
        assert [b["type"] for b in off["content"]] == ["text"]
    finally:
        async_engine.shutdown()


def test_the_start_log_names_every_endpoint(server: ServerProcess) -> None:
    out = server.output()
    line = next(line for line in out.splitlines() if "endpoints: " in line)
    for part in (f"OpenAI {server.url}/v1 ", f"Anthropic {server.url}/v1/messages", f"Ollama {server.url}/api",
                 f"chat page {server.url}/", f"metrics {server.url}/metrics"):
        assert part in line, line
