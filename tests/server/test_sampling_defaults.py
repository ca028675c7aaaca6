"""The model's own sampling defaults (tokenmill/sampling_defaults.py, vLLM's --generation-config auto): a
request that leaves a sampling field out gets the model's recommendation (a GGUF's general.sampling.*, an HF
directory's generation_config.json), one that sets it keeps its own; `vllm` turns them off. Through the
OpenAI routes, Ollama's (and /api/show's parameters) and the offline API."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgi_app import call, in_process_app

from tokenmill import LLM, SamplingParams
from tokenmill import sampling_defaults as sd
from tokenmill.entrypoints.server.config import ServerConfig

# fp32 on dequantized weights: greedy text the same cold or prefix-cached on every CPU (the block kernels and
# the dense path part at near-ties, which a random model has many of)
ENGINE = dict(max_model_len=256, kv_cache_memory=16 * 2**20, dtype="float32", quantization="dequantize")
CHAT = [{"role": "user", "content": "Tell me a story about a dragon."}]


# -- reading them --------------------------------------------------------------------------------------------
def test_generation_config_values_and_transformers_defaults(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
        "max_new_tokens": 512, "bos_token_id": 1, "eos_token_id": [2, 3]}))
    d = sd.from_generation_config(tmp_path)
    assert d.given() == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "max_tokens": 512}
    # transformers' own defaults are not a recommendation (vLLM reads the file's diff against them)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 1.0, "top_k": 50, "top_p": 1.0}))
    assert sd.from_generation_config(tmp_path).given() == {}
    assert sd.resolve("vllm", "hf", tmp_path, None).given() == {}
    with pytest.raises(ValueError, match="no generation_config.json there"):
        sd.resolve(str(tmp_path / "nowhere"), "hf", tmp_path, None)


def test_gguf_keys_and_samplers_we_do_not_have(caplog) -> None:
    md = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 0.95,
          "general.sampling.min_p": 0.0, "general.sampling.penalty_repeat": 1.1, "general.sampling.mirostat": 2}
    with caplog.at_level(logging.INFO, logger="tokenmill"):
        d = sd.from_gguf(md, "m.gguf")
    assert d.given() == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0, "repetition_penalty": 1.1}
    assert "general.sampling.mirostat" in caplog.text and "not applied" in caplog.text
    assert d.pick("temperature", None, 1.0) == 0.6 and d.pick("temperature", 1.3, 1.0) == 1.3
    assert sd.SamplingDefaults().pick("top_k", None, 40) == 40


# -- serving them ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def greedy_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model whose GGUF recommends greedy decoding and top_k 5."""
    from tokenmill.benchmarks.random_gguf import PRESETS, write_random_gguf

    return write_random_gguf(tmp_path_factory.mktemp("sampling") / "greedy.gguf", PRESETS["tiny-256"], "q8_0",
                             extra_metadata={"general.sampling.temp": 0.0, "general.sampling.top_k": 5})


@pytest.fixture(scope="module")
def app(greedy_gguf: Path) -> Iterator[Any]:
    yield from in_process_app(ServerConfig(log_requests=False), model=str(greedy_gguf), **ENGINE)


def chat(app: Any, **fields: Any) -> str:
    r = call(app, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 24, **fields})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_a_request_without_temperature_gets_the_models(app: Any) -> None:
    greedy = chat(app, temperature=0)
    assert [chat(app), chat(app, seed=1), chat(app, seed=2)] == [greedy] * 3  # the model's temperature 0
    sampled = {chat(app, temperature=1.5, top_k=0, seed=s) for s in range(4)}
    assert sampled != {greedy}, "the request's own temperature must win"


def test_ollama_options_and_show(app: Any) -> None:
    r = call(app, "POST", "/api/chat", {"model": "greedy", "messages": CHAT, "stream": False,
                                        "options": {"num_predict": 24}})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == chat(app, temperature=0)
    params = call(app, "POST", "/api/show", {"model": "greedy"}).json()["parameters"]
    lines = dict(line.split() for line in params.splitlines())
    assert (lines["temperature"], lines["top_k"], lines["top_p"]) == ("0.0", "5", "0.9")  # top_p: Ollama's


def test_offline_defaults_and_vllm_setting(greedy_gguf: Path) -> None:
    llm = LLM(str(greedy_gguf), progress=False, **ENGINE)
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.top_p, d.max_tokens) == (0.0, 5, 1.0, 16)
    prompt = "Once upon a time"
    want = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].token_ids
    assert llm.generate([prompt])[0].outputs[0].token_ids == want
    off = LLM(str(greedy_gguf), progress=False, generation_config="vllm", **ENGINE)
    assert off.get_default_sampling_params() == SamplingParams()


def test_max_new_tokens_caps_a_chat_without_max_tokens(tmp_path: Path) -> None:
    """An HF directory's max_new_tokens is the default max_tokens of a chat that gives none (within the
    context), not of one that gives its own."""
    from tokenmill.cli import main

    out = tmp_path / "hf"
    assert main(["convert", "default", str(out)]) == 0
    gen = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**gen, "max_new_tokens": 5, "temperature": 0.0}))
    for app in in_process_app(ServerConfig(log_requests=False), model=str(out), **ENGINE):
        body: dict[str, Any] = {"messages": CHAT, "ignore_eos": True}
        r = call(app, "POST", "/v1/chat/completions", body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
        r = call(app, "POST", "/v1/chat/completions", {**body, "max_tokens": 9})
        assert r.json()["usage"]["completion_tokens"] == 9


def test_override_generation_config(greedy_gguf: Path, tmp_path: Path) -> None:
    """vLLM's --override-generation-config: its keys over the model's (auto) or alone (vllm); a key or value
    it cannot take is refused at once."""
    from tokenmill.cli import build_parser, engine_config_from_args

    merged = sd.resolve("auto", "gguf", greedy_gguf, {"general.sampling.temp": 0.0, "general.sampling.top_k": 5},
                        {"top_p": 0.5, "temperature": 0.3})
    assert merged.given() == {"temperature": 0.3, "top_k": 5, "top_p": 0.5}
    assert sd.resolve("vllm", "gguf", greedy_gguf, None, {"max_new_tokens": 7}).given() == {"max_tokens": 7}
    llm = LLM(str(greedy_gguf), progress=False, override_generation_config={"top_k": 3}, **ENGINE)
    assert (llm.get_default_sampling_params().temperature, llm.get_default_sampling_params().top_k) == (0.0, 3)
    for bad, says in (({"beams": 2}, "not a sampling setting"), ({"top_k": 2.5}, "must be a number"),
                      ({"temperature": "hot"}, "must be a number")):
        with pytest.raises(ValueError, match=says):
            LLM(str(greedy_gguf), progress=False, override_generation_config=bad, **ENGINE)
    args = build_parser().parse_args(["serve", "--override-generation-config", "{temperature"])
    with pytest.raises(ValueError, match="--override-generation-config is not valid JSON"):
        engine_config_from_args(args, "default")
    args = build_parser().parse_args(["serve", "--override-generation-config", '{"temperature": 0.2}'])
    assert engine_config_from_args(args, "default").override_generation_config == {"temperature": 0.2}

