"""YaRN rope scaling (Qwen2.5 / Qwen3 long-context configs and the GGUFs converted from them), held to
transformers: the frequency tables and the temperature on cos and sin for assorted configs, then a tiny
random Qwen3 with a YaRN config through both formats (HF directory, GGUF written as convert_hf_to_gguf
writes it), prompt logits and greedy tokens against transformers' forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from raw_forward import prompt_logits

from tokenmill import LLM, SamplingParams
from tokenmill.layers.rotary import attention_factor, inv_frequencies
from tokenmill.loader.model_config import ModelConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.mark.parametrize("rope", [
    {"factor": 4.0, "original_max_position_embeddings": 128},
    {"factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen2.5's README config
    {"factor": 8.0, "original_max_position_embeddings": 4096, "beta_fast": 16.0, "beta_slow": 2.0},
    {"factor": 2.0, "original_max_position_embeddings": 256, "truncate": False},
    {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707},
    {"factor": 4.0, "original_max_position_embeddings": 128, "attention_factor": 1.3},
])
@pytest.mark.parametrize("head_dim", [32, 128])
def test_tables_match_transformers(rope: dict[str, Any], head_dim: int) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "yarn", **rope}
    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=4 * head_dim, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=16384,
                                   rope_theta=1e6, rope_scaling=scaling)
    want_inv, want_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    got = inv_frequencies(head_dim, 1e6, scaling)
    assert torch.allclose(got, want_inv.float(), rtol=1e-6, atol=0), (got - want_inv).abs().max()
    assert attention_factor(scaling, 16384) == pytest.approx(want_factor, rel=1e-9)


def test_gguf_keys() -> None:
    """The GGUF's YaRN keys: the ramp's betas read, llama.cpp's yarn_attn_factor times YaRN's own
    temperature, the original context from the trained one when it is missing; a partial blend
    (yarn_ext_factor other than 1) and DeepSeek's log multiplier refused by name."""
    md: dict[str, Any] = {"general.architecture": "qwen3", "qwen3.block_count": 2, "qwen3.context_length": 4096,
                          "qwen3.embedding_length": 64, "qwen3.feed_forward_length": 128,
                          "qwen3.attention.head_count": 4, "qwen3.attention.head_count_kv": 2,
                          "qwen3.attention.key_length": 16, "qwen3.vocab_size": 64,
                          "qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0}
    cfg = ModelConfig.from_gguf({**md, "qwen3.rope.scaling.yarn_beta_fast": 16.0,
                                 "qwen3.rope.scaling.yarn_attn_factor": 0.5}, set(), "F32")
    assert cfg.rope_scaling is not None
    assert cfg.rope_scaling["original_max_position_embeddings"] == 4096 and cfg.rope_scaling["beta_fast"] == 16.0
    assert attention_factor(cfg.rope_scaling, 4096) == pytest.approx(0.5 * (1 + 0.1 * torch.log(torch.tensor(4.0)).item()))
    with pytest.raises(ValueError, match="yarn_ext_factor"):
        ModelConfig.from_gguf({**md, "qwen3.rope.scaling.yarn_ext_factor": 0.5}, set(), "F32")
    with pytest.raises(ValueError, match="yarn_log_multiplier"):
        ModelConfig.from_gguf({**md, "qwen3.rope.scaling.yarn_log_multiplier": 0.1}, set(), "F32")


@pytest.fixture(scope="module")
def yarn_qwen3(tmp_path_factory: pytest.TempPathFactory):
    import test_qwen3_moe as tiny

    name = "qwen3-yarn"
    tiny.FAMILIES[name] = dict(tiny.FAMILIES["qwen3"], gguf_arch="qwen3", kw=dict(
        tiny.FAMILIES["qwen3"]["kw"], rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 64, "beta_fast": 24.0}))
    try:
        tmp = tmp_path_factory.mktemp(name)
        model = tiny.make_hf(tmp / "hf", name)
        path = tiny.write_gguf(tmp / "model.gguf", model, name)
    finally:
        del tiny.FAMILIES[name]
    return model, {"hf": str(tmp / "hf"), "gguf": str(path)}, tiny


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_tiny_qwen3_with_yarn_matches_transformers(yarn_qwen3, fmt: str) -> None:
    model, paths, tiny = yarn_qwen3
    llm = LLM(paths[fmt], **tiny.ENGINE)
    scaling = llm.engine.model_config.rope_scaling
    assert scaling is not None and scaling["rope_type"] == "yarn" and scaling["beta_fast"] == 24.0
    ids = [llm.tokenizer.encode(p) for p in tiny.PROMPTS]
    ids.append(ids[1] * 4)  # past the original 64 positions
    for seq in ids:
        want, got = tiny.ref_logits(model, seq), prompt_logits(llm, seq)
        assert (want - got).abs().max() < 1e-3, fmt
    outs = llm.generate(ids[:2], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert tiny.texts(outs) == [tiny.ref_greedy(model, seq, 24) for seq in ids[:2]]
