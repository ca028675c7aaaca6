"""--reasoning-parser over HTTP: a thinking answer's <think> text comes back as `reasoning_content` (chat,
streamed or not, the pieces joining to the whole) or Ollama's `thinking`, the rest as the content.

The default model does not think, so the tests make it: a chat template that opens a <think> block when
enable_thinking is true (as DeepSeek-R1's and the Qwen3 thinking models' do), and a regex constraint that
writes a whole <think> ... </think> answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgi_app import call, in_process_app

from tokenmill.entrypoints.server.config import ServerConfig

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = ("{% for m in messages %}### {{ m.role }}\n"
            "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}### assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}")
CHAT = [{"role": "user", "content": "What is two plus two?"}]
THINK = {"chat_template_kwargs": {"enable_thinking": True}}
# a whole thinking answer, written by the grammar (a constrained answer starts outside the block)
FORCED = {"structured_outputs": {"regex": "<think>\\nI add two and two\\.\\n</think>\\n\\nFour\\."}}


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    yield from in_process_app(ServerConfig(log_requests=False, reasoning_parser="deepseek_r1"), max_model_len=256,
                              kv_cache_memory=32 * 2**20, dtype="float32", quantization="dequantize",
                              chat_template=TEMPLATE)


def chat(app: Any, **body: Any) -> dict[str, Any]:
    r = call(app, "POST", "/v1/chat/completions", {"messages": CHAT, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def streamed(app: Any, **body: Any) -> tuple[str, str, str | None]:
    """(reasoning, content, finish_reason) joined from a stream's deltas."""
    r = call(app, "POST", "/v1/chat/completions", {"messages": CHAT, "temperature": 0, "stream": True, **body})
    assert r.status_code == 200, r.text
    reasoning, content, finish = [], [], None
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for c in json.loads(line[6:])["choices"]:
                assert c["delta"].get("reasoning") == c["delta"].get("reasoning_content")
                reasoning.append(c["delta"].get("reasoning_content") or "")
                content.append(c["delta"].get("content") or "")
                finish = c["finish_reason"] or finish
    return "".join(reasoning), "".join(content), finish


def test_a_written_think_block_is_the_reasoning(app: Any) -> None:
    whole = chat(app, max_tokens=64, **FORCED)
    # under vLLM's current name and its older one (SGLang's, llama.cpp's)
    assert whole["message"]["reasoning"] == whole["message"]["reasoning_content"] == "\nI add two and two.\n"
    assert whole["message"]["content"] == "Four." and whole["finish_reason"] == "stop"
    assert streamed(app, max_tokens=64, **FORCED) == ("\nI add two and two.\n", "Four.", "stop")
    # vLLM's include_reasoning false: the reasoning is left out, and still not content
    quiet = chat(app, max_tokens=64, include_reasoning=False, **FORCED)["message"]
    assert quiet["content"] == "Four." and not {"reasoning", "reasoning_content"} & set(quiet)
    assert streamed(app, max_tokens=64, include_reasoning=False, **FORCED) == ("", "Four.", "stop")


def test_a_block_the_template_opened_holds_the_whole_unfinished_answer(app: Any) -> None:
    ids = call(app, "POST", "/tokenize", {"messages": CHAT, **THINK}).json()["tokens"]
    plain = call(app, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0}).json()
    text = plain["choices"][0]["text"]
    assert "</think>" not in text  # the premise: it does not close the block in 6 tokens
    whole = chat(app, max_tokens=6, **THINK)
    assert whole["message"]["reasoning_content"] == text and whole["message"]["content"] == ""
    assert streamed(app, max_tokens=6, **THINK) == (text, "", "length")
    # beam search reads its answers the same way; include_reasoning false leaves the thinking out, not in
    beams = call(app, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "use_beam_search": True,
                                                      "n": 2, "include_reasoning": False, **THINK})
    assert beams.status_code == 200, beams.text
    assert all(c["message"]["content"] == "" and "reasoning" not in c["message"] for c in beams.json()["choices"])


def test_an_answer_without_a_block_is_all_content(app: Any) -> None:
    whole = chat(app, max_tokens=6)
    assert not {"reasoning", "reasoning_content"} & set(whole["message"]) and whole["message"]["content"]
    assert streamed(app, max_tokens=6) == ("", whole["message"]["content"], "length")


def test_ollama_think_true_returns_the_thinking(app: Any) -> None:
    ids = call(app, "POST", "/tokenize", {"messages": CHAT, **THINK}).json()["tokens"]
    text = call(app, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0}).json()
    body = {"model": MODEL, "messages": CHAT, "think": True, "options": {"num_predict": 6, "temperature": 0}}
    r = call(app, "POST", "/api/chat", {**body, "stream": False})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["thinking"] == text["choices"][0]["text"] and r.json()["message"]["content"] == ""
    lines = [json.loads(x) for x in call(app, "POST", "/api/chat", body).text.splitlines()]
    assert "".join(x["message"].get("thinking") or "" for x in lines) == r.json()["message"]["thinking"]
    # think false: the template's block stays closed, nothing is thinking
    r = call(app, "POST", "/api/chat", {**body, "think": False, "stream": False})
    assert r.status_code == 200 and "thinking" not in r.json()["message"]
    # a level (gpt-oss's): thinking on, the level as the template's reasoning_effort (this one reads only the first)
    high = call(app, "POST", "/api/chat", {**body, "think": "high", "stream": False})
    assert high.status_code == 200 and high.json()["message"]["thinking"] == text["choices"][0]["text"]
    # the clients that ask before they send think: this model thinks (apart) here
    assert "thinking" in call(app, "POST", "/api/show", {"model": MODEL}).json()["capabilities"]


def test_an_answer_sent_back_keeps_its_reasoning_for_the_template(app: Any) -> None:
    """A client that appends the assistant message as it came (reasoning and all) is not refused, and a
    template that renders past reasoning gets it as reasoning_content, whichever name it came under."""
    message = chat(app, max_tokens=64, **FORCED)["message"]
    history = [*CHAT, message, {"role": "user", "content": "And three plus three?"}]
    text = call(app, "POST", "/detokenize", {"tokens": call(app, "POST", "/tokenize", {"messages": history}).json()[
        "tokens"]}).json()["prompt"]
    assert "### assistant\n<think>\nI add two and two.\n</think>Four.\n" in text
    for name in ("reasoning", "reasoning_content"):
        turn = {"role": "assistant", "content": "Four.", name: "I add."}
        r = call(app, "POST", "/tokenize", {"messages": [*CHAT, turn, CHAT[0]]})
        assert r.status_code == 200, r.text
