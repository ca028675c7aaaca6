"""The official `ollama` Python client, unchanged, against a real `tokenmill serve` process (the session's
shared one, with an API key: the client sends it as a header, as it does from $OLLAMA_API_KEY).

Exact comparisons (greedy text through /api/generate == /v1/completions, chat == /v1/chat/completions) hold
because that server runs fp32 dequantized weights (server_process.py): the same prompt ids give the same
tokens on every route.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from conftest import API_KEY
from server_process import ServerProcess, wait_for

ollama = pytest.importorskip("ollama")  # a test extra

MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0}
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    return ollama.Client(host=server.url, headers=HEADERS)


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def completion(server: ServerProcess, prompt: str | list[int], max_tokens: int, **fields: Any) -> Any:
    return post(server, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **fields})


def token_ids(server: ServerProcess, text: str, add_special_tokens: bool = True) -> list[int]:
    return post(server, "/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})["tokens"]


def test_list_show_ps_version(server: ServerProcess, client: Any) -> None:
    models = client.list().models
    assert [m.model for m in models] == [f"{MODEL}:latest"]
    m = models[0]
    assert m.size > 10**7 and len(m.digest) == 64 and m.modified_at is not None
    assert (m.details.format, m.details.family, m.details.quantization_level) == ("gguf", "llama", "Q4_1")
    assert m.details.parameter_size.endswith("M")

    for name in (MODEL, f"{MODEL}:latest"):
        show = client.show(name)
        info = show.modelinfo
        assert info["general.architecture"] == "llama" and info["llama.context_length"] == 8192
        assert info["llama.block_count"] == 30 and info["general.parameter_count"] > 10**8
        assert info["tokenizer.ggml.tokens"] is None  # the vocabulary only with verbose
        assert "<|im_start|>" in show.template and show.capabilities == ["completion", "tools"]
        assert re.search(r"^temperature\s+0.8$", show.parameters, re.M)
        assert re.search(r"^num_ctx\s+2048$", show.parameters, re.M)
    verbose = post(server, "/api/show", {"model": MODEL, "verbose": True})["model_info"]
    assert len(verbose["tokenizer.ggml.tokens"]) == 49152

    running = client.ps().models
    assert [r.model for r in running] == [f"{MODEL}:latest"]
    assert running[0].context_length == 2048 and running[0].size > m.size and running[0].size_vram == 0
    assert running[0].expires_at.year > 2200  # never unloaded
    assert httpx.get(f"{server.url}/api/version", headers=HEADERS).json()["version"]
    for path in ("/api/tags", "/api/version", "/metrics"):  # Ollama answers HEAD there (clients' health checks)
        r = httpx.head(f"{server.url}{path}", headers=HEADERS)
        assert r.status_code == 200 and r.content == b"", (path, r.status_code)


def test_generate_raw_equals_completions(server: ServerProcess, client: Any) -> None:
    prompt = "The capital of France is"
    r = client.generate(model=MODEL, prompt=prompt, raw=True, options={**GREEDY, "num_predict": 12})
    ref = completion(server, prompt, 12, return_token_ids=True)
    choice = ref["choices"][0]
    assert r.response == choice["text"] and r.done and r.done_reason == "length"
    assert r.eval_count == 12 and r.prompt_eval_count == ref["usage"]["prompt_tokens"]
    assert r.context == token_ids(server, prompt) + choice["token_ids"]
    for d in (r.total_duration, r.prompt_eval_duration, r.eval_duration):
        assert isinstance(d, int) and d > 0
    assert r.total_duration >= r.prompt_eval_duration + r.eval_duration and r.load_duration == 0

    parts = list(client.generate(model=MODEL, prompt=prompt, raw=True, stream=True,
                                 options={**GREEDY, "num_predict": 12}))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    assert "".join(p.response for p in parts) == r.response and parts[-1].eval_count == 12
    assert parts[-1].context == r.context and all(p.context is None for p in parts[:-1])


def test_logprobs(server: ServerProcess, client: Any) -> None:
    prompt = "The sky is"
    r = client.generate(model=MODEL, prompt=prompt, raw=True, logprobs=True, top_logprobs=3,
                        options={**GREEDY, "num_predict": 5})
    ref = completion(server, prompt, 5, logprobs=3)["choices"][0]["logprobs"]
    assert [lp.token for lp in r.logprobs] == ref["tokens"] and "".join(ref["tokens"]) == r.response
    assert [lp.logprob for lp in r.logprobs] == pytest.approx(ref["token_logprobs"], abs=1e-5)
    assert all(len(lp.top_logprobs) == 3 and lp.top_logprobs[0].token == lp.token for lp in r.logprobs)  # greedy
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True, logprobs=True,
                             options={**GREEDY, "num_predict": 4}))
    assert sum(len(p.logprobs or []) for p in parts) == parts[-1].eval_count == 4
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt=prompt, top_logprobs=2)
    assert e.value.status_code == 400 and "needs logprobs" in e.value.error


def test_generate_ndjson_on_the_wire(server: ServerProcess) -> None:
    with httpx.stream("POST", f"{server.url}/api/generate", headers=HEADERS, timeout=60,
                      json={"model": MODEL, "prompt": "Hi", "raw": True, "options": {**GREEDY, "num_predict": 3}}) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    last = lines[-1]
    assert last["response"] == "" and last["eval_count"] == 3
    assert {"total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_duration",
            "created_at", "model", "context"} <= set(last)


def test_context_continues(server: ServerProcess, client: Any) -> None:
    first = client.generate(model=MODEL, prompt="1, 2, 3,", raw=True, options={**GREEDY, "num_predict": 4})
    more = " 9, 10,"
    second = client.generate(model=MODEL, prompt=more, raw=True, context=first.context,
                             options={**GREEDY, "num_predict": 6})
    ids = list(first.context) + token_ids(server, more, add_special_tokens=False)
    ref = completion(server, ids, 6, return_token_ids=True)["choices"][0]
    assert second.response == ref["text"] and second.context == ids + ref["token_ids"]


def test_generate_templates(server: ServerProcess, client: Any) -> None:
    """The model's template (with system) is chat's; a request template renders Go's syntax, .Suffix too."""
    opts = {**GREEDY, "num_predict": 8}
    templated = client.generate(model=MODEL, prompt="Name a color.", system="Answer in one word.", options=opts)
    chat = client.chat(model=MODEL, options=opts, messages=[{"role": "system", "content": "Answer in one word."},
                                                            {"role": "user", "content": "Name a color."}])
    assert templated.response == chat.message.content and templated.prompt_eval_count == chat.prompt_eval_count

    template = ("{{ if .System }}[{{ .System }}] {{ end }}Before: {{ .Prompt }} After: {{ .Suffix }} "
                "Middle:{{ .Response }}!")
    own = client.generate(model=MODEL, prompt="def f(x):", suffix="return y", template=template, options=opts)
    raw = client.generate(model=MODEL, prompt="Before: def f(x): After: return y Middle:", raw=True, options=opts)
    assert own.response == raw.response and own.context == raw.context
    with pytest.raises(ollama.ResponseError) as e:  # no .Suffix in the template, no FIM tokens in the model
        client.generate(model=MODEL, prompt="def f(x):", suffix="return y")
    assert e.value.status_code == 400 and "fill in the middle" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt="x", template="{{ printf \"%s\" .Prompt }}")
    assert e.value.status_code == 400 and "printf" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt="x", raw=True, system="s")
    assert e.value.status_code == 400 and "raw" in e.value.error


def test_chat_equals_openai_chat(server: ServerProcess, client: Any) -> None:
    messages = [{"role": "user", "content": "Write one short sentence about the sea."}]
    r = client.chat(model=MODEL, messages=messages, options={**GREEDY, "num_predict": 10})
    ref = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 10, "temperature": 0})
    assert r.message.role == "assistant" and r.message.content == ref["choices"][0]["message"]["content"]
    assert r.done and r.done_reason == ref["choices"][0]["finish_reason"]
    assert r.prompt_eval_count == ref["usage"]["prompt_tokens"] and r.eval_count == ref["usage"]["completion_tokens"]

    parts = list(client.chat(model=MODEL, messages=messages, stream=True, options={**GREEDY, "num_predict": 10}))
    assert "".join(p.message.content for p in parts) == r.message.content and parts[-1].done
    assert parts[-1].eval_count == r.eval_count and parts[-1].message.content == ""

    # a final assistant message is continued (Ollama's prefill), as vLLM's continue_final_message
    prefill = [*messages, {"role": "assistant", "content": "The sea is"}]
    cont = client.chat(model=MODEL, messages=prefill, options={**GREEDY, "num_predict": 6})
    ref = post(server, "/v1/chat/completions", {"messages": prefill, "max_tokens": 6, "temperature": 0,
                                                "continue_final_message": True, "add_generation_prompt": False})
    assert cont.message.content == ref["choices"][0]["message"]["content"]


def test_options(server: ServerProcess, client: Any) -> None:
    prompt = "1, 2, 3, 4,"
    stopped = client.generate(model=MODEL, prompt=prompt, raw=True,
                              options={**GREEDY, "num_predict": 20, "stop": [" 7"]})
    assert stopped.done_reason == "stop" and " 7" not in stopped.response and stopped.response.startswith(" 5")

    seeded = [client.generate(model=MODEL, prompt="Once upon a time", raw=True,
                              options={"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 7, "num_predict": 8})
              for _ in range(2)]
    assert seeded[0].response == seeded[1].response

    # num_ctx bounds prompt + output: -1 runs until that context is full
    n = len(token_ids(server, prompt))
    full = client.generate(model=MODEL, prompt=prompt, raw=True,
                           options={**GREEDY, "num_predict": -1, "num_ctx": n + 5})
    assert full.done_reason == "length" and full.eval_count == 5

    # repeat_penalty over the whole context (-1) is vLLM's repetition_penalty
    penalized = client.generate(model=MODEL, prompt=prompt, raw=True,
                                options={**GREEDY, "num_predict": 8, "repeat_penalty": 1.5, "repeat_last_n": -1})
    assert penalized.response == completion(server, prompt, 8, repetition_penalty=1.5)["choices"][0]["text"]
    # Ollama's modelfile defaults (a window of 64) run: the penalty over the last 64 tokens only
    windowed = client.generate(model=MODEL, prompt=prompt, raw=True,
                               options={**GREEDY, "num_predict": 8, "repeat_penalty": 1.5, "repeat_last_n": 64})
    assert windowed.eval_count == 8

    # placement options are accepted and logged once as fixed at start
    for _ in range(2):
        client.generate(model=MODEL, prompt="Hi", raw=True,
                        options={"num_predict": 1, "num_thread": 3, "use_mmap": True})
    assert wait_for(lambda: "option num_thread is fixed when the server starts" in server.output(), 10)
    assert server.output().count("option num_thread is fixed") == 1 and "option use_mmap is fixed" in server.output()

    # what Ollama takes leniently: a num_ctx past the server's context (clamped to it, logged once), an empty
    # template (the model's), truncate and shift true (nothing to cut or shift when the prompt fits)
    big = client.generate(model=MODEL, prompt=prompt, raw=True, options={**GREEDY, "num_predict": 3, "num_ctx": 32768})
    assert big.eval_count == 3 and "num_ctx 32768 is larger than this server's context of 2048" in server.output()
    plain = client.generate(model=MODEL, prompt="Name a color.", options={**GREEDY, "num_predict": 4})
    empty = client.generate(model=MODEL, prompt="Name a color.", template="", options={**GREEDY, "num_predict": 4})
    assert empty.response == plain.response and empty.prompt_eval_count == plain.prompt_eval_count
    r = httpx.post(f"{server.url}/api/chat", headers=HEADERS,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                         "truncate": True, "shift": True, "options": {**GREEDY, "num_predict": 2}})
    assert r.status_code == 200 and r.json()["eval_count"] == 2, r.text

    for options, words in (({"bogus": 1}, "options.bogus: unknown field"),
                           ({"temperature": "hot"}, "options.temperature"),
                           ({"repeat_penalty": 1.2, "repeat_last_n": -5}, "repeat_last_n must be -1"),
                           ({"mirostat": 2}, "mirostat 2 is not supported")):
        with pytest.raises(ollama.ResponseError) as e:
            client.generate(model=MODEL, prompt="Hi", options=options)
        assert e.value.status_code == 400 and words in e.value.error, (options, e.value.error)


def test_errors(server: ServerProcess, client: Any) -> None:
    for call in (lambda: client.generate(model="nope", prompt="Hi"),
                 lambda: list(client.chat(model="nope:7b", messages=[{"role": "user", "content": "Hi"}], stream=True)),
                 lambda: client.show("nope")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 404 and re.fullmatch(r"model 'nope(:7b)?' not found", e.value.error)
    for call, words in ((lambda: client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], think=True),
                         "does not support thinking"),
                        (lambda: client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                             tools=[{"type": "function", "function": {"name": "f g"}}]),
                         "is not a function name"),
                        (lambda: client.generate(model=MODEL, prompt="Hi", images=[b"\x89PNG"]), "takes text only"),
                        (lambda: client.generate(model=MODEL, prompt="Hi", keep_alive="soon"), "not a duration")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 400 and words in e.value.error, e.value.error
    for call, action in ((lambda: client.pull("llama3"), "pull"), (lambda: client.delete(MODEL), "delete"),
                         (lambda: client.copy(MODEL, "other"), "copy"), (lambda: client.push(MODEL), "push")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 501 and f"does not {action} models" in e.value.error
        assert "tokenmill serve MODEL" in e.value.error
    # a served model is there already: pulling it succeeds at once (scripts pull before they chat)
    assert client.pull(MODEL).status == "success"
    assert [p.status for p in client.pull(MODEL.removesuffix(":latest"), stream=True)] == ["success"]
    r = httpx.post(f"{server.url}/api/generate", headers=HEADERS, content=b"{not json")
    assert r.status_code == 400 and set(r.json()) == {"error"}
    # the server's guards and FastAPI's own answers are in Ollama's shape on /api/ paths too
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.url).list()  # no API key
    assert e.value.status_code == 401 and e.value.error.startswith("missing or wrong API key")
    for r, status in ((httpx.get(f"{server.url}/api/nothing", headers=HEADERS), 404),
                      (httpx.get(f"{server.url}/api/generate", headers=HEADERS), 405),
                      (httpx.post(f"{server.url}/api/generate", headers=HEADERS, content=b" " * (5 * 2**20)), 413)):
        assert r.status_code == status and isinstance(r.json()["error"], str), r.text
    # Ollama's "load" answers: no prompt, nothing generated
    assert client.generate(model=MODEL, prompt="", keep_alive="5m").done_reason == "load"
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"


def test_disconnect_aborts(server: ServerProcess) -> None:
    def aborted() -> float:
        text = httpx.get(f"{server.url}/metrics", headers=HEADERS).text
        m = re.search(r'^tokenmill:request_success_total\{finished_reason="abort".*\} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    before = aborted()
    with httpx.stream("POST", f"{server.url}/api/chat", headers=HEADERS, timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Count to a thousand."}],
            "options": {"num_predict": 1000}}) as r:
        for _ in zip(range(2), r.iter_lines()):
            pass
    assert wait_for(lambda: aborted() == before + 1, 30)


def test_format_json_and_schema(server: ServerProcess, client: Any) -> None:
    import jsonschema

    # "json" is OpenAI's json_object: the same greedy constrained tokens
    messages = [{"role": "user", "content": "Describe a cat as JSON."}]
    r = client.chat(model=MODEL, messages=messages, format="json", options={**GREEDY, "num_predict": 32})
    ref = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 32, "temperature": 0,
                                                "response_format": {"type": "json_object"}})
    assert r.message.content == ref["choices"][0]["message"]["content"] and r.message.content.startswith("{")

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    g = client.generate(model=MODEL, prompt="Invent a person: name and age.", format=schema,
                        options={**GREEDY, "num_predict": 64})
    assert g.done_reason == "stop"
    jsonschema.validate(json.loads(g.response), schema)
    parts = list(client.chat(model=MODEL, format=schema, stream=True, options={"temperature": 1.0, "seed": 3},
                             messages=[{"role": "user", "content": "Invent a person."}]))
    assert parts[-1].done_reason == "stop"
    jsonschema.validate(json.loads("".join(p.message.content for p in parts)), schema)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=messages, format={"type": "nonsense"})
    assert e.value.status_code == 400 and "does not compile" in e.value.error
