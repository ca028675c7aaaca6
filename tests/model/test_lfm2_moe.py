"""LFM2-MoE against transformers, from an HF directory and from a GGUF written as llama.cpp's converter writes it.

A tiny random Lfm2MoeForCausalLM (transformers' own class, save_pretrained, tied embeddings as the released model):
two short-conv and two GQA attention layers, the first layer's MLP dense (num_dense_layers 1), the rest 4 experts
of which 2 are chosen per token by sigmoid scores plus a nonzero random expert_bias (selection only). At fp32 on
dequantized weights:
- both formats read the same config; the parameter count is transformers';
- the router (SparseMoE.route) equals transformers' Lfm2MoeTopKRouter, with and without norm_topk_prob and with a
  routed_scaling_factor other than 1;
- prompt logits within 1e-3 of transformers' and 32 greedy tokens identical, both formats;
- controls: the expert bias dropped from the selection, or softmax scores in place of sigmoid, moves the logits
  (so the comparisons above see both);
- the default gguf method: the F32 file within 1e-3 of transformers, a Q8_0 file (each expert's blocks kept,
  run grouped) close to the same file dequantized;
- the recurrent (conv) state across steps (raw_forward.assert_state_across_steps) and the prefix cache's state
  checkpoints (raw_forward.assert_prefix_cache_exact);
- `tokenmill convert` writes the GGUF back as an HF directory transformers loads as the same model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from raw_forward import (assert_prefix_cache_exact, assert_state_across_steps, close_gguf, hf_reference,
                         prompt_logits, ref_logits, save_with_tokenizer, texts)

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
if not hasattr(transformers, "Lfm2MoeForCausalLM"):
    pytest.skip("this transformers has no LFM2-MoE", allow_module_level=True)

VOCAB = 49152  # the default model's tokenizer, so both formats are complete models
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, norm_eps=1e-5,
              conv_L_cache=3, num_dense_layers=1, num_experts=4, num_experts_per_tok=2, use_expert_bias=True,
              norm_topk_prob=True, routed_scaling_factor=1.0, tie_word_embeddings=True, bos_token_id=1,
              eos_token_id=2, pad_token_id=0, layer_types=["conv", "full_attention", "conv", "full_attention"],
              rope_parameters=dict(rope_type="default", rope_theta=10000.0))
PROMPTS = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 8,
           "The quick brown fox jumps over the lazy dog. " * 6, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"]
ENGINE = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")


# -- the checkpoints ---------------------------------------------------------------------------------------
def make_hf(tmp: Path) -> Any:
    """A tiny random LFM2-MoE, saved to tmp with the default model's tokenizer; each layer of experts has a
    random expert_bias of the scores' own size, so it changes which experts are chosen."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    torch.manual_seed(0)
    model = transformers.Lfm2MoeForCausalLM(transformers.Lfm2MoeConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5 if "conv.conv" in name else (0.3 if "feed_forward.gate" in name else 0.08))
            else:
                p.uniform_(0.5, 1.5)  # norms: plain weights
        for layer in model.model.layers[CONFIG["num_dense_layers"]:]:
            layer.feed_forward.expert_bias.normal_(0, 0.3)
    save_with_tokenizer(model, Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata), tmp)
    return model


def write_gguf(path: Path, model: Any, qtype: str = "F32") -> Path:
    """The checkpoint as llama.cpp's converter writes LFM2-MoE (arch "lfm2moe", conversion/lfm2.py's
    LFM2MoeModel): head_count_kv per layer (0 for the conv layers), intermediate_size as feed_forward_length,
    expert_feed_forward_length, leading_dense_block_count, expert_gating_func sigmoid, shortconv.l_cache; the
    experts stacked per layer (ffn_{gate,up,down}_exps from w1, w3, w2), the router as ffn_gate_inp, the
    expert_bias as exp_probs_b.bias; the conv squeezed to (C, K), the final norm as token_embd_norm, no
    output.weight (tied). Matrices in `qtype` (F32 or Q8_0; norms, the bias, the router and the conv stay F32)."""
    from gguf import ExpertGatingFuncType, GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from tokenmill.benchmarks.random_gguf import add_default_tokenizer

    c = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = GGUFWriter(str(path), "lfm2moe")
    w.add_name("tiny lfm2 moe")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv([c.num_key_value_heads if t == "full_attention" else 0 for t in c.layer_types])
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_expert_count(c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_leading_dense_block_count(c.num_dense_layers)
    w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(c.vocab_size)
    w.add_shortconv_l_cache(c.conv_L_cache)
    add_default_tokenizer(w, c.vocab_size)

    def add(name: str, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype == "F32" or arr.ndim == 1 or name.endswith(("ffn_gate_inp.weight", "shortconv.conv.weight")):
            w.add_tensor(name, arr)
        else:
            q = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(arr, q), raw_dtype=q)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("token_embd_norm.weight", sd["model.embedding_norm.weight"])
    inter = c.moe_intermediate_size
    for i, kind in enumerate(c.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "operator_norm.weight"])
        add(b + "ffn_norm.weight", sd[p + "ffn_norm.weight"])
        if i < c.num_dense_layers:
            for ours, hf in (("ffn_gate", "w1"), ("ffn_up", "w3"), ("ffn_down", "w2")):
                add(b + f"{ours}.weight", sd[p + f"feed_forward.{hf}.weight"])
        else:  # transformers keeps w1 | w3 stacked as gate_up_proj (E, 2I, D) in memory; w2 as down_proj (E, D, I)
            gate_up = sd[p + "feed_forward.experts.gate_up_proj"]
            add(b + "ffn_gate_inp.weight", sd[p + "feed_forward.gate.weight"])
            add(b + "ffn_gate_exps.weight", gate_up[:, :inter])
            add(b + "ffn_up_exps.weight", gate_up[:, inter:])
            add(b + "ffn_down_exps.weight", sd[p + "feed_forward.experts.down_proj"])
            add(b + "exp_probs_b.bias", sd[p + "feed_forward.expert_bias"])
        if kind == "conv":
            add(b + "shortconv.conv.weight", sd[p + "conv.conv.weight"].squeeze(1))  # (C, K)
            add(b + "shortconv.in_proj.weight", sd[p + "conv.in_proj.weight"])
            add(b + "shortconv.out_proj.weight", sd[p + "conv.out_proj.weight"])
            continue
        for ours, hf in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "out_proj")):
            add(b + f"{ours}.weight", sd[p + f"self_attn.{hf}.weight"])  # not permuted: llama.cpp's NeoX rotary
        add(b + "attn_q_norm.weight", sd[p + "self_attn.q_layernorm.weight"])
        add(b + "attn_k_norm.weight", sd[p + "self_attn.k_layernorm.weight"])
    return close_gguf(w, path)


@pytest.fixture(scope="module")
def lfm2moe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lfm2moe")
    model = make_hf(tmp / "hf")
    gguf_path = write_gguf(tmp / "model.gguf", model)
    engines = {"hf": LLM(str(tmp / "hf"), **ENGINE), "gguf": LLM(str(gguf_path), **ENGINE)}
    ids = [engines["hf"].tokenizer.encode(p) for p in PROMPTS]
    return dict(model=model, tmp=tmp, gguf=gguf_path, engines=engines, ids=ids)


def moe_layers(llm: LLM) -> list[Any]:
    from tokenmill.layers.moe import SparseMoE

    model = llm.engine.executor.worker.runner.model  # type: ignore[attr-defined]
    return [m for m in model.modules() if isinstance(m, SparseMoE)]


# -- tests -------------------------------------------------------------------------------------------------
def test_both_formats_read_the_same_config(lfm2moe: dict[str, Any]) -> None:
    hf, gg = (e.engine.model_config for e in lfm2moe["engines"].values())
    assert hf.architecture == gg.architecture == "lfm2_moe"
    fields = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "layer_types",
              "linear_conv_kernel", "qk_norm", "tie_word_embeddings", "rope_theta", "vocab_size", "num_experts",
              "num_experts_per_tok", "moe_intermediate_size", "moe_renormalize", "moe_selection_bias", "moe_sigmoid",
              "moe_routed_scaling", "dense_mlp_layers", "shared_expert_intermediate_size")
    assert {f: getattr(hf, f) for f in fields} == {f: getattr(gg, f) for f in fields}
    assert gg.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6) and hf.rms_norm_eps == 1e-5
    assert hf.intermediate_size == 96 and hf.moe_intermediate_size == 32  # the dense MLP's width as it is
    assert hf.num_experts == 4 and hf.num_experts_per_tok == 2 and hf.dense_mlp_layers == (0,)
    assert hf.moe_sigmoid and hf.moe_selection_bias and hf.moe_renormalize and hf.moe_routed_scaling == 1.0
    assert hf.kv_layers == [1, 3] and hf.linear_layers == [0, 2] and hf.linear_conv_dim == 64
    assert len(moe_layers(lfm2moe["engines"]["gguf"])) == 3


def test_parameter_count_matches_transformers(lfm2moe: dict[str, Any]) -> None:
    cfg = lfm2moe["engines"]["hf"].engine.model_config
    model = lfm2moe["model"]
    buffers = sum(b.numel() for n, b in model.named_buffers() if n.endswith("expert_bias"))
    assert cfg.num_parameters() == sum(p.numel() for p in model.parameters()) + buffers


@pytest.mark.parametrize("norm,scale", [(True, 1.0), (False, 1.0), (True, 2.5), (False, 0.5)])
def test_router_matches_transformers(norm: bool, scale: float) -> None:
    """SparseMoE.route == Lfm2MoeTopKRouter (weights and ids), the bias on, norm_topk_prob either way and a
    routed_scaling_factor other than 1 (which the released model does not use)."""
    from tokenmill.layers.linear import UnquantizedLinearMethod
    from tokenmill.layers.moe import SparseMoE

    cfg = transformers.Lfm2MoeConfig(**{**CONFIG, "num_experts": 8, "num_experts_per_tok": 3,
                                        "norm_topk_prob": norm, "routed_scaling_factor": scale})
    router = transformers.models.lfm2_moe.modeling_lfm2_moe.Lfm2MoeTopKRouter(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        router.weight.copy_(torch.randn(8, 64, generator=g) * 0.3)
    bias = torch.randn(8, generator=g) * 0.3
    moe = SparseMoE(64, 32, 8, 3, norm, UnquantizedLinearMethod(), selection_bias=True, sigmoid=True,
                    routed_scaling=scale)
    with torch.no_grad():
        moe.gate.weight.copy_(router.weight)
        moe.moe_statics.bias.copy_(bias)  # type: ignore[union-attr]
    h = torch.randn(50, 64, generator=g)
    _, want_w, want_ids = router(h, bias)
    got_w, got_ids = moe.route(h)
    assert torch.equal(got_ids, want_ids)
    assert torch.allclose(got_w, want_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_prompt_logits_match_transformers(lfm2moe: dict[str, Any], fmt: str) -> None:
    for ids in lfm2moe["ids"]:
        want = ref_logits(lfm2moe["model"], ids)
        got = prompt_logits(lfm2moe["engines"][fmt], ids)
        assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), f"{fmt}: max diff {(got - want).abs().max():.2e}"


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_greedy_32_tokens_match_transformers(lfm2moe: dict[str, Any], fmt: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    got = texts(lfm2moe["engines"][fmt].generate(lfm2moe["ids"], params))
    for ids, toks in zip(lfm2moe["ids"], got):
        assert toks == hf_reference(lfm2moe["model"], ids, 32)[1]


@pytest.mark.parametrize("control", ["no_bias", "softmax"])
def test_control_routing_changes_move_the_logits(lfm2moe: dict[str, Any], control: str) -> None:
    """The expert bias dropped from the selection (zeroed), or the experts scored by softmax instead of sigmoid,
    moves the prompt logits far past the tolerance above: the comparisons see both."""
    llm = lfm2moe["engines"]["hf"]
    layers = moe_layers(llm)
    assert len(layers) == 3
    saved = [(m.moe_statics.bias.detach().clone(), m.sigmoid) for m in layers]
    try:
        for m in layers:
            if control == "no_bias":
                m.moe_statics.bias.data.zero_()
            else:
                m.sigmoid = False
        diffs = [(prompt_logits(llm, ids) - ref_logits(lfm2moe["model"], ids)).abs().max().item()
                 for ids in lfm2moe["ids"]]
        assert max(diffs) > 1e-1, diffs
    finally:
        for m, (bias, sigmoid) in zip(layers, saved):
            m.moe_statics.bias.data.copy_(bias)
            m.sigmoid = sigmoid
    ids = lfm2moe["ids"][0]
    assert torch.allclose(prompt_logits(llm, ids), ref_logits(lfm2moe["model"], ids), atol=1e-3, rtol=1e-3)


def test_state_across_steps(lfm2moe: dict[str, Any]) -> None:
    ids = lfm2moe["ids"] + [lfm2moe["ids"][0][:5], lfm2moe["ids"][2][3:40]]
    assert_state_across_steps(lfm2moe["engines"]["hf"], str(lfm2moe["tmp"] / "hf"), ENGINE, ids,
                              36 * 16 * 2 * 2 * 2 * 16 * 4)


def test_prefix_cache_restores_states_exactly(lfm2moe: dict[str, Any]) -> None:
    assert_prefix_cache_exact(str(lfm2moe["tmp"] / "hf"), ENGINE, lfm2moe["ids"])


def test_gguf_method_runs_the_experts_blocks(lfm2moe: dict[str, Any]) -> None:
    """The default (gguf) method: on the F32 file, transformers' logits within 1e-3; on a Q8_0 file, every expert's
    matrices kept as ggml blocks, and the logits within 1e-2 (relative) of the same file dequantized at fp32. (Q8_0's
    own weight error moves this sensitive tiny model's logits by 4-7% from transformers', the same with both
    methods: the bound is held against the dequantized file, not against transformers.)"""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    kw = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    f32 = LLM(str(lfm2moe["gguf"]), **kw)
    assert f32.engine.platform.compute.linear_method == "gguf"
    for ids in lfm2moe["ids"]:
        want, got = ref_logits(lfm2moe["model"], ids), prompt_logits(f32, ids)
        assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), f"max diff {(got - want).abs().max():.2e}"
    path = write_gguf(lfm2moe["tmp"] / "q8_0.gguf", lfm2moe["model"], "Q8_0")
    blocks, dense = LLM(str(path), **kw), LLM(str(path), **kw, quantization="dequantize")
    first = moe_layers(blocks)[0].experts[0].gate_up_proj
    assert first.matmul is not None and first.weight.numel() == 0, "kept as blocks, not dequantized"
    for ids in lfm2moe["ids"]:
        want, got = prompt_logits(dense, ids), prompt_logits(blocks, ids)
        rel = float((got - want).norm() / want.norm())
        assert rel < 1e-2, f"relative logit error {rel:.2e}"


def test_convert_writes_an_hf_copy_transformers_loads(lfm2moe: dict[str, Any], tmp_path: Path) -> None:
    """`tokenmill convert` on the GGUF: transformers loads the directory as the same model (the experts, the router
    and expert_bias under HF's names, num_dense_layers, the conv back to (C, 1, K))."""
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    out = convert_gguf_to_hf(str(lfm2moe["gguf"]), tmp_path / "hf", progress=False)
    back = transformers.Lfm2MoeForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    c = back.config
    assert (c.num_dense_layers, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.intermediate_size,
            c.use_expert_bias, c.norm_topk_prob) == (1, 4, 2, 32, 96, True, True)
    for layer, orig in zip(back.model.layers[1:], lfm2moe["model"].model.layers[1:]):
        assert torch.equal(layer.feed_forward.expert_bias, orig.feed_forward.expert_bias)
    for ids in lfm2moe["ids"][:2]:
        assert torch.allclose(ref_logits(back, ids), ref_logits(lfm2moe["model"], ids), atol=1e-4, rtol=1e-4)
