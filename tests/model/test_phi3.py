"""Phi-3 / Phi-3.5 / Phi-4-mini (phi3) against transformers' Phi3ForCausalLM, from HF and from GGUF.

Each case is a tiny random checkpoint written by transformers (save_pretrained) and, from the same weights,
a GGUF written with the gguf package under llama.cpp's tensor names and metadata keys (its
convert_hf_to_gguf.py Phi3MiniModel: attn_qkv and ffn_up hold the fused rows, rope_factors_short / _long
hold longrope's factors). Covers: the fused tensors from both formats, GQA, tied and untied output,
partial rotary (Phi-4-mini's 0.75), LongRoPE in its short regime (max_model_len <= original) and its long
regime (a prompt longer than original), a sliding window at least the context, the GGUF's Q8_0 blocks
through the gguf method, the invariances, and the config features we refuse, named.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gemma3_tiny import default_tokenizer
from raw_forward import (add_hparams, assert_invariances, hf_reference, logits_close_on_blocks, native_against_layers,
                         prompt_logits, widen_and_save)

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

NUM_TOKENS = 32
MAX_MODEL_LEN = 256
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
SHORT = [1.0 + 0.05 * i for i in range(16)]  # longrope factors, cut to the rotary's dim / 2
LONG = [1.0 + 1.5 * i for i in range(16)]

CASES = {
    # Phi-3-mini-4k: plain RoPE, a sliding window wider than the context (so it changes nothing)
    "mini-4k": dict(num_key_value_heads=4, max_position_embeddings=4096, sliding_window=2047),
    # Phi-3.5-mini: longrope (max 128x the original), short regime since max_model_len <= original
    "longrope-short": dict(num_key_value_heads=2, max_position_embeddings=131072, original_max_position_embeddings=4096,
                           longrope=True, sliding_window=262144),
    # Phi-4-mini: longrope and partial rotary, tied embeddings
    "partial-tied": dict(num_key_value_heads=2, max_position_embeddings=131072, original_max_position_embeddings=4096,
                         longrope=True, partial_rotary_factor=0.75, tie_word_embeddings=True),
    # the long regime: original 64, max_model_len 256 > 64, and prompts longer than 64
    "longrope-long": dict(num_key_value_heads=2, max_position_embeddings=512, original_max_position_embeddings=64,
                          longrope=True, partial_rotary_factor=0.75),
}


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


def make_hf(tmp: Path, case: dict, tokenizer) -> tuple[Path, object]:
    """An HF directory of a tiny random Phi3ForCausalLM; returns it and the fp32 model."""
    tok, _ = tokenizer
    hidden, heads = 128, 4  # head_dim 32: partial 0.75 rotates 24 dims, 12 factors
    kw = dict(vocab_size=tok.vocab_size, hidden_size=hidden, intermediate_size=192, num_hidden_layers=2,
              num_attention_heads=heads, num_key_value_heads=case["num_key_value_heads"],
              max_position_embeddings=case["max_position_embeddings"], rms_norm_eps=1e-5,
              tie_word_embeddings=case.get("tie_word_embeddings", False), sliding_window=case.get("sliding_window"),
              bos_token_id=1, eos_token_id=2, pad_token_id=2)
    rotary = int(hidden // heads * case.get("partial_rotary_factor", 1.0))
    rope: dict = {"rope_type": "default", "rope_theta": 10000.0,
                  "partial_rotary_factor": case.get("partial_rotary_factor", 1.0)}
    if case.get("longrope"):
        kw["original_max_position_embeddings"] = case["original_max_position_embeddings"]
        rope |= {"rope_type": "longrope", "short_factor": SHORT[: rotary // 2], "long_factor": LONG[: rotary // 2],
                 "original_max_position_embeddings": case["original_max_position_embeddings"]}
    cfg = transformers.Phi3Config(rope_parameters=rope, **kw)
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(cfg).eval()
    widen_and_save(model, tok, tmp)
    return tmp, model


def write_gguf(path: Path, model, tokenizer, qtype: str = "F32", split_qkv: bool = False, **overrides) -> Path:
    """The same weights as a GGUF, as llama.cpp's converter writes a Phi3ForCausalLM (names, metadata);
    `split_qkv`: attn_q / attn_k / attn_v instead of attn_qkv (llama.cpp's phi3 graph takes either)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    _, src = tokenizer
    c = model.config
    rp = c.rope_parameters
    head_dim = c.hidden_size // c.num_attention_heads
    w = GGUFWriter(str(path), "phi3")
    a = "phi3"
    add_hparams(w, a, c, head_dim)
    w.add_uint32(f"{a}.rope.scaling.original_context_length", c.original_max_position_embeddings)
    w.add_uint32(f"{a}.rope.dimension_count", int(rp.get("partial_rotary_factor", 1.0) * c.hidden_size)
                 // c.num_attention_heads)
    w.add_float32(f"{a}.rope.freq_base", rp["rope_theta"])
    w.add_uint32(f"{a}.attention.sliding_window", c.sliding_window or 0)
    if rp["rope_type"] == "longrope":
        scale = c.max_position_embeddings / c.original_max_position_embeddings
        w.add_float32(f"{a}.rope.scaling.attn_factor",
                      float(np.sqrt(1 + np.log(scale) / np.log(c.original_max_position_embeddings))) if scale > 1 else 1.0)
    for key, value in overrides.items():
        w.add_string(f"{a}.{key}", value)
    w.add_tokenizer_model(str(src["tokenizer.ggml.model"]))
    w.add_tokenizer_pre(str(src["tokenizer.ggml.pre"]))
    w.add_token_list(list(src["tokenizer.ggml.tokens"]))
    w.add_token_types([int(t) for t in src["tokenizer.ggml.token_type"]])
    w.add_token_merges(list(src["tokenizer.ggml.merges"]))
    w.add_bos_token_id(int(src["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(src["tokenizer.ggml.eos_token_id"]))
    w.add_add_bos_token(False)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not c.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        names |= {p + "input_layernorm.weight": b + "attn_norm.weight", p + "self_attn.qkv_proj.weight": b + "attn_qkv.weight",
                  p + "self_attn.o_proj.weight": b + "attn_output.weight",
                  p + "post_attention_layernorm.weight": b + "ffn_norm.weight",
                  p + "mlp.gate_up_proj.weight": b + "ffn_up.weight", p + "mlp.down_proj.weight": b + "ffn_down.weight"}
    if split_qkv:
        q, kv = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
        for i in range(c.num_hidden_layers):
            qkv = sd.pop(f"model.layers.{i}.self_attn.qkv_proj.weight")
            del names[f"model.layers.{i}.self_attn.qkv_proj.weight"]
            for part, rows in zip("qkv", np.split(qkv, [q, q + kv])):
                sd[f"{i}.{part}"] = rows
                names[f"{i}.{part}"] = f"blk.{i}.attn_{part}.weight"
    for hf_name, name in names.items():
        x = np.ascontiguousarray(sd[hf_name], dtype=np.float32)
        if x.ndim == 2 and qtype != "F32":
            t = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(x, t), raw_dtype=t)
        else:
            w.add_tensor(name, x)
    if rp["rope_type"] == "longrope":
        w.add_tensor("rope_factors_long.weight", np.array(rp["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rp["short_factor"], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def engine(model: Path, **kw) -> LLM:
    args = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=MAX_MODEL_LEN, dtype="float32",
                quantization="dequantize") | kw
    return LLM(str(model), **args)


def prompts_for(name: str, tok) -> list[list[int]]:
    texts = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 3]
    ids = [tok.encode(t) for t in texts]
    if name == "longrope-long":  # longer than original_max_position_embeddings (64)
        ids = [(i * 8)[:100] for i in ids]
        assert all(len(i) > 64 for i in ids)
    return ids


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tokenizer, tmp_path_factory):
    name = request.param
    d, model = make_hf(tmp_path_factory.mktemp(name), CASES[name], tokenizer)
    g = write_gguf(tmp_path_factory.mktemp(name + "-gguf") / "tiny.gguf", model, tokenizer)
    return name, d, g, model


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_logits_and_greedy_match_transformers(case, fmt: str, tokenizer) -> None:
    name, d, g, model = case
    ours = engine(d if fmt == "hf" else g)
    cfg = ours.engine.model_config
    assert cfg.architecture == "phi3"
    assert cfg.num_parameters() == sum(p.numel() for p in model.parameters())  # the memory plan counts them all
    if "partial_rotary_factor" in CASES[name]:
        assert cfg.rotary_dim == 24
    for ids in prompts_for(name, tokenizer[0]):
        want_logits, want_tokens = hf_reference(model, ids, NUM_TOKENS)
        got = prompt_logits(ours, ids)
        err = float((got - want_logits).abs().max())
        assert err < 1e-3, f"{name} {fmt}: max logit error {err:.2e}"
        out = ours.generate([ids], GREEDY)[0]
        assert out.outputs[0].token_ids == want_tokens, f"{name} {fmt} diverged"


def test_gguf_with_separate_q_k_v(tokenizer, tmp_path: Path) -> None:
    _, model = make_hf(tmp_path, CASES["longrope-short"], tokenizer)
    ours = engine(write_gguf(tmp_path / "split.gguf", model, tokenizer, split_qkv=True))
    ids = prompts_for("longrope-short", tokenizer[0])[0]
    with torch.inference_mode():
        want = model(torch.tensor([ids])).logits[0]
    assert float((prompt_logits(ours, ids) - want).abs().max()) < 1e-3


def test_config_json_as_the_hub_ships_it(tmp_path: Path) -> None:
    """Phi-4-mini-instruct's config.json (transformers 4 form: rope_scaling with "type", the original
    context and partial_rotary_factor at the top level), read without weights."""
    from tokenmill.layers.rotary import attention_factor, longrope_factors
    from tokenmill.loader.model_config import ModelConfig

    short, long = [1.0] * 48, [1.5 + i for i in range(48)]
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 200064, "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
        "hidden_act": "silu", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": {"long_factor": long, "short_factor": short, "type": "longrope"},
        "sliding_window": 262144, "tie_word_embeddings": True}))
    cfg = ModelConfig.from_hf_dir(tmp_path)
    assert (cfg.architecture, cfg.head_dim, cfg.rotary_dim, cfg.sliding_window) == ("phi3", 128, 96, 262144)
    assert cfg.rope_scaling is not None
    assert longrope_factors(cfg.rope_scaling, 131072) == long and longrope_factors(cfg.rope_scaling, 4096) == short
    assert attention_factor(cfg.rope_scaling, cfg.max_position_embeddings) == pytest.approx(
        (1 + np.log(32) / np.log(4096)) ** 0.5)


def test_long_regime_is_not_the_short_one(tokenizer, tmp_path: Path) -> None:
    """The long test above means something: transformers' logits of the first 64 positions differ by the
    factor set (short when the sequence is 64 long, long when it is 100 long)."""
    _, model = make_hf(tmp_path, CASES["longrope-long"], tokenizer)
    ids = prompts_for("longrope-long", tokenizer[0])[0]
    with torch.inference_mode():
        short = model(torch.tensor([ids[:64]])).logits[0]
        long = model(torch.tensor([ids])).logits[0, :64]
    assert float((short - long).abs().max()) > 1e-1


def test_gguf_q8_0_through_the_gguf_method(tokenizer, tmp_path: Path) -> None:
    """The default method on a GGUF keeps its Q8_0 blocks (fused qkv and gate|up too) and stays close;
    held to test_gguf_method.py's bounds for tiny random models (their logits are flat, so near-ties are
    common); measured: relative logit error 1.9e-2, top-1 agreement 0.91."""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    _, model = make_hf(tmp_path, CASES["partial-tied"], tokenizer)
    g = write_gguf(tmp_path / "q8.gguf", model, tokenizer, qtype="Q8_0")
    ours = LLM(str(g), progress=False, kv_cache_memory=16 * 2**20, max_model_len=MAX_MODEL_LEN, dtype="float32")
    assert ours.engine.platform.compute.linear_method == "gguf"
    logits_close_on_blocks(ours, model, prompts_for("partial-tied", tokenizer[0]), "phi3")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_decode_step_with_partial_rotary(dtype: str, tokenizer, tmp_path: Path, monkeypatch) -> None:
    """On the Phi-4-mini shape (partial rotary: 24 of 32 dims, longrope) as Q8_0 blocks, decode steps run as one
    native call (its rotary on each head's leading dims) with the same greedy tokens and logprobs, bit for bit, as
    layer by layer."""
    from tokenmill.native import decode_step, ggml

    if not ggml.available() or decode_step.library() is None:
        pytest.skip("ggml or the native decode step is not built here")
    _, model = make_hf(tmp_path, CASES["partial-tied"], tokenizer)
    g = write_gguf(tmp_path / "q8.gguf", model, tokenizer, qtype="Q8_0")
    llm, calls, want, got = native_against_layers(g, prompts_for("partial-tied", tokenizer[0]), monkeypatch,
                                                  max_model_len=MAX_MODEL_LEN, dtype=dtype)
    assert llm.engine.model_config.rotary_dim == 24
    assert got == want
    assert calls, "the native decode step never ran"


def test_invariances(tokenizer, tmp_path: Path) -> None:
    """batched == alone, prefix cache on == off, chunked prefill == whole, at fp32, on the Phi-4-mini shape."""
    d, _ = make_hf(tmp_path, CASES["partial-tied"], tokenizer)
    assert_invariances(lambda **kw: engine(d, **kw), tokenizer[0], ["the ocean", "a violin", "bread", "Mars", "chess"])


def test_unsupported_rope_scaling_fails_naming_it(tokenizer, tmp_path: Path) -> None:
    d, model = make_hf(tmp_path / "hf", CASES["mini-4k"], tokenizer)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="rope scaling 'dynamic' is not supported"):
        engine(d)
    (tmp_path / "g").mkdir()
    g = write_gguf(tmp_path / "g" / "yarn.gguf", model, tokenizer, **{"rope.scaling.type": "yarn"})
    with pytest.raises(ValueError, match="rope scaling 'yarn' is not supported"):
        engine(g)


def test_other_unsupported_features_fail_naming_them(tokenizer, tmp_path: Path) -> None:
    d, _ = make_hf(tmp_path, CASES["mini-4k"], tokenizer)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        engine(d)


def test_convert_writes_a_phi3_directory(tokenizer, tmp_path: Path) -> None:
    """`tokenmill convert` on a phi3 GGUF (longrope factors as tensors, partial rotary): transformers loads
    the directory and computes what the original checkpoint computes."""
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    _, model = make_hf(tmp_path / "hf", CASES["longrope-long"], tokenizer)
    (tmp_path / "g").mkdir()
    g = write_gguf(tmp_path / "g" / "tiny.gguf", model, tokenizer)
    out = convert_gguf_to_hf(str(g), tmp_path / "converted", progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Phi3ForCausalLM"] and cfg["rope_scaling"]["long_factor"] == LONG[:12]
    converted = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = prompts_for("longrope-long", tokenizer[0])[0]
    with torch.inference_mode():
        want, got = model(torch.tensor([ids])).logits, converted(torch.tensor([ids])).logits
    assert float((got - want).abs().max()) < 1e-4
