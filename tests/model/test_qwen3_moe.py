"""Qwen3, Qwen3-MoE, Mixtral, Qwen2-MoE, OLMoE, Granite MoE (with and without its shared expert) and ERNIE 4.5 MoE
against transformers, from HF directories and from GGUF files.

Each family: a tiny random checkpoint made by transformers' own class (save_pretrained), and a GGUF of the
same weights written with the gguf package under llama.cpp's tensor names and metadata keys (Mixtral as
arch "llama" with 3-D expert tensors and llama.cpp's q/k row permutation, Granite MoE permuted too, its
stacked input_linear split into gate and up and its four multipliers as llama.cpp's granite keys; the Qwen
families and OLMoE unpermuted, as llama.cpp's converter leaves them). Held, at fp32 on dequantized weights:
- prompt logits within 1e-3 of transformers' fp32 logits, and 32 greedy tokens identical, both formats;
- batched == alone, prefix cache on == off, chunked prefill == whole;
- the MoE prompts route each token to top_k >= 2 experts, and the tokens use more than one expert.
And a Q8_0 GGUF through the default gguf method (expert blocks kept, ggml's kernels) stays close.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from raw_forward import grouped_against_one_by_one, native_against_layers, prompt_logits, ref_logits

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

VOCAB = 49152  # the default model's tokenizer, so both formats are complete models
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
FAMILIES: dict[str, dict[str, Any]] = {
    # head_dim 32 != hidden / heads; tied output
    "qwen3": dict(cls="Qwen3ForCausalLM", config="Qwen3Config", gguf_arch="qwen3",
                  kw=dict(intermediate_size=128, head_dim=32, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3moe": dict(cls="Qwen3MoeForCausalLM", config="Qwen3MoeConfig", gguf_arch="qwen3moe",
                     kw=dict(intermediate_size=128, head_dim=32, num_experts=8, num_experts_per_tok=3,
                             moe_intermediate_size=32, norm_topk_prob=True, tie_word_embeddings=False)),
    "mixtral": dict(cls="MixtralForCausalLM", config="MixtralConfig", gguf_arch="llama",
                    kw=dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                            tie_word_embeddings=False)),
    "qwen2moe": dict(cls="Qwen2MoeForCausalLM", config="Qwen2MoeConfig", gguf_arch="qwen2moe",
                     kw=dict(intermediate_size=128, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=64, norm_topk_prob=False, qkv_bias=True,
                             tie_word_embeddings=False)),
    # q / k normalized over the whole projection, softmax over all experts without renormalizing
    "olmoe": dict(cls="OlmoeForCausalLM", config="OlmoeConfig", gguf_arch="olmoe",
                  kw=dict(intermediate_size=32, num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
                          tie_word_embeddings=False, pad_token_id=0)),
    # softmax over the top-k logits, Granite's multipliers, experts stacked in the checkpoint
    "granitemoe": dict(cls="GraniteMoeForCausalLM", config="GraniteMoeConfig", gguf_arch="granitemoe",
                       kw=dict(intermediate_size=32, num_local_experts=5, num_experts_per_tok=2,
                               tie_word_embeddings=True, embedding_multiplier=12.0, attention_multiplier=0.0625,
                               residual_multiplier=0.22, logits_scaling=8.0)),
    # ... and an ungated shared expert beside them (llama.cpp writes it as "granitemoe" with *_shexp tensors)
    "granitemoeshared": dict(cls="GraniteMoeSharedForCausalLM", config="GraniteMoeSharedConfig",
                             gguf_arch="granitemoe",
                             kw=dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                     shared_intermediate_size=64, tie_word_embeddings=False,
                                     embedding_multiplier=12.0, attention_multiplier=0.0625,
                                     residual_multiplier=0.22, logits_scaling=8.0)),
    # ERNIE 4.5 MoE: a dense first layer, experts chosen with a per-expert bias, two ungated shared experts, rotary on
    # adjacent pairs (llama.cpp's converter keeps HF's q / k rows); llama.cpp sizes the shared experts as
    # intermediate_size // num_key_value_heads, which this config meets (128 // 2 = 2 x 32)
    "ernie4_5_moe": dict(cls="Ernie4_5_MoeForCausalLM", config="Ernie4_5_MoeConfig", gguf_arch="ernie4_5-moe",
                         kw=dict(intermediate_size=128, moe_intermediate_size=32, moe_num_experts=6, moe_k=2,
                                 moe_num_shared_experts=2, moe_layer_start_index=1, tie_word_embeddings=True,
                                 rope_theta=500000.0)),
}
# our architecture for each family (GraniteMoeShared is Granite MoE with a shared expert)
OURS = {"granitemoeshared": "granitemoe"}
PROMPTS = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 3,
           "The quick brown fox jumps over the lazy dog.", "1, 2, 3, 4, 5, 6, 7,"]
ENGINE = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")


# -- the checkpoints ---------------------------------------------------------------------------------------
def make_hf(tmp: Path, family: str) -> Any:
    """A tiny random transformers model of `family`, saved to tmp (with the default model's tokenizer)."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    f = FAMILIES[family]
    cfg = getattr(transformers, f["config"])(**COMMON, **f["kw"])
    torch.manual_seed(0)
    model = getattr(transformers, f["cls"])(cfg).eval()
    with torch.no_grad():  # random init is tiny; widen it so logits and routing are well separated
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.uniform_(-0.5, 0.5)
    model.save_pretrained(tmp, safe_serialization=True)
    tok = Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata)
    tok.backend.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": tok.chat_template}))
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (for arch "llama")."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model: Any, family: str, qtype: str = "F32") -> Path:
    """The saved checkpoint (model.safetensors: one tensor per expert, as save_pretrained writes them) as a
    GGUF with llama.cpp's names and keys; matrices in `qtype` (F32 or Q8_0; norms, biases and routers stay
    F32, as llama.cpp's quantizer leaves them)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize
    from safetensors.numpy import load_file

    from tokenmill.benchmarks.random_gguf import add_default_tokenizer

    c, arch = model.config, FAMILIES[family]["gguf_arch"]
    sd = load_file(str(path.parent / "hf" / "model.safetensors"))
    hd = c.head_dim if getattr(c, "head_dim", None) else c.hidden_size // c.num_attention_heads
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {family}")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters or {}
    if rope.get("rope_type") == "yarn":  # as convert_hf_to_gguf writes a YaRN config
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        for key in ("beta_fast", "beta_slow"):
            if rope.get(key) is not None:
                w.add_float32(f"{arch}.rope.scaling.yarn_{key}", float(rope[key]))
    n_experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None)
    if n_experts:
        w.add_expert_count(n_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
    dense_layers: set[int] = set()
    if family == "ernie4_5_moe":  # as llama.cpp's Ernie4_5MoeModel writes it
        w.add_interleave_moe_layer_step(c.moe_layer_interval)
        w.add_leading_dense_block_count(c.moe_layer_start_index)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        w.add_expert_shared_count(c.moe_num_shared_experts)
        w.add_expert_shared_feed_forward_length(c.intermediate_size // c.num_key_value_heads)
        dense_layers = set(range(c.moe_layer_start_index))
    if family in ("qwen3moe", "qwen2moe"):  # the others' experts are feed_forward_length wide
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if family == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    if family == "granitemoeshared":
        w.add_expert_shared_feed_forward_length(c.shared_intermediate_size)
    if arch == "granitemoe":  # llama.cpp's names for Granite's multipliers
        w.add_float32(f"{arch}.embedding_scale", c.embedding_multiplier)
        w.add_float32(f"{arch}.residual_scale", c.residual_multiplier)
        w.add_float32(f"{arch}.attention.scale", c.attention_multiplier)
        w.add_float32(f"{arch}.logit_scale", c.logits_scaling)
    add_default_tokenizer(w, c.vocab_size)

    def add(name: str, arr: np.ndarray) -> None:
        dense = arr.ndim == 1 or name.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"))
        if qtype == "F32" or dense:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        else:
            q = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(np.ascontiguousarray(arr, dtype=np.float32), q), raw_dtype=q)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if arch in ("llama", "granitemoe"):
            q, k = _permute(q, c.num_attention_heads), _permute(k, c.num_key_value_heads)
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(b + "attn_q.weight", q)
        add(b + "attn_k.weight", k)
        add(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        add(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        for part in "qkv":
            if p + f"self_attn.{part}_proj.bias" in sd:
                add(b + f"attn_{part}.bias", sd[p + f"self_attn.{part}_proj.bias"])
        if p + "self_attn.q_norm.weight" in sd:
            add(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            add(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        add(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if not n_experts or i in dense_layers:
            for part in ("gate", "up", "down"):
                add(b + f"ffn_{part}.weight", sd[p + f"mlp.{part}_proj.weight"])
            continue
        if arch == "granitemoe":  # stacked: input_linear (E, 2I, D) is each expert's gate rows, then its up rows
            moe = p + "block_sparse_moe."
            gate_up, inter = sd[moe + "input_linear.weight"], c.intermediate_size
            add(b + "ffn_gate_inp.weight", sd[moe + "router.layer.weight"])
            add(b + "ffn_gate_exps.weight", gate_up[:, :inter])
            add(b + "ffn_up_exps.weight", gate_up[:, inter:])
            add(b + "ffn_down_exps.weight", sd[moe + "output_linear.weight"])
            if p + "shared_mlp.input_linear.weight" in sd:
                shared, inter = sd[p + "shared_mlp.input_linear.weight"], c.shared_intermediate_size
                add(b + "ffn_gate_shexp.weight", shared[:inter])
                add(b + "ffn_up_shexp.weight", shared[inter:])
                add(b + "ffn_down_shexp.weight", sd[p + "shared_mlp.output_linear.weight"])
            continue
        moe = p + ("block_sparse_moe." if family == "mixtral" else "mlp.")
        names = {"gate": "w1", "up": "w3", "down": "w2"} if family == "mixtral" else \
            {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        add(b + "ffn_gate_inp.weight", sd[moe + "gate.weight"])
        for part, hf in names.items():  # (n_experts, out, in): one 3-D tensor per part
            add(b + f"ffn_{part}_exps.weight", np.stack([sd[moe + f"experts.{e}.{hf}.weight"]
                                                         for e in range(n_experts)]))
        if family == "qwen2moe":
            add(b + "ffn_gate_inp_shexp.weight", sd[moe + "shared_expert_gate.weight"][0])  # llama.cpp's (d,)
            for part in ("gate", "up", "down"):
                add(b + f"ffn_{part}_shexp.weight", sd[moe + f"shared_expert.{part}_proj.weight"])
        if family == "ernie4_5_moe":
            add(b + "exp_probs_b.bias", sd[moe + "moe_statics.e_score_correction_bias"].reshape(-1))
            for part in ("gate", "up", "down"):
                add(b + f"ffn_{part}_shexp.weight", sd[moe + f"shared_experts.{part}_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- references --------------------------------------------------------------------------------------------
def ref_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def texts(outs: Any) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The family's HF model, its directory, its fp32 GGUF, and a tokenmill engine on each."""
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    model = make_hf(tmp / "hf", name)
    gguf_path = write_gguf(tmp / "model.gguf", model, name)
    hf_llm, gguf_llm = LLM(str(tmp / "hf"), **ENGINE), LLM(str(gguf_path), **ENGINE)
    ids = [hf_llm.tokenizer.encode(p) for p in PROMPTS]
    return dict(name=name, model=model, tmp=tmp, gguf=gguf_path, engines={"hf": hf_llm, "gguf": gguf_llm}, ids=ids)


# -- tests -------------------------------------------------------------------------------------------------
def test_both_formats_read_the_same_config(family: dict[str, Any]) -> None:
    hf, gg = (e.engine.model_config for e in family["engines"].values())
    assert hf.architecture == gg.architecture == OURS.get(family["name"], family["name"])
    fields = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "tie_word_embeddings",
              "attention_bias", "qk_norm", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
              "moe_renormalize", "shared_expert_intermediate_size", "shared_expert_gated", "rope_theta",
              "dense_mlp_layers", "moe_selection_bias")
    assert {f: getattr(hf, f) for f in fields} == {f: getattr(gg, f) for f in fields}
    scales = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")
    assert [getattr(hf, f) for f in scales] == pytest.approx([getattr(gg, f) for f in scales])  # GGUF: float32
    n = sum(p.numel() for p in family["model"].parameters())
    assert hf.num_parameters() == n, "the memory plan counts every weight, all experts included"


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_prompt_logits_match_transformers(family: dict[str, Any], fmt: str) -> None:
    llm = family["engines"][fmt]
    for ids in family["ids"]:
        want, got = ref_logits(family["model"], ids), prompt_logits(llm, ids)
        assert (want - got).abs().max() < 1e-3, f"{family['name']} {fmt}"


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_greedy_32_tokens_match_transformers(family: dict[str, Any], fmt: str) -> None:
    if "greedy" not in family:  # once for both formats
        family["greedy"] = [ref_greedy(family["model"], ids, 32) for ids in family["ids"][:2]]
    want = family["greedy"]
    outs = family["engines"][fmt].generate(family["ids"][:2], SamplingParams(temperature=0, max_tokens=32,
                                                                             ignore_eos=True))
    assert texts(outs) == want


def test_several_experts_per_token(family: dict[str, Any]) -> None:
    """The prompts exercise the mixture: k >= 2 experts per token, in every layer more than k experts in
    use and tokens routed to different sets of experts (the logits above match with this routing)."""
    cfg = family["engines"]["hf"].engine.model_config
    if not cfg.num_experts:
        pytest.skip("dense")
    k = cfg.num_experts_per_tok
    assert k >= 2
    with torch.inference_mode():
        per_prompt = [family["model"](torch.tensor([ids]), output_router_logits=True).router_logits
                      for ids in family["ids"]]
    moe_layers = [layer for layer in range(cfg.num_layers) if layer not in cfg.dense_mlp_layers]
    for j, layer in enumerate(moe_layers):  # router logits: one entry per layer of experts
        logits = torch.cat([r[j].reshape(-1, cfg.num_experts) for r in per_prompt])
        chosen = logits.topk(k, dim=-1).indices.sort(dim=-1).values  # (tokens, k)
        assert len(set(chosen.flatten().tolist())) > k, f"layer {layer}: experts {set(chosen.flatten().tolist())}"
        assert len(set(map(tuple, chosen.tolist()))) > 1, f"layer {layer}: every token has the same experts"


def test_ernie_selection_bias_takes_part(family: dict[str, Any]) -> None:
    """ERNIE 4.5 MoE's experts are chosen by probs + its per-expert bias: without the bias the logits move (so
    the match above is with it), and its first layer is dense."""
    if family["name"] != "ernie4_5_moe":
        pytest.skip("ERNIE 4.5 MoE only")
    from tokenmill.layers.moe import SparseMoE

    llm, ids = family["engines"]["hf"], family["ids"][1]
    layers = llm.engine.executor.worker.model.model.layers
    assert not isinstance(layers[0].mlp, SparseMoE) and isinstance(layers[1].mlp, SparseMoE)
    statics = layers[1].mlp.moe_statics
    saved = statics.bias.data.clone()
    try:
        statics.bias.data.zero_()
        assert (prompt_logits(llm, ids) - ref_logits(family["model"], ids)).abs().max() > 1e-2
    finally:
        statics.bias.data.copy_(saved)


def test_batched_equals_alone(family: dict[str, Any]) -> None:
    llm, greedy = family["engines"]["gguf"], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    batched = texts(llm.generate(family["ids"], greedy))
    assert batched == [texts(llm.generate([ids], greedy))[0] for ids in family["ids"]]


def test_prefix_cache_on_equals_off(family: dict[str, Any]) -> None:
    llm, greedy = family["engines"]["hf"], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    system = "You are a meticulous assistant. Answer briefly, cite nothing, and never apologise. " * 3
    prompts = [system + p for p in PROMPTS]
    off = LLM(str(family["tmp"] / "hf"), **ENGINE, enable_prefix_caching=False)
    want = texts(off.generate(prompts, greedy))
    bm = llm.engine.block_manager
    hits = bm.num_hits
    assert texts(llm.generate(prompts, greedy)) == want
    assert texts(llm.generate(prompts, greedy)) == want
    assert bm.num_hits > hits


def test_chunked_prefill_equals_whole(family: dict[str, Any]) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    whole = texts(family["engines"]["gguf"].generate(family["ids"], greedy))
    chunked = LLM(str(family["gguf"]), **ENGINE, max_num_batched_tokens=16)
    assert texts(chunked.generate(family["ids"], greedy)) == whole


def test_q8_0_gguf_through_the_gguf_method(family: dict[str, Any]) -> None:
    """The default method on a Q8_0 file keeps every matrix (each expert's too) as ggml blocks."""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    path = write_gguf(family["tmp"] / "q8_0.gguf", family["model"], family["name"], "Q8_0")
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    assert llm.engine.platform.compute.linear_method == "gguf"
    mlp = llm.engine.executor.worker.model.model.layers[0].mlp
    first = mlp.experts[0].gate_up_proj if hasattr(mlp, "experts") else mlp.gate_up_proj
    assert first.matmul is not None and first.weight.numel() == 0, "kept as blocks, not dequantized"
    from tokenmill.loader.gguf import GGUFFile

    gf = GGUFFile(path)
    assert llm.engine.plan.weight_bytes == sum(t.num_bytes for t in gf.tensors.values()), \
        "the memory plan counts every expert's blocks"
    gf.close()
    agree = total = 0
    for ids in family["ids"]:
        want, got = ref_logits(family["model"], ids), prompt_logits(llm, ids)
        rel = (want - got).norm(dim=-1) / want.norm(dim=-1)
        assert float(rel.median()) < 5e-2, f"median relative logit error {float(rel.median()):.2e}"
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
    assert agree / total >= 0.85, f"top-1 agreement {agree / total:.2f}"


def test_grouped_experts_equal_one_call_per_expert(family: dict[str, Any], monkeypatch) -> None:
    """Under the gguf method every expert of a layer runs in one grouped ggml call; it computes exactly
    what one call per expert does (the same ggml matmul per expert, whatever the grouping)."""
    from tokenmill.layers.moe import SparseMoE
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    path = write_gguf(family["tmp"] / "q8_0-grouped.gguf", family["model"], family["name"], "Q8_0")
    # the crossover fixed, not measured: the grouped path is taken only by experts within it, and a measured
    # one depends on the machine's speed at that moment (this failed a CI run when it came out low)
    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", "64")
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    if not any(isinstance(layer.mlp, SparseMoE) for layer in llm.engine.executor.worker.model.model.layers):
        pytest.skip("a dense family")
    calls = grouped_against_one_by_one(llm, family["ids"], monkeypatch)
    assert any(calls), "the grouped path ran (not where an expert has more rows than the crossover)"


def test_experts_in_one_native_call_match_the_grouped_matmuls(family: dict[str, Any], monkeypatch) -> None:
    """Under the gguf method on a type only ggml multiplies (Q5_0), a layer's experts run as one ggml call
    (GGUFLinearMethod.apply_moe: gate|up, SwiGLU, down in one graph, the weighted sum); its prompt logits match
    the grouped matmuls with torch's activation and sum (fp32), and the greedy choice is the same at every
    position."""
    import tokenmill.layers.moe as moe
    from tokenmill.layers.ggml_linear import GGUFLinearMethod
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    path = write_gguf(family["tmp"] / "q5_0-experts.gguf", family["model"], family["name"], "Q5_0")
    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", "64")  # the crossover fixed (a measured one varies)
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    if not any(isinstance(layer.mlp, moe.SparseMoE) for layer in llm.engine.executor.worker.model.model.layers):
        pytest.skip("a dense family")
    taken: list[bool] = []
    real = GGUFLinearMethod.apply_moe

    def spy(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        out = real(self, *args, **kwargs)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(GGUFLinearMethod, "apply_moe", spy)
    native = [prompt_logits(llm, ids) for ids in family["ids"]]
    assert taken and all(taken), "every layer's experts ran in one call"
    monkeypatch.setattr(moe, "_NATIVE_ACTS", {})
    for ids, got in zip(family["ids"], native):
        want = prompt_logits(llm, ids)
        assert float((got - want).abs().max() / want.abs().max()) < 1e-4
        assert torch.equal(got.argmax(-1), want.argmax(-1))


# the families whose layers the native decode step takes (qwen2moe's shared expert is gated, OLMoE's q / k norms
# span the whole projection)
def test_native_decode_step_equals_layer_by_layer(family: dict[str, Any], monkeypatch) -> None:
    """Under the gguf method on Q5_0 (ggml's kernels), every family's decode steps run as one native call
    (native/decode_step.cpp: Qwen3's q / k norms, OLMoE's whole-projection ones; each layer's experts, router and
    shared expert, gated or not, in one tm_moe call), with the same greedy tokens and logprobs, bit for bit, as
    layer by layer."""
    from tokenmill.native import decode_step, ggml

    if not ggml.available() or decode_step.library() is None:
        pytest.skip("ggml or the native decode step is not built here")
    path = write_gguf(family["tmp"] / "q5_0-native.gguf", family["model"], family["name"], "Q5_0")
    _, calls, want, got = native_against_layers(path, family["ids"], monkeypatch)
    assert calls, "the native decode step never ran"
    assert got == want


def test_convert_writes_an_hf_copy_transformers_loads(family: dict[str, Any]) -> None:
    """`tokenmill convert` of the GGUF: transformers loads the directory as the family's class, and its
    logits are the original model's."""
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    out = convert_gguf_to_hf(str(family["gguf"]), family["tmp"] / "converted", progress=False)
    copy = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(copy).__name__ == FAMILIES[family["name"]]["cls"]
    ids = family["ids"][1]
    assert (ref_logits(copy, ids) - ref_logits(family["model"], ids)).abs().max() < 1e-4


def test_unsupported_features_fail_by_name(tmp_path: Path) -> None:
    from tokenmill.loader.model_config import ModelConfig

    base = {"architectures": ["Qwen3MoeForCausalLM"], "num_attention_heads": 4, "hidden_size": 64, "vocab_size": 10,
            "intermediate_size": 8, "num_hidden_layers": 2, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 8}
    for extra, feature in [({"mlp_only_layers": [1]}, "mlp_only_layers"), ({"hidden_act": "gelu"}, "hidden_act"),
                           ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
                           ({"use_sliding_window": True}, "sliding_window")]:
        (tmp_path / "config.json").write_text(json.dumps(base | extra))
        with pytest.raises(ValueError, match=feature):
            ModelConfig.from_hf_dir(tmp_path)
    olmoe = {"architectures": ["OlmoeForCausalLM"], "num_attention_heads": 4, "hidden_size": 64, "vocab_size": 10,
             "intermediate_size": 8, "num_hidden_layers": 2, "num_experts": 4, "num_experts_per_tok": 2}
    for extra, feature in [({"clip_qkv": 8.0}, "clip_qkv"), ({"attention_bias": True}, "attention_bias")]:
        (tmp_path / "config.json").write_text(json.dumps(olmoe | extra))
        with pytest.raises(ValueError, match=feature):
            ModelConfig.from_hf_dir(tmp_path)
    from tokenmill.loader import architectures

    assert architectures.from_gguf_name("llama", has_experts=True).name == "mixtral"
    assert architectures.from_gguf_name("llama").name == "llama"
    md = {"general.architecture": "qwen2", "qwen2.attention.head_count": 4, "qwen2.embedding_length": 64}
    with pytest.raises(ValueError, match="'qwen2' with expert tensors is not supported"):
        ModelConfig.from_gguf(md, {"blk.0.ffn_gate_exps.weight"}, "F32")
    md = {"general.architecture": "qwen3moe", "qwen3moe.expert_gating_func": 2}
    for k in ("attention.head_count", "embedding_length", "feed_forward_length", "block_count", "expert_count",
              "expert_used_count"):
        md[f"qwen3moe.{k}"] = 4
    with pytest.raises(ValueError, match="expert_gating_func"):
        ModelConfig.from_gguf(md, {"blk.0.ffn_gate_exps.weight"}, "F32")


def test_f32_gguf_through_the_gguf_method(family: dict[str, Any]) -> None:
    """F32 matrices (embedding, router, experts) kept as ggml blocks: ggml multiplies F32 without
    quantizing activations, so the logits stay at fp32 accuracy (F32 rows are gathered, not dequantized)."""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    llm = LLM(str(family["gguf"]), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    assert llm.engine.platform.compute.linear_method == "gguf"
    ids = family["ids"][1]
    assert (ref_logits(family["model"], ids) - prompt_logits(llm, ids)).abs().max() < 1e-3


@pytest.fixture(scope="module")
def qwen2moe_hf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    d = tmp_path_factory.mktemp("qwen2moe-methods")
    return make_hf(d, "qwen2moe"), d


@pytest.mark.parametrize("kw", [dict(quantization="int8"), dict(dtype="bfloat16"), dict(quantization="q8_0")],
                         ids=["int8", "bf16", "requant-q8_0"])
def test_other_linear_methods_run_the_experts(qwen2moe_hf: tuple[Any, Path], kw: dict[str, str]) -> None:
    """Every linear method takes the experts (and the router, the shared expert and its 1-row gate): on
    Qwen2-MoE, which has all of them, each stays close to transformers' fp32 logits."""
    if kw.get("quantization") == "q8_0":
        from tokenmill.native import ggml

        if not ggml.available():
            pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    model, d = qwen2moe_hf
    llm = LLM(str(d), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, **kw)
    ids = llm.tokenizer.encode(PROMPTS[1])
    want, got = ref_logits(model, ids), prompt_logits(llm, ids)
    rel = (want - got).norm(dim=-1) / want.norm(dim=-1)
    assert float(rel.median()) < 5e-2
    assert float((want.argmax(-1) == got.argmax(-1)).float().mean()) >= 0.85


def test_random_moe_gguf_loads_and_generates(tmp_path: Path) -> None:
    """random_gguf writes MoE files (the benchmarks' Qwen3-30B-A3B-shaped one): a tiny one loads as
    qwen3moe, keeps its experts' blocks, and its plan counts them."""
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    shape = Shape("qwen3moe", 256, 512, 2, 4, 2, head_dim=64, qk_norm=True, experts=8, experts_used=2,
                  expert_intermediate=256)
    path = write_random_gguf(tmp_path / "moe.gguf", shape, "q4_k_m")
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    cfg = llm.engine.model_config
    assert (cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == \
        ("qwen3moe", 8, 2, 256)
    gf = GGUFFile(path)
    assert llm.engine.plan.weight_bytes == sum(t.num_bytes for t in gf.tensors.values())
    gf.close()
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8


def test_q5_0_experts_stay_on_ggml_where_the_rest_is_packed(tmp_path: Path) -> None:
    """At bf16 with the dense copy on a VNNI CPU without AMX the gguf method packs Q5_0 matrices for the 16-bit
    VNNI kernel, but not a mixture of experts' (routed or shared): the one-call MoE path multiplies those on
    ggml. The memory plan counts exactly that (the packed attention at +9%, the experts at the file's bytes)."""
    import dataclasses

    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf
    from tokenmill.layers.linear import Linear
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.memory_plan import make_plan
    from tokenmill.native import block_matmul, ggml

    if not ggml.available() or block_matmul.vnni_bits() != 16:
        pytest.skip("Q5_0 is packed where the 16-bit VNNI kernel is the bf16 panel (VNNI, no AMX) and ggml is built")
    shape = Shape("qwen3moe", 256, 512, 2, 4, 2, head_dim=64, qk_norm=True, experts=8, experts_used=2,
                  expert_intermediate=256)
    path = write_random_gguf(tmp_path / "moe-q5_0.gguf", shape, "q5_0")
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="bfloat16",
              dense_copy="on")
    model = llm.engine.executor.worker.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    experts = [m for m in linears if m.expert]
    assert experts and all(m.matmul is not None and not m.packed_blocks for m in experts)
    packed = [m for m in linears if m.packed_blocks]
    assert packed and all(not m.expert for m in packed)
    assert all(layer.mlp._native is not None for layer in model.model.layers), "the one-call MoE path"
    held = sum(b.nbytes - 64 for m in packed for b in m.packed_blocks)
    gf = GGUFFile(path)
    matrices = gf.matrices()
    assert [(m.rows, m.k) for m in matrices if m.expert] == [(8 * 256, 256)] * 3 * 2  # gate, up, down a layer
    plain = make_plan(llm.engine.model_config, dataclasses.replace(llm.engine.platform.compute, vnni_pack=False),
                      16, 16 * 2**20, 256, matrices)
    file_bytes = sum(t.num_bytes for name, t in gf.tensors.items() if len(t.shape) == 2 and t.ggml_type.name == "Q5_0"
                     and "_exps." not in name and name != "token_embd.weight")  # the decoder's and the head's
    assert llm.engine.plan.weight_bytes == plain.weight_bytes - file_bytes + held
    gf.close()
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8
