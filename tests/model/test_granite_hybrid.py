"""Granite 4.0-H (GraniteMoeHybridForCausalLM) against transformers, from an HF directory and from a GGUF written as
llama.cpp's converter writes it (conversion/granite.py's GraniteHybridModel, arch "granitehybrid").

Tiny random models made with transformers' own class (save_pretrained): three Mamba2 layers and two of GQA
attention, Granite's four multipliers, in three variants:
- "moe": experts beside the shared MLP (H-Tiny / H-Small), NoPE (as released), 2 groups of B / C, tied embeddings;
- "dense": the shared MLP alone (num_local_experts 0, H-Micro), NoPE, 1 group, an untied head;
- "rope": the MoE model with position_embedding_type "rope" (HF only: llama.cpp's converter marks every
  GraniteMoeHybrid GGUF rope.scaling.finetuned false, so llama.cpp runs it without rotary).
Held at fp32 on dequantized weights: prompt logits within 1e-3 of transformers' and 32 greedy tokens identical,
both formats; a control (the states dropped between steps moves the tokens); the recurrent state across steps
(batched == alone == chunked == preempted == joining) and prefix-cache checkpoints restoring it exactly; both
formats read the same config; the parameter count and the memory plan's state size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from raw_forward import (assert_prefix_cache_exact, assert_state_across_steps, assert_state_is_seen, close_gguf,
                         hf_reference, prompt_logits, ref_logits, save_with_tokenizer, texts)

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
if not hasattr(transformers, "GraniteMoeHybridForCausalLM"):
    pytest.skip("this transformers has no GraniteMoeHybrid", allow_module_level=True)

VOCAB = 49152  # the default model's tokenizer, so both formats are complete models
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=5,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
            layer_types=["mamba", "mamba", "attention", "mamba", "attention"], mamba_n_heads=8, mamba_d_head=16,
            mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=32,
            num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=4.0, attention_multiplier=0.3,
            residual_multiplier=0.5, logits_scaling=0.5, position_embedding_type="nope", tie_word_embeddings=True,
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0))
VARIANTS = {
    "moe": BASE,
    # llama.cpp needs the dense MLP's width as feed_forward_length (intermediate_size): the shared one's
    "dense": {**BASE, "num_local_experts": 0, "intermediate_size": 48, "mamba_n_groups": 1,
              "tie_word_embeddings": False},
    "rope": {**BASE, "position_embedding_type": "rope"},
}
PROMPTS = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 8,
           "The quick brown fox jumps over the lazy dog. " * 6, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"]
ENGINE = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")


# -- the checkpoints ---------------------------------------------------------------------------------------
def make_hf(tmp: Path, config: dict[str, Any]) -> Any:
    """A tiny random Granite 4.0-H, saved to tmp with the default model's tokenizer."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    torch.manual_seed(0)
    model = transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(**config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif name.endswith("dt_bias"):
                p.uniform_(-2.0, 0.5)
            elif name.endswith("conv1d.bias"):
                p.normal_(0, 0.1)
            elif p.dim() > 1:
                p.normal_(0, 0.3 if "conv1d" in name else 0.08)
            else:  # norms (plain weights) and D
                p.uniform_(0.5, 1.5)
    save_with_tokenizer(model, Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata), tmp)
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute of q / k rows (GraniteHybridModel keeps undo_permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model: Any) -> Path:
    """The checkpoint as llama.cpp's converter writes GraniteMoeHybridForCausalLM (GraniteHybridModel: GraniteMoeModel's
    keys, then Mamba2's): head_count_kv per layer (0: a Mamba2 layer), expert_count (0 for the dense one) and the
    shared MLP's width, Granite's scales, ssm.conv_kernel / state_size / group_count / inner_size (d_inner) /
    time_step_rank (heads), rope.scaling.finetuned false and a 2**20 context (no rotary: not Bamba); tensors
    through Mamba2Model.modify_tensors (conv squeezed to (C, K), ssm_a = -exp(A_log) and ssm_d as (H, 1), ssm_norm
    as (groups, d_inner / groups), dt_bias as ssm_dt.bias), q / k permuted as llama's, the experts' input_linear
    split into ffn_gate_exps / ffn_up_exps and the shared MLP into *_shexp (or ffn_gate / up / down when dense)."""
    from gguf import GGUFWriter

    from tokenmill.benchmarks.random_gguf import add_default_tokenizer

    from safetensors.numpy import load_file

    c = model.config
    arch = "granitehybrid"
    sd = load_file(str(path.parent / "hf" / "model.safetensors"))  # the checkpoint's names (stacked experts)
    hd = c.hidden_size // c.num_attention_heads
    inner = c.mamba_expand * c.hidden_size
    experts = c.num_local_experts
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny granitehybrid")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(2**20)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv([c.num_key_value_heads if t == "full_attention" else 0 for t in c.layer_types])
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_expert_count(experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(hd)
    w.add_attention_scale(c.attention_multiplier)
    w.add_embedding_scale(c.embedding_multiplier)
    w.add_residual_scale(c.residual_multiplier)
    w.add_logit_scale(c.logits_scaling)
    w.add_expert_shared_feed_forward_length(c.shared_intermediate_size)
    w.add_ssm_conv_kernel(c.mamba_d_conv)
    w.add_ssm_state_size(c.mamba_d_state)
    w.add_ssm_group_count(c.mamba_n_groups)
    w.add_ssm_inner_size(inner)
    w.add_ssm_time_step_rank(c.mamba_n_heads)
    w.add_rope_scaling_finetuned(False)
    add_default_tokenizer(w, c.vocab_size)

    def add(name: str, arr: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    for i, kind in enumerate(c.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if kind == "full_attention":
            add(b + "attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
            add(b + "attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
            add(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
            add(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        else:
            m = p + "mamba."
            add(b + "ssm_in.weight", sd[m + "in_proj.weight"])
            add(b + "ssm_conv1d.weight", sd[m + "conv1d.weight"].squeeze())
            add(b + "ssm_conv1d.bias", sd[m + "conv1d.bias"])
            add(b + "ssm_dt.bias", sd[m + "dt_bias"])
            add(b + "ssm_a", -np.exp(sd[m + "A_log"]).reshape(-1, 1))
            add(b + "ssm_d", sd[m + "D"].reshape(-1, 1))
            add(b + "ssm_norm.weight", sd[m + "norm.weight"].reshape(c.mamba_n_groups, -1))
            add(b + "ssm_out.weight", sd[m + "out_proj.weight"])
        shared, si = sd[p + "shared_mlp.input_linear.weight"], c.shared_intermediate_size
        if not experts:
            add(b + "ffn_gate.weight", shared[:si])
            add(b + "ffn_up.weight", shared[si:])
            add(b + "ffn_down.weight", sd[p + "shared_mlp.output_linear.weight"])
            continue
        moe, inter = p + "block_sparse_moe.", c.intermediate_size
        gate_up = sd[moe + "input_linear.weight"]
        add(b + "ffn_gate_inp.weight", sd[moe + "router.layer.weight"])
        add(b + "ffn_gate_exps.weight", gate_up[:, :inter])
        add(b + "ffn_up_exps.weight", gate_up[:, inter:])
        add(b + "ffn_down_exps.weight", sd[moe + "output_linear.weight"])
        add(b + "ffn_gate_shexp.weight", shared[:si])
        add(b + "ffn_up_shexp.weight", shared[si:])
        add(b + "ffn_down_shexp.weight", sd[p + "shared_mlp.output_linear.weight"])
    return close_gguf(w, path)


@pytest.fixture(scope="module", params=list(VARIANTS))
def granite(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    model = make_hf(tmp / "hf", VARIANTS[name])
    engines = {"hf": LLM(str(tmp / "hf"), **ENGINE)}
    gguf_path = None
    if name != "rope":
        gguf_path = write_gguf(tmp / "model.gguf", model)
        engines["gguf"] = LLM(str(gguf_path), **ENGINE)
    ids = [engines["hf"].tokenizer.encode(p) for p in PROMPTS]
    return dict(name=name, model=model, tmp=tmp, gguf=gguf_path, engines=engines, ids=ids)


def _engines(granite: dict[str, Any]) -> list[tuple[str, LLM]]:
    return list(granite["engines"].items())


# -- tests -------------------------------------------------------------------------------------------------
def test_both_formats_read_the_same_config(granite: dict[str, Any]) -> None:
    cfg = granite["engines"]["hf"].engine.model_config
    c = granite["model"].config
    assert cfg.architecture == ("granite_hybrid" if granite["name"] == "dense" else "granite_hybrid_moe")
    assert cfg.linear_layers == [0, 1, 3] and cfg.kv_layers == [2, 4]
    assert cfg.nope_layers == (() if granite["name"] == "rope" else tuple(range(5)))
    assert cfg.linear_conv_dim == 128 + 2 * c.mamba_n_groups * 16
    assert cfg.intermediate_size == (48 if granite["name"] == "dense" else 32)
    if "gguf" not in granite["engines"]:
        return
    gg = granite["engines"]["gguf"].engine.model_config
    fields = ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "layer_types", "nope_layers", "linear_conv_kernel", "linear_num_key_heads", "linear_num_value_heads",
              "linear_key_head_dim", "linear_value_head_dim", "tie_word_embeddings", "vocab_size", "num_experts",
              "num_experts_per_tok", "moe_intermediate_size", "moe_renormalize", "shared_expert_intermediate_size",
              "shared_expert_gated", "qk_norm")
    assert {f: getattr(cfg, f) for f in fields} == {f: getattr(gg, f) for f in fields}
    for f in ("rms_norm_eps", "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"):
        assert getattr(gg, f) == pytest.approx(getattr(cfg, f), rel=1e-6), f  # (float32 keys)


def test_prompt_logits_match_transformers(granite: dict[str, Any]) -> None:
    for fmt, llm in _engines(granite):
        for ids in granite["ids"]:
            want = ref_logits(granite["model"], ids)
            got = prompt_logits(llm, ids)
            assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), f"{fmt}: max diff {(got - want).abs().max():.2e}"


def test_the_default_gguf_method_loads_and_matches(granite: dict[str, Any]) -> None:
    """`serve file.gguf` as a user runs it (the gguf method: every matrix kept as blocks): ssm_a, ssm_d, the conv
    and the grouped norm are no matmul's and must come dense."""
    if granite["gguf"] is None:
        pytest.skip("no GGUF for this variant")
    llm = LLM(str(granite["gguf"]), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    assert llm.engine.platform.compute.linear_method == "gguf"
    for ids in granite["ids"]:
        assert torch.allclose(prompt_logits(llm, ids), ref_logits(granite["model"], ids), atol=1e-3, rtol=1e-3)


def test_greedy_32_tokens_match_transformers(granite: dict[str, Any]) -> None:
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    want = [hf_reference(granite["model"], ids, 32)[1] for ids in granite["ids"]]
    for fmt, llm in _engines(granite):
        assert texts(llm.generate(granite["ids"], params)) == want, fmt


def test_control_states_dropped_between_steps_move_the_tokens(granite: dict[str, Any]) -> None:
    """Every Mamba2 layer reading a zero state at each step (its conv window and SSM state not carried) changes the
    greedy tokens: the comparisons above see the state."""
    from tokenmill.worker.recurrent_state import RecurrentStatePool

    if granite["name"] != "moe":
        pytest.skip("one variant is enough")
    pool = assert_state_is_seen(granite["engines"]["hf"], granite["ids"])
    assert isinstance(pool, RecurrentStatePool) and pool.ssm.shape[2:] == (8, 16, 16)


def test_state_across_steps(granite: dict[str, Any]) -> None:
    if granite["name"] == "rope":
        pytest.skip("the NoPE variants cover it")
    ids = granite["ids"] + [granite["ids"][0][:5], granite["ids"][2][3:40]]
    cfg = granite["engines"]["hf"].engine.model_config
    small = 36 * 16 * cfg.kv_bytes_per_token(4) + 4 * cfg.recurrent_state_bytes()
    assert_state_across_steps(granite["engines"]["hf"], str(granite["tmp"] / "hf"), ENGINE, ids, small)


def test_prefix_cache_restores_states_exactly(granite: dict[str, Any]) -> None:
    if granite["name"] == "rope":
        pytest.skip("the NoPE variants cover it")
    assert_prefix_cache_exact(str(granite["tmp"] / "hf"), ENGINE, granite["ids"])


def test_parameter_count_and_state_size(granite: dict[str, Any]) -> None:
    cfg = granite["engines"]["hf"].engine.model_config
    c = granite["model"].config
    assert cfg.num_parameters() == sum(p.numel() for p in granite["model"].parameters())
    conv = 128 + 2 * c.mamba_n_groups * 16
    assert cfg.recurrent_state_bytes() == 3 * 4 * (conv * 3 + 8 * 16 * 16)
    eng = granite["engines"]["hf"].engine
    assert eng.plan.num_state_slots > 0 and eng.prefix_caching


def test_convert_writes_an_hf_copy_transformers_loads(granite: dict[str, Any], tmp_path: Path) -> None:
    """`tokenmill convert` on the GGUF: transformers loads the directory as the same model (A_log from ssm_a, the
    conv back to (C, 1, K), the experts stacked, a dense MLP as shared_mlp)."""
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    if granite["gguf"] is None:
        pytest.skip("no GGUF for the rope variant")
    out = convert_gguf_to_hf(str(granite["gguf"]), tmp_path / "hf", progress=False)
    back = transformers.GraniteMoeHybridForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    for ids in granite["ids"][:2]:
        assert torch.allclose(ref_logits(back, ids), ref_logits(granite["model"], ids), atol=1e-4, rtol=1e-4)
