"""What vLLM's and llama-server's clients rely on (issue 11), in-process: /v1/completions defaults to 16
tokens, stream_options needs stream, logit_bias names every bad key, the unprefixed routes that
llama-server and Ollama answer; vLLM's extras (continuous usage stats, return_token_ids, truncation_side,
chat echo and continue_final_message) and beam search. Outputs are compared between
requests (fp32, dequantized weights), never against fixed text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from asgi_app import call, in_process_app


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    yield from in_process_app(max_model_len=256, kv_cache_memory=32 * 2**20, dtype="float32",
                              quantization="dequantize")


def test_completions_default_to_16_tokens(app) -> None:
    r = call(app, "POST", "/v1/completions", {"prompt": "Once upon a time", "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_stream_options_without_stream_is_a_400(app) -> None:
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = call(app, "POST", path, {**body, "max_tokens": 2, "stream_options": {"include_usage": True}})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "stream_options" and "stream=True" in err["message"], err


def test_logit_bias_names_every_bad_key(app) -> None:
    r = call(app, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                              "logit_bias": {"foo": 1, "12": 1, "bar": 2}})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert "'foo'" in msg and "'bar'" in msg and "'12'" not in msg, msg
    r = call(app, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                              "logit_bias": {"99999999": 1, "88888888": 1, "5": 300}})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert "300" in msg, msg  # values first; then ids, all of them
    r = call(app, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                              "logit_bias": {"99999999": 1, "88888888": 1}})
    msg = r.json()["error"]["message"]
    assert "99999999" in msg and "88888888" in msg, msg


def test_unprefixed_routes_answer_like_v1(app) -> None:
    assert call(app, "GET", "/models").json() == call(app, "GET", "/v1/models").json()
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    a, b = call(app, "POST", "/completions", body), call(app, "POST", "/v1/completions", body)
    assert a.status_code == 200 and a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    a, b = call(app, "POST", "/chat/completions", chat), call(app, "POST", "/v1/chat/completions", chat)
    assert a.status_code == 200
    assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]


def test_embeddings_say_the_model_does_not_support_them(app) -> None:
    for path in ("/v1/embeddings", "/embeddings"):
        r = call(app, "POST", path, {"input": "hello", "model": "x"})
        assert r.status_code == 400 and "does not support Embeddings API" in r.json()["error"]["message"], r.text


def test_cors_preflight_without_cors_origins_says_how_to_enable_it(app) -> None:
    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.options("/v1/chat/completions", headers={
                "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})

    r = asyncio.run(main())
    assert r.status_code == 403
    msg = r.json()["error"]["message"]
    assert "--cors-origins http://localhost:3000" in msg, msg


def test_tokenize_returns_token_strings_when_asked(app) -> None:
    plain = call(app, "POST", "/tokenize", {"prompt": "Hello world"}).json()
    assert plain.get("token_strs") is None
    r = call(app, "POST", "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == plain["tokens"] and len(body["token_strs"]) == body["count"]
    assert "".join(body["token_strs"]).replace("\u0120", " ") == "Hello world"  # byte-level BPE's space mark


# -- vLLM's extras (issue 11): continuous usage, token ids, truncation side, chat echo and continuation,
# beam search refused by name ---------------------------------------------------------------------------
CHAT = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"}]


def frames(r: httpx.Response) -> list[dict[str, Any]]:
    """The JSON events of an SSE answer, [DONE] checked and dropped."""
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and data[-1] == "[DONE]", r.text
    return [json.loads(d) for d in data[:-1]]


def assert_400(r: httpx.Response, param: str, *words: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["param"] == param and all(w in err["message"] for w in words), err


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "Once upon a time"}),
    ("/v1/chat/completions", {"messages": CHAT[:1]}),
])
def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(app, path: str, body: dict[str, Any]) -> None:
    body = {**body, "max_tokens": 5, "ignore_eos": True, "temperature": 0, "stream": True}
    events = frames(call(app, "POST", path, {**body, "stream_options": {"include_usage": True,
                                                                       "continuous_usage_stats": True}}))
    *chunks, last = events
    assert chunks and last["choices"] == [] and last["usage"]["completion_tokens"] == 5
    num_prompt = last["usage"]["prompt_tokens"]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c["usage"]["prompt_tokens"] == num_prompt for c in chunks)
    assert all(c["usage"]["total_tokens"] == num_prompt + c["usage"]["completion_tokens"] for c in chunks)
    assert counts == sorted(counts) and counts[-1] == 5  # running counts, ending at the whole
    # vLLM's rule: per-chunk usage only together with include_usage; without the flag only the last chunk
    for options in ({"continuous_usage_stats": True}, {"include_usage": True}):
        events = frames(call(app, "POST", path, {**body, "stream_options": options}))
        assert all(e.get("usage") is None for e in events if e["choices"]), options


def test_return_token_ids_on_completions(app) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    prompt_ids = call(app, "POST", "/tokenize", {"prompt": body["prompt"]}).json()["tokens"]
    plain = call(app, "POST", "/v1/completions", body).json()["choices"][0]
    assert plain["prompt_token_ids"] is None and plain["token_ids"] is None  # only when asked
    choice = call(app, "POST", "/v1/completions", {**body, "return_token_ids": True}).json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids and len(choice["token_ids"]) == 6
    assert call(app, "POST", "/detokenize", {"tokens": choice["token_ids"]}).json()["prompt"] == choice["text"]
    chunks = [e["choices"][0] for e in frames(call(app, "POST", "/v1/completions",
                                                   {**body, "return_token_ids": True, "stream": True}))]
    assert chunks[0]["prompt_token_ids"] == prompt_ids  # in the first chunk only, as vLLM
    assert all(c["prompt_token_ids"] is None for c in chunks[1:])
    assert [t for c in chunks for t in c["token_ids"]] == choice["token_ids"]  # deltas add up


def test_return_token_ids_on_chat(app) -> None:
    body = {"messages": CHAT[:1], "max_tokens": 6, "temperature": 0}
    prompt_ids = call(app, "POST", "/tokenize", {"messages": CHAT[:1]}).json()["tokens"]
    r = call(app, "POST", "/v1/chat/completions", {**body, "return_token_ids": True}).json()
    assert r["prompt_token_ids"] == prompt_ids and len(r["choices"][0]["token_ids"]) == r["usage"]["completion_tokens"]
    text = call(app, "POST", "/detokenize", {"tokens": r["choices"][0]["token_ids"]}).json()["prompt"]
    assert text == r["choices"][0]["message"]["content"]
    events = frames(call(app, "POST", "/v1/chat/completions", {**body, "return_token_ids": True, "stream": True}))
    assert events[0]["prompt_token_ids"] == prompt_ids and all(e["prompt_token_ids"] is None for e in events[1:])
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == r["choices"][0]["token_ids"]


def test_truncation_side_picks_which_prompt_tokens_stay(app) -> None:
    prompt = list(range(1000, 1010))
    body = {"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 3, "return_token_ids": True}
    for side, kept in ((None, prompt[-3:]), ("left", prompt[-3:]), ("right", prompt[:3])):
        r = call(app, "POST", "/v1/completions", {**body, **({"truncation_side": side} if side else {})})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["prompt_token_ids"] == kept and r.json()["usage"]["prompt_tokens"] == 3
    assert_400(call(app, "POST", "/v1/completions", {**body, "truncation_side": "middle"}), "truncation_side")
    assert_400(call(app, "POST", "/v1/chat/completions", {"messages": CHAT[:1], "truncation_side": "up"}),
               "truncation_side")


def test_continue_final_message_continues_the_assistant_turn(app) -> None:
    opened = call(app, "POST", "/tokenize", {"messages": CHAT, "continue_final_message": True,
                                             "add_generation_prompt": False}).json()["tokens"]
    closed = call(app, "POST", "/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()["tokens"]
    text = call(app, "POST", "/detokenize", {"tokens": opened}).json()["prompt"]
    assert len(opened) < len(closed) and closed[:len(opened)] == opened  # the end of turn is cut off
    assert text.endswith(CHAT[-1]["content"])
    # add_generation_prompt left out means false when continuing (true is refused below)
    assert call(app, "POST", "/tokenize", {"messages": CHAT, "continue_final_message": True}).json()["tokens"] == opened
    body = {"messages": CHAT, "continue_final_message": True, "max_tokens": 5, "temperature": 0}
    chat = call(app, "POST", "/v1/chat/completions", body).json()
    same = call(app, "POST", "/v1/completions", {"prompt": opened, "max_tokens": 5, "temperature": 0}).json()
    assert chat["usage"]["prompt_tokens"] == len(opened)
    assert chat["choices"][0]["message"]["content"] == same["choices"][0]["text"]  # the same continuation


def test_continue_final_message_refusals(app) -> None:
    both = {"messages": CHAT, "continue_final_message": True, "add_generation_prompt": True}
    for path in ("/v1/chat/completions", "/tokenize"):
        assert_400(call(app, "POST", path, both), "continue_final_message",
                   "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    r = call(app, "POST", "/v1/chat/completions", {"messages": CHAT[:1], "continue_final_message": True})
    assert_400(r, "continue_final_message", "assistant", "'user'")


def test_chat_echo_starts_the_answer_with_the_final_assistant_message(app) -> None:
    body = {"messages": CHAT, "continue_final_message": True, "max_tokens": 5, "temperature": 0}
    answer = call(app, "POST", "/v1/chat/completions", body).json()
    plain = answer["choices"][0]["message"]["content"]
    echoed = call(app, "POST", "/v1/chat/completions", {**body, "echo": True}).json()
    assert echoed["choices"][0]["message"]["content"] == CHAT[-1]["content"] + plain
    assert echoed["usage"] == answer["usage"]  # the echo is neither generated nor counted
    events = frames(call(app, "POST", "/v1/chat/completions", {**body, "echo": True, "stream": True}))
    first = events[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": CHAT[-1]["content"]}
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == CHAT[-1]["content"] + plain
    # the final message is the user's: the role being generated differs, nothing is echoed
    user_last = {"messages": CHAT[:1], "max_tokens": 5, "temperature": 0}
    assert (call(app, "POST", "/v1/chat/completions", {**user_last, "echo": True}).json()["choices"][0]["message"]
            == call(app, "POST", "/v1/chat/completions", user_last).json()["choices"][0]["message"])


def reference_beams(reference, ids: list[int], width: int, max_tokens: int, eos: list[int]) -> list[list[int]]:
    """transformers' beam search on the same weights: the generated ids of its `width` hypotheses, best first."""
    import torch
    from transformers import GenerationConfig

    cfg = GenerationConfig(num_beams=width, num_return_sequences=width, do_sample=False, max_new_tokens=max_tokens,
                           eos_token_id=eos, pad_token_id=eos[0])
    with torch.inference_mode():
        seqs = reference.generate(torch.tensor([ids]), generation_config=cfg, attention_mask=torch.ones(1, len(ids)))
    out = []
    for seq in seqs:
        gen = seq[len(ids):].tolist()
        out.append(next((gen[: j + 1] for j, t in enumerate(gen) if t in eos), gen))
    return out


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_beam_search_answers_transformers_beams(app, reference, path: str) -> None:
    """use_beam_search with n beams: the n choices are transformers' n hypotheses, best first, streamed or not."""
    body: dict[str, Any] = {"prompt": "The capital of France is"} if path == "/v1/completions" else {"messages": CHAT[:1]}
    body |= {"use_beam_search": True, "n": 3, "max_tokens": 8, "return_token_ids": True}
    r = call(app, "POST", path, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    prompt_ids = answer["choices"][0]["prompt_token_ids"] if path == "/v1/completions" else answer["prompt_token_ids"]
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    eos = sorted(Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata).eog_token_ids)
    want = reference_beams(reference, prompt_ids, 3, 8, eos)
    assert [c["token_ids"] for c in answer["choices"]] == want
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert answer["usage"]["completion_tokens"] == sum(len(w) for w in want)
    streamed = frames(call(app, "POST", path, body | {"stream": True}))
    ids = {}
    for f in streamed:
        for c in f["choices"]:
            ids.setdefault(c["index"], []).extend(c.get("token_ids") or [])
    assert [ids[i] for i in range(3)] == want


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": CHAT[:1], "max_tokens": 2}),
])
def test_beam_search_refuses_what_it_would_not_honour(app, path: str, body: dict[str, Any]) -> None:
    """Sampling fields beam search would not honour, and its own fields without it, are 400s naming them."""
    beams = {**body, "use_beam_search": True, "n": 2}
    for field, value in (("temperature", 0.7), ("top_p", 0.5), ("stop", ["x"]), ("presence_penalty", 0.5)):
        assert_400(call(app, "POST", path, {**beams, field: value}), field, "use_beam_search")
    for neutral in ({"use_beam_search": False}, {"length_penalty": 1.0}, {"early_stopping": False}):
        assert call(app, "POST", path, {**body, **neutral}).status_code == 200, neutral
    assert_400(call(app, "POST", path, {**body, "length_penalty": 0.5}), "length_penalty", "use_beam_search")
    assert_400(call(app, "POST", path, {**body, "early_stopping": True}), "early_stopping", "use_beam_search")
    assert call(app, "POST", path, {**beams, "length_penalty": 0.5, "early_stopping": "never"}).status_code == 200
