"""LFM2 against transformers, from an HF directory and from a GGUF written as llama.cpp's converter writes it.

A tiny random Lfm2ForCausalLM (transformers' own class, save_pretrained, tied embeddings as the released models):
three short-conv layers and two of GQA attention with q / k norms, an MLP width from block_auto_adjust_ff_dim
(2/3 of the config's, rounded up to block_multiple_of). Held at fp32 on dequantized weights:
- prompt logits within 1e-3 of transformers' and 32 greedy tokens identical, both formats;
- a control: the conv layers' states dropped between steps (every step fresh) moves the greedy tokens;
- the recurrent (conv) state across steps: batched == alone, chunked prefill (chunks of 16 and 7) == whole,
  preempted (a cache too small for all) == not, n > 1 on a prompt longer than a block == transformers' greedy;
- the memory plan counts the conv states (no delta-rule state), speculative decoding is refused;
- `tokenmill convert` writes the GGUF back as an HF directory transformers loads as the same model.
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
if not hasattr(transformers, "Lfm2ForCausalLM"):
    pytest.skip("this transformers has no LFM2", allow_module_level=True)

VOCAB = 49152  # the default model's tokenizer, so both formats are complete models
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=120, num_hidden_layers=5, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, norm_eps=1e-5, conv_L_cache=3,
              block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0, block_multiple_of=32,
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              layer_types=["conv", "conv", "full_attention", "conv", "full_attention"],
              rope_parameters=dict(rope_type="default", rope_theta=10000.0))
FF = 96  # int(2 * 120 / 3) = 80, rounded up to a multiple of 32
PROMPTS = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 8,
           "The quick brown fox jumps over the lazy dog. " * 6, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"]
ENGINE = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")


# -- the checkpoints ---------------------------------------------------------------------------------------
def make_hf(tmp: Path) -> Any:
    """A tiny random LFM2, saved to tmp with the default model's tokenizer."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    torch.manual_seed(0)
    model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5 if "conv.conv" in name else 0.08)
            else:
                p.uniform_(0.5, 1.5)  # norms: plain weights
    save_with_tokenizer(model, Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata), tmp)
    return model


def write_gguf(path: Path, model: Any) -> Path:
    """The checkpoint as llama.cpp's converter writes LFM2 (arch "lfm2", convert_hf_to_gguf.py's LFM2Model):
    head_count_kv per layer (0 for the conv layers), the MLP's adjusted width as feed_forward_length,
    shortconv.l_cache, the conv squeezed to (C, K), the final norm as token_embd_norm, no output.weight (tied)."""
    from gguf import GGUFWriter

    from tokenmill.benchmarks.random_gguf import add_default_tokenizer

    c = model.config
    arch = "lfm2"
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny lfm2")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(model.model.layers[0].feed_forward.w1.out_features)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv([c.num_key_value_heads if t != "conv" else 0 for t in c.layer_types])
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_shortconv_l_cache(c.conv_L_cache)
    add_default_tokenizer(w, c.vocab_size)

    def add(name: str, arr: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("token_embd_norm.weight", sd["model.embedding_norm.weight"])
    for i, kind in enumerate(c.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "operator_norm.weight"])
        add(b + "ffn_norm.weight", sd[p + "ffn_norm.weight"])
        for ours, hf in (("ffn_gate", "w1"), ("ffn_up", "w3"), ("ffn_down", "w2")):
            add(b + f"{ours}.weight", sd[p + f"feed_forward.{hf}.weight"])
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
def lfm2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lfm2")
    model = make_hf(tmp / "hf")
    gguf_path = write_gguf(tmp / "model.gguf", model)
    engines = {"hf": LLM(str(tmp / "hf"), **ENGINE), "gguf": LLM(str(gguf_path), **ENGINE)}
    ids = [engines["hf"].tokenizer.encode(p) for p in PROMPTS]
    return dict(model=model, tmp=tmp, gguf=gguf_path, engines=engines, ids=ids)


# -- tests -------------------------------------------------------------------------------------------------
def test_both_formats_read_the_same_config(lfm2: dict[str, Any]) -> None:
    hf, gg = (e.engine.model_config for e in lfm2["engines"].values())
    assert hf.architecture == gg.architecture == "lfm2"
    fields = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "layer_types",
              "linear_conv_kernel", "qk_norm", "tie_word_embeddings", "rope_theta", "vocab_size")
    assert {f: getattr(hf, f) for f in fields} == {f: getattr(gg, f) for f in fields}
    assert gg.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6) and hf.rms_norm_eps == 1e-5  # (float32 key)
    assert hf.intermediate_size == FF and hf.tie_word_embeddings and hf.qk_norm
    assert hf.kv_layers == [2, 4] and hf.linear_layers == [0, 1, 3] and hf.linear_conv_dim == 64


def test_mlp_width_follows_transformers() -> None:
    """block_auto_adjust_ff_dim: 2/3, times the multiplier, rounded up to block_multiple_of; as it is without it."""
    from tokenmill.loader.model_config import _lfm2_common

    for ff, mult, multiple, adjust in ((6656, 1.0, 256, True), (12288, 1.0, 256, True), (120, 1.5, 32, True),
                                       (96, 1.0, 32, False)):
        cfg = transformers.Lfm2Config(intermediate_size=ff, block_ffn_dim_multiplier=mult, block_multiple_of=multiple,
                                      block_auto_adjust_ff_dim=adjust, hidden_size=16, num_attention_heads=2,
                                      num_key_value_heads=1)
        want = transformers.models.lfm2.modeling_lfm2.Lfm2MLP(cfg).w1.out_features
        assert _lfm2_common(cfg.to_dict())["intermediate_size"] == want
    assert _lfm2_common({"block_ff_dim": 6656})["intermediate_size"] == 4608  # LFM2-350M's


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_prompt_logits_match_transformers(lfm2: dict[str, Any], fmt: str) -> None:
    for ids in lfm2["ids"]:
        want = ref_logits(lfm2["model"], ids)
        got = prompt_logits(lfm2["engines"][fmt], ids)
        assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), f"{fmt}: max diff {(got - want).abs().max():.2e}"


def test_the_default_gguf_method_loads_and_matches(lfm2: dict[str, Any]) -> None:
    """`serve file.gguf` as a user runs it (the gguf method, blocks kept): the short conv's (C, K) weight is no
    matmul's, so it must not be handed over as blocks (it was, and the load failed)."""
    llm = LLM(str(lfm2["gguf"]), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    assert llm.engine.platform.compute.linear_method == "gguf"
    for ids in lfm2["ids"]:
        want = ref_logits(lfm2["model"], ids)
        assert torch.allclose(prompt_logits(llm, ids), want, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_greedy_32_tokens_match_transformers(lfm2: dict[str, Any], fmt: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    got = texts(lfm2["engines"][fmt].generate(lfm2["ids"], params))
    for ids, toks in zip(lfm2["ids"], got):
        assert toks == hf_reference(lfm2["model"], ids, 32)[1]


def test_control_states_dropped_between_steps_move_the_tokens(lfm2: dict[str, Any]) -> None:
    """Every conv layer reading a zero window at each step (its state not carried) changes the greedy tokens:
    the comparisons above see the state."""
    from tokenmill.worker.recurrent_state import RecurrentStatePool

    pool = assert_state_is_seen(lfm2["engines"]["hf"], lfm2["ids"])
    assert isinstance(pool, RecurrentStatePool) and pool.ssm.numel() == 0  # conv windows only


def test_state_across_steps(lfm2: dict[str, Any]) -> None:
    ids = lfm2["ids"] + [lfm2["ids"][0][:5], lfm2["ids"][2][3:40]]
    assert_state_across_steps(lfm2["engines"]["hf"], str(lfm2["tmp"] / "hf"), ENGINE, ids, 36 * 16 * 2 * 2 * 2 * 16 * 4)


def test_prefix_cache_restores_states_exactly(lfm2: dict[str, Any]) -> None:
    assert_prefix_cache_exact(str(lfm2["tmp"] / "hf"), ENGINE, lfm2["ids"])


def test_n_samples_compute_their_own_prompt(lfm2: dict[str, Any]) -> None:
    """n > 1 over prompts longer than a block (16 tokens): every greedy sample equals transformers'."""
    llm = lfm2["engines"]["hf"]
    for ids in (lfm2["ids"][1], lfm2["ids"][2][:17]):
        assert len(ids) > 16
        want = hf_reference(lfm2["model"], ids, 12)[1]
        greedy = SamplingParams(temperature=0, max_tokens=12, n=3, ignore_eos=True)
        assert [c.token_ids for c in llm.generate([ids], greedy)[0].outputs] == [want] * 3


def test_speculative_decoding_is_refused_and_the_plan_counts_states(lfm2: dict[str, Any]) -> None:
    path = str(lfm2["tmp"] / "hf")
    with pytest.raises(ValueError, match="speculative decoding is not supported .* recurrent state"):
        LLM(path, **ENGINE, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    eng = lfm2["engines"]["hf"].engine
    cfg = eng.model_config
    # per sequence: 3 conv layers x 64 channels x (3 - 1) taps, float32; no delta-rule state
    assert cfg.recurrent_state_bytes() == 3 * 4 * 64 * 2
    assert eng.plan.num_state_slots == eng.max_num_seqs and eng.plan.state_bytes > 0
    assert cfg.kv_bytes_per_token(4) == 2 * 2 * 2 * 16 * 4  # two attention layers' K and V
    assert eng.prefix_caching and eng.plan.num_state_checkpoints > 0


def test_parameter_count_matches_transformers(lfm2: dict[str, Any]) -> None:
    cfg = lfm2["engines"]["hf"].engine.model_config
    assert cfg.num_parameters() == sum(p.numel() for p in lfm2["model"].parameters())


def test_convert_writes_an_hf_copy_transformers_loads(lfm2: dict[str, Any], tmp_path: Path) -> None:
    """`tokenmill convert` on the GGUF: transformers loads the directory as the same model (the MLP's width kept,
    the conv back to (C, 1, K))."""
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    out = convert_gguf_to_hf(str(lfm2["gguf"]), tmp_path / "hf", progress=False)
    back = transformers.Lfm2ForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    for ids in lfm2["ids"][:2]:
        assert torch.allclose(ref_logits(back, ids), ref_logits(lfm2["model"], ids), atol=1e-4, rtol=1e-4)
