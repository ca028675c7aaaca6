"""Structured output over the OpenAI API: response_format (json_object, json_schema and the openai
client's parse()), vLLM's structured_outputs and guided_* fields, streamed and not; bad constraints are
400s in OpenAI's error shape.

The default model (SmolLM2-135M-Instruct, its GGUF as `tokenmill serve` runs it) writes every answer:
the claims are that each output validates, whatever the model would rather have said.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from app_server import AppServer

from tokenmill.benchmarks.json_schemas import SCHEMAS
from tokenmill.config import EngineConfig

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def srv() -> Iterator[AppServer]:
    # all 200 requests of the fifty-schema test in one running batch
    s = AppServer(EngineConfig(model="default", max_model_len=1024, max_num_seqs=256, max_num_batched_tokens=2048))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv: AppServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


async def _chat_usage(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, str, int]:
    """(content, finish_reason, completion tokens) of one chat completion, streamed or not."""
    if not body.get("stream"):
        r = await http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"], r.json()["usage"]["completion_tokens"]
    text, finish, used = [], None, -1
    body = {**body, "stream_options": {"include_usage": True}}
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for c in chunk["choices"]:
                text.append(c["delta"].get("content") or "")
                finish = c["finish_reason"] or finish
            if chunk.get("usage"):
                used = chunk["usage"]["completion_tokens"]
    return "".join(text), str(finish), used


async def _chat(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, str]:
    """(content, finish_reason) of one chat completion, streamed or not."""
    text, finish, _ = await _chat_usage(http, body)
    return text, finish


def _grammar_accepts_prefix(srv: AppServer, schema: dict[str, Any], text: str) -> bool:
    """Whether `text` is a prefix of some document of `schema`, by a matcher built here from llguidance and
    the schema (not the server's): an answer cut by max_tokens must still be on the schema's path."""
    import llguidance

    from tokenmill.structured_output.grammar import json_options
    from tokenmill.sampling_params import StructuredOutputsParams

    lltok = srv.async_engine.engine.structured.lltokenizer
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults=json_options(StructuredOutputsParams(json=schema)))  # type: ignore[arg-type]
    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
    tokens = lltok.tokenize_str(text)
    return matcher.validate_tokens(tokens) == len(tokens)


def test_fifty_schemas_validate_streamed_and_not_at_temperature_0_and_1(srv: AppServer) -> None:
    """Every output of every schema validates with the jsonschema package: 50 schemas, each streamed and
    not and at temperature 0 and 1 (schema i: not streamed at temperature i % 2, streamed at the other),
    all 100 requests at once (so they batch together); half of each temperature's requests stream.

    Greedy answers must all close within max_tokens. A sampled one may not: at temperature 1 the 135M
    model sometimes writes a string of \\u001F escapes (six characters for each one maxLength counts), and
    no constraint bounds that in tokens. So a sampled answer cut by max_tokens must have used all of them
    and be a prefix the schema's grammar accepts; and at most a few of the fifty may end that way (a
    server that never closed a document would fail here)."""
    cases = [(what, schema, stream, float((i + stream) % 2)) for i, (what, schema) in enumerate(SCHEMAS)
             for stream in (False, True)]
    max_tokens = 400

    async def run() -> list[tuple[str, str, int]]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=600) as http:
            return await asyncio.gather(*(_chat_usage(http, {
                "model": MODEL, "messages": [{"role": "user", "content": f"Reply in JSON with {what}."}],
                "temperature": temp, "seed": i, "max_tokens": max_tokens, "stream": stream,
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i // 2}", "schema": schema,
                                                                           "strict": True}}})
                for i, (what, schema, stream, temp) in enumerate(cases)))

    results = asyncio.run(run())
    failures, cut = [], []
    for (what, schema, stream, temp), (text, finish, used) in zip(cases, results):
        where = f"{what} (stream={stream}, temperature={temp})"
        try:
            if finish == "length" and temp > 0:
                assert used == max_tokens, f"cut by length after {used} of {max_tokens} tokens"
                assert _grammar_accepts_prefix(srv, schema, text), "cut by length off the schema's path"
                cut.append(where)
                continue
            assert finish == "stop", f"finish_reason {finish}"
            jsonschema.validate(json.loads(text), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{where}: {str(e)[:200]}: {text[:200]!r}")
    assert not failures, "\n".join(failures)
    assert len(cut) <= 5, f"{len(cut)} sampled answers ran to max_tokens: {cut}"


def test_greedy_constrained_streamed_equals_not(srv: AppServer) -> None:
    """Streaming changes nothing in a constrained greedy answer. Each request has its own cache_salt and
    they go one at a time: under the GGUF blocks a step's kernel path depends on its rows (ggml's 8-bit
    activations up to the crossover, dequantized tiles past it), so a twin that reused the other's cached
    prompt blocks, or shared a batch with it, may differ by a token."""

    async def run() -> list[tuple[str, str]]:
        out = []
        async with httpx.AsyncClient(base_url=srv.url, timeout=600) as http:
            for i, (what, schema) in enumerate(SCHEMAS[:4]):
                for stream in (False, True):
                    out.append(await _chat(http, {
                        "model": MODEL, "messages": [{"role": "user", "content": f"Reply in JSON with {what}."}],
                        "temperature": 0.0, "max_tokens": 48, "stream": stream, "cache_salt": f"{i}-{stream}",
                        "response_format": {"type": "json_schema",
                                            "json_schema": {"name": "s", "schema": schema, "strict": True}}}))
            bad = await http.post("/v1/chat/completions", json={"model": MODEL, "cache_salt": "",
                                                                "messages": [{"role": "user", "content": "hi"}]})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt", bad.text
        return out

    results = asyncio.run(run())
    assert all(text for text, _ in results)
    assert results[0::2] == results[1::2]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=120)
    pets: list[str] = pydantic.Field(max_length=3)


def test_openai_parse_returns_the_parsed_object(client: openai.OpenAI) -> None:
    for temperature in (0.0, 1.0):
        r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe a person."}],
                                          response_format=Person, temperature=temperature, seed=1, max_tokens=300)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(msg.parsed, Person), msg.content
        assert 0 <= msg.parsed.age <= 120


def test_json_object_and_n(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A JSON object, please."}],
                                       response_format={"type": "json_object"}, temperature=1.0, seed=4, n=3,
                                       max_tokens=400)
    for c in r.choices:
        if c.finish_reason == "stop":  # a free JSON object may run past max_tokens: then it is cut, and says so
            assert isinstance(json.loads(c.message.content or ""), dict)
        else:
            assert c.finish_reason == "length" and (c.message.content or "").startswith("{")


@pytest.mark.parametrize("extra, ok", [
    ({"structured_outputs": {"regex": r"\+1-[0-9]{3}-[0-9]{4}"}}, lambda t: re.fullmatch(r"\+1-[0-9]{3}-[0-9]{4}", t)),
    ({"guided_regex": r"[A-Z][a-z]{2,9}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,9}", t)),
    ({"structured_outputs": {"choice": ["alpha", "beta", "gamma delta"]}}, lambda t: t in ("alpha", "beta", "gamma delta")),
    ({"guided_choice": ["up", "down"]}, lambda t: t in ("up", "down")),
    ({"structured_outputs": {"grammar": 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/'}},
     lambda t: re.fullmatch(r"\(\d{1,3}(\+\d{1,3})*\)", t)),
    ({"guided_grammar": 'root ::= "I am " [a-z]+ "."'}, lambda t: re.fullmatch(r"I am [a-z]+\.", t)),
    ({"guided_json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
                      "maxItems": 4}}, lambda t: 2 <= len(json.loads(t)) <= 4),
    ({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
                                      "additionalProperties": False},
                             "disable_any_whitespace": True}}, lambda t: re.fullmatch(r'\{"a":(true|false)\}', t)),
])
def test_regex_choice_grammar_and_json_on_both_endpoints(client: openai.OpenAI, extra: dict[str, Any], ok: Any) -> None:
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Answer."}],
                                          temperature=1.0, seed=2, max_tokens=60, n=2, extra_body=extra)
    for c in chat.choices:
        assert c.finish_reason == "stop" and ok(c.message.content), c.message.content
    stream = client.completions.create(model=MODEL, prompt="Answer:", temperature=0, max_tokens=60, stream=True,
                                       extra_body=extra)
    text = "".join(ch.choices[0].text for ch in stream if ch.choices)
    assert ok(text), text


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format", "Invalid type"),
    ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json", "uniqueItems"),
    ({"guided_regex": "a(b"}, "guided_regex", "unclosed group"),
    ({"structured_outputs": {"regex": "[z-a]"}}, "structured_outputs", "regex"),
    ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs", "nowhere"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "at most one"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "one output constraint"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs a json_schema"),
    ({"response_format": {"type": "yaml"}}, None, "json_schema"),
    # text the vocabulary cannot write (SmolLM2 has no token for the byte 0xF1 that U+7DA03 starts with):
    # a choice is refused before it runs; a regex only once the grammar refuses what the mask allowed
    ({"guided_choice": ["ok", "\x8c\U0007da03hr"]}, "guided_choice", "U+7DA03"),
    ({"guided_regex": "a\U0007da03"}, "structured_outputs", "cannot write"),
])
def test_bad_constraints_are_400s_in_openai_shape(client: openai.OpenAI, extra: dict[str, Any], param: str | None,
                                                  words: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       extra_body=extra)
    body = e.value.body
    assert isinstance(body, dict) and words in body["message"], body
    if param is not None:
        assert body["param"] == param, body


def test_beam_search_refuses_a_constraint(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="structured_outputs"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0, n=2,
                                  extra_body={"use_beam_search": True, "guided_choice": ["a", "b"]})
