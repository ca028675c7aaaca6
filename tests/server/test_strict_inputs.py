"""Validation as strict as OpenAI's, in-process: no type coercion, and a user or system message without
content is a 400 naming `messages[i].content` (it used to generate until the context was full)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from asgi_app import call, in_process_app

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    yield from in_process_app(max_model_len=256, kv_cache_memory=32 * 2**20)


def post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return call(app, "POST", path, body, timeout=60)


def assert_400(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"] and err["code"] == 400, err


def _chat(**kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **kw}


def _completion(**kw: Any) -> dict[str, Any]:
    return {"prompt": "hi", "max_tokens": 1, **kw}


@pytest.mark.parametrize(("path", "body", "param"), [
    (COMPLETIONS, _completion(stream="yes"), "stream"),
    (COMPLETIONS, _completion(stream=1), "stream"),
    (COMPLETIONS, _completion(echo="true"), "echo"),
    (COMPLETIONS, _completion(max_tokens="5"), "max_tokens"),
    (COMPLETIONS, _completion(max_tokens=1.0), "max_tokens"),
    (COMPLETIONS, _completion(n="1"), "n"),
    (COMPLETIONS, _completion(temperature="0.5"), "temperature"),
    (COMPLETIONS, _completion(temperature=True), "temperature"),
    (COMPLETIONS, _completion(seed="7"), "seed"),
    (COMPLETIONS, _completion(stop=5), "stop"),
    (COMPLETIONS, _completion(user=5), "user"),
    (COMPLETIONS, _completion(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    (COMPLETIONS, {"prompt": [1, "2"], "max_tokens": 1}, "prompt"),
    (COMPLETIONS, _completion(logit_bias={"1": "5"}), "logit_bias.1"),
    (CHAT, _chat(logprobs="true"), "logprobs"),
    (CHAT, _chat(model=3), "model"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
])
def test_no_type_coercion(app: Any, path: str, body: dict[str, Any], param: str) -> None:
    assert_400(post(app, path, body), param)


@pytest.mark.parametrize("body", [
    _completion(temperature=1), _completion(top_p=1), _completion(logit_bias={"1": 5}), _chat(temperature=0),
    _chat(presence_penalty=0),
])
def test_integers_are_numbers(app: Any, body: dict[str, Any]) -> None:
    """OpenAI accepts an integer where a number is expected (`temperature: 1`), and so do we."""
    path = CHAT if "messages" in body else COMPLETIONS
    r = post(app, path, body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "system"}, {"role": "user", "content": "hi"}], "messages[0].content"),
    ([{"role": "system", "content": "be brief"}, {"role": "user"}], "messages[1].content"),
    ([{"role": "developer", "content": None}, {"role": "user", "content": "hi"}], "messages[0].content"),
])
def test_a_message_without_content_is_a_400(app: Any, messages: list[dict[str, Any]], param: str) -> None:
    r = post(app, CHAT, {"messages": messages, "max_tokens": 1})
    assert_400(r, param)
    assert "needs content" in r.json()["error"]["message"]


def test_an_assistant_turn_may_have_null_content(app: Any) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "and?"}]
    r = post(app, CHAT, {"messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_tokenize_is_as_strict(app: Any) -> None:
    assert_400(post(app, "/tokenize", {"messages": [{"role": "user"}]}), "messages[0].content")
    assert_400(post(app, "/tokenize", {"prompt": "hi", "add_special_tokens": "no"}), "add_special_tokens")


def test_param_comes_from_the_error_not_its_text(app: Any) -> None:
    """Rejections from the input processor name their field (ParamError.field), for chat and completions."""
    assert_400(post(app, COMPLETIONS, _completion(logit_bias={"49152": 1})), "logit_bias")
    assert_400(post(app, CHAT, _chat(stop_token_ids=[49152])), "stop_token_ids")
    assert_400(post(app, COMPLETIONS, {"prompt": [49152]}), "prompt")
    r = post(app, CHAT, {"messages": [{"role": "user", "content": "hi"}], "truncate_prompt_tokens": 1,
                         "max_tokens": 300})
    assert r.status_code == 400 and "maximum context length is 256 tokens" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] is None
