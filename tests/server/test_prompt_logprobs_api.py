"""Prompt logprobs through the HTTP API (issue 11): /v1/completions' echo with logprobs (what
lm-evaluation-harness sends to score loglikelihoods), max_tokens 0 with echo, and vLLM's prompt_logprobs
field on completions and chat; values held to transformers' fp32 log-softmax of the same prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from asgi_app import call, in_process_app

PROMPT = "The quick brown fox jumps over the lazy dog because"


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    yield from in_process_app(max_model_len=256, kv_cache_memory=32 * 2**20, dtype="float32",
                              quantization="dequantize")


def post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return call(app, "POST", path, body)


@pytest.fixture(scope="module")
def ids(app) -> list[int]:
    r = post(app, "/tokenize", {"prompt": PROMPT})
    return r.json()["tokens"]


@pytest.fixture(scope="module")
def ref_logprobs(reference, ids) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_echo_logprobs_max_tokens_0_scores_the_prompt(app, ids, ref_logprobs) -> None:
    r = post(app, "/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 3, "max_tokens": 0,
                                      "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    c = body["choices"][0]
    assert c["text"] == PROMPT  # the prompt back, nothing generated
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(ids)
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for p in range(1, len(ids)):
        assert abs(lp["token_logprobs"][p] - float(ref_logprobs[p - 1, ids[p]])) < 1e-3
        assert 3 <= len(lp["top_logprobs"][p]) <= 4  # the top 3, plus the token itself when it is not among them
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0


def test_echo_logprobs_with_generation_puts_the_prompt_first(app, ids, ref_logprobs) -> None:
    """lm-evaluation-harness's loglikelihood call: echo, logprobs 1, max_tokens 1; it reads
    token_logprobs[ctxlen:-1]."""
    r = post(app, "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1,
                                      "temperature": 0})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1
    got = lp["token_logprobs"][1 : len(ids)]
    want = [float(ref_logprobs[p - 1, ids[p]]) for p in range(1, len(ids))]
    assert got == pytest.approx(want, abs=1e-3)
    assert lp["token_logprobs"][-1] == pytest.approx(float(ref_logprobs[-1].max()), abs=1e-3)  # greedy's token


def test_echo_logprobs_streamed_equals_whole(app, ids) -> None:
    body = {"prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    whole = post(app, "/v1/completions", body).json()["choices"][0]
    r = post(app, "/v1/completions", dict(body, stream=True))
    frames = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = "".join(f["choices"][0]["text"] for f in frames if f["choices"])
    tlps = [x for f in frames if f["choices"] and f["choices"][0]["logprobs"]
            for x in f["choices"][0]["logprobs"]["token_logprobs"]]
    assert text == whole["text"]
    assert tlps == whole["logprobs"]["token_logprobs"]


def test_vllm_prompt_logprobs_field(app, ids, ref_logprobs) -> None:
    r = post(app, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 2, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    plp = r.json()["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for p in range(1, len(ids)):
        entry = plp[p][str(ids[p])]
        assert abs(entry["logprob"] - float(ref_logprobs[p - 1, ids[p]])) < 1e-3
        assert entry["rank"] >= 1 and isinstance(entry["decoded_token"], str)
        ranks = sorted(e["rank"] for e in plp[p].values())
        assert ranks[:2] == [1, 2] or entry["rank"] in ranks
    chat = post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 0,
                                              "max_tokens": 1})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["prompt_logprobs"][0] is None and all(len(e) == 1 for e in body["prompt_logprobs"][1:])
    assert len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"]


def test_prompt_logprobs_refusals_name_the_field(app) -> None:
    r = post(app, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 2, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
    assert "stream=True" in r.json()["error"]["message"]
    r = post(app, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 99})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
    r = post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
