"""Gemma 2 against transformers' Gemma2ForCausalLM (fp32): the Gemma 3 layer without per-head q/k norms, with
attention scores soft-capped, local and global layers alternating (tests/model/gemma3_tiny.py makes both an HF
directory and a GGUF of the same random weights). Prompt logits within 1e-3 and 32 greedy tokens identical from
both formats, on every attention backend (the native one caps in its kernel); the cap matters (without it the reference moves); invariances; `tokenmill convert` back to a directory transformers
loads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tokenmill import SamplingParams

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from gemma3_tiny import WINDOW, default_tokenizer, make_hf_gemma2, write_gguf, write_hf_dir  # noqa: E402
from raw_forward import exact_engine, greedy_reference, prompt_logits  # noqa: E402

PROMPTS = ["The quick brown fox jumps over the lazy dog, and then it keeps running far away.",
           "def f(x):\n    return x * 2\n" * 3,
           "Hello!"]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers model, HF dir, F32 GGUF, tokenizer) of one random Gemma 2."""
    d = tmp_path_factory.mktemp("gemma2")
    tok, md = default_tokenizer()
    model = make_hf_gemma2(transformers, len(md["tokenizer.ggml.tokens"]))
    return model, write_hf_dir(model, tok, d / "hf"), write_gguf(model, md, d / "f32.gguf"), tok


@pytest.mark.parametrize("backend", ["native", "decode_mirror", "paged"])
@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_tiny_matches_transformers(fmt: str, backend: str, tiny, monkeypatch) -> None:
    from tokenmill.native import kernels

    monkeypatch.setenv("TOKENMILL_ATTENTION_BACKEND", backend)
    capped_calls = []
    kernel = kernels.paged_decode_attention

    def counting(*args, **kw):  # the native backend's kernel calls that carry the cap
        ok = kernel(*args, **kw)
        capped_calls.append(ok and kw.get("softcap", 0.0) == 5.0)
        return ok

    monkeypatch.setattr(kernels, "paged_decode_attention", counting)
    model, hf_dir, gguf_path, tok = tiny
    ours = exact_engine(hf_dir if fmt == "hf" else gguf_path)
    cfg = ours.engine.model_config
    assert cfg.architecture == "gemma2" and cfg.sliding_window == WINDOW
    assert cfg.layer_windows() == [WINDOW, 0, WINDOW, 0]
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping, cfg.query_pre_attn_scalar) == (5.0, 10.0, 32.0)
    ids = [tok.encode(p) for p in PROMPTS]
    assert max(len(i) for i in ids) > 2 * WINDOW  # the local layers' window matters
    for prompt_ids in ids:
        with torch.inference_mode():
            ref = model(torch.tensor([prompt_ids])).logits[0]
        assert torch.allclose(prompt_logits(ours, prompt_ids), ref, atol=1e-3, rtol=0), (fmt, backend)
    outs = ours.generate(ids, GREEDY)
    for prompt_ids, out in zip(ids, outs):
        assert out.outputs[0].token_ids == greedy_reference(model, prompt_ids, 32), (fmt, backend)
    if backend == "native" and kernels.is_enabled():
        assert any(capped_calls), "the native backend did not take the capped attention to its kernel"


def test_the_attention_cap_matters(tiny) -> None:
    """Without the cap transformers' logits move well past the tolerance above: the test would see a path
    that dropped it."""
    model, _, _, tok = tiny
    assert model.config._attn_implementation == "eager"  # the implementation that applies the cap
    ids = torch.tensor([tok.encode(PROMPTS[0])])
    attns = [layer.self_attn for layer in model.model.layers]
    with torch.inference_mode():
        capped = model(ids).logits
        try:
            for a in attns:
                a.attn_logit_softcapping = None
            uncapped = model(ids).logits
        finally:
            for a in attns:
                a.attn_logit_softcapping = 5.0
    assert (capped - uncapped).abs().max() > 0.05


def test_invariances(tiny) -> None:
    """batched == alone, prefix cache on == off, chunked prefill == whole, at fp32, with prompts longer
    than the window (chunks of 8 tokens cross it)."""
    _, hf_dir, _, tok = tiny
    system = "You are a careful assistant who answers briefly and never apologises. "
    ids = [tok.encode(system + f"Question {i}: tell me about " + s)
           for i, s in enumerate(["the ocean", "a violin", "bread", "Mars"])]
    ours = exact_engine(hf_dir)
    batched = [o.outputs[0].token_ids for o in ours.generate(ids, GREEDY)]
    assert batched == [ours.generate([i], GREEDY)[0].outputs[0].token_ids for i in ids]
    hits = ours.engine.block_manager.num_hits
    assert [o.outputs[0].token_ids for o in ours.generate(ids, GREEDY)] == batched
    assert ours.engine.block_manager.num_hits > hits
    chunked = exact_engine(hf_dir, max_num_batched_tokens=8, enable_prefix_caching=False)
    assert [o.outputs[0].token_ids for o in chunked.generate(ids, GREEDY)] == batched


def test_convert_writes_a_directory_transformers_loads(tiny, tmp_path: Path) -> None:
    from tokenmill.entrypoints.convert import convert_gguf_to_hf

    model, _, gguf_path, tok = tiny
    out = convert_gguf_to_hf(str(gguf_path), tmp_path / "hf", progress=False)
    again = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(again).__name__ == "Gemma2ForCausalLM"
    ids = torch.tensor([tok.encode(PROMPTS[0] * 2)])
    with torch.inference_mode():
        assert torch.allclose(again(ids).logits, model(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_q8_0_gguf_through_the_gguf_method(dtype: str, tiny, tmp_path: Path) -> None:
    """The default method on a Q8_0 file (ggml's blocks, 8-bit activations; at bf16 too): close to
    transformers on the original weights, not equal."""
    from tokenmill import LLM

    model, _, _, tok = tiny
    _, md = default_tokenizer()
    q8 = write_gguf(model, md, tmp_path / "q8_0.gguf", "Q8_0")
    ours = LLM(str(q8), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype=dtype)
    assert ours.engine.platform.compute.linear_method == "gguf"
    ids = tok.encode(PROMPTS[0] + " " + PROMPTS[1])
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0]
    got = prompt_logits(ours, ids)
    assert (got - ref).abs().max() < 0.3 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
    out = ours.generate([ids], GREEDY)[0].outputs[0].token_ids
    assert len(out) == 32
