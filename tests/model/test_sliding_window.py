"""Sliding-window attention against transformers (fp32), in every attention backend: prompts longer than
the window, Gemma-style (local layers mixed with global ones) and Mistral- and Phi-3-style (every layer
windowed);
and on the all-windowed model, blocks that left the window are freed, so the blocks in use stay bounded
while a sequence generates far past the window."""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import pytest
import torch

from tokenmill import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from gemma3_tiny import default_tokenizer, make_hf_model, write_hf_dir  # noqa: E402
from raw_forward import exact_engine, greedy_reference, prompt_logits  # noqa: E402

WINDOW = 20  # not a multiple of the block size (16): the window's edge falls inside a block
BACKENDS = ["paged", "native", "decode_mirror"]
PROMPT = ("A sliding window lets each token see only the last few tokens before it, so a long prompt "
          "reaches beyond it: this one is about three windows long, give or take a few words, because "
          "the test wants several blocks and chunks.")


def mistral(tmp: Path, tok, vocab: int) -> tuple[object, Path]:
    cfg = transformers.MistralConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                     max_position_embeddings=1024, sliding_window=WINDOW, bos_token_id=1,
                                     eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(1)
    model = transformers.MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    return model, write_hf_dir(model, tok, tmp)


def phi3(tmp: Path, tok, vocab: int) -> tuple[object, Path]:
    """Phi-3's window, on every layer like Mistral's, through the phi3 family's fused checkpoint tensors."""
    cfg = transformers.Phi3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                                  sliding_window=WINDOW, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                                  tie_word_embeddings=False)
    torch.manual_seed(2)
    model = transformers.Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    return model, write_hf_dir(model, tok, tmp)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    tok, md = default_tokenizer()
    vocab = len(md["tokenizer.ggml.tokens"])
    gemma = make_hf_model(transformers, vocab, sliding_window=WINDOW)
    return {"gemma3": (gemma, write_hf_dir(gemma, tok, tmp_path_factory.mktemp("g"))),
            "mistral": mistral(tmp_path_factory.mktemp("m"), tok, vocab),
            "phi3": phi3(tmp_path_factory.mktemp("p"), tok, vocab), "tok": tok}  # type: ignore[dict-item]


engine = functools.partial(exact_engine, max_model_len=1024)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["gemma3", "mistral", "phi3"])
def test_longer_than_the_window_matches_transformers(family: str, backend: str, models, monkeypatch) -> None:
    model, path = models[family]
    monkeypatch.setenv("TOKENMILL_ATTENTION_BACKEND", backend)
    ours = engine(path, max_num_batched_tokens=24)  # prefill chunks start inside and past the window
    cfg = ours.engine.model_config
    assert set(cfg.layer_windows()) == ({WINDOW, 0} if family == "gemma3" else {WINDOW})
    tok = models["tok"]
    ids = tok.encode(PROMPT)
    assert len(ids) > 2 * WINDOW
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0]
    assert torch.allclose(prompt_logits(ours, ids), ref, atol=1e-3, rtol=0)
    # decodes (a batch of two, different lengths) go through the backend's decode path with the window
    prompts = [ids, tok.encode(PROMPT[:60])]
    outs = ours.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    for p, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == greedy_reference(model, p, 32), (family, backend)


def test_blocks_stay_bounded_far_past_the_window(models, monkeypatch) -> None:
    """Mistral-style: every layer windowed, so blocks that leave the window are freed; the blocks in use
    never exceed what the memory plan says one decoding sequence holds (plus the prompt's prefill), and
    the tokens are still transformers'."""
    model, path = models["mistral"]
    ours = engine(path, max_num_batched_tokens=64, enable_prefix_caching=False)
    plan = ours.engine.plan
    assert plan.sliding_window == WINDOW
    assert plan.max_blocks_per_decoding_seq == 3  # ceil(19 / 16) + 1
    assert any("sliding window 20 on every layer" in line for line in plan.lines())
    bm, sched = ours.engine.block_manager, ours.engine.scheduler
    used: list[int] = []
    update = sched.update

    def watch(out, result):  # blocks in use by the step just computed, before its frees
        used.append(bm.num_used_blocks)
        return update(out, result)

    monkeypatch.setattr(sched, "update", watch)
    ids = models["tok"].encode(PROMPT)
    n = 400  # 20 windows past the prompt
    out = ours.generate([ids], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
    assert len(used) == n  # one prefill step, then a decode per token
    assert used[0] == -(-len(ids) // 16)  # the prefill holds the whole prompt
    assert max(used[1:]) <= plan.max_blocks_per_decoding_seq
    assert bm.num_used_blocks == 0
    assert out.outputs[0].token_ids[:48] == greedy_reference(model, ids, 48)
    # and the rest equals the same engine keeping every block (no window frees): a windowed cache
    # computes exactly what a whole one does
    whole = engine(path, max_num_batched_tokens=64, enable_prefix_caching=False)
    whole.engine.scheduler.config = dataclasses.replace(whole.engine.scheduler.config, sliding_window=0)
    again = whole.generate([ids], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
    assert whole.engine.block_manager.num_used_blocks == 0
    assert again.outputs[0].token_ids == out.outputs[0].token_ids


def test_window_frees_with_shared_prefix_blocks(models) -> None:
    """Four sequences sharing their prompt's first blocks (prefix cache) in a cache too small for them
    whole: each frees its blocks as they leave its window (shared ones once the last holder lets go),
    so they run together; tokens equal one-at-a-time on an ample cache."""
    _, path = models["mistral"]
    tok = models["tok"]
    prompts = [tok.encode(PROMPT + f" Variant {i}.") for i in range(4)]
    p = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    ample = engine(path)
    want = [ample.generate([i], p)[0].outputs[0].token_ids for i in prompts]
    bytes_per_block = ample.engine.plan.kv_bytes_per_block
    small = engine(path, kv_cache_memory=14 * bytes_per_block, max_model_len=200)
    assert small.engine.plan.num_blocks == 14 < 4 * -(-(len(prompts[0]) + 120) // 16)
    got = [o.outputs[0].token_ids for o in small.generate(prompts, p)]
    assert got == want
    assert small.engine.block_manager.num_hits > 0
    assert small.engine.block_manager.num_free_blocks == 14


def test_a_prompt_longer_than_the_cache(models) -> None:
    """Every layer windowed: the plan asks only for the window's blocks plus a chunk's, so a cache of 12
    blocks (192 tokens) serves a 1024-token context; a prompt longer than the whole cache runs in chunks,
    freeing as it goes, and gives transformers' tokens. A prompt run twice hits the prefix cache, the
    request taking only the hits its window still reaches."""
    model, path = models["mistral"]
    tok = models["tok"]
    bytes_per_block = engine(path).engine.plan.kv_bytes_per_block
    small = engine(path, kv_cache_memory=12 * bytes_per_block, max_model_len=1024, max_num_batched_tokens=32)
    plan = small.engine.plan
    assert plan.num_cache_tokens == 192 < plan.max_model_len and plan.max_seq_tokens == (3 + 2) * 16
    ids = tok.encode((PROMPT + " ") * 6)
    assert len(ids) > plan.num_cache_tokens
    p = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    first = small.generate([ids], p)[0].outputs[0].token_ids
    assert first == greedy_reference(model, ids, 40)
    # a prompt the cache holds whole: the second run hits its 7 full blocks but takes only the window's
    medium = tok.encode((PROMPT + " ") * 3)[:120]
    want = small.generate([medium], p)[0].outputs[0].token_ids
    bm = small.engine.block_manager
    hits = bm.num_hits
    assert small.generate([medium], p)[0].outputs[0].token_ids == want == greedy_reference(model, medium, 40)
    assert bm.num_hits - hits == 112 and bm.num_free_blocks == 12
    with pytest.raises(ValueError, match="sliding window 20"):  # too small even for the window and a chunk
        engine(path, kv_cache_memory=4 * bytes_per_block, max_model_len=1024, max_num_batched_tokens=32)
