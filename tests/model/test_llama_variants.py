"""SmolLM3, Granite, OLMo 2 and Gemma (1), the llama decoder with a twist each, against transformers, from HF
and from GGUF.

- SmolLM3 (SmolLM3ForCausalLM; GGUF architecture "smollm3"): every 4th layer's q and k are not rotated
  (NoPE). HF lists it per layer (`no_rope_layers`, 1 = rotate); llama.cpp fixes the interval at 4.
- Granite (GraniteForCausalLM; GGUF "granite"): embeddings times embedding_multiplier, attention scaled by
  attention_multiplier instead of head_dim ** -0.5, each sublayer's output times residual_multiplier before
  it joins the residual stream, logits divided by logits_scaling; GGUF keeps them as embedding_scale,
  attention.scale, residual_scale and logit_scale.
- OLMo 2 (Olmo2ForCausalLM; GGUF "olmo2"): no norm before a sublayer, one after each (before the residual
  add), and q / k RMS-normalized over the whole projection before rotary.
- Gemma (GemmaForCausalLM; GGUF "gemma"): (1 + w) norms (llama.cpp stores 1 + w), a GELU-tanh MLP,
  embeddings times sqrt(hidden), a tied head, head_dim apart from hidden / heads.
- ERNIE 4.5 (Ernie4_5ForCausalLM; GGUF "ernie4_5"): rotary on adjacent pairs of dims (GPT-J style), in both
  formats' q / k rows (llama.cpp keeps HF's rows and rotates them so), a tied head.
- Hunyuan dense (HunYuanDenseV1ForCausalLM; GGUF "hunyuan-dense"): per-head q / k norms after rotary, a
  "dynamic" rope with a fixed NTK alpha (static: llama.cpp's converter folds it into freq_base).
- Ministral 3 (Ministral3ForCausalLM; GGUF "mistral3"): YaRN, and q times 1 + beta ln(1 + floor(pos / original
  context)) after rotary (llama.cpp's attention.temperature_scale; its converter writes mscale_all_dim as
  yarn_log_multiplier); q / k permuted.
- Cohere2 (Cohere2ForCausalLM; GGUF "cohere2"): one LayerNorm (no bias) feeding attention and the MLP side
  by side, rotary on adjacent pairs only in the windowed layers, logits times logit_scale, a tied head.
- Arcee (ArceeForCausalLM; GGUF "arcee"): an MLP without a gate, down(relu(up(x)) ** 2); q / k permuted.
- GLM-4 (Glm4ForCausalLM; GGUF "glm4"): a norm before and after each sublayer, rotary on half of each head on
  adjacent pairs, q / k / v biases, gate|up as one tensor.
- OLMo 3 (Olmo3ForCausalLM; GGUF "olmo2" with attention.sliding_window): OLMo 2's layer, layers 0-2 of 4
  windowed and rotated with plain rotary, the global one with YaRN (its control: every layer on the YaRN tables).
- EXAONE 4 (Exaone4ForCausalLM; GGUF "exaone4"): OLMo 2's norms after the sublayers, per-head q / k norms,
  and with a sliding window, windowed rotated local layers between global ones without rotary (without a
  window, as EXAONE 4.0 1.2B, every layer global and rotated).

Each case is a tiny random checkpoint written by transformers and, from the same weights, a GGUF as llama.cpp's
converter writes it (SmolLM3 and Granite convert as llama: q and k rows permuted; OLMo 2, Gemma and EXAONE 4
do not). Prompt logits within
1e-3 and 32 greedy tokens identical; a model with the twist removed differs from the reference (the test
would see a path that dropped it); the Q8_0 blocks through the gguf method; the invariances; `tokenmill
convert` back to a directory transformers loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gemma3_tiny import default_tokenizer
from raw_forward import (add_hparams, assert_invariances, hf_reference, logits_close_on_blocks, prompt_logits,
                         widen_and_save)

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

NUM_TOKENS = 32
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
GRANITE = dict(embedding_multiplier=12.0, attention_multiplier=0.015625 * 4, residual_multiplier=0.22,
               logits_scaling=8.0)
FAMILIES = {
    "smollm3": dict(cls="SmolLM3", layers=8, extra={}),  # layers 3 and 7 without rotary
    "granite": dict(cls="Granite", layers=2, extra=GRANITE),
    "olmo2": dict(cls="Olmo2", layers=2, extra={}),
    # layers 0-2 windowed (8 keys) with plain rotary, layer 3 global with YaRN (transformers 5's per-type entries)
    "olmo3": dict(cls="Olmo3", layers=4, extra=dict(sliding_window=8, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                           "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0}})),
    "gemma": dict(cls="Gemma", layers=2, extra=dict(head_dim=64, hidden_act="gelu_pytorch_tanh")),
    # layers 0-2 windowed (8 keys) and rotated, layer 3 global without rotary
    "exaone4": dict(cls="Exaone4", layers=4, extra=dict(sliding_window=8, sliding_window_pattern=4)),
    "ernie4_5": dict(cls="Ernie4_5", layers=2, extra=dict(head_dim=32)),  # its config's default is 128
    # head_dim 48 (hidden 128 / 4 heads would be 32), 24 of them rotating; q / k / v biases
    # q / k norms after rotary; "dynamic" rope with a fixed NTK alpha (a static base: 10000 * 1000 ** (32 / 30))
    "hunyuan_dense": dict(cls="HunYuanDenseV1", layers=2, extra=dict(
        head_dim=32, rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0})),
    # YaRN with mscale == mscale_all_dim, and q's temperature from position 16 on (the tests' prompts pass it)
    "ministral3": dict(cls="Ministral3", layers=2, extra=dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16, beta_fast=32.0,
        beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1))),
    # layers 0-2 windowed (8 keys) and rotated, layer 3 global without rotary; logits times 0.25
    "cohere2": dict(cls="Cohere2", layers=4, extra=dict(sliding_window=8, logit_scale=0.25, layer_norm_eps=1e-5)),
    "arcee": dict(cls="Arcee", layers=2, extra=dict(hidden_act="relu2")),  # no gate: down(relu(up(x)) ** 2)
    "glm4": dict(cls="Glm4", layers=2, extra=dict(head_dim=48, attention_bias=True, partial_rotary_factor=0.5,
                                                  pad_token_id=0)),
}
UNPERMUTED = ("olmo2", "olmo3", "gemma", "exaone4", "ernie4_5", "glm4", "hunyuan_dense", "cohere2")
GGUF_ARCH = {"hunyuan_dense": "hunyuan-dense", "ministral3": "mistral3", "olmo3": "olmo2"}  # llama.cpp's names that are not ours
# EXAONE 4 without a window (its config then needs layer_types: it cannot derive them)
GLOBAL_EXAONE4 = dict(sliding_window=None, layer_types=["full_attention"] * 4)


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


def make_hf(tmp: Path, family: str, tokenizer: Any, **overrides: Any) -> tuple[Path, Any]:
    """An HF directory of a tiny random model of `family`; returns it and the fp32 model."""
    tok, _ = tokenizer
    spec = FAMILIES[family]
    kw = dict(vocab_size=tok.vocab_size, hidden_size=128, intermediate_size=192, num_hidden_layers=spec["layers"],
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
              tie_word_embeddings=family in ("smollm3", "gemma", "ernie4_5", "cohere2"), bos_token_id=1,
              eos_token_id=2, pad_token_id=2,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}) | spec["extra"] | overrides
    cfg = getattr(transformers, spec["cls"] + "Config")(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, spec["cls"] + "ForCausalLM")(cfg).eval()
    widen_and_save(model, tok, tmp)
    return tmp, model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's permutation of q / k rows (LlamaModel, which both families extend)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, family: str, model: Any, tokenizer: Any, qtype: str = "F32", scales: bool = True) -> Path:
    """The same weights as a GGUF with llama.cpp's names and keys for `family`; `scales=False` leaves Granite's
    four keys out (llama.cpp then uses 1, head_dim ** -0.5, 1, 1)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from tokenmill.benchmarks.random_gguf import add_default_tokenizer

    _, src = tokenizer
    c = model.config
    a = GGUF_ARCH.get(family, family)
    w = GGUFWriter(str(path), a)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    add_hparams(w, a, c, head_dim)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)  # OLMo 3's per-type entries: its global one
    w.add_uint32(f"{a}.rope.dimension_count",  # GLM-4's rotating dims (transformers 5 keeps the factor there)
                 int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    w.add_float32(f"{a}.rope.freq_base", rope["rope_theta"] * rope.get("alpha", 1.0) ** (head_dim / (head_dim - 2))
                  if family == "hunyuan_dense" else rope["rope_theta"])
    if family == "granite" and scales:
        w.add_float32(f"{a}.embedding_scale", c.embedding_multiplier)
        w.add_float32(f"{a}.residual_scale", c.residual_multiplier)
        w.add_float32(f"{a}.attention.scale", c.attention_multiplier)
        w.add_float32(f"{a}.logit_scale", c.logits_scaling)
    add_default_tokenizer(w, len(src["tokenizer.ggml.tokens"]))  # the default model's, whole

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not c.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    if family == "olmo3":  # as llama.cpp's converter writes OLMo 3: olmo2 with a window and the YaRN keys
        w.add_uint32(f"{a}.attention.sliding_window", c.sliding_window)
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", rope["factor"])
        w.add_uint32(f"{a}.rope.scaling.original_context_length", rope["original_max_position_embeddings"])
        w.add_float32(f"{a}.rope.scaling.yarn_beta_fast", rope["beta_fast"])
        w.add_float32(f"{a}.rope.scaling.yarn_beta_slow", rope["beta_slow"])
    if family in ("olmo2", "olmo3", "exaone4"):
        del parts["input_layernorm"]
        parts |= {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm",
                  "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    if family == "arcee":
        del parts["mlp.gate_proj"]
    if family == "cohere2":  # one norm a layer; llama.cpp's keys
        del parts["post_attention_layernorm"]
        w.add_float32(f"{a}.attention.layer_norm_epsilon", c.layer_norm_eps)
        w.add_float32(f"{a}.logit_scale", c.logit_scale)
        w.add_uint32(f"{a}.attention.sliding_window", c.sliding_window)
    if family == "ministral3":  # as llama.cpp's converter writes a Ministral 3
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", rope["factor"])
        w.add_uint32(f"{a}.rope.scaling.original_context_length", rope["original_max_position_embeddings"])
        w.add_float32(f"{a}.rope.scaling.yarn_beta_fast", rope["beta_fast"])
        w.add_float32(f"{a}.rope.scaling.yarn_beta_slow", rope["beta_slow"])
        w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", rope["mscale_all_dim"])
        w.add_float32(f"{a}.attention.temperature_scale", rope["llama_4_scaling_beta"])
    if family == "hunyuan_dense":
        parts |= {"self_attn.query_layernorm": "attn_q_norm", "self_attn.key_layernorm": "attn_k_norm"}
    if family == "glm4":
        for hf in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            del parts[hf]
        parts |= {"mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                  "post_self_attn_layernorm": "post_attention_norm", "post_mlp_layernorm": "post_ffw_norm"}
        for i in range(c.num_hidden_layers):
            names |= {f"model.layers.{i}.self_attn.{x}_proj.bias": f"blk.{i}.attn_{x}.bias" for x in "qkv"}
    if family == "exaone4" and c.sliding_window:  # as llama.cpp's converter writes them
        w.add_uint32(f"{a}.attention.sliding_window", c.sliding_window)
        w.add_array(f"{a}.attention.sliding_window_pattern", [t == "sliding_attention" for t in c.layer_types])
    for i in range(c.num_hidden_layers):
        names |= {f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for hf, g in parts.items()}
    for hf_name, name in names.items():
        x = np.ascontiguousarray(sd[hf_name], dtype=np.float32)
        if family == "gemma" and name.endswith("norm.weight"):
            x = x + 1  # llama.cpp's converter stores Gemma's (1 + w)
        if family in UNPERMUTED:
            pass
        elif name.endswith("attn_q.weight"):
            x = np.ascontiguousarray(_permute(x, c.num_attention_heads))
        elif name.endswith("attn_k.weight"):
            x = np.ascontiguousarray(_permute(x, c.num_key_value_heads))
        if x.ndim == 2 and qtype != "F32":
            t = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(x, t), raw_dtype=t)
        else:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def engine(model: Path, **kw: Any) -> LLM:
    args = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
                quantization="dequantize") | kw
    return LLM(str(model), **args)


def prompts(tok: Any) -> list[list[int]]:
    return [tok.encode(t) for t in ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 3]]


@pytest.fixture(scope="module", params=list(FAMILIES))
def case(request, tokenizer, tmp_path_factory):
    family = request.param
    d, model = make_hf(tmp_path_factory.mktemp(family), family, tokenizer)
    g = write_gguf(tmp_path_factory.mktemp(family + "-gguf") / "tiny.gguf", family, model, tokenizer)
    return family, d, g, model


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_logits_and_greedy_match_transformers(case, fmt: str, tokenizer) -> None:
    family, d, g, model = case
    ours = engine(d if fmt == "hf" else g)
    cfg = ours.engine.model_config
    assert cfg.architecture == family
    assert cfg.num_parameters() == sum(p.numel() for p in model.parameters())
    if family == "smollm3":
        assert cfg.nope_layers == (3, 7)
    elif family == "exaone4":
        assert (cfg.nope_layers, cfg.layer_windows()) == ((3,), [8, 8, 8, 0])
    elif family == "olmo3":
        assert cfg.layer_windows() == [8, 8, 8, 0] and ours.engine.executor.worker.model.rope_windowed is not None
    elif family == "granite":
        assert (cfg.embedding_multiplier, cfg.attention_multiplier, cfg.residual_multiplier,
                cfg.logits_scaling) == pytest.approx(tuple(GRANITE.values()))
    for ids in prompts(tokenizer[0]):
        want_logits, want_tokens = hf_reference(model, ids, NUM_TOKENS)
        got = prompt_logits(ours, ids)
        err = float((got - want_logits).abs().max())
        assert err < 1e-3, f"{family} {fmt}: max logit error {err:.2e}"
        out = ours.generate([ids], GREEDY)[0]
        assert out.outputs[0].token_ids == want_tokens, f"{family} {fmt} diverged"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_twist_matters(family: str, tokenizer, tmp_path: Path) -> None:
    """The same weights as plain llama (every layer rotated; no multipliers) give other logits: the test above
    would see a path that dropped the family's difference."""
    _, model = make_hf(tmp_path / "hf", family, tokenizer)
    ids = prompts(tokenizer[0])[1]
    if family == "olmo2":  # the same weights through llama's layer: norms before the sublayers, none on q / k
        def llama_name(k: str) -> str:  # OLMo 2's norm after attention as llama's before it, and so on
            if "post_attention_layernorm" in k:
                return k.replace("post_attention_layernorm", "input_layernorm")
            return k.replace("post_feedforward_layernorm", "post_attention_layernorm")

        sd = {llama_name(k): v for k, v in model.state_dict().items() if "q_norm" not in k and "k_norm" not in k}
        c = model.config
        other = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads, rms_norm_eps=c.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})).eval()
        other.load_state_dict(sd)
    elif family == "glm4":  # each head's rotating q / k rows as halves, as a loader that skipped the reorder gives
        other = make_hf(tmp_path / "plain", family, tokenizer)[1]
        hd, rd = other.config.head_dim, other.config.head_dim // 2
        order = torch.cat([torch.arange(0, rd, 2), torch.arange(1, rd, 2), torch.arange(rd, hd)])
        with torch.no_grad():
            for layer in other.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    n = proj.weight.shape[0] // hd
                    rows = torch.cat([h * hd + order for h in range(n)])
                    proj.weight.copy_(proj.weight[rows])
                    proj.bias.copy_(proj.bias[rows])
    elif family == "ministral3":  # no temperature
        plain_rope = dict(FAMILIES[family]["extra"]["rope_parameters"], llama_4_scaling_beta=0.0)
        other = make_hf(tmp_path / "plain", family, tokenizer, rope_parameters=plain_rope)[1]
    elif family == "cohere2":  # every layer windowed and rotated
        other = make_hf(tmp_path / "plain", family, tokenizer, layer_types=["sliding_attention"] * 4)[1]
    elif family == "olmo3":  # the windowed layers on the global layers' YaRN tables
        full = FAMILIES[family]["extra"]["rope_parameters"]["full_attention"]
        other = make_hf(tmp_path / "plain", family, tokenizer,
                        rope_parameters={"sliding_attention": full, "full_attention": full})[1]
    elif family == "arcee":  # relu, not squared
        other = make_hf(tmp_path / "plain", family, tokenizer, hidden_act="relu")[1]
    elif family == "hunyuan_dense":  # the same weights as Qwen3, whose q / k norms come before rotary
        c = model.config
        theta = 10000.0 * 1000.0 ** (c.head_dim / (c.head_dim - 2))
        other = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
            tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": theta})).eval()
        other.load_state_dict({k.replace("query_layernorm", "q_norm").replace("key_layernorm", "k_norm"): v
                               for k, v in model.state_dict().items()})
    elif family == "ernie4_5":  # the same weights through llama's rotary, which pairs halves of each head
        c = model.config
        other = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
            tie_word_embeddings=True, rope_parameters=c.rope_parameters)).eval()
        other.load_state_dict(model.state_dict())
    elif family == "gemma":  # without the embedding scale
        other = make_hf(tmp_path / "plain", family, tokenizer)[1]
        other.model.embed_tokens.embed_scale.fill_(1.0)
    else:
        plain = {"exaone4": GLOBAL_EXAONE4, "smollm3": dict(no_rope_layers=[1] * 8), "granite": dict(
            embedding_multiplier=1.0, attention_multiplier=(128 // 4) ** -0.5, residual_multiplier=1.0,
            logits_scaling=1.0)}[family]
        _, other = make_hf(tmp_path / "plain", family, tokenizer, **plain)
    with torch.inference_mode():
        a, b = model(torch.tensor([ids])).logits, other(torch.tensor([ids])).logits
    assert float((a - b).abs().max()) > 0.1


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_exaone4_without_a_window(fmt: str, tokenizer, tmp_path: Path) -> None:
    """EXAONE 4.0 1.2B's form: no sliding window, so every layer global and rotated."""
    d, model = make_hf(tmp_path / "hf", "exaone4", tokenizer, **GLOBAL_EXAONE4)
    src = d if fmt == "hf" else write_gguf(tmp_path / "tiny.gguf", "exaone4", model, tokenizer)
    ours = engine(src)
    assert (ours.engine.model_config.nope_layers, ours.engine.model_config.layer_windows()) == ((), [0] * 4)
    for ids in prompts(tokenizer[0]):
        want_logits, want_tokens = hf_reference(model, ids, NUM_TOKENS)
        assert float((prompt_logits(ours, ids) - want_logits).abs().max()) < 1e-3
        assert ours.generate([ids], GREEDY)[0].outputs[0].token_ids == want_tokens


def test_ministral3_temperature_in_the_native_decode_step(tokenizer, tmp_path: Path) -> None:
    """The one-call native decode step has no temperature: past the original context it gives the step back
    to the layer path. An F32 GGUF on the gguf method (ggml's F32 matmuls: fp32 accuracy) with the native
    step on decodes transformers' greedy tokens from positions under and over 16."""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    _, model = make_hf(tmp_path / "hf", "ministral3", tokenizer)
    g = write_gguf(tmp_path / "tiny.gguf", "ministral3", model, tokenizer)
    ours = LLM(str(g), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    if ours.engine.executor.worker.model.native_decode is None:
        pytest.skip("the native decode step is not built here")
    ids = tokenizer[0].encode("Hi")
    assert len(ids) < 16
    _, want = hf_reference(model, ids, NUM_TOKENS)
    assert ours.generate([ids], GREEDY)[0].outputs[0].token_ids == want


@pytest.mark.parametrize("family", ["gemma", "glm4", "olmo2", "olmo3", "exaone4", "hunyuan_dense", "cohere2",
                                    "arcee"])
def test_in_the_native_decode_step(family: str, tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma (1) (its GELU-tanh MLP, (1 + w) norms, embeddings times sqrt(hidden)), GLM-4 (norms after each
    sublayer too, half of each head rotating, q / k / v biases), OLMo 2 (norms only after each sublayer, q / k norms
    over the whole projection), OLMo 3 (windowed layers on their own rotary tables), EXAONE 4 (OLMo 2's norms,
    per-head q / k norms, windowed layers and a global one without rotary), Hunyuan (q / k norms after rotary) and
    Cohere2 (LayerNorms, attention and the MLP side by side, windowed and NoPE layers) and Arcee (an ungated MLP,
    relu(up) ** 2) take the one-call native decode step: on a Q8_0 file it gives the layer path's token ids and logprobs bit for
    bit, at fp32 and bf16."""
    from tokenmill.native import decode_step, ggml

    if not ggml.available() or decode_step.library() is None:
        pytest.skip("ggml or the native decode step is not built here")
    _, model = make_hf(tmp_path / "hf", family, tokenizer)
    g = write_gguf(tmp_path / f"{family}-q8.gguf", family, model, tokenizer, qtype="Q8_0")
    calls: list[int] = []
    real = decode_step.run
    monkeypatch.setattr(decode_step, "run", lambda m, s: (calls.append(int(s.M)), real(m, s)))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    ids = [tokenizer[0].encode(p) for p in ("the ocean", "a violin plays", "bread")]
    for dtype in ("float32", "bfloat16"):
        ours = LLM(str(g), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype=dtype,
                   enable_prefix_caching=False)
        assert ours.engine.executor.worker.model.native_decode is not None
        runs = []
        for switch in ("0", "1"):
            monkeypatch.setenv(decode_step.ENV_SWITCH, switch)
            calls.clear()
            outs = ours.generate(ids, params)
            runs.append([(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs or []]) for o in outs])
            assert bool(calls) == (switch == "1")
        assert runs[0] == runs[1]


def test_granite_gguf_without_its_keys_uses_llama_cpp_defaults(tokenizer, tmp_path: Path) -> None:
    _, model = make_hf(tmp_path / "hf", "granite", tokenizer)
    (tmp_path / "g").mkdir()
    cfg = engine(write_gguf(tmp_path / "g" / "bare.gguf", "granite", model, tokenizer, scales=False)).engine.model_config
    assert (cfg.embedding_multiplier, cfg.attention_multiplier, cfg.residual_multiplier, cfg.logits_scaling) == (
        1.0, 0.0, 1.0, 1.0)


def test_gguf_q8_0_through_the_gguf_method(tokenizer, tmp_path: Path) -> None:
    """The default method keeps the Q8_0 blocks (layer by layer, or in the one-call native decode step where the
    family takes it) and stays within test_gguf_method.py's bounds for tiny random models."""
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    for family in FAMILIES:
        _, model = make_hf(tmp_path / family, family, tokenizer)
        g = write_gguf(tmp_path / f"{family}-q8.gguf", family, model, tokenizer, qtype="Q8_0")
        ours = LLM(str(g), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
        assert ours.engine.platform.compute.linear_method == "gguf"
        logits_close_on_blocks(ours, model, prompts(tokenizer[0]), family)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_invariances(family: str, tokenizer, tmp_path: Path) -> None:
    """batched == alone, prefix cache on == off, chunked prefill == whole, at fp32."""
    d, _ = make_hf(tmp_path, family, tokenizer)
    assert_invariances(lambda **kw: engine(d, **kw), tokenizer[0], ["the ocean", "a violin", "bread", "Mars"])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_convert_writes_a_directory_transformers_loads(family: str, tokenizer, tmp_path: Path) -> None:
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    _, model = make_hf(tmp_path / "hf", family, tokenizer)
    (tmp_path / "g").mkdir()
    out = convert_gguf_to_hf(str(write_gguf(tmp_path / "g" / "tiny.gguf", family, model, tokenizer)),
                             tmp_path / "converted", progress=False)
    assert json.loads((out / "config.json").read_text())["architectures"] == [FAMILIES[family]["cls"] + "ForCausalLM"]
    converted = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = prompts(tokenizer[0])[1]
    with torch.inference_mode():
        want, got = model(torch.tensor([ids])).logits, converted(torch.tensor([ids])).logits
    assert float((got - want).abs().max()) < 1e-4


def test_unsupported_config_features_fail_naming_them(tokenizer, tmp_path: Path) -> None:
    d, _ = make_hf(tmp_path, "granite", tokenizer)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"attention_bias": True}))
    with pytest.raises(ValueError, match="granite with attention_bias is not supported"):
        engine(d)
    from tokenmill.loader.model_config import ModelConfig

    def gguf_md(arch: str, **extra: Any) -> dict[str, Any]:
        md = {"general.architecture": arch} | {f"{arch}.{k}": v for k, v in extra.items()}
        for k in ("attention.head_count", "embedding_length", "feed_forward_length", "block_count"):
            md.setdefault(f"{arch}.{k}", 4)
        return md

    # OLMo 3 is written as olmo2 with windowed layers: read as OLMo 3, 3 of 4 windowed
    olmo3 = ModelConfig.from_gguf(gguf_md("olmo2", **{"attention.sliding_window": 4096}), set(), "F32")
    assert (olmo3.architecture, olmo3.layer_windows()) == ("olmo3", [4096, 4096, 4096, 0])
    with pytest.raises(ValueError, match="cohere2 without attention.sliding_window"):
        ModelConfig.from_gguf(gguf_md("cohere2"), set(), "F32")
    for arch, cfg_extra, feature in [("exaone4", {"attention_bias": True}, "attention_bias"),
                                     ("ernie4_5", {"use_bias": True}, "use_bias"),
                                     ("cohere2", {"sliding_window": None}, "sliding_window"),
                                     ("hunyuan_dense", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
                                      "rope scaling 'linear'")]:
        d, _ = make_hf(tmp_path / arch, arch, tokenizer)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(cfg | cfg_extra))
        with pytest.raises(ValueError, match=feature):
            ModelConfig.from_hf_dir(d)
