"""Qwen3.5 against transformers, from an HF directory and from a GGUF written as llama.cpp's converter writes it.

A tiny random Qwen3_5ForCausalLM (transformers' own class, save_pretrained): three Gated DeltaNet layers and one
of gated attention, with more value heads than key heads (so the GGUF's value heads are in llama.cpp's tiled
order), zero-centred norms, partial rotary. Held at fp32 on dequantized weights:
- prompt logits within 1e-3 of transformers' and 32 greedy tokens identical, both formats, prompts past the
  delta rule's 64-token chunks;
- a control: the value heads read in the wrong order move the logits;
- the recurrent state across steps: batched == alone, chunked prefill (chunks of 16 and 7) == whole, preempted
  (a cache too small for all) == not, n > 1 == one at a time, requests joining a running batch;
- the VL checkpoint's layout (language model under model.language_model, a vision tower beside it) loads;
- a GGUF with Q8_0 matrices on the default gguf method stays close to the fp32 reference;
- speculative decoding is refused with the reason; the memory plan counts the states.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from raw_forward import (add_hparams, assert_prefix_cache_exact, assert_state_across_steps, close_gguf,
                         hf_reference, native_against_layers, prompt_logits, ref_logits, save_with_tokenizer, texts)

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
if not hasattr(transformers, "Qwen3_5ForCausalLM"):
    pytest.skip("this transformers has no Qwen3.5", allow_module_level=True)

VOCAB = 49152  # the default model's tokenizer, so both formats are complete models
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=512,
              rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
              layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))
PROMPTS = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 8,
           "The quick brown fox jumps over the lazy dog. " * 6, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"]
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
ENGINE = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")


# -- the checkpoints ---------------------------------------------------------------------------------------
def make_hf(tmp: Path, moe: bool = False) -> Any:
    """A tiny random Qwen3.5 (with `moe`, Qwen3.5 MoE), saved to tmp with the default model's tokenizer."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    torch.manual_seed(0)
    if moe:
        config = {k: v for k, v in CONFIG.items() if k != "intermediate_size"} | MOE
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**config)).eval()
    else:
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.5)
            elif name.endswith("dt_bias"):
                p.uniform_(-1.0, 1.0)
            elif p.dim() > 1:
                p.normal_(0, 0.3 if "conv1d" in name else 0.08)
            elif name.endswith("linear_attn.norm.weight"):
                p.uniform_(0.5, 1.5)  # the gated norm's plain weight
            else:
                p.uniform_(-0.5, 0.5)  # zero-centred norms: the scale is 1 + w
    save_with_tokenizer(model, Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata), tmp)
    return model


def _tiled(x: np.ndarray, dim: int, hk: int, head: int) -> np.ndarray:
    """Value heads along `dim` (each `head` wide) from grouped order (key head kh's r-th at kh R + r) to tiled
    (at r Hk + kh), as llama.cpp's converter reorders them."""
    x = np.moveaxis(x, dim, 0)
    rest = x.shape[1:]
    x = x.reshape(hk, -1, head, *rest).swapaxes(0, 1).reshape(-1, *rest)
    return np.moveaxis(x, 0, dim)


def write_gguf(path: Path, model: Any, qtype: str = "F32") -> Path:
    """The checkpoint as llama.cpp's converter writes Qwen3.5 (arch "qwen35"): norms + 1 but the gated one,
    A_log as -exp(A_log), dt_bias as ssm_dt.bias, the conv squeezed to (C, K), and the value heads reordered to
    tiled order in every tensor that has them; matrices in `qtype` (F32 or Q8_0; the rest F32)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from tokenmill.benchmarks.random_gguf import add_default_tokenizer

    c = model.config
    moe = hasattr(c, "num_experts")
    arch = "qwen35moe" if moe else "qwen35"
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = GGUFWriter(str(path), arch)
    add_hparams(w, arch, c, c.head_dim)
    if moe:  # (the MoE's config has no dense MLP: no feed_forward_length)
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_rope_dimension_count(int(c.head_dim * c.rope_parameters["partial_rotary_factor"]))
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_ssm_conv_kernel(c.linear_conv_kernel_dim)
    w.add_ssm_state_size(c.linear_key_head_dim)
    w.add_ssm_group_count(c.linear_num_key_heads)
    w.add_ssm_time_step_rank(c.linear_num_value_heads)
    w.add_ssm_inner_size(c.linear_value_head_dim * c.linear_num_value_heads)
    w.add_full_attention_interval(4)
    w.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in c.layer_types])
    add_default_tokenizer(w, c.vocab_size)
    hk, dk, dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_value_head_dim

    def add(name: str, arr: np.ndarray, quantized: bool = False) -> None:
        if qtype == "F32" or not quantized or arr.shape[-1] % 32:  # (rows not whole blocks stay F32, as llama.cpp's)
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        else:
            q = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(np.ascontiguousarray(arr, dtype=np.float32), q), raw_dtype=q)

    add("token_embd.weight", sd["model.embed_tokens.weight"], quantized=True)
    add("output_norm.weight", sd["model.norm.weight"] + 1)
    add("output.weight", sd["lm_head.weight"], quantized=True)
    for i, kind in enumerate(c.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"] + 1)
        add(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"] + 1)
        for ours, hf in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            if not moe:
                add(b + f"{ours}.weight", sd[p + f"mlp.{hf}.weight"], quantized=True)
            else:
                add(b + f"{ours}_shexp.weight", sd[p + f"mlp.shared_expert.{hf}.weight"], quantized=True)
        if moe:  # transformers holds the experts stacked: gate_up (E, 2I, D), each expert's gate rows first
            gate_up, inter = sd[p + "mlp.experts.gate_up_proj"], c.moe_intermediate_size
            add(b + "ffn_gate_exps.weight", gate_up[:, :inter], quantized=True)
            add(b + "ffn_up_exps.weight", gate_up[:, inter:], quantized=True)
            add(b + "ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"], quantized=True)
            add(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
            add(b + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"])  # (1, D)
        if kind == "full_attention":
            for ours, hf in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
                add(b + f"{ours}.weight", sd[p + f"self_attn.{hf}.weight"], quantized=True)
            add(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"] + 1)
            add(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"] + 1)
            continue
        la = p + "linear_attn."
        qkv = sd[la + "in_proj_qkv.weight"]
        qkv = np.concatenate([qkv[: 2 * hk * dk], _tiled(qkv[2 * hk * dk:], 0, hk, dv)])
        add(b + "attn_qkv.weight", qkv, quantized=True)
        add(b + "attn_gate.weight", _tiled(sd[la + "in_proj_z.weight"], 0, hk, dv), quantized=True)
        add(b + "ssm_alpha.weight", _tiled(sd[la + "in_proj_a.weight"], 0, hk, 1))
        add(b + "ssm_beta.weight", _tiled(sd[la + "in_proj_b.weight"], 0, hk, 1))
        add(b + "ssm_a", -np.exp(_tiled(sd[la + "A_log"], 0, hk, 1)))
        add(b + "ssm_dt.bias", _tiled(sd[la + "dt_bias"], 0, hk, 1))
        conv = sd[la + "conv1d.weight"].squeeze(1)  # (C, K)
        add(b + "ssm_conv1d.weight", np.concatenate([conv[: 2 * hk * dk], _tiled(conv[2 * hk * dk:], 0, hk, dv)]))
        add(b + "ssm_norm.weight", sd[la + "norm.weight"])
        add(b + "ssm_out.weight", _tiled(sd[la + "out_proj.weight"], 1, hk, dv), quantized=True)
    return close_gguf(w, path)


@pytest.fixture(scope="module")
def q35(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("qwen3_5")
    model = make_hf(tmp / "hf")
    gguf_path = write_gguf(tmp / "model.gguf", model)
    engines = {"hf": LLM(str(tmp / "hf"), **ENGINE), "gguf": LLM(str(gguf_path), **ENGINE)}
    ids = [engines["hf"].tokenizer.encode(p) for p in PROMPTS]
    assert max(map(len, ids)) > 64  # past one chunk of the delta rule
    return dict(model=model, tmp=tmp, gguf=gguf_path, engines=engines, ids=ids)


# -- tests -------------------------------------------------------------------------------------------------
def test_both_formats_read_the_same_config(q35: dict[str, Any]) -> None:
    hf, gg = (e.engine.model_config for e in q35["engines"].values())
    assert hf.architecture == gg.architecture == "qwen3_5"
    fields = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "rotary_dim", "layer_types",
              "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel", "qk_norm", "tie_word_embeddings")
    assert {f: getattr(hf, f) for f in fields} == {f: getattr(gg, f) for f in fields}
    assert hf.rotary_dim == 8 and hf.kv_layers == [2] and hf.linear_layers == [0, 1, 3]
    assert not hf.linear_v_heads_tiled and gg.linear_v_heads_tiled


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_prompt_logits_match_transformers(q35: dict[str, Any], fmt: str) -> None:
    for ids in q35["ids"]:
        want = ref_logits(q35["model"], ids)
        got = prompt_logits(q35["engines"][fmt], ids)
        assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), f"{fmt}: max diff {(got - want).abs().max():.2e}"


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_greedy_32_tokens_match_transformers(q35: dict[str, Any], fmt: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    got = texts(q35["engines"][fmt].generate(q35["ids"], params))
    for ids, toks in zip(q35["ids"], got):
        assert toks == hf_reference(q35["model"], ids, 32)[1]


def test_control_value_heads_in_the_wrong_order_move_the_logits(q35: dict[str, Any]) -> None:
    llm = q35["engines"]["gguf"]
    ids = q35["ids"][1]
    want = ref_logits(q35["model"], ids)
    nets = [m for m in llm.engine.executor.worker.model.modules() if hasattr(m, "v_heads_tiled")]
    for m in nets:
        m.v_heads_tiled = False
    try:
        assert (prompt_logits(llm, ids) - want).abs().max() > 1e-2
    finally:
        for m in nets:
            m.v_heads_tiled = True


def test_state_across_steps(q35: dict[str, Any]) -> None:
    ids = q35["ids"] + [q35["ids"][0][:5], q35["ids"][2][3:40]]
    assert_state_across_steps(q35["engines"]["hf"], str(q35["tmp"] / "hf"), ENGINE, ids, 36 * 16 * 2 * 2 * 32 * 4)


def test_prefix_cache_restores_states_exactly(q35: dict[str, Any]) -> None:
    assert_prefix_cache_exact(str(q35["tmp"] / "hf"), ENGINE, q35["ids"])


def test_n_samples_compute_their_own_prompt(q35: dict[str, Any]) -> None:
    """n > 1 over prompts longer than a block: every greedy sample equals transformers' (a sibling restarts from
    the checkpoint of the leader's prompt, its state must cover the rest), and seeded samples repeat."""
    llm = q35["engines"]["hf"]
    for ids in (q35["ids"][1], q35["ids"][2][:17]):
        want = hf_reference(q35["model"], ids, 12)[1]
        greedy = SamplingParams(temperature=0, max_tokens=12, n=3, ignore_eos=True)
        restored = llm.engine.state_cache.num_restored
        assert [c.token_ids for c in llm.generate([ids], greedy)[0].outputs] == [want] * 3
        assert llm.engine.state_cache.num_restored >= restored + 2  # the siblings restarted from the leader's
    params = SamplingParams(temperature=0.8, max_tokens=12, n=3, seed=7, ignore_eos=True)
    many = [c.token_ids for c in llm.generate([q35["ids"][1]], params)[0].outputs]
    assert len({tuple(t) for t in many}) > 1
    assert [c.token_ids for c in llm.generate([q35["ids"][1]], params)[0].outputs] == many


def test_a_sequence_without_its_state_is_refused() -> None:
    """The guards: the state cache refuses a sequence admitted past token 0 without a checkpoint of its state, and
    the pool a plan that does not cover the step's tokens; a plan's segments chain through their slots."""
    from tokenmill.engine.request import Request
    from tokenmill.engine.state_cache import StateCache
    from tokenmill.loader.model_config import ModelConfig
    from tokenmill.scheduler_output import StatePlan
    from tokenmill.worker.recurrent_state import RecurrentStatePool

    req = Request("b", list(range(20)), SamplingParams(max_tokens=4), 4)
    req.num_computed_tokens = 16
    with pytest.raises(RuntimeError, match="without a checkpoint"):
        StateCache(2, 2, 16).admit(req)
    cfg = ModelConfig("qwen3_5", 16, 8, 8, 2, 1, 1, 8, 1e-6, 1e4, 64, False, layer_types=("linear_attention",
                      "full_attention"), linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=4,
                      linear_value_head_dim=4, linear_conv_kernel=4)
    pool = RecurrentStatePool(cfg, 3, torch.device("cpu"))
    with pytest.raises(ValueError, match="does not cover"):
        pool.step([(0, 3, 0, StatePlan(-1, [2], [0]))])
    seqs = pool.step([(0, 1, 7, StatePlan(2, [8], [2])), (1, 3, 0, StatePlan(-1, [2, 3], [1, 0]))]).seqs
    assert [(s.read_slot, s.slot, s.q_start, s.q_len, s.fresh) for s in seqs] == [
        (2, 2, 0, 1, False), (1, 1, 1, 2, True), (1, 0, 3, 1, False)]


def test_vl_checkpoint_layout_loads(q35: dict[str, Any], tmp_path: Path) -> None:
    """Qwen3_5ForConditionalGeneration's files: config with text_config, the language model's weights under
    model.language_model., a vision tower and an mtp layer beside them (skipped)."""
    from safetensors.torch import load_file, save_file

    src = q35["tmp"] / "hf"
    sd = load_file(str(src / "model.safetensors"))
    out = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in sd.items()}
    out["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    out["mtp.fc.weight"] = torch.zeros(4, 4)
    save_file(out, str(tmp_path / "model.safetensors"))
    text = json.loads((src / "config.json").read_text())
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "tie_word_embeddings": False, "text_config": {k: v for k, v in text.items() if k != "architectures"},
           "vision_config": {"depth": 1}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / f).write_text((src / f).read_text())
    llm = LLM(str(tmp_path), **ENGINE)
    ids = q35["ids"][0]
    assert torch.allclose(prompt_logits(llm, ids), ref_logits(q35["model"], ids), atol=1e-3, rtol=1e-3)


def test_q8_0_blocks_on_the_gguf_method(q35: dict[str, Any]) -> None:
    """The default gguf method on Q8_0 blocks against the same file dequantized (what the method answers for:
    this tiny random model amplifies the weights' own 8-bit rounding to ~7% of the logits, either way)."""
    path = write_gguf(q35["tmp"] / "q8.gguf", q35["model"], "Q8_0")
    args = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    blocks, dense = LLM(str(path), **args), LLM(str(path), **args, quantization="dequantize")
    assert blocks.engine.platform.compute.linear_method == "gguf"
    agree = total = 0
    for ids in q35["ids"]:
        got, want = prompt_logits(blocks, ids), prompt_logits(dense, ids)
        assert float((got - want).norm() / want.norm()) < 5e-3
        assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.98
        agree += int((want.argmax(-1) == ref_logits(q35["model"], ids).argmax(-1)).sum())
        total += len(ids)
    assert agree / total >= 0.7  # the 8-bit weights themselves, against the fp32 model (flat random logits)


def test_speculative_decoding_is_refused_and_the_plan_counts_states(q35: dict[str, Any]) -> None:
    path = str(q35["tmp"] / "hf")
    with pytest.raises(ValueError, match="speculative decoding is not supported .* recurrent state"):
        LLM(path, **ENGINE, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    eng = q35["engines"]["hf"].engine
    cfg = eng.model_config
    # per sequence: 3 linear layers x (conv: (2*2*16 + 4*16) channels x 3 taps + state: 4 x 16 x 16), float32
    assert cfg.recurrent_state_bytes() == 3 * 4 * (128 * 3 + 4 * 16 * 16)
    assert eng.plan.num_state_slots == eng.max_num_seqs and eng.plan.state_bytes > 0
    assert any("recurrent state" in line for line in eng.plan.lines())
    assert cfg.kv_bytes_per_token(4) == 2 * 1 * 2 * 32 * 4  # one attention layer's K and V
    assert eng.prefix_caching and eng.plan.num_state_checkpoints > 0


# -- Qwen3.5 MoE -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def q35moe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("qwen3_5_moe")
    model = make_hf(tmp / "hf", moe=True)
    gguf_path = write_gguf(tmp / "model.gguf", model)
    engines = {"hf": LLM(str(tmp / "hf"), **ENGINE), "gguf": LLM(str(gguf_path), **ENGINE)}
    return dict(model=model, tmp=tmp, engines=engines, ids=[engines["hf"].tokenizer.encode(p) for p in PROMPTS])


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_moe_matches_transformers(q35moe: dict[str, Any], fmt: str) -> None:
    """Experts (softmax, top-k, renormalized) and the gated shared expert on Qwen3.5's layers: logits within
    1e-3 and 32 greedy tokens identical, both formats; batched == alone."""
    llm = q35moe["engines"][fmt]
    cfg = llm.engine.model_config
    assert (cfg.architecture, cfg.num_experts, cfg.shared_expert_intermediate_size) == ("qwen3_5_moe", 4, 48)
    for ids in q35moe["ids"]:
        want = ref_logits(q35moe["model"], ids)
        assert torch.allclose(prompt_logits(llm, ids), want, atol=1e-3, rtol=1e-3)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    batched = texts(llm.generate(q35moe["ids"], params))
    assert batched == [hf_reference(q35moe["model"], ids, 32)[1] for ids in q35moe["ids"]]
    assert [texts(llm.generate([ids], params))[0] for ids in q35moe["ids"]] == batched


@pytest.mark.parametrize("moe", [False, True])
def test_convert_writes_an_hf_copy_transformers_loads(q35: dict[str, Any], q35moe: dict[str, Any], moe: bool,
                                                      tmp_path: Path) -> None:
    """`tokenmill convert` on the GGUF (value heads tiled, A as -exp(A_log), norms + 1): transformers loads the
    directory as the same model (its logits equal the original's)."""
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    src = q35moe if moe else q35
    gguf_path = src["tmp"] / "model.gguf" if moe else src["gguf"]
    out = convert_gguf_to_hf(str(gguf_path), tmp_path / "hf", progress=False)
    cls = transformers.Qwen3_5MoeForCausalLM if moe else transformers.Qwen3_5ForCausalLM
    back = cls.from_pretrained(str(out), dtype=torch.float32).eval()
    for ids in src["ids"][:2]:
        assert torch.allclose(ref_logits(back, ids), ref_logits(src["model"], ids), atol=1e-4, rtol=1e-4)


def test_plan_advice_counts_the_states_and_refuses_speculation(q35: dict[str, Any], capsys: Any) -> None:
    """`tokenmill plan`: the --kv-cache-memory it advises for max_num_seqs sequences holds their states as well
    (following it, they all fit), and speculative decoding is refused as serve refuses it."""
    import re

    from tokenmill.cli import main

    path = str(q35["gguf"])
    args = ["plan", path, "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "64"]
    assert main([*args, "--kv-cache-memory", "2MiB"]) == 0
    advice = re.search(r"use --kv-cache-memory ([\d.]+) (\w+) \(their KV cache and recurrent states, and 64 of the "
                       r"prefix cache's checkpoints\)",
                       capsys.readouterr().out)
    assert advice is not None
    assert main([*args, "--kv-cache-memory", advice.group(1) + advice.group(2)]) == 0
    out = capsys.readouterr().out
    assert "fit at once: 64 (max_num_seqs 64)" in out and out.rstrip().endswith("verdict: works.")
    assert main([*args, "--kv-cache-memory", "64MiB", "--speculative-config", '{"method": "ngram"}']) == 1
    assert "Speculative decoding is not supported" in capsys.readouterr().out


@pytest.mark.parametrize("moe", [False, True])
def test_native_decode_step_equals_layer_by_layer(q35: dict[str, Any], q35moe: dict[str, Any], moe: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """On Q5_0 blocks (ggml's kernels), decode steps run as one native call: the Gated DeltaNet layers, the gated
    attention, and for the MoE each layer's router, experts and gated shared expert in one tm_moe call; the same
    greedy tokens and logprobs, bit for bit, as layer by layer."""
    from tokenmill.native import decode_step, ggml

    if not ggml.available() or decode_step.library() is None:
        pytest.skip("ggml or the native decode step is not built here")
    src = q35moe if moe else q35
    path = write_gguf(src["tmp"] / "q5_0-native.gguf", src["model"], "Q5_0")
    _, calls, want, got = native_against_layers(path, src["ids"], monkeypatch)
    assert calls and max(calls) == len(src["ids"])  # the whole batch in one native step
    assert got == want
