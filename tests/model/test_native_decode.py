"""The native decode step (models/native_decode.py, native/decode_step.cpp) against the layer-by-layer path.

It calls the same kernels with the same arguments, so the reference is exact: the same engine with
TOKENMILL_NATIVE_DECODE=0 must give the same token ids and the same logprobs, bit for bit, on every shape the
step takes (fp32 and bf16, batches of decodes at different context lengths across block boundaries, speculative
verification's several entries per request, layer-skip drafting's first layers, sliding windows, q/k/v
biases, ggml's K-quant and repacked kernels beside our block kernel, Qwen3's q/k norms, mixture-of-experts
layers in one tm_moe call; the MoE families of tests/model/test_qwen3_moe.py are held the same way there). Each test also checks that the
native step actually ran (or, where it must not, that it did not).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.config import SpeculativeConfig
from tokenmill.native import decode_step, ggml

pytestmark = pytest.mark.skipif(not ggml.available() or decode_step.library() is None,
                                reason="ggml or the native decode step is not built here")

PROMPTS = ["The capital of France is", "def fib(n):\n    if n < 2:\n        return n\n",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who",
           "1, 2, 3, 4, 5,", "Write a short poem about the moon.", "SELECT name FROM users WHERE",
           "The quick brown fox jumps over the lazy dog. " * 6, "Q: What is 2+2?\nA:"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The row count of every native decode step run while the test runs."""
    calls: list[int] = []
    real = decode_step.run

    def counting(model: object, step: decode_step.TmStep) -> None:
        calls.append(int(step.M))
        real(model, step)  # type: ignore[arg-type]

    monkeypatch.setattr(decode_step, "run", counting)
    yield calls


def engine(model: str | None = None, **kw: object) -> LLM:
    """fp32 on the gguf method, block kernels up to 64 rows (fixed, so every decode step here fits), no
    prefix cache (each run computes its own K/V)."""
    old = os.environ.get("TOKENMILL_GGML_MAX_ROWS")
    os.environ["TOKENMILL_GGML_MAX_ROWS"] = "64"
    try:
        args = dict(progress=False, kv_cache_memory=32 * 2**20, max_model_len=512, dtype="float32",
                    enable_prefix_caching=False) | kw
        return LLM(model, **args) if model else LLM(**args)  # type: ignore[arg-type]
    finally:
        if old is None:
            del os.environ["TOKENMILL_GGML_MAX_ROWS"]
        else:
            os.environ["TOKENMILL_GGML_MAX_ROWS"] = old


def outputs(llm: LLM, prompts: list[str], params: SamplingParams = GREEDY) -> list[tuple[list[int], list[float]]]:
    outs = llm.generate(prompts, params)
    return [(list(o.outputs[0].token_ids), [lp.logprob for lp in o.outputs[0].logprobs or []]) for o in outs]


def both_ways(llm: LLM, prompts: list[str], calls: list[int], monkeypatch: pytest.MonkeyPatch,
              params: SamplingParams = GREEDY) -> None:
    """Native and layer by layer give the same ids and logprobs; the native step ran, the other did not."""
    monkeypatch.setenv(decode_step.ENV_SWITCH, "0")
    ref = outputs(llm, prompts, params)
    assert not calls
    monkeypatch.delenv(decode_step.ENV_SWITCH)
    got = outputs(llm, prompts, params)
    assert calls, "the native decode step never ran"
    assert got == ref


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_model_batched_and_alone(dtype: str, native_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 (the default on CPUs with AMX) widens each matmul's input and rounds its output as torch does."""
    llm = engine(dtype=dtype)
    assert llm.engine.model_config.architecture in ("llama", "smollm")
    both_ways(llm, PROMPTS, native_calls, monkeypatch)
    assert max(native_calls) == len(PROMPTS)  # the whole batch in one step
    native_calls.clear()
    both_ways(llm, PROMPTS[2:3], native_calls, monkeypatch)
    assert set(native_calls) == {1}


def test_sliding_window(native_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer windowed to 20 keys (fewer than the prompts and outputs), odd and even layers apart."""
    llm = engine()
    model = llm.engine.executor.worker.runner.model  # type: ignore[attr-defined]
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.sliding_window = 20 if i % 2 else 33
    both_ways(llm, PROMPTS, native_calls, monkeypatch)


def test_speculative_verification_and_layer_skip(native_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """n-gram drafts verified as several decode entries of one request; layer_skip drafts through the
    first layers of the same model (num_layers)."""
    prompts = ["Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,",
               "a b c a b c a b c a b c a b"]
    for cfg in (SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=4,
                                  max_batch_size=256, draft_length="fixed"),
                SpeculativeConfig(method="layer_skip", num_speculative_tokens=3, num_draft_layers=8,
                                  max_batch_size=256, draft_length="fixed")):
        native_calls.clear()
        llm = engine(speculative_config=cfg)
        both_ways(llm, prompts, native_calls, monkeypatch)
        assert max(native_calls) > len(prompts), f"{cfg.method}: no verification step ran natively"


@pytest.fixture(scope="module")
def random_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf

    d = tmp_path_factory.mktemp("gguf")
    qwen2 = Shape("qwen2", 256, 512, 2, 4, 2, 49152, attention_bias=True)
    return {"qwen2-q8_0": write_random_gguf(d / "qwen2-q8_0.gguf", qwen2, "q8_0", std=0.03),
            "llama-q4_k_m": write_random_gguf(d / "llama-q4_k_m.gguf", Shape(), "q4_k_m", std=0.03),
            "llama-q4_0": write_random_gguf(d / "llama-q4_0.gguf", Shape(), "q4_0", std=0.03),
            # layer 3 without rotary
            "smollm3-q8_0": write_random_gguf(d / "smollm3-q8_0.gguf", Shape("smollm3", layers=4), "q8_0", std=0.03),
            "qwen3-q4_k_m": write_random_gguf(d / "qwen3-q4_k_m.gguf", Shape("qwen3", head_dim=64, qk_norm=True),
                                              "q4_k_m", std=0.03),
            # experts MXFP4 (ggml's), the rest Q8_0 (our block kernel); 8 experts, 3 a token
            "qwen3moe-mxfp4": write_random_gguf(d / "qwen3moe-mxfp4.gguf",
                                                Shape("qwen3moe", head_dim=64, qk_norm=True, experts=8, experts_used=3,
                                                      expert_intermediate=256), "mxfp4_moe", std=0.03),
            # gpt-oss: biased q/k/v and o, sinks, every other layer windowed (to 16 keys here), a biased router,
            # biased experts on the clamped SwiGLU
            "gpt-oss-mxfp4": write_random_gguf(d / "gpt-oss-mxfp4.gguf",
                                               Shape("gpt-oss", 256, 256, 2, 4, 2, 49152, attention_bias=True,
                                                     head_dim=64, experts=4, experts_used=2, expert_intermediate=256,
                                                     window=16), "mxfp4_moe", std=0.03),
            # LFM2-MoE: short conv layers (0, 2) and attention ones with q / k norms (1, 3); a dense MLP first, then
            # experts chosen by sigmoid scores plus a bias
            "lfm2moe-mxfp4": write_random_gguf(d / "lfm2moe-mxfp4.gguf",
                                               Shape("lfm2moe", 256, 512, 4, 4, 2, 49152, tied=True, head_dim=64,
                                                     qk_norm=True, experts=4, experts_used=2, expert_intermediate=256,
                                                     attn_layers=(1, 3), conv_kernel=3, dense_layers=1),
                                               "mxfp4_moe", std=0.03),
            # Granite 4.0-H: Mamba2 layers (0, 2) and NoPE attention (1, 3), experts beside an ungated shared MLP
            # (all Q5_0: ggml's, so the shared MLP goes into the experts' call), Granite's multipliers
            "granitehybrid-q5_0": write_random_gguf(d / "granitehybrid-q5_0.gguf",
                                                    Shape("granitehybrid", 256, 256, 4, 4, 2, 49152, tied=True,
                                                          head_dim=64, experts=4, experts_used=2,
                                                          expert_intermediate=256, attn_layers=(1, 3),
                                                          shared_intermediate=256, ssm_heads=8, ssm_head_dim=32,
                                                          ssm_state=32, ssm_groups=1, conv_kernel=4),
                                                    "q5_0", std=0.03),
            # Qwen3.5: Gated DeltaNet layers (0-2; 2 key heads, 4 value heads) and gated attention (3: q rows with
            # their gates, (1 + w) q / k norms, a quarter of each head rotated)
            "qwen35-q8_0": write_random_gguf(d / "qwen35-q8_0.gguf",
                                             Shape("qwen35", 256, 512, 4, 4, 2, 49152, tied=True, head_dim=64,
                                                   qk_norm=True, linear_heads=(2, 4), linear_dim=32),
                                             "q8_0", std=0.03),
            "granite-q8_0": write_random_gguf(d / "granite-q8_0.gguf", Shape("granite"), "q8_0", std=0.03,
                                              extra_metadata={"granite.embedding_scale": 12.0,
                                                              "granite.residual_scale": 0.22,
                                                              "granite.attention.scale": 0.0625,
                                                              "granite.logit_scale": 8.0})}


@pytest.mark.parametrize("name", ["qwen2-q8_0", "llama-q4_k_m", "llama-q4_0", "smollm3-q8_0", "granite-q8_0",
                                  "qwen3-q4_k_m", "qwen3moe-mxfp4", "gpt-oss-mxfp4", "lfm2moe-mxfp4",
                                  "granitehybrid-q5_0", "qwen35-q8_0"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_models(name: str, dtype: str, random_files: dict[str, Path], native_calls: list[int],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """q/k/v biases on the block kernel (Q8_0); K-quants (Q4_K and Q6_K parts in one matrix) on our K-quant
    kernel; Q4_0, which ggml repacks on AVX2 CPUs, on ggml's; SmolLM3's layers without rotary; Granite's
    multipliers (the residual one applied in the step, rounded as torch rounds it); Qwen3's q/k norms; a
    Qwen3-MoE's experts in one tm_moe call (router and routing inside), at bf16 widened and rounded around it;
    gpt-oss's sinks, windows, biases and experts; LFM2's short convs, Granite 4.0-H's Mamba2 layers and Qwen3.5's
    Gated DeltaNet layers over the recurrent state slots; Qwen3.5's gated attention."""
    if dtype == "bfloat16" and name not in ("smollm3-q8_0", "granite-q8_0", "qwen3-q4_k_m", "qwen3moe-mxfp4",
                                            "gpt-oss-mxfp4", "lfm2moe-mxfp4", "granitehybrid-q5_0", "qwen35-q8_0"):
        pytest.skip("bf16 runs on the default model above")
    llm = engine(str(random_files[name]), dtype=dtype)
    cfg = llm.engine.model_config
    assert cfg.nope_layers == {"smollm3-q8_0": (3,), "granitehybrid-q5_0": (0, 1, 2, 3)}.get(name, ())
    assert cfg.residual_multiplier == pytest.approx(0.22 if name.startswith("granite") else 1.0)
    nd = llm.engine.executor.worker.runner.model.native_decode  # type: ignore[attr-defined]
    assert nd is not None
    both_ways(llm, PROMPTS[:5], native_calls, monkeypatch)


def test_what_does_not_fit_runs_layer_by_layer(native_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Dequantized weights never take the native step; a step of more rows than the block kernels' crossover
    does not either (the layers then multiply dense tiles)."""
    deq = LLM(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")
    assert deq.engine.executor.worker.runner.model.native_decode is None  # type: ignore[attr-defined]
    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", "2")  # read when the engine is built
    llm = LLM(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs(llm, PROMPTS[:4], short)
    assert not native_calls  # 4 decodes a step: layer by layer
    outputs(llm, PROMPTS[:1], short)
    assert native_calls == [1, 1, 1]


@pytest.mark.parametrize("name", ["lfm2moe-mxfp4", "granitehybrid-q5_0", "qwen35-q8_0"])
def test_recurrent_states_restored_from_checkpoints(name: str, random_files: dict[str, Path], native_calls: list[int],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """LFM2, Granite 4.0-H and Qwen3.5 with prefix caching: a repeated prompt restores its conv windows (and states)
    from a checkpoint slot, so decodes read one slot and write another; the native step and the layers agree over
    the same restored states."""
    from tokenmill.models import native_decode

    llm = engine(str(random_files[name]), enable_prefix_caching=True)
    prompts = [p * 3 for p in PROMPTS[:4]]  # past a block, so there are checkpoints to restore
    outputs(llm, prompts)
    native_calls.clear()
    moved: list[bool] = []  # per native step: whether some decode read one slot and wrote another
    real = native_decode.slot_tensors

    def spy(decodes: list) -> tuple:  # type: ignore[type-arg]
        src, dst = real(decodes)
        moved.append(bool(((src >= 0) & (src != dst)).any()))
        return src, dst

    monkeypatch.setattr(native_decode, "slot_tensors", spy)
    both_ways(llm, prompts, native_calls, monkeypatch)
    assert llm.engine.block_manager.num_hits > 0
    assert any(moved), "no native step read a restored checkpoint slot"


@pytest.fixture(scope="module")
def gemma_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random Gemma 3 (5 windowed layers on their own rotary base, then a global one with linear scaling;
    (1 + w) q / k norms) and Gemma 2 (local and global layers, attention scores capped at 5) as Q8_0 GGUFs
    (tests/model/gemma3_tiny.py)."""
    transformers = pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from gemma3_tiny import default_tokenizer, make_hf_gemma2, make_hf_model, write_gguf

    d = tmp_path_factory.mktemp("gemma")
    _, md = default_tokenizer()
    vocab = len(md["tokenizer.ggml.tokens"])
    return {"gemma3": write_gguf(make_hf_model(transformers, vocab), md, d / "gemma3-q8_0.gguf", "Q8_0"),
            "gemma2": write_gguf(make_hf_gemma2(transformers, vocab), md, d / "gemma2-q8_0.gguf", "Q8_0")}


@pytest.mark.parametrize("name", ["gemma3", "gemma2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma(name: str, dtype: str, gemma_files: dict[str, Path], native_calls: list[int],
               monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma's layers: norms after each sublayer, the GELU-tanh MLP, (1 + w) q / k norms (Gemma 3), the local
    layers' window (16 keys, fewer than the prompts) and own rotary tables, the attention soft-cap (Gemma 2), the
    scaled embeddings; batched and alone."""
    llm = engine(str(gemma_files[name]), dtype=dtype)
    model = llm.engine.executor.worker.runner.model  # type: ignore[attr-defined]
    assert model.native_decode is not None
    assert any(layer.self_attn.sliding_window for layer in model.model.layers)
    both_ways(llm, PROMPTS, native_calls, monkeypatch)
    assert max(native_calls) == len(PROMPTS)
    native_calls.clear()
    both_ways(llm, PROMPTS[6:7], native_calls, monkeypatch)
    assert set(native_calls) == {1}
