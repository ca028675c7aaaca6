"""OpenAI's Responses API (/v1/responses) through the official `openai` client against a real server: the
same answer as chat completions for the same conversation and settings, whole and streamed (the typed events
in order, their deltas adding up to the text), max_output_tokens as status incomplete, function tools both
ways, text.format's JSON schema, and 400s / 404s that name what is not done here. A client that hangs up
mid-stream leaves nothing running."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest
from conftest import API_KEY
from server_process import ServerProcess

from tokenmill.benchmarks.soak import server_gauges

QUESTION = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def chat_text(client: openai.OpenAI, messages: list[dict], **kw) -> tuple[str, int]:
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, temperature=0, **kw)
    assert r.usage is not None
    return str(r.choices[0].message.content), r.usage.prompt_tokens


def test_a_response_is_the_chat_answer(client: openai.OpenAI) -> None:
    r = client.responses.create(model="SmolLM2-135M-Instruct", input=QUESTION, max_output_tokens=24, temperature=0)
    want, prompt_tokens = chat_text(client, [{"role": "user", "content": QUESTION}], max_tokens=24)
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.output_text == want and "Paris" in want
    assert [item.type for item in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.usage is not None and r.usage.input_tokens == prompt_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.store is False  # nothing is kept for retrieval, and the answer says so
    # instructions and a list of items are the system message and the conversation
    items = [{"role": "user", "content": [{"type": "input_text", "text": "My name is Ada."}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Hello Ada!"}]},
             {"type": "message", "role": "user", "content": "What is my name?"}]
    r = client.responses.create(model="SmolLM2-135M-Instruct", instructions="Answer briefly.", input=items,
                                max_output_tokens=16, temperature=0)
    want, _ = chat_text(client, [{"role": "system", "content": "Answer briefly."},
                                 {"role": "user", "content": "My name is Ada."},
                                 {"role": "assistant", "content": "Hello Ada!"},
                                 {"role": "user", "content": "What is my name?"}], max_tokens=16)
    assert r.output_text == want


def test_max_output_tokens_is_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="SmolLM2-135M-Instruct", input="Write a long story about a dragon.",
                                max_output_tokens=5, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 5
    assert r.output[-1].status == "incomplete"  # the item the limit cut, as OpenAI marks it
    events = list(client.responses.create(model="SmolLM2-135M-Instruct", input="Write a long story about a dragon.",
                                          max_output_tokens=5, temperature=0, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done[-1].status == "incomplete" and events[-1].response.output[-1].status == "incomplete"


def test_streamed_events(client: openai.OpenAI) -> None:
    whole = client.responses.create(model="SmolLM2-135M-Instruct", input=QUESTION, max_output_tokens=24,
                                    temperature=0)
    events = list(client.responses.create(model="SmolLM2-135M-Instruct", input=QUESTION, max_output_tokens=24,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    done = events[-1].response
    assert done.output_text == whole.output_text and done.usage.output_tokens == whole.usage.output_tokens
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {done.output[0].id}


def test_function_tools_both_ways(client: openai.OpenAI) -> None:
    forced = {"type": "function", "name": "get_weather"}
    r = client.responses.create(model="SmolLM2-135M-Instruct", input="What is the weather in Paris?",
                                tools=[WEATHER], tool_choice=forced, max_output_tokens=64, temperature=0)
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    # streamed: one function_call item whose argument deltas add up
    events = list(client.responses.create(model="SmolLM2-135M-Instruct", input="What is the weather in Paris?",
                                          tools=[WEATHER], tool_choice=forced, max_output_tokens=64, temperature=0,
                                          stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [i.type for i in added] == ["function_call"] and added[0].name == "get_weather"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == calls[0].arguments == events[-1].response.output[0].arguments
    # the call and its result sent back: the conversation goes on
    back = [{"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
             "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 C"}]
    r = client.responses.create(model="SmolLM2-135M-Instruct", input=back, tools=[WEATHER], max_output_tokens=24,
                                temperature=0)
    assert r.status in ("completed", "incomplete") and r.output


def test_text_format_json_schema(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client.responses.create(model="SmolLM2-135M-Instruct", input="Name a city and its country as JSON.",
                                text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                                                 "strict": True}}, max_output_tokens=64, temperature=0)
    jsonschema.validate(json.loads(r.output_text), schema)


def test_what_is_not_done_here_says_so(server: ServerProcess, client: openai.OpenAI) -> None:
    m = "SmolLM2-135M-Instruct"
    cases = [
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]),
         "only text parts", "input[0].content"),
        (dict(input="hi", previous_response_id="resp_1"), "stores no responses", "previous_response_id"),
        (dict(input="hi", tools=[{"type": "web_search"}]), "function tools only", "tools[0].type"),
        (dict(input="hi", truncation="auto"), "never truncates", "truncation"),
        (dict(input="hi", background=True), "background", "background"),
        (dict(input="hi", max_output_tokens=100000), "maximum context length", None),
        (dict(input=[]), "input must not be empty", "input"),
        (dict(input="hi", text={"format": {"type": "text"}, "verbosity": "low"}), "text.verbosity", "text.verbosity"),
        (dict(input=[{"type": "reasoning", "content": [{"text": 5}]}]), "reasoning item", "input[0].content"),
    ]
    for kw, says, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=m, **kw)
        assert says in str(e.value), (kw, str(e.value))
        if param is not None:
            assert e.value.body["param"] == param, (kw, e.value.body)
    with pytest.raises(openai.NotFoundError, match="stores no responses"):
        client.responses.retrieve("resp_123")


def test_a_client_that_hangs_up_mid_stream_leaves_nothing_running(server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        body = {"input": "Write a long story about a dragon.", "max_output_tokens": 400, "stream": True,
                "temperature": 0}
        with http.stream("POST", "/v1/responses", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            seen = [next(lines) for _ in range(30)]  # event, data and a blank line each: 10 events
            assert any("response.output_text.delta" in line for line in seen)
            assert http.get("/load").json() == {"server_load": 1}  # vLLM's load probe counts it
        deadline = time.monotonic() + 10
        while True:
            gauges = server_gauges(http.get("/metrics").text)
            if gauges["num_requests_running"] == 0 and gauges["kv_cache_usage_perc"] == 0:
                break
            assert time.monotonic() < deadline, gauges
            time.sleep(0.05)
        assert http.get("/load").json() == {"server_load": 0}


# -- reasoning items (--reasoning-parser): a template that opens a <think> block when reasoning.effort is set
THINKING_TEMPLATE = ("{% for m in messages %}### {{ m.role }}\n"
                     "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
                     "{{ m.content }}\n{% endfor %}"
                     "{% if add_generation_prompt %}### assistant\n{% if reasoning_effort %}<think>\n{% endif %}"
                     "{% endif %}")


def test_reasoning_items(tmp_path_factory: pytest.TempPathFactory) -> None:
    from asgi_app import call, in_process_app

    from tokenmill.entrypoints.server.config import ServerConfig

    for app in in_process_app(ServerConfig(log_requests=False, reasoning_parser="deepseek_r1"), max_model_len=256,
                              kv_cache_memory=32 * 2**20, dtype="float32", quantization="dequantize",
                              chat_template=THINKING_TEMPLATE):
        body = {"input": "What is two plus two?", "reasoning": {"effort": "high"}, "max_output_tokens": 12,
                "temperature": 0}
        whole = call(app, "POST", "/v1/responses", body).json()
        chat = call(app, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "What is two plus two?"}], "reasoning_effort": "high",
            "max_tokens": 12, "temperature": 0}).json()["choices"][0]["message"]
        assert chat["reasoning_content"] and not chat.get("content")  # all of it inside the opened block
        assert [i["type"] for i in whole["output"]] == ["reasoning"]
        assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": chat["reasoning_content"]}]
        assert 0 < whole["usage"]["output_tokens_details"]["reasoning_tokens"] <= 12
        text = call(app, "POST", "/v1/responses", {**body, "stream": True}).text
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
        assert deltas == chat["reasoning_content"] and events[-1]["type"] == "response.incomplete"
        # a reasoning item sent back reaches the template as the next assistant turn's reasoning
        back = [{"role": "user", "content": "Hi"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                                 "text": "They greet me."}]},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
        r = call(app, "POST", "/v1/responses", {"input": back, "max_output_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["input_tokens"] == len(call(app, "POST", "/tokenize", {"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "They greet me."},
            {"role": "user", "content": "Bye"}]}).json()["tokens"])


def test_cached_prompt_tokens_are_reported(client: openai.OpenAI) -> None:
    """The prefix cache's share of a prompt, counted by the engine: chat's usage.prompt_tokens_details and the
    Responses usage's input_tokens_details: for a prompt never seen at most the template's opening, whole blocks of
    it the second time."""
    import uuid

    text = f"{uuid.uuid4().hex} " + "Tell me everything you know about the history of the river Thames. " * 4
    first = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": text}],
                                           max_tokens=2, temperature=0)
    again = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": text}],
                                           max_tokens=2, temperature=0)
    # the first time only the template's opening (the same in every chat, before the unique text) can be cached
    before = first.usage.prompt_tokens_details.cached_tokens
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert before < 32 and cached >= before + 48 and cached % 16 == 0 and cached < again.usage.prompt_tokens
    r = client.responses.create(model="SmolLM2-135M-Instruct", input=text, max_output_tokens=2, temperature=0)
    assert r.usage.input_tokens_details.cached_tokens == cached
    events = list(client.responses.create(model="SmolLM2-135M-Instruct", input=text, max_output_tokens=2,
                                          temperature=0, stream=True))
    assert events[-1].response.usage.input_tokens_details.cached_tokens == cached
