"""Other shapes, through the HF-directory path: tiny random Llama / Qwen2 / Mistral checkpoints written by
transformers (safetensors), loaded by tokenmill, checked against transformers' own forward.
Covers: config.json parsing, safetensors loading, GQA, attention bias, llama3 and linear rope scaling,
untied lm_head, a non-16 head_dim, and prefill + decode through the paged cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")

VOCAB = 49152  # the default model's tokenizer is reused so the directory is complete

CASES = {
    "llama-gqa-llama3rope": dict(arch="LlamaForCausalLM", model_type="llama", num_key_value_heads=2,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                 tie_word_embeddings=False),
    "qwen2-bias": dict(arch="Qwen2ForCausalLM", model_type="qwen2", num_key_value_heads=1, tie_word_embeddings=True),
    "mistral-linear": dict(arch="MistralForCausalLM", model_type="mistral", num_key_value_heads=4,
                           rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=False),
}


def make_dir(tmp: Path, case: dict, tokenizer) -> Path:
    cfg_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}[case["model_type"]]
    kw = dict(vocab_size=VOCAB, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=case["num_key_value_heads"], max_position_embeddings=256, rms_norm_eps=1e-5,
              rope_theta=10000.0, tie_word_embeddings=case["tie_word_embeddings"], bos_token_id=1, eos_token_id=2)
    if "rope_scaling" in case:
        kw["rope_scaling"] = case["rope_scaling"]
    cfg = cfg_cls(**kw)
    torch.manual_seed(0)
    model = getattr(transformers, case["arch"])(cfg).eval()
    with torch.no_grad():  # random init is tiny; widen it so logits are well separated
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            else:
                p.uniform_(-0.5, 0.5) if "bias" in str(p.shape) else None
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.backend.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": tokenizer.chat_template}))
    return tmp


@pytest.mark.parametrize("name", list(CASES))
def test_tiny_hf_model_matches_transformers(name: str, tmp_path: Path, llm) -> None:
    d = make_dir(tmp_path, CASES[name], llm.tokenizer)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    ours = LLM(str(d), progress=False, kv_cache_memory=16 * 2**20, max_model_len=200, dtype="float32")
    assert ours.engine.model_config.architecture in ("llama", "qwen2", "mistral")
    prompts = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 3]
    ids = [ours.tokenizer.encode(p) for p in prompts]
    outs = ours.generate(ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for prompt_ids, out in zip(ids, outs):
        seq = list(prompt_ids)
        with torch.inference_mode():
            for _ in range(12):
                seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
        assert out.outputs[0].token_ids == seq[len(prompt_ids):], name


def test_hf_dir_errors_are_helpful(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(str(tmp_path), progress=False)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(tmp_path), progress=False)
    with pytest.raises(FileNotFoundError, match="not found"):
        LLM(str(tmp_path / "nope"), progress=False)
