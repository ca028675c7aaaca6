"""The official `openai` client, sync and async, against a real `tokenmill serve` process."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from conftest import API_KEY
from server_process import ServerProcess


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_models(server: ServerProcess, client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert len(models) == 1
    m = models[0].model_dump()
    assert m["id"] == m["root"] == "SmolLM2-135M-Instruct"
    assert m["object"] == "model" and m["owned_by"] and m["created"] > 0 and m["max_model_len"] == 2048
    # OpenAI's retrieve, by the listed name or Ollama's tagged one; another name is a 404 naming the served one
    for name in (m["id"], m["id"] + ":latest"):
        assert client.models.retrieve(name).model_dump() == m
    with pytest.raises(openai.NotFoundError, match="does not exist.*SmolLM2-135M-Instruct"):
        client.models.retrieve("gpt-4o")


def test_completion(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert len(r.choices) == 1 and r.choices[0].text and r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_completion_prompt_shapes(server: ServerProcess, client: openai.OpenAI, model: str) -> None:
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello there"},
                     headers={"Authorization": f"Bearer {API_KEY}"}).json()["tokens"]
    text = client.completions.create(model=model, prompt="Hello there", max_tokens=4, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == text.choices[0].text
    many = client.completions.create(model=model, prompt=["Hello there", "One two three"], max_tokens=4,
                                     temperature=0, n=2)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == text.choices[0].text == many.choices[1].text
    lists = client.completions.create(model=model, prompt=[ids, ids], max_tokens=4, temperature=0)
    assert [c.text for c in lists.choices] == [text.choices[0].text] * 2
    assert lists.usage.prompt_tokens == 2 * len(ids)
    echo = client.completions.create(model=model, prompt="Hello there", max_tokens=4, temperature=0, echo=True)
    assert echo.choices[0].text == "Hello there" + text.choices[0].text


def test_chat(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, max_completion_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Again."}])
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 8


def test_an_answer_sent_back_as_history(client: openai.OpenAI, model: str) -> None:
    """The common loop `messages.append(r.choices[0].message.model_dump())`: the dump carries refusal,
    audio, function_call and annotations as null (OpenAI's message fields), and the next turn takes it; a
    refusal turn is rendered by its text, a deprecated function_call as a call, an audio reference is a 400."""
    msgs: list = [{"role": "user", "content": "Say hi."}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0)
    dumped = r.choices[0].message.model_dump()
    assert {"refusal", "audio", "function_call"} <= dumped.keys()
    again = client.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                           messages=msgs + [dumped, {"role": "user", "content": "More."}])
    assert again.choices[0].message.content
    refused = {"role": "assistant", "content": None, "refusal": "I can't help with that.", "annotations": []}
    call = {"role": "assistant", "content": None,
            "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    for turn in (refused, call):
        r = client.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                           messages=msgs + [turn, {"role": "user", "content": "Why?"}])
        assert r.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="audio is not supported"):
        client.chat.completions.create(model=model, max_tokens=4, messages=msgs + [
            {"role": "assistant", "content": None, "audio": {"id": "audio_1"}}, {"role": "user", "content": "?"}])


def test_logprob_bytes_rebuild_characters_split_across_tokens(client: openai.OpenAI, model: str) -> None:
    """OpenAI's `bytes` are each token's own bytes, so a client can join them into the text even where an
    emoji's bytes fall in several tokens (whose `token` text alone is U+FFFD)."""
    r = client.chat.completions.create(model=model, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
                                       messages=[{"role": "user", "content": "Reply with only emojis: 😀🎉🐱🚀🌈🍕"}])
    choice = r.choices[0]
    entries = choice.logprobs.content
    assert any(e.token == "\ufffd" for e in entries), "no token split a character: the test shows nothing"
    joined = b"".join(bytes(e.bytes) for e in entries)
    if choice.finish_reason == "stop":
        assert joined.decode() == choice.message.content
    else:  # cut by max_tokens: the last character may be unfinished
        assert joined.decode(errors="ignore") == choice.message.content.rstrip("\ufffd")
    for e in entries:
        assert all(t.bytes and (t.token != "\ufffd" or bytes(t.bytes) != "\ufffd".encode()) for t in e.top_logprobs)


def test_n_and_logprobs(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a story"}],
                                       n=2, max_tokens=5, logprobs=True, top_logprobs=3, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        lp = c.logprobs.content
        assert len(lp) == 5
        for tok in lp:
            assert tok.logprob <= 0 and len(tok.top_logprobs) == 3 and tok.bytes is not None
            assert tok.top_logprobs[0].logprob >= tok.top_logprobs[-1].logprob
    assert r.usage.completion_tokens == 10
    c = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=4, logprobs=2, temperature=0)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == c.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(d) >= 2 for d in lp.top_logprobs)
    # greedy: the chosen token is the most likely one
    assert all(max(d.values()) == pytest.approx(t) for d, t in zip(lp.top_logprobs, lp.token_logprobs))


def test_stop_and_seed(client: openai.OpenAI, model: str) -> None:
    base = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    text = base.choices[0].text
    assert "," in text
    stopped = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[","])
    assert stopped.choices[0].text == text[: text.index(",")]
    assert stopped.choices[0].finish_reason == "stop"
    runs = [client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=1.0,
                                      seed=1234).choices[0].text for _ in range(2)]
    assert runs[0] == runs[1]


def test_streaming_with_usage(client: openai.OpenAI, model: str) -> None:
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count to five"}], max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 8
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to five"}],
                                           max_tokens=8, temperature=0)
    assert text == whole.choices[0].message.content

    comp = list(client.completions.create(model=model, prompt="Hello", max_tokens=6, temperature=0, n=2,
                                          stream=True, stream_options={"include_usage": True}))
    assert comp[-1].choices == [] and comp[-1].usage.completion_tokens == 12
    per_choice = {0: "", 1: ""}
    for ch in comp[:-1]:
        per_choice[ch.choices[0].index] += ch.choices[0].text
    assert per_choice[0] == per_choice[1] != ""


def test_typed_errors(server: ServerProcess, client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length") as e:
        client.completions.create(model=model, prompt="hello " * 2100, max_tokens=10)
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    bad_key = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad_key.completions.create(model=model, prompt="hi", max_tokens=2)
    assert httpx.get(f"{server.url}/health").status_code == 200  # /health needs no key
    assert httpx.get(f"{server.url}/metrics").status_code == 200  # nor /metrics, unless --metrics-require-key


@pytest.mark.parametrize("body, field", [
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": []}, "prompt"),
    ({}, "prompt"),
])
def test_completion_400s(server: ServerProcess, body: dict, field: str) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
    assert err["param"] == field and field in err["message"]


@pytest.mark.parametrize("extra, field", [
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),  # needs its json_schema
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"functions": []}, "functions"),
])
def test_chat_400s(server: ServerProcess, extra: dict, field: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_image_part_rejected(server: ServerProcess) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and "image_url" in r.json()["error"]["message"]


def test_tokenize_detokenize_version(server: ServerProcess) -> None:
    h = {"Authorization": f"Bearer {API_KEY}"}
    t = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello world"}, headers=h).json()
    assert t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] == 2048
    d = httpx.post(f"{server.url}/detokenize", json={"tokens": t["tokens"]}, headers=h).json()
    assert d["prompt"] == "Hello world"
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, headers=h)
    assert chat.json()["count"] > 3
    assert httpx.get(f"{server.url}/version", headers=h).json()["version"]


def test_async_client(server: ServerProcess, model: str) -> None:
    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        comp, chat = await asyncio.gather(
            client.completions.create(model=model, prompt="Hello", max_tokens=5, temperature=0),
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                           temperature=0))
        assert comp.usage.completion_tokens == 5 and chat.choices[0].message.content
        stream = await client.completions.create(model=model, prompt="Hello", max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True})
        parts = [c async for c in stream]
        assert "".join(c.choices[0].text for c in parts if c.choices) == comp.choices[0].text
        assert parts[-1].usage.completion_tokens == 5
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await client.completions.create(model=model, prompt="hi", max_tokens=4096)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}])
        bad = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.completions.create(model=model, prompt="Hello", max_tokens=5)
        await client.close()
        await bad.close()

    asyncio.run(main())
