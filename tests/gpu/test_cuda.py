"""The same engine on a CUDA GPU (skipped without one): tiny random checkpoints against transformers on
the GPU, invariances on the GPU, and bf16 (the CUDA default) running end to end.

Run: pytest -q -s tests/gpu   (on a machine with CUDA)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3, "def add(a, b):\n    return a + b\n" * 3,
          "Paged attention keeps the KV cache in fixed-size blocks. " * 3, "0123456789 " * 5]


def make_model_dir(tmp: Path, arch: str = "llama", hidden: int = 128, layers: int = 2, heads: int = 4,
                   kv_heads: int = 2, inter: int = 256) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                           "add_bos_token": False}))
    cfg_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    cfg = cfg_cls(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=inter,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=1024, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = (transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
            elif name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    model.save_pretrained(tmp, safe_serialization=True)
    return tmp


def ref_greedy(model, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq], device="cuda")).logits[0, -1].argmax()))
    return seq[len(ids):]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cuda_fp32_matches_transformers(tmp_path: Path, arch: str) -> None:
    from tokenmill import LLM, SamplingParams

    d = make_model_dir(tmp_path, arch)
    ours = LLM(str(d), progress=False, device="cuda", dtype="float32", kv_cache_memory=64 * 2**20, max_model_len=512)
    assert ours.engine.platform.device.type == "cuda"
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).cuda().eval()
    prompts = [ours.tokenizer.encode(t[:60]) for t in CORPUS]
    outs = ours.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for ids, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == ref_greedy(ref, ids, 16)


def test_cuda_invariances_fp32(tmp_path: Path) -> None:
    from tokenmill import LLM, SamplingParams

    d = make_model_dir(tmp_path)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [CORPUS[i % 4][i : i + 40 + i] for i in range(12)]
    big = LLM(str(d), progress=False, device="cuda", dtype="float32", kv_cache_memory=64 * 2**20, max_model_len=256)
    batched = [o.outputs[0].token_ids for o in big.generate(prompts, greedy)]
    alone = [big.generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    assert batched == alone
    bpt = big.engine.plan.kv_bytes_per_token
    small = LLM(str(d), progress=False, device="cuda", dtype="float32", kv_cache_memory=12 * 16 * bpt,
                max_model_len=128, max_num_batched_tokens=16)
    got = [o.outputs[0].token_ids for o in small.generate(prompts, greedy)]
    assert small.engine.scheduler.num_preemptions > 0
    assert got == batched
    assert small.engine.block_manager.num_free_blocks == small.engine.plan.num_blocks


def test_cuda_bf16_default_runs(tmp_path: Path) -> None:
    from tokenmill import LLM, SamplingParams

    d = make_model_dir(tmp_path)
    llm = LLM(str(d), progress=False, device="cuda", kv_cache_memory=64 * 2**20, max_model_len=256)
    assert llm.engine.platform.dtype == torch.bfloat16
    p = SamplingParams(temperature=0.8, seed=5, max_tokens=20, ignore_eos=True, logprobs=2)
    a = llm.generate(CORPUS, p)
    b = llm.generate(CORPUS, p)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(len(o.outputs[0].token_ids) == 20 for o in a)


def test_cuda_throughput_smollm2_shape(tmp_path: Path) -> None:
    """Not an assertion of speed: prints offline throughput of a SmolLM2-135M-shaped random model."""
    from tokenmill import LLM, SamplingParams

    d = make_model_dir(tmp_path, hidden=576, layers=30, heads=9, kv_heads=3, inter=1536)
    for dtype in ("bfloat16", "float32"):
        llm = LLM(str(d), progress=False, device="cuda", dtype=dtype, kv_cache_memory=4 * 2**30, max_model_len=1024,
                  max_num_seqs=64, max_num_batched_tokens=2048)
        import random

        rng = random.Random(0)
        V = llm.engine.model_config.vocab_size
        prompts = [[rng.randrange(2, V) for _ in range(200)] for _ in range(64)]
        params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
        llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"\nCUDA {dtype}: 64 prompts x 200 -> 128 tokens: {dt:.2f}s, {n / dt:.0f} output tok/s")
        eng = llm.engine
        eng.add_request("lat", prompts[0], SamplingParams(temperature=0, max_tokens=128, ignore_eos=True), stream=True)
        t = time.perf_counter()
        steps = 0
        while eng.has_unfinished_requests():
            eng.step()
            steps += 1
        dt = time.perf_counter() - t
        print(f"CUDA {dtype}: single stream {steps} steps in {dt:.2f}s -> {128 / dt:.0f} tok/s")
