"""`tokenmill convert`: the HF fp32 directory written from the default GGUF loads in transformers and in
tokenmill, and computes what the GGUF computes (transformers' own GGUF loader is the reference)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenmill import LLM, SamplingParams

PROMPT = "The capital of France is"
TEXTS = ["The capital of France is Paris.", "Ünïcode 123456\n\n  spaced  out", "<|im_start|>user\nhi<|im_end|>\n"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    return convert_gguf_to_hf("default", tmp_path_factory.mktemp("converted"), progress=False)


@pytest.fixture(scope="module")
def hf_model(hf_dir: Path):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    return model.eval()


def test_directory_layout(hf_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (hf_dir / name).is_file(), name
    cfg = json.loads((hf_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "float32"
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|im_end|>" and "chat_template" in tok_cfg


def test_hf_tokenizer_matches_tokenmill(hf_dir: Path, llm: LLM) -> None:
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    for text in TEXTS:
        assert hf_tok(text).input_ids == llm.tokenizer.encode(text), text
    msgs = [{"role": "user", "content": "hi"}]
    assert (hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            == llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True))


def test_transformers_greedy_matches_tokenmill(hf_model, llm: LLM) -> None:
    ids = llm.tokenizer.encode(PROMPT)
    ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    ours = llm.generate([ids], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert ours.outputs[0].token_ids == ref


def test_tokenmill_loads_converted_dir(hf_dir: Path, llm: LLM) -> None:
    converted = LLM(str(hf_dir), progress=False, kv_cache_memory=64 * 2**20, max_model_len=512, dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    a = converted.generate([PROMPT], params)[0].outputs[0].token_ids
    b = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert a == b


@pytest.mark.slow
def test_logits_match_transformers_gguf(hf_model, default_model_path: str) -> None:
    """transformers reading the GGUF itself (its own dequantization and q/k un-permutation) vs the dir."""
    transformers = pytest.importorskip("transformers")
    p = Path(default_model_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
    ids = torch.tensor([[504, 3575, 282, 4649, 314, 7042, 30, 216, 33, 34, 35, 2, 1, 9225]])
    with torch.inference_mode():
        got, want = hf_model(ids).logits, ref.eval()(ids).logits
    assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max().item()
