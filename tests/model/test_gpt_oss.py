"""gpt-oss against transformers, from an HF directory and from a GGUF written as llama.cpp's converter writes it.

A tiny random GptOssForCausalLM (transformers' own class, save_pretrained) with what makes the family: q/k/v/o
biases, attention sinks, a window of 8 keys on the even layers (prompts run past it), YaRN without rounding,
a biased router and biased experts whose gate and up the clamped SwiGLU cuts (weights wide enough that the
limit of 7 is reached). Held at fp32 on dequantized weights:
- prompt logits within 1e-3 of transformers' and 32 greedy tokens identical, both formats;
- controls: without the sinks, or without the clamp, the logits move (so the paths above use both);
- batched == alone, prefix cache on == off, chunked prefill == whole, across the windows;
- OpenAI's MXFP4 checkpoint tensors (blocks and scales) decode as transformers decodes them, and load as the
  same model as their dense values;
- a GGUF with MXFP4 and Q8_0 expert blocks on the default gguf method (ggml's kernels) stays close to the
  same file dequantized.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from raw_forward import (assert_invariances, close_gguf, grouped_against_one_by_one, prompt_logits, ref_logits,
                         save_with_tokenizer, texts)

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

VOCAB = 49152  # the default model's tokenizer, so both formats are complete models
WINDOW = 8
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
              max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
              rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128,
                                   beta_fast=32.0, beta_slow=1.0, truncate=False, rope_theta=150000.0))
PROMPTS = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 3,
           "The quick brown fox jumps over the lazy dog.", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"]
ENGINE = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")


# -- the checkpoints ---------------------------------------------------------------------------------------
def make_hf(tmp: Path) -> Any:
    """A tiny random gpt-oss, saved to tmp with the default model's tokenizer."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):  # wide: gate and up reach the clamp at 7
                p.normal_(0, 0.6)
            elif p.dim() > 1:
                p.normal_(0, 0.08)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("sinks"):
                p.uniform_(-1.0, 2.0)
            else:
                p.uniform_(-0.5, 0.5)
    save_with_tokenizer(model, Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata), tmp)
    return model


def write_gguf(path: Path, model: Any, qtype: str = "F32") -> Path:
    """The checkpoint as llama.cpp's converter writes gpt-oss (arch "gpt-oss"): q/k rows as they are, gate_up
    split into gate and up (HF's alternating columns), experts as (E, out, in) with 2-D biases, the sinks as
    attn_sinks; expert matrices in `qtype` (F32, Q8_0 or MXFP4; the rest F32)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from tokenmill.benchmarks.random_gguf import add_default_tokenizer

    c, arch = model.config, "gpt-oss"
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny gpt-oss")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_dimension_count(c.head_dim)
    rope = c.rope_parameters
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(float(rope["factor"]))
    w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    w.add_rope_scaling_yarn_beta_fast(float(rope["beta_fast"]))
    w.add_rope_scaling_yarn_beta_slow(float(rope["beta_slow"]))
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_sliding_window(c.sliding_window)
    w.add_expert_feed_forward_length(c.intermediate_size)
    add_default_tokenizer(w, c.vocab_size)

    def add(name: str, arr: np.ndarray, quantized: bool = False) -> None:
        if qtype == "F32" or not quantized:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        else:
            q = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(np.ascontiguousarray(arr, dtype=np.float32), q), raw_dtype=q)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    add("output.weight", sd["lm_head.weight"])
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
        for ours, hf in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
            add(b + f"{ours}.weight", sd[p + f"self_attn.{hf}.weight"])
            add(b + f"{ours}.bias", sd[p + f"self_attn.{hf}.bias"])
        add(b + "attn_sinks.weight", sd[p + "self_attn.sinks"])
        add(b + "ffn_gate_inp.weight", sd[p + "mlp.router.weight"])
        add(b + "ffn_gate_inp.bias", sd[p + "mlp.router.bias"])
        e = p + "mlp.experts."
        gate_up = sd[e + "gate_up_proj"].transpose(0, 2, 1)  # (E, 2I, D): rows alternate gate, up
        add(b + "ffn_gate_exps.weight", gate_up[:, 0::2], quantized=True)
        add(b + "ffn_up_exps.weight", gate_up[:, 1::2], quantized=True)
        add(b + "ffn_gate_exps.bias", sd[e + "gate_up_proj_bias"][:, 0::2])
        add(b + "ffn_up_exps.bias", sd[e + "gate_up_proj_bias"][:, 1::2])
        add(b + "ffn_down_exps.weight", sd[e + "down_proj"].transpose(0, 2, 1), quantized=True)  # (E, D, I)
        add(b + "ffn_down_exps.bias", sd[e + "down_proj_bias"])
    return close_gguf(w, path)


@pytest.fixture(scope="module")
def oss(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gpt_oss")
    model = make_hf(tmp / "hf")
    gguf_path = write_gguf(tmp / "model.gguf", model)
    engines = {"hf": LLM(str(tmp / "hf"), **ENGINE), "gguf": LLM(str(gguf_path), **ENGINE)}
    ids = [engines["hf"].tokenizer.encode(p) for p in PROMPTS]
    assert max(map(len, ids)) > 3 * WINDOW
    return dict(model=model, tmp=tmp, gguf=gguf_path, engines=engines, ids=ids)


# -- tests -------------------------------------------------------------------------------------------------
def test_both_formats_read_the_same_config(oss: dict[str, Any]) -> None:
    hf, gg = (e.engine.model_config for e in oss["engines"].values())
    assert hf.architecture == gg.architecture == "gpt_oss"
    fields = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "tie_word_embeddings",
              "attention_bias", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_renormalize",
              "rope_theta", "sliding_window", "layer_types")
    assert {f: getattr(hf, f) for f in fields} == {f: getattr(gg, f) for f in fields}
    yarn = ("rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate")
    assert {k: (hf.rope_scaling or {}).get(k) for k in yarn} == {k: (gg.rope_scaling or {}).get(k) for k in yarn}
    assert hf.layer_windows() == [WINDOW, 0, WINDOW]
    assert hf.num_parameters() == sum(p.numel() for p in oss["model"].parameters()), "the memory plan counts all"


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_prompt_logits_match_transformers(oss: dict[str, Any], fmt: str) -> None:
    for ids in oss["ids"]:
        want, got = ref_logits(oss["model"], ids), prompt_logits(oss["engines"][fmt], ids)
        assert (want - got).abs().max() < 1e-3, fmt


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_greedy_32_tokens_match_transformers(oss: dict[str, Any], fmt: str) -> None:
    if "greedy" not in oss:  # (the fixture's dict: once for every engine)
        with torch.inference_mode():
            oss["greedy"] = [oss["model"].generate(torch.tensor([ids]), do_sample=False, max_new_tokens=32,
                                                   min_new_tokens=32, pad_token_id=0)[0, len(ids):].tolist()
                             for ids in oss["ids"][:2]]
    outs = oss["engines"][fmt].generate(oss["ids"][:2], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    assert texts(outs) == oss["greedy"]


def test_torch_attention_path_matches_too(oss: dict[str, Any], monkeypatch) -> None:
    """The sinks on the paged backend's torch path (what CUDA runs, and CPU steps the kernel does not take)
    as well as on the native kernel the tests above ran: the same greedy tokens as transformers."""
    monkeypatch.setenv("TOKENMILL_ATTENTION_BACKEND", "paged")
    llm = LLM(str(oss["tmp"] / "hf"), **ENGINE)
    assert llm.engine.executor.worker.runner.attn_backend.name == "paged"
    for ids in oss["ids"][:2]:
        assert (ref_logits(oss["model"], ids) - prompt_logits(llm, ids)).abs().max() < 1e-3
    test_greedy_32_tokens_match_transformers({**oss, "engines": {"hf": llm}}, "hf")


def test_controls_sinks_and_clamp_move_the_logits(oss: dict[str, Any]) -> None:
    """The sinks and the SwiGLU's limit take part in the logits matched above: without either, they move."""
    llm, ids = oss["engines"]["hf"], oss["ids"][1]
    want = ref_logits(oss["model"], ids)
    layers = llm.engine.executor.worker.model.model.layers
    sinks = [layer.self_attn.sinks.data.clone() for layer in layers]
    try:
        for layer in layers:
            layer.self_attn.sinks.data.fill_(-1e4)  # a sink nothing attends to
        assert (prompt_logits(llm, ids) - want).abs().max() > 1e-2
    finally:
        for layer, s in zip(layers, sinks):
            layer.self_attn.sinks.data.copy_(s)
    acts = [e.act for layer in layers for e in layer.mlp.experts]
    try:
        for a in acts:
            a.limit = 1e9
        assert (prompt_logits(llm, ids) - want).abs().max() > 1e-2
    finally:
        for a in acts:
            a.limit = 7.0
    assert (prompt_logits(llm, ids) - want).abs().max() < 1e-3


def test_invariances(oss: dict[str, Any]) -> None:
    """batched == alone, prefix cache on == off, chunked == whole, with prompts past the window."""
    assert_invariances(lambda **kw: LLM(str(oss["gguf"]), **{**ENGINE, **kw}), oss["engines"]["gguf"].tokenizer,
                       ["the ocean", "a violin", "bread", "Mars"])


def test_convert_writes_an_hf_copy_transformers_loads(oss: dict[str, Any]) -> None:
    """`tokenmill convert` of the GGUF: transformers loads it as GptOssForCausalLM with the original logits, and
    tokenmill reads it back as the same model."""
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    out = convert_gguf_to_hf(str(oss["gguf"]), oss["tmp"] / "converted", progress=False)
    copy = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(copy).__name__ == "GptOssForCausalLM"
    ids = oss["ids"][1]
    assert (ref_logits(copy, ids) - ref_logits(oss["model"], ids)).abs().max() < 1e-4
    assert (prompt_logits(LLM(str(out), **ENGINE), ids) - ref_logits(oss["model"], ids)).abs().max() < 1e-3


def test_mxfp4_decodes_as_transformers_decodes(tmp_path: Path) -> None:
    """OpenAI's MXFP4 expert tensors: our decoding equals transformers' (its own converter), and a checkpoint
    storing the experts so loads as the same model as one storing their dense values."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tokenmill.models.gpt_oss import mxfp4_to_float

    gen = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (3, 6, 2, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(120, 132, (3, 6, 2), dtype=torch.uint8, generator=gen)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # (E, in, out), x @ w
    assert torch.equal(mxfp4_to_float(blocks, scales).transpose(1, 2), want)

    # the tiny model with every expert matrix MXFP4-coded: random codes, and the dense copy they decode to
    model = make_hf(tmp_path / "dense")
    sd = load_file(str(tmp_path / "dense" / "model.safetensors"))
    packed = dict(sd)
    for name in [n for n in sd if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, d_in, d_out = sd[name].shape
        b = torch.randint(0, 256, (e, d_out, d_in // 32, 16), dtype=torch.uint8, generator=gen)
        s = torch.randint(122, 128, (e, d_out, d_in // 32), dtype=torch.uint8, generator=gen)
        sd[name] = convert_moe_packed_tensors(b, s, dtype=torch.float32).contiguous()
        del packed[name]
        packed[name + "_blocks"], packed[name + "_scales"] = b, s
    save_file(sd, str(tmp_path / "dense" / "model.safetensors"))
    (tmp_path / "mxfp4").mkdir()
    for f in (tmp_path / "dense").iterdir():
        if f.name != "model.safetensors":
            (tmp_path / "mxfp4" / f.name).write_bytes(f.read_bytes())
    save_file(packed, str(tmp_path / "mxfp4" / "model.safetensors"))
    ids = LLM(str(tmp_path / "dense"), **ENGINE).tokenizer.encode(PROMPTS[1])
    dense, mx = LLM(str(tmp_path / "dense"), **ENGINE), LLM(str(tmp_path / "mxfp4"), **ENGINE)
    assert torch.equal(prompt_logits(dense, ids), prompt_logits(mx, ids))
    del model


@pytest.mark.parametrize("qtype", ["MXFP4", "Q8_0"])
def test_quantized_experts_through_the_gguf_method(oss: dict[str, Any], qtype: str) -> None:
    """gpt-oss GGUFs keep the experts as MXFP4 blocks (Q8_0 here too): the default method keeps them as ggml
    blocks, counts their bytes, and stays close to the same file dequantized to fp32 by the gguf package."""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    path = write_gguf(oss["tmp"] / f"{qtype}.gguf", oss["model"], qtype)
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    assert llm.engine.platform.compute.linear_method == "gguf"
    expert = llm.engine.executor.worker.model.model.layers[0].mlp.experts[0]
    assert expert.gate_up_proj.weight.numel() == 0, "kept as blocks, not dequantized"
    from tokenmill.loader.gguf import GGUFFile

    gf = GGUFFile(path)
    assert llm.engine.plan.weight_bytes == sum(t.num_bytes for t in gf.tensors.values())
    gf.close()
    reference = LLM(str(path), **ENGINE)
    agree = total = 0
    for ids in oss["ids"]:
        want, got = prompt_logits(reference, ids), prompt_logits(llm, ids)
        rel = (want - got).norm(dim=-1) / want.norm(dim=-1)
        assert float(rel.median()) < 5e-2, f"median relative logit error {float(rel.median()):.2e}"
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
    assert agree / total >= 0.9, f"top-1 agreement {agree / total:.2f}"
    if qtype == "Q8_0":  # and near the unquantized model
        for ids in oss["ids"]:
            want, got = ref_logits(oss["model"], ids), prompt_logits(llm, ids)
            assert float(((want - got).norm(dim=-1) / want.norm(dim=-1)).median()) < 5e-2


def test_grouped_experts_equal_one_call_per_expert(oss: dict[str, Any], monkeypatch) -> None:
    """The MXFP4 experts' gate and up (two ggml weights each) and down, with their biases, run grouped: one
    ggml call per part for every expert of a layer; exactly what one call per expert computes."""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    path = oss["tmp"] / "MXFP4-grouped.gguf"
    if not path.exists():
        write_gguf(path, oss["model"], "MXFP4")
    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", "64")  # the crossover fixed (a measured one varies)
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    gate_up = llm.engine.executor.worker.model.model.layers[0].mlp.experts[0].gate_up_proj
    assert gate_up.matmul is not None and len(gate_up.matmul.weights) == 2, "gate and up kept apart"
    calls = grouped_against_one_by_one(llm, oss["ids"], monkeypatch)
    assert calls and all(calls), "every layer's experts ran grouped"
