"""gpt-oss's harmony format over HTTP: a model whose chat template is harmony's has its answers read as
harmony (openai/harmony.py) without any flag: the analysis channel as `reasoning` / `reasoning_content`
(Ollama: `thinking`, Anthropic: a thinking block, Responses: a reasoning item), the final channel as the
content, messages to functions.NAME as tool calls; streamed in pieces that join to the whole answer, and
never a marker in what the client sees.

The model is a scripted one (harmony_model.py): the default tokenizer with harmony's markers as special
tokens, a harmony-style template, and weights that write a fixed answer; a grammar with the markers as
special tokens writes the others."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgi_app import call
from harmony_model import CALLING, MARKERS, THINKING, write_harmony_model

from tokenmill.entrypoints.server.config import ServerConfig
from tokenmill.tokenizer.tokenizer import Tokenizer

CHAT = [{"role": "user", "content": "What is two plus two?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
# the whole format, written by a grammar: analysis, then a final message with its own header
FULL = ('start: <|channel|> "analysis" <|message|> "I add two and two." <|end|> <|start|> "assistant" <|channel|> '
        '"final" <|message|> "Four." <|return|>')
# a preamble, a call with the recipient before the channel, and (never reached) text after its <|call|>
PREAMBLE_CALL = ('start: <|channel|> "commentary" <|message|> "Let me check." <|end|> <|start|> '
                 '"assistant to=functions.get_weather" <|channel|> "commentary json" <|message|> '
                 '"{\\"city\\": \\"Oslo\\"}" <|call|> <|start|> "assistant" <|channel|> "final" <|message|> "Done."')


def serve(path: Path) -> Iterator[Any]:
    """An in-process app over the model at `path`: OpenAI's routes (chat, Responses), Ollama's, Anthropic's."""
    from tokenmill.config import EngineConfig
    from tokenmill.engine.async_engine import AsyncEngine
    from tokenmill.engine.llm_engine import LLMEngine
    from tokenmill.entrypoints.anthropic import router as anthropic_router
    from tokenmill.entrypoints.ollama import router as ollama_router
    from tokenmill.entrypoints.openai import router as openai_router
    from tokenmill.entrypoints.server import app as server_app

    engine = AsyncEngine(LLMEngine(EngineConfig(str(path), max_model_len=256, kv_cache_memory=8 * 2**20,
                                                dtype="float32"), progress=False))
    try:
        yield server_app.build_app(engine, ServerConfig(log_requests=False), routers=[
            openai_router.build_router, ollama_router.build_router, anthropic_router.build_router])
        assert not engine.is_dead, engine.dead_reason
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model that reasons, then answers (THINKING)."""
    return write_harmony_model(tmp_path_factory.mktemp("thinking"), THINKING)


@pytest.fixture(scope="module")
def app(thinking: Path) -> Iterator[Any]:
    yield from serve(thinking)


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The model that calls get_weather (CALLING)."""
    yield from serve(write_harmony_model(tmp_path_factory.mktemp("calling"), CALLING))


def chat(app: Any, **body: Any) -> dict[str, Any]:
    r = call(app, "POST", "/v1/chat/completions", {"messages": CHAT, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def chunks(app: Any, **body: Any) -> list[dict[str, Any]]:
    r = call(app, "POST", "/v1/chat/completions", {"messages": CHAT, "temperature": 0, "stream": True, **body})
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def joined(stream: list[dict[str, Any]], index: int = 0) -> dict[str, Any]:
    """A choice's message as a stream's deltas build it (reasoning, content, calls, finish_reason), each
    delta checked: no marker in it, reasoning under both names."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        for c in chunk["choices"]:
            if c["index"] != index:
                continue
            d = c["delta"]
            assert d.get("reasoning") == d.get("reasoning_content")
            for text in (d.get("reasoning_content") or "", d.get("content") or ""):
                assert "<|" not in text, text
            reasoning += d.get("reasoning_content") or ""
            content += d.get("content") or ""
            for t in d.get("tool_calls") or []:
                got = calls.setdefault(t["index"], {"id": t["id"], "type": t["type"], "function": {
                    "name": t["function"]["name"], "arguments": ""}})
                got["function"]["arguments"] += t["function"]["arguments"]
            finish = c["finish_reason"] or finish
    return {"reasoning": reasoning or None, "content": content or None,
            "tool_calls": [calls[i] for i in sorted(calls)] or None, "finish_reason": finish}


def whole(choice: dict[str, Any]) -> dict[str, Any]:
    m = choice["message"]
    assert m.get("reasoning") == m.get("reasoning_content")
    return {"reasoning": m.get("reasoning_content"), "content": m.get("content") or None,
            "tool_calls": m.get("tool_calls") or None, "finish_reason": choice["finish_reason"]}


def same_calls(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal answers but for the calls' ids (each answer makes its own)."""
    def strip(x: dict[str, Any]) -> dict[str, Any]:
        return {**x, "tool_calls": [{**t, "id": None} for t in x["tool_calls"] or []]}
    return strip(a) == strip(b)


def test_the_premise_the_markers_are_special_tokens(app: Any) -> None:
    """A plain completion decodes with special tokens skipped: the markers vanish and the channel names run
    into the text (what a gpt-oss chat answer looked like before harmony was read); kept, it is the script."""
    ids = call(app, "POST", "/tokenize", {"messages": CHAT}).json()["tokens"]
    plain = call(app, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 32, "temperature": 0}).json()
    assert plain["choices"][0]["text"] == "analysisTwo and two make fourFour!"
    kept = call(app, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 32, "temperature": 0,
                                                 "skip_special_tokens": False}).json()
    # <|end|> ends a message, not the answer; <|return|> ends it (and, an end token, is not text)
    assert kept["choices"][0]["text"] + "<|return|>" == THINKING and kept["choices"][0]["finish_reason"] == "stop"


def test_the_analysis_is_the_reasoning_and_the_rest_the_content(app: Any) -> None:
    answer = whole(chat(app, max_tokens=32)["choices"][0])
    assert answer == {"reasoning": "Two and two make four", "content": "Four!", "tool_calls": None,
                      "finish_reason": "stop"}
    assert joined(chunks(app, max_tokens=32)) == answer
    # the whole format (a final message with its own header), written by the grammar
    forced = {"max_tokens": 64, "structured_outputs": {"grammar": FULL}}
    answer = whole(chat(app, **forced)["choices"][0])
    assert answer == {"reasoning": "I add two and two.", "content": "Four.", "tool_calls": None,
                      "finish_reason": "stop"}
    assert joined(chunks(app, **forced)) == answer
    # vLLM's include_reasoning false: left out, and still not content
    quiet = chat(app, max_tokens=32, include_reasoning=False)["choices"][0]["message"]
    assert quiet["content"] == "Four!" and not {"reasoning", "reasoning_content"} & set(quiet)


def test_an_answer_cut_in_its_reasoning_is_reasoning(app: Any) -> None:
    answer = whole(chat(app, max_tokens=5)["choices"][0])  # <|channel|> analysis <|message|> Two ␣and
    assert answer == {"reasoning": "Two and", "content": None, "tool_calls": None, "finish_reason": "length"}
    assert joined(chunks(app, max_tokens=5)) == answer


def test_several_choices_and_their_logprobs(app: Any) -> None:
    """n = 2: each choice read on its own; logprobs still one per generated token, its text with the markers."""
    body = {"max_tokens": 32, "n": 2, "logprobs": True, "top_logprobs": 1}
    got = chat(app, **body)
    stream = chunks(app, **body)
    for i in range(2):
        c = got["choices"][i]
        assert whole(c) == {"reasoning": "Two and two make four", "content": "Four!", "tool_calls": None,
                            "finish_reason": "stop"}
        assert joined(stream, i) == whole(c)
        tokens = [t["token"] for t in c["logprobs"]["content"]]
        assert "".join(tokens) == THINKING  # the end token <|return|> included, as it was generated
        streamed = [t["token"] for s in stream for x in s["choices"] if x["index"] == i and x.get("logprobs")
                    for t in x["logprobs"]["content"]]
        assert streamed == tokens
    assert got["usage"]["completion_tokens"] == 2 * len(tokens)


def test_the_request_skip_special_tokens_governs_the_other_special_tokens(app: Any) -> None:
    grammar = ('start: <|channel|> "final" <|message|> "Four" <|im_start|> "!" <|return|>')
    body = {"max_tokens": 32, "structured_outputs": {"grammar": grammar}}
    assert whole(chat(app, **body)["choices"][0])["content"] == "Four!"
    assert joined(chunks(app, **body))["content"] == "Four!"
    kept = {**body, "skip_special_tokens": False}  # the markers are read all the same
    assert whole(chat(app, **kept)["choices"][0])["content"] == "Four<|im_start|>!"


def test_a_call_to_a_function_is_a_tool_call(caller: Any) -> None:
    got = chat(caller, max_tokens=32, tools=[WEATHER])
    answer = whole(got["choices"][0])
    assert answer["content"] is None and answer["finish_reason"] == "tool_calls"
    (tool_call,) = answer["tool_calls"]
    assert tool_call["id"].startswith("chatcmpl-tool-") and tool_call["type"] == "function"
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert same_calls(joined(chunks(caller, max_tokens=32, tools=[WEATHER])), answer)
    # the front ends that answer through chat: a function_call item, a tool_use block
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    r = call(caller, "POST", "/v1/responses", {"input": "Weather in Paris?", "tools": [tool], "temperature": 0,
                                               "max_output_tokens": 32}).json()
    assert [(i["type"], i["name"], i["arguments"]) for i in r["output"]] == [
        ("function_call", "get_weather", '{"city": "Paris"}')]
    m = call(caller, "POST", "/v1/messages", {"max_tokens": 32, "temperature": 0, "messages": CHAT, "tools": [
        {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]}).json()
    assert [(b["type"], b["name"], b["input"]) for b in m["content"]] == [("tool_use", "get_weather", {"city": "Paris"})]
    assert m["stop_reason"] == "tool_use"
    # no tools offered (or tool_choice none): nothing is a call, the arguments are what the model said
    for body in ({}, {"tools": [WEATHER], "tool_choice": "none"}):
        assert whole(chat(caller, max_tokens=32, **body)["choices"][0]) == {
            "reasoning": None, "content": '{"city": "Paris"}', "tool_calls": None, "finish_reason": "stop"}


def test_the_answer_ends_at_call_and_a_preamble_is_content(app: Any) -> None:
    """<|call|> ends the answer (the grammar would go on: it does not get to), and the commentary before the
    call, addressed to no one, is the content."""
    body = {"max_tokens": 80, "tools": [WEATHER], "structured_outputs": {"grammar": PREAMBLE_CALL}}
    answer = whole(chat(app, **body)["choices"][0])
    assert answer["content"] == "Let me check." and answer["finish_reason"] == "tool_calls"
    assert [t["function"] for t in answer["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    assert same_calls(joined(chunks(app, **body)), answer)


def test_a_forced_function_is_read_from_its_constrained_arguments(app: Any) -> None:
    """A forced tool_choice's answer is the constrained arguments, with no harmony around them."""
    paris = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"]}}}
    body = {"max_tokens": 40, "tools": [paris],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    answer = whole(chat(app, **body)["choices"][0])
    assert [t["function"] for t in answer["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert answer["content"] is None and answer["finish_reason"] == "stop"  # OpenAI's for a named function


def test_tools_and_the_history_reach_the_template(app: Any, thinking: Path) -> None:
    """The tools render as the template's functions namespace; past calls (arguments as objects), their
    reasoning (as `thinking`, the name harmony templates read) and their results render as harmony messages."""
    history = [*CHAT, {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need the weather.",
                       "tool_calls": [{"id": "c1", "type": "function", "function": {
                           "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]
    ids = call(app, "POST", "/tokenize", {"messages": history, "tools": [WEATHER]}).json()["tokens"]
    text = Tokenizer.from_hf_dir(thinking).decode(ids, skip_special_tokens=False)
    assert "<|start|>developer<|message|># Tools\nnamespace functions {type get_weather = (_: {" in text
    # a preamble sent back beside the reasoning (which such templates refuse) joins the analysis after it
    assert ("<|start|>assistant<|channel|>analysis<|message|>Need the weather.\nLet me check.<|end|>"
            "<|start|>assistant "
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
            "<|start|>functions.c1 to=assistant<|channel|>commentary<|message|>Sunny<|end|><|start|>assistant") in text


def test_beam_search_reads_its_answers_too(app: Any) -> None:
    got = chat(app, max_tokens=32, use_beam_search=True, n=2)
    assert whole(got["choices"][0]) == {"reasoning": "Two and two make four", "content": "Four!",
                                        "tool_calls": None, "finish_reason": "stop"}


# -- Ollama ------------------------------------------------------------------------------------------------
def ollama(app: Any, path: str, **body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The whole answer, and the stream's lines."""
    body = {"model": "m", "options": {"temperature": 0, "num_predict": 32}, **body}
    r = call(app, "POST", path, {**body, "stream": False})
    assert r.status_code == 200, r.text
    lines = [json.loads(x) for x in call(app, "POST", path, body).text.splitlines()]
    return r.json(), lines


def test_ollama_chat_thinks_apart(app: Any) -> None:
    model = call(app, "GET", "/api/tags").json()["models"][0]["name"]
    answer, lines = ollama(app, "/api/chat", model=model, messages=CHAT)
    assert answer["message"]["thinking"] == "Two and two make four" and answer["message"]["content"] == "Four!"
    assert "".join(x["message"].get("thinking") or "" for x in lines) == "Two and two make four"
    assert "".join(x["message"]["content"] for x in lines) == "Four!"
    assert all("<|" not in x["message"]["content"] for x in lines) and lines[-1]["done_reason"] == "stop"
    # think false: the thinking is left out (gpt-oss reasons anyway), never content
    answer, lines = ollama(app, "/api/chat", model=model, messages=CHAT, think=False)
    assert "thinking" not in answer["message"] and answer["message"]["content"] == "Four!"
    # generate through the model's template reads it the same way
    answer, lines = ollama(app, "/api/generate", model=model, prompt="What is two plus two?")
    assert answer["thinking"] == "Two and two make four" and answer["response"] == "Four!"
    assert "".join(x["response"] for x in lines) == "Four!"
    # clients that ask first: this model thinks apart, with no --reasoning-parser
    assert "thinking" in call(app, "POST", "/api/show", {"model": model}).json()["capabilities"]


def test_ollama_chat_calls_tools(caller: Any) -> None:
    model = call(caller, "GET", "/api/tags").json()["models"][0]["name"]
    answer, lines = ollama(caller, "/api/chat", model=model, messages=CHAT, tools=[WEATHER])
    calls = [{"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert answer["message"]["tool_calls"] == calls and answer["message"]["content"] == ""
    assert lines[-1]["message"]["tool_calls"] == calls
    assert "".join(x["message"]["content"] for x in lines) == ""


# -- the front ends that answer through chat -------------------------------------------------------------
def test_responses_and_messages_get_the_reasoning_apart(app: Any) -> None:
    r = call(app, "POST", "/v1/responses", {"input": "What is two plus two?", "max_output_tokens": 32,
                                            "temperature": 0}).json()
    assert [i["type"] for i in r["output"]] == ["reasoning", "message"]
    assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "Two and two make four"}]
    assert r["output"][1]["content"][0]["text"] == "Four!"
    text = call(app, "POST", "/v1/responses", {"input": "What is two plus two?", "max_output_tokens": 32,
                                               "temperature": 0, "stream": True}).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Four!"
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert thought == "Two and two make four"
    m = call(app, "POST", "/v1/messages", {"max_tokens": 32, "temperature": 0, "messages": CHAT}).json()
    assert m["content"] == [{"type": "thinking", "thinking": "Two and two make four", "signature": ""},
                            {"type": "text", "text": "Four!"}]
    assert not any(marker in json.dumps(x) for x in (r, m) for marker in MARKERS)
    off = call(app, "POST", "/v1/messages", {"max_tokens": 32, "temperature": 0, "messages": CHAT,
                                             "thinking": {"type": "disabled"}}).json()
    assert off["content"] == [{"type": "text", "text": "Four!"}]  # no thinking block when it is disabled


def test_terminal_chat_shows_the_final_channel(tmp_path: Path, monkeypatch, capsys) -> None:
    """`tokenmill chat` with a harmony model prints the analysis and the answer without a marker or channel
    name, and keeps only the answer in the history."""
    from tokenmill import cli

    model = write_harmony_model(tmp_path / "m", THINKING)
    lines = iter(["What is two plus two?", "And again?", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    rendered: list[list[dict[str, Any]]] = []
    from tokenmill.engine.input_processor import InputProcessor

    real = InputProcessor.render_chat_ids

    def spy(self, messages, *args, **kwargs):  # type: ignore[no-untyped-def]
        rendered.append([dict(m) for m in messages])
        return real(self, messages, *args, **kwargs)

    monkeypatch.setattr(InputProcessor, "render_chat_ids", spy)
    assert cli.main(["chat", "--model", str(model), "--dtype", "float32", "--max-model-len", "256",
                     "--max-tokens", "32", "--kv-cache-memory", "32MiB"]) == 0
    out = capsys.readouterr().out
    assert out.count("Two and two make four\nFour!") == 2  # the answer on its own line
    assert not any(m in out for m in MARKERS) and "analysis" not in out
    assert rendered[-1][1] == {"role": "assistant", "content": "Four!"}
