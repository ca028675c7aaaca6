"""The layers and the attention backend with the native kernels and without (TOKENMILL_NATIVE_KERNELS=0,
or a library that did not build): both paths give the same results (within the kernels' tolerances, see
test_native_kernels.py), and without the kernels everything runs the torch path."""

from __future__ import annotations

import logging

import pytest
import torch

from tokenmill.attention.backend import AttentionStep, ScheduledSeq
from tokenmill.attention.native_paged import NativePagedAttentionBackend, NativeRows
from tokenmill.attention.paged import PagedAttentionBackend
from tokenmill.layers.activation import SiluAndMul
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryEmbedding, inv_frequencies, rotate, rotate_
from tokenmill.native import kernels

FP32 = dict(rtol=1e-4, atol=1e-5)
BF16 = dict(rtol=2e-2, atol=2e-2)  # two bf16 roundings of outputs of magnitude ~1 apart
needs_kernels = pytest.mark.skipif(kernels.library() is None, reason="the native kernels did not build here")


@pytest.fixture
def torch_only(monkeypatch):
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    assert not kernels.is_enabled()


@needs_kernels
def test_layers_agree_with_their_torch_path(monkeypatch) -> None:
    native_norm, native_act = RMSNorm(576, 1e-5), SiluAndMul()
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    torch_norm, torch_act = RMSNorm(576, 1e-5), SiluAndMul()
    assert native_norm.use_native and native_act.use_native
    assert not torch_norm.use_native and not torch_act.use_native
    w = torch.randn(576)
    native_norm.weight.data.copy_(w)
    torch_norm.weight.data.copy_(w)
    x, res = torch.randn(7, 576), torch.randn(7, 576)
    out_n, res_n = native_norm(x, res.clone())
    out_t, res_t = torch_norm(x, res.clone())
    assert torch.equal(res_n, res_t)
    torch.testing.assert_close(out_n, out_t, **FP32)
    torch.testing.assert_close(native_norm(x), torch_norm(x), **FP32)
    gu = torch.randn(7, 2 * 1536)
    torch.testing.assert_close(native_act(gu), torch_act(gu), **FP32)


@needs_kernels
def test_rotate_in_place_equals_the_copy(monkeypatch) -> None:
    inv = inv_frequencies(64, 10000.0, None)
    native = RotaryEmbedding(64, 512, inv, torch.device("cpu"), torch.float32)
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    plain = RotaryEmbedding(64, 512, inv, torch.device("cpu"), torch.float32)
    pos = torch.tensor([0, 5, 511, 17])
    qkv = torch.randn(4, 15 * 64)
    qk = qkv[:, : 12 * 64].view(4, 12, 64)
    want = rotate(qk, plain.tables(pos))
    assert not plain.tables(pos).native and native.tables(pos).native
    assert torch.equal(rotate_(qk.clone(), plain.tables(pos)), want)  # torch path: a copy
    got = rotate_(qk, native.tables(pos))
    assert got.data_ptr() == qk.data_ptr() and torch.equal(got, want)  # in place, same bits


def mixed_step(bs: int) -> tuple[AttentionStep, int]:
    """Decodes at lengths around block boundaries plus a prefill chunk with a cached prefix."""
    starts = [1, 14, 15, 16, 33, 99, 300]
    decodes, next_block = [], 0
    for i, s in enumerate(starts):
        n = -(-(s + 1) // bs)
        decodes.append(ScheduledSeq(f"d{i}", s, 1, list(range(next_block, next_block + n))[::-1]))
        next_block += n
    n = -(-(20 + 12) // bs)
    prefill = ScheduledSeq("p", 20, 12, list(range(next_block, next_block + n)))
    return AttentionStep(decodes, [prefill]), next_block + n


@pytest.mark.parametrize("native_on", [True, False])
def test_native_backend_equals_paged(native_on: bool, monkeypatch) -> None:
    if native_on and kernels.library() is None:
        pytest.skip("the native kernels did not build here")
    if not native_on:
        monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    bs, nh, nkv, hd = 16, 9, 3, 64
    step, nb = mixed_step(bs)
    T = len(step.decodes) + 12
    kv = torch.randn(2, 1, nb + 2, bs, nkv, hd)
    kv_ref = kv.clone()
    native = NativePagedAttentionBackend(bs, torch.device("cpu"), kv)
    assert native.use_kernel == native_on
    paged = PagedAttentionBackend(bs, torch.device("cpu"))
    q, k, v = torch.randn(T, nh, hd), torch.randn(T, nkv, hd), torch.randn(T, nkv, hd)
    got = native.forward(0, q, k, v, (kv[0, 0], kv[1, 0]), native.build_metadata(step), hd ** -0.5)
    want = paged.forward(0, q, k, v, (kv_ref[0, 0], kv_ref[1, 0]), paged.build_metadata(step), hd ** -0.5)
    assert torch.equal(kv, kv_ref)  # the same K/V written to the same slots
    torch.testing.assert_close(got, want, **FP32)


def test_switch_off_means_torch_everywhere(torch_only) -> None:
    from tokenmill.compute import ComputeChoice
    from tokenmill.platforms import Platform

    assert not RMSNorm(8, 1e-5).use_native and not SiluAndMul().use_native
    kv = torch.zeros(2, 1, 4, 16, 2, 64)
    assert not NativePagedAttentionBackend(16, torch.device("cpu"), kv).use_kernel
    platform = Platform(torch.device("cpu"), ComputeChoice("float32", "unquantized"))
    assert platform.attention_backend()[0] == "decode_mirror"


@needs_kernels
def test_platform_picks_native_on_cpu_and_obeys_the_override(monkeypatch) -> None:
    import tokenmill.platforms as platforms
    from tokenmill.compute import ComputeChoice

    fp32 = platforms.Platform(torch.device("cpu"), ComputeChoice("float32", "unquantized"))
    bf16 = platforms.Platform(torch.device("cpu"), ComputeChoice("bfloat16", "prepacked"))
    assert fp32.attention_backend() == ("native", 0)
    monkeypatch.setattr(platforms, "cpu_bf16_is_fast", lambda: False)
    assert bf16.attention_backend() == ("native", 0)
    monkeypatch.setattr(platforms, "cpu_bf16_is_fast", lambda: True)  # AMX: measured there too (2x one stream)
    assert bf16.attention_backend() == ("native", 0)
    monkeypatch.setenv("TOKENMILL_ATTENTION_BACKEND", "paged")
    assert fp32.attention_backend() == ("paged", 0)


def test_a_failed_build_is_logged_once_and_gives_none(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tokenmill.native"):
        assert kernels.library(("--no-such-g++-flag",)) is None
        assert kernels.library(("--no-such-g++-flag",)) is None
    warnings = [r for r in caplog.records if "native CPU kernels unavailable" in r.getMessage()]
    assert len(warnings) == 1


def test_no_library_means_torch_path(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "library", lambda flags=kernels.FLAGS: None)
    assert not kernels.is_enabled()
    x = torch.randn(2, 8)
    assert kernels.add_rms_norm(x, None, torch.ones(8), 1e-5) is None
    assert kernels.silu_and_mul(x) is None
    norm = RMSNorm(8, 1e-5)
    assert not norm.use_native
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (8,), torch.ones(8), 1e-5))


@pytest.mark.slow
def test_engine_without_native_kernels_generates_the_same(llm, monkeypatch) -> None:
    """The default model end to end with the switch off: the old backend, the same greedy tokens."""
    from tokenmill import LLM, SamplingParams
    from tokenmill.attention.decode_mirror import MirrorAttentionBackend

    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    plain = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=512, dtype="float32",
                quantization="dequantize")
    runner = plain.engine.executor.worker.runner
    assert isinstance(runner.attn_backend, MirrorAttentionBackend)
    assert not runner.model.model.layers[0].input_layernorm.use_native
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["Write two sentences about the ocean.", "Name three planets."]
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in plain.generate(prompts, params)] == want


def prefill_steps(base: int) -> tuple[list[tuple[AttentionStep, int]], list[int]]:
    """One request's prompt positions base .. base + 69 (blocks in a scattered order; `base` already
    cached), as one chunk and as three (20, 20, 30 tokens) beside two decodes of another request (positions
    38 and 39 over blocks 1, 3, 4); (step, first row of the prompt's) per step, and the prompt's blocks."""
    nb = -(-(base + 70) // 16)
    table = [5 + i for i in torch.randperm(nb, generator=torch.Generator().manual_seed(1)).tolist()]
    whole = AttentionStep([], [ScheduledSeq("p", base, 70, table)])
    parts = [(base, 20), (base + 20, 20), (base + 40, 30)]
    chunked = [AttentionStep([ScheduledSeq("d", 38, 1, [1, 3, 4]), ScheduledSeq("d", 39, 1, [1, 3, 4])],
                             [ScheduledSeq("p", s, n, table)]) for s, n in parts]
    return [(whole, 0)] + [(c, 2) for c in chunked], table


@needs_kernels
@pytest.mark.parametrize("base", [0, 230])  # 230: rows on both sides of the kernel's 256-key partitions
@pytest.mark.parametrize("window", [0, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_rows_on_the_kernel_match_torch_and_keep_their_bits_across_chunks(base: int, window: int,
                                                                                  dtype: torch.dtype,
                                                                                  monkeypatch) -> None:
    """Prefill chunks attend on the decode kernel, their rows as queries at successive positions: the
    result agrees with the torch path (SDPA per chunk; at bf16 within bf16's rounding), and each row's bits
    are the same whether its prompt came whole or in chunks beside another request's decodes (the kernel's
    result for a row depends on its keys only). (bf16: the rule of a CPU without AMX.)"""
    from tokenmill.attention import native_paged

    monkeypatch.setattr(native_paged, "cpu_has_amx_bf16", lambda: False)
    bs, nh, nkv, hd = 16, 9, 3, 64
    steps, table = prefill_steps(base)
    torch.manual_seed(0)
    kv = torch.randn(2, 1, 5 + len(table), bs, nkv, hd).to(dtype)  # cached: the prompt's first `base`, the other's 38
    q_all, k_all, v_all = (torch.randn(70, n, hd).to(dtype) for n in (nh, nkv, nkv))
    dq, dk, dv = (torch.randn(2, n, hd).to(dtype) for n in (nh, nkv, nkv))
    native = NativePagedAttentionBackend(bs, torch.device("cpu"), kv)
    assert native.native_prefill
    paged = PagedAttentionBackend(bs, torch.device("cpu"))
    results = []
    for step, first in steps:
        ref = kv.clone()
        rows = [p - base for s in step.prefills for p in range(s.start, s.start + s.num_tokens)]
        q = torch.cat([dq[: len(step.decodes)], q_all[rows]])
        k = torch.cat([dk[: len(step.decodes)], k_all[rows]])
        v = torch.cat([dv[: len(step.decodes)], v_all[rows]])
        meta = native.build_metadata(step)
        assert isinstance(meta.extra, NativeRows) and meta.extra.count == q.shape[0]  # every row on the kernel
        got = native.forward(0, q, k, v, (kv[0, 0], kv[1, 0]), meta, hd ** -0.5, window)
        want = paged.forward(0, q, k, v, (ref[0, 0], ref[1, 0]), paged.build_metadata(step), hd ** -0.5, window)
        assert torch.equal(kv, ref)  # the same K/V in the same slots
        torch.testing.assert_close(got.float(), want.float(), **(FP32 if dtype == torch.float32 else BF16))
        results.append(got[first:])
    assert torch.equal(results[0], torch.cat(results[1:]))


@needs_kernels
def test_long_prefill_chunks_and_bf16_take_the_torch_path(monkeypatch) -> None:
    """A chunk past NATIVE_PREFILL_MAX_KEYS keys, and the chunks after it, take SDPA; so does every chunk
    over a bf16 cache on a CPU with AMX (not over one without), and every chunk with TOKENMILL_NATIVE_PREFILL=0."""
    from tokenmill.attention import native_paged

    bs = 16
    monkeypatch.setattr(native_paged, "NATIVE_PREFILL_MAX_KEYS", 48)
    kv = torch.zeros(2, 1, 12, bs, 3, 64)
    native = NativePagedAttentionBackend(bs, torch.device("cpu"), kv)
    step = AttentionStep([ScheduledSeq("d", 5, 1, [9])], [ScheduledSeq("a", 0, 40, [0, 1, 2]),
                                                          ScheduledSeq("b", 30, 20, [3, 4, 5, 6]),
                                                          ScheduledSeq("c", 0, 8, [7])])
    meta = native.build_metadata(step)
    assert meta.extra.count == 41 and meta.extra.chunks == 1  # the decode and chunk a; b (50 keys) and c not
    assert meta.extra.lens.tolist() == [6] + list(range(1, 41))
    assert meta.extra.tables[1:].tolist() == [[0, 1, 2]] * 40 and meta.extra.tables[0, 0].item() == 9
    # the rows' partial results past one partition are bounded: chunk a's 40 rows, but 30 partitions at most
    assert native_paged.split_partitions(0, 40, 16) == 16 * 2 + 8 * 3  # contexts 17-32 and 33-40
    assert native_paged.split_partitions(0, 256) == 0 and native_paged.split_partitions(250, 10) == 4 * 2
    for start, n, part in ((0, 1, 16), (15, 3, 16), (16, 1, 16), (100, 300, 16), (0, 1024, 256), (700, 90, 256)):
        assert native_paged.split_partitions(start, n, part) == sum(  # the closed form against counting
            -(-ctx // part) for ctx in range(start + 1, start + n + 1) if ctx > part)
    monkeypatch.setattr(native_paged.kernels, "DEFAULT_PARTITION", 16)
    monkeypatch.setattr(native_paged, "NATIVE_PREFILL_MAX_SPLIT_PARTITIONS", 30)
    assert native.build_metadata(step).extra is None  # no chunk on the kernel: the decode alone, as before
    monkeypatch.setattr(native_paged, "cpu_has_amx_bf16", lambda: True)
    bf16 = NativePagedAttentionBackend(bs, torch.device("cpu"), kv.to(torch.bfloat16))
    assert bf16.use_kernel and not bf16.native_prefill and bf16.build_metadata(step).extra is None
    monkeypatch.setattr(native_paged, "cpu_has_amx_bf16", lambda: False)
    assert NativePagedAttentionBackend(bs, torch.device("cpu"), kv.to(torch.bfloat16)).native_prefill
    monkeypatch.setenv("TOKENMILL_NATIVE_PREFILL", "0")
    assert NativePagedAttentionBackend(bs, torch.device("cpu"), kv).build_metadata(step).extra is None
