"""The native CPU kernels (tokenmill/native/kernels.cpp) against the torch path they replace, over random
shapes; skipped, saying why, when the library cannot be built here.

Tolerances. fp32: residual add exact; RMSNorm, silu * up and attention within rtol 1e-4, atol 1e-5 (the
kernels sum in another order and use their own exp: measured errors are ~1e-6); rotary bit-identical.
bf16: the kernels compute in fp32 and round once, the torch ops round at every step, so within 2 bf16 ulps
(rtol 1.6e-2) of the torch result, or of an fp32 reference on the same bf16 inputs for attention.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from tokenmill.cpu_features import cpu_flags
from tokenmill.native import kernels

FP32 = dict(rtol=1e-4, atol=1e-5)
BF16 = dict(rtol=1.6e-2, atol=1.6e-2)


@pytest.fixture(scope="module", autouse=True)
def lib():
    if kernels.library() is None:
        pytest.skip("the native kernels did not build here (no g++, or a compiler error: see the log of "
                    "tokenmill.native); everything runs the torch path")
    return kernels.library()


@pytest.fixture(scope="module")
def portable_lib():
    """The same source without the AVX2 intrinsics (the plain 8-float path other CPUs compile)."""
    lib = kernels.library(kernels.FLAGS + ("-DTM_PORTABLE",))
    if lib is None:
        pytest.skip("the portable build of the native kernels failed")
    return lib


def tol(dtype: torch.dtype) -> dict[str, float]:
    return FP32 if dtype == torch.float32 else BF16


# -- residual add + RMSNorm ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D", [(1, 576), (5, 67), (16, 4096), (64, 576), (3, 8)])
def test_add_rms_norm_matches_torch(dtype: torch.dtype, T: int, D: int) -> None:
    g = torch.Generator().manual_seed(T * 1000 + D)
    x = torch.randn(T, D, generator=g).to(dtype)
    res = torch.randn(T, D, generator=g).to(dtype) * 3
    w = torch.randn(D, generator=g).to(dtype)
    want_res = res + x
    want = F.rms_norm(want_res, (D,), w, 1e-5)
    res_native = res.clone()
    got = kernels.add_rms_norm(x, res_native, w, 1e-5)
    assert got is not None
    assert torch.equal(res_native, want_res)  # the add rounds once, either way
    torch.testing.assert_close(got, want, **tol(dtype))
    alone = kernels.add_rms_norm(x, None, w, 1e-5)  # no residual: the plain norm
    assert alone is not None
    torch.testing.assert_close(alone, F.rms_norm(x, (D,), w, 1e-5), **tol(dtype))


def test_add_rms_norm_strided_rows_and_refusals() -> None:
    base = torch.randn(4, 100)
    x = base[:, 10:74]  # rows 100 apart
    res = torch.randn(4, 64)
    w = torch.randn(64)
    want = F.rms_norm(res + x, (64,), w, 1e-6)
    got = kernels.add_rms_norm(x, res, w, 1e-6)
    assert got is not None
    torch.testing.assert_close(got, want, **FP32)
    assert kernels.add_rms_norm(x.half(), None, w.half(), 1e-6) is None  # fp16: torch's
    assert kernels.add_rms_norm(torch.randn(4, 64, 2)[..., 0], None, w, 1e-6) is None  # stride 2 in the last dim
    assert kernels.add_rms_norm(torch.randn(64), None, w, 1e-6) is None  # 1-D


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D", [(1, 4096), (5, 67), (3, 8)])
def test_add_layer_norm_matches_torch(dtype: torch.dtype, T: int, D: int) -> None:
    """Cohere's LayerNorm (no bias), fused with the residual add: rows far from zero mean, so leaving the mean in
    fails."""
    g = torch.Generator().manual_seed(T * 1000 + D)
    x = (torch.randn(T, D, generator=g) * 3 + 1.5).to(dtype)
    res = torch.randn(T, D, generator=g).to(dtype)
    w = (torch.randn(D, generator=g) * 0.5 + 1).to(dtype)
    r = res.clone()
    got = kernels.add_layer_norm(x, r, w, 1e-5)
    assert got is not None
    torch.testing.assert_close(r, res + x, rtol=0, atol=0)
    want = F.layer_norm((res + x).float(), (D,), w.float(), None, 1e-5).to(dtype)
    torch.testing.assert_close(got, want, **tol(dtype))
    alone = kernels.add_layer_norm(x, None, w, 1e-5)
    assert alone is not None
    torch.testing.assert_close(alone, F.layer_norm(x.float(), (D,), w.float(), None, 1e-5).to(dtype), **tol(dtype))


# -- silu(gate) * up -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,I", [(1, 1536), (7, 13), (64, 1536), (2, 14336)])
def test_silu_and_mul_matches_torch(dtype: torch.dtype, T: int, I: int) -> None:
    x = (torch.randn(T, 2 * I, generator=torch.Generator().manual_seed(T + I)) * 4).to(dtype)
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # saturation and zero
    gate, up = x.chunk(2, dim=-1)
    got = kernels.silu_and_mul(x)
    assert got is not None
    torch.testing.assert_close(got, F.silu(gate) * up, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,I", [(1, 2048), (7, 13), (64, 640), (2, 14336)])
def test_gelu_tanh_and_mul_matches_torch(dtype: torch.dtype, T: int, I: int) -> None:
    """Gemma's MLP activation, computed as g / (1 + exp(-2 z)): torch's 0.5 g (1 + tanh(z)) within rounding, tails
    included (large negative gates, where 1 + tanh cancels, and the saturated positive ones)."""
    x = (torch.randn(T, 2 * I, generator=torch.Generator().manual_seed(T + I)) * 4).to(dtype)
    x[0, :5] = torch.tensor([-100.0, 100.0, 0.0, -0.0, -9.0])
    gate, up = x.chunk(2, dim=-1)
    got = kernels.gelu_tanh_and_mul(x)
    assert got is not None
    want = (F.gelu(gate.double(), approximate="tanh") * up.double()).to(dtype)
    torch.testing.assert_close(got, want, **tol(dtype))
    assert kernels.gelu_tanh_and_mul(x[:, :-1]) is None  # odd width: no gate | up halves


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_mul_matches_torch(dtype: torch.dtype) -> None:
    """Qwen3.5's output gate: x (T, H, hd) times sigmoid(g) in place, g's heads between q's (2 hd apart), tails
    (hd = 20: 16 + 4) and saturated gates included."""
    g0 = torch.Generator().manual_seed(3)
    for hd in (256, 20):
        x = (torch.randn(6, 4, hd, generator=g0) * 2).to(dtype)
        qg = (torch.randn(6, 4, 2, hd, generator=g0) * 4).to(dtype)
        qg[0, 0, 1, :3] = torch.tensor([-100.0, 100.0, 0.0])
        gate = qg[:, :, 1]
        want = (x.double() * torch.sigmoid(gate.double())).to(dtype)
        assert kernels.sigmoid_mul_(x, gate)
        torch.testing.assert_close(x, want, **tol(dtype))
    assert not kernels.sigmoid_mul_(x, gate.float() if dtype != torch.float32 else gate.double())  # dtypes differ


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_f32_matches_torch(dtype: torch.dtype) -> None:
    """A gated shared expert's weights: sigmoid of its (T, 1) gate logits into (T,) fp32."""
    x = (torch.randn(37, 1, generator=torch.Generator().manual_seed(5)) * 6).to(dtype)
    x[0, 0], x[1, 0] = -200.0, 200.0
    got = kernels.sigmoid_f32(x)
    assert got is not None and got.dtype == torch.float32 and got.shape == (37,)
    torch.testing.assert_close(got, torch.sigmoid(x.float()).flatten(), **FP32)
    assert kernels.sigmoid_f32(x.t().contiguous().t()[:, :1].expand(37, 2)) is None  # not contiguous


# -- per-head RMSNorm, in place ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_head_rms_norm_matches_hf(dtype: torch.dtype, offset: float) -> None:
    """Each head of a view into projection rows normalized in place, times w (Qwen3's) or (1 + w) taken in fp32
    (Gemma 3's, as HF computes it); the rest of each row untouched."""
    g = torch.Generator().manual_seed(7)
    rows = (torch.randn(5, 3 * 64 + 40, generator=g) * 3).to(dtype)  # 3 heads of 64, then other columns
    w = (torch.randn(64, generator=g) * 0.5).to(dtype)
    before = rows.clone()
    heads = rows[:, : 3 * 64].view(5, 3, 64)
    assert kernels.head_rms_norm_(heads, w, 1e-6, offset)
    x = before[:, : 3 * 64].view(5, 3, 64).float()
    want = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + w.float())).to(dtype)
    torch.testing.assert_close(heads, want, **tol(dtype))
    assert torch.equal(rows[:, 3 * 64:], before[:, 3 * 64:])


# -- rotary ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,nkv,hd", [(9, 3, 64), (32, 8, 128), (4, 2, 36)])
def test_rotary_matches_torch(dtype: torch.dtype, nh: int, nkv: int, hd: int) -> None:
    from tokenmill.layers.rotary import RotaryEmbedding, inv_frequencies, rotate

    rope = RotaryEmbedding(hd, 2048, inv_frequencies(hd, 10000.0, None), torch.device("cpu"), dtype)
    for T in (1, 16, 33):
        tables = rope.tables(torch.randint(0, 2048, (T,)))
        qkv = torch.randn(T, (nh + 2 * nkv) * hd).to(dtype)
        qk = qkv[:, : (nh + nkv) * hd].view(T, nh + nkv, hd)  # a view: rows (nh + 2 nkv) hd apart
        v_before = qkv[:, (nh + nkv) * hd :].clone()
        want = rotate(qk, tables)
        assert kernels.rotary_(qk, tables.cos, tables.signed_sin)
        if dtype == torch.float32:
            assert torch.equal(qk, want)  # the same products and sums as torch, rounded the same way
        else:
            torch.testing.assert_close(qk, want, **BF16)
        assert torch.equal(qkv[:, (nh + nkv) * hd :], v_before)  # v untouched


# -- paged decode attention ------------------------------------------------------------------------
LENGTHS = [1, 15, 16, 17, 100, 513]


def make_paged(B: int, nkv: int, hd: int, bs: int, lens: list[int], dtype: torch.dtype, seed: int):
    """Random caches with each sequence's blocks scattered; -> k_cache, v_cache, block tables, lens."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-L // bs) for L in lens]
    nb = sum(need) + 3
    k_cache = torch.randn(nb, bs, nkv, hd, generator=g).to(dtype)
    v_cache = torch.randn(nb, bs, nkv, hd, generator=g).to(dtype)
    perm = torch.randperm(nb, generator=g).tolist()
    width = max(need) + 2  # wider than needed, padded with 0, as the metadata is
    tables = torch.zeros(B, width, dtype=torch.long)
    at = 0
    for b, n in enumerate(need):
        tables[b, :n] = torch.tensor(perm[at : at + n])
        at += n
    return k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.long)


def reference(q, k_cache, v_cache, tables, lens, scale, starts=None, softcap=0.0, sinks=None) -> torch.Tensor:
    """The torch path, per sequence: gather its blocks, SDPA (GQA as enable_gqa has it), in fp32, over
    positions [starts[b], lens[b]) (a sliding window's) or all of [0, lens[b]); with softcap or sinks, the
    paged backend's explicit attention (attention/paged.py's attend)."""
    from tokenmill.attention.paged import attend

    B, nh, hd = q.shape
    bs, nkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(B, nh, hd)
    for b in range(B):
        L = int(lens[b])
        S = int(starts[b]) if starts is not None else 0
        ids = tables[b, : -(-L // bs)]
        k = k_cache[ids].reshape(-1, nkv, hd)[S:L].float().transpose(0, 1)[None]
        v = v_cache[ids].reshape(-1, nkv, hd)[S:L].float().transpose(0, 1)[None]
        o = attend(q[b].float()[None, :, None], k, v, None, scale, softcap, sinks=sinks)
        out[b] = o[0, :, 0]
    return out


CASES = [  # (nh, nkv, hd): GQA ratios 1-8, head dims 64 and 128 (and one other multiple of 8)
    (9, 3, 64), (8, 8, 64), (8, 1, 64), (16, 2, 128), (32, 8, 128), (28, 4, 128), (12, 2, 64), (10, 2, 64),
    (4, 4, 128), (16, 16, 64), (6, 1, 96),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,nkv,hd", CASES)
def test_paged_decode_attention_matches_torch(nh: int, nkv: int, hd: int, dtype: torch.dtype) -> None:
    """bf16 (on AVX-512: the 16-lane tiles; with the runs below, groups of 1-8 heads) against fp32 math on the
    same inputs."""
    rng = random.Random(nh * 100 + nkv * 10 + hd)
    for B in (1, rng.randint(2, 9), 64):
        lens = [rng.choice(LENGTHS) if rng.random() < 0.6 else rng.randint(1, 600) for _ in range(B)]
        if B == 64:  # keep the caches small: long contexts for a few sequences only
            lens = [L if b < 8 else min(L, 48) for b, L in enumerate(lens)]
        k_cache, v_cache, tables, lens_t = make_paged(B, nkv, hd, 16, lens, dtype, seed=B)
        qkv = torch.randn(B, (nh + 2 * nkv) * hd).to(dtype)
        q = qkv[:, : nh * hd].view(B, nh, hd)  # a view into the projection, as the model passes it
        out = torch.empty(B, nh, hd, dtype=dtype)
        assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, hd ** -0.5)
        want = reference(q, k_cache, v_cache, tables, lens_t, hd ** -0.5)
        torch.testing.assert_close(out.float(), want, **tol(dtype))


@pytest.mark.parametrize("bs", [8, 32, 5])
def test_paged_decode_attention_other_block_sizes(bs: int) -> None:
    """Tiles of 16 positions cross blocks smaller than 16, or lie inside bigger ones."""
    lens = [1, 15, 16, 17, 33, 100, 257, 513]
    k_cache, v_cache, tables, lens_t = make_paged(len(lens), 3, 64, bs, lens, torch.float32, seed=bs)
    q = torch.randn(len(lens), 9, 64)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 0.125)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, lens_t, 0.125), **FP32)


@pytest.mark.parametrize("window", [1, 5, 16, 100, 512])
def test_paged_decode_attention_sliding_window(window: int) -> None:
    """Each sequence's keys from its window's first position, lens - window (0 if the context is
    shorter): partitions start there, inside a block or at its edge."""
    lens = [1, 15, 16, 17, 33, 100, 257, 513, 1000]
    k_cache, v_cache, tables, lens_t = make_paged(len(lens), 2, 64, 16, lens, torch.float32, seed=window)
    starts = (lens_t - window).clamp(min=0)
    q = torch.randn(len(lens), 8, 64)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 0.125, starts=starts)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, lens_t, 0.125, starts), **FP32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_attention_soft_capped(dtype: torch.dtype) -> None:
    """Gemma 2's attention: each scaled score s becomes cap * tanh(s / cap) before the softmax; a cap small
    enough to bite (the uncapped result is far off), with a window, GQA 4, head dim 256 (Gemma 2's)."""
    lens = [1, 16, 17, 100, 300]
    k_cache, v_cache, tables, lens_t = make_paged(len(lens), 2, 256, 16, lens, dtype, seed=3)
    starts = (lens_t - 64).clamp(min=0)
    q = (torch.randn(len(lens), 8, 256) * 4).to(dtype)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 256 ** -0.5, starts=starts,
                                          softcap=2.0)
    want = reference(q, k_cache, v_cache, tables, lens_t, 256 ** -0.5, starts, softcap=2.0)
    torch.testing.assert_close(out.float(), want, **tol(dtype))
    uncapped = reference(q, k_cache, v_cache, tables, lens_t, 256 ** -0.5, starts)
    assert (uncapped - want).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_attention_with_sinks(dtype: torch.dtype) -> None:
    """gpt-oss's sinks: one more logit per query head in each softmax, selecting no value; one partition and
    several (513, 1000 keys), with a window, decode rows and prompt rows (prefill_from); sinks large enough to
    take most of the weight (without them the result is far off)."""
    lens = [1, 16, 17, 100, 513, 1000]
    nh, nkv, hd = 16, 2, 64
    k_cache, v_cache, tables, lens_t = make_paged(len(lens), nkv, hd, 16, lens, dtype, seed=11)
    sinks = torch.linspace(-3.0, 4.0, nh)
    q = torch.randn(len(lens), nh, hd).to(dtype)
    for starts in (None, (lens_t - 128).clamp(min=0)):
        want = reference(q, k_cache, v_cache, tables, lens_t, hd ** -0.5, starts, sinks=sinks)
        for prefill_from in (None, 3):
            out = torch.empty_like(q)
            assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, hd ** -0.5, starts=starts,
                                                  sinks=sinks, prefill_from=prefill_from)
            torch.testing.assert_close(out.float(), want, **tol(dtype))
        plain = reference(q, k_cache, v_cache, tables, lens_t, hd ** -0.5, starts)
        assert (plain - want).abs().max() > 0.1
    assert not kernels.paged_decode_attention(torch.empty_like(q), q, k_cache, v_cache, tables, lens_t, 0.125,
                                              sinks=sinks.to(dtype=torch.float64))


def test_paged_decode_attention_bf16() -> None:
    lens = [1, 17, 100, 513, 300]
    k_cache, v_cache, tables, lens_t = make_paged(len(lens), 4, 128, 16, lens, torch.bfloat16, seed=7)
    q = torch.randn(len(lens), 28, 128).to(torch.bfloat16)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 128 ** -0.5)
    want = reference(q, k_cache, v_cache, tables, lens_t, 128 ** -0.5)  # fp32 math on the bf16 inputs
    torch.testing.assert_close(out.float(), want, **BF16)


def test_each_sequence_is_independent_of_the_batch_and_the_threads() -> None:
    """Bit for bit: a sequence alone, in a batch (any position), at 1 or 2 threads. The engine's
    batched == alone invariance rests on this."""
    lens = [513, 1, 300, 17, 256, 257, 40, 1000]
    k_cache, v_cache, tables, lens_t = make_paged(len(lens), 3, 64, 16, lens, torch.float32, seed=3)
    q = torch.randn(len(lens), 9, 64)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            out = torch.empty_like(q)
            assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 0.125)
            outs.append(out)
        assert torch.equal(outs[0], outs[1])
        for b in range(len(lens)):
            alone = torch.empty(1, 9, 64)
            assert kernels.paged_decode_attention(alone, q[b : b + 1], k_cache, v_cache, tables[b : b + 1],
                                                  lens_t[b : b + 1], 0.125)
            assert torch.equal(alone[0], outs[0][b]), b
        # reversed batch order: each row still the same bits
        rev = torch.empty_like(q)
        assert kernels.paged_decode_attention(rev, q.flip(0), k_cache, v_cache, tables.flip(0), lens_t.flip(0), 0.125)
        assert torch.equal(rev.flip(0), outs[0])
    finally:
        torch.set_num_threads(threads)


def verification_batch(runs: list[tuple[int, int]], nkv: int, hd: int, bs: int, seed: int):
    """Speculative verification's layout: for each (L, R) one sequence's R rows at positions L-1 .. L+R-2
    (lens L .. L+R-1), every row with the sequence's block table; -> caches, tables, lens."""
    k_cache, v_cache, tables, _ = make_paged(len(runs), nkv, hd, bs, [L + R - 1 for L, R in runs], torch.float32,
                                             seed)
    rows = [b for b, (_, R) in enumerate(runs) for _ in range(R)]
    lens = [L + r for L, R in runs for r in range(R)]
    return k_cache, v_cache, tables[rows], torch.tensor(lens, dtype=torch.long)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,nkv,hd,bs", [(9, 3, 64, 16), (32, 8, 128, 16), (8, 1, 64, 5), (16, 16, 64, 32)])
def test_rows_of_one_sequence_attend_together_and_keep_their_bits(nh: int, nkv: int, hd: int, bs: int,
                                                                   dtype: torch.dtype) -> None:
    """Rows of one sequence at successive positions (speculative verification) are attended as one run,
    each tile read once for all of them. Each row must still get the bits it gets alone, across tile,
    block and partition edges (lens around 16, 256 and 512), in runs longer than the kernel groups (20
    rows), beside other sequences, at 1 and 2 threads; and match the torch reference."""
    runs = [(1, 5), (254, 5), (300, 1), (14, 4), (509, 9), (100, 20), (2, 2), (1000, 3)]
    k_cache, v_cache, tables, lens_t = verification_batch(runs, nkv, hd, bs, seed=nh + bs)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    q = torch.randn(len(lens_t), nh, hd).to(dtype)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = torch.empty_like(q)
            assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, hd ** -0.5)
            want = reference(q, k_cache, v_cache, tables, lens_t, hd ** -0.5)
            torch.testing.assert_close(out.float(), want, **tol(dtype))
            for b in range(len(lens_t)):
                alone = torch.empty(1, nh, hd, dtype=dtype)
                assert kernels.paged_decode_attention(alone, q[b : b + 1], k_cache, v_cache, tables[b : b + 1],
                                                      lens_t[b : b + 1], hd ** -0.5)
                assert torch.equal(alone[0], out[b]), (n, b)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,nkv,hd,bs", [(9, 3, 64, 16), (32, 8, 128, 16), (8, 1, 64, 5), (16, 16, 64, 32),
                                          (6, 1, 96, 16), (10, 2, 72, 16), (32, 1, 64, 16)])
def test_prompt_rows_match_torch_and_keep_their_bits(nh: int, nkv: int, hd: int, bs: int, dtype: torch.dtype,
                                                     monkeypatch) -> None:
    """A step's rows as the native backend passes them: decodes, then prompt rows (prefill_from). At bf16 with
    AVX512_BF16 the prompt rows take the lane-wise tiles: within bf16's rounding of the torch reference, with
    and without a soft cap; a prompt row gets the same bits alone (as a prompt row) as in its chunk's runs,
    beside decodes, at 1 and 2 threads; the decodes keep the bits they get without prompt rows. Elsewhere
    (fp32, no AVX512_BF16 or a build without it, -DTM_NO_DPBF16, a head dim not a multiple of 16) prompt rows
    are computed as any row: the same bits as without prefill_from. GQA 32 (one KV head): 512 query heads in
    a 16-row run's lanes."""
    decodes = [(300, 1), (17, 1), (1, 1)]  # (L, 1): one decode at length L
    chunks = [(1, 40), (90, 23), (500, 20)]  # (first length, rows): a prompt chunk's rows at successive positions
    k_cache, v_cache, tables, lens_t = verification_batch(decodes + chunks, nkv, hd, bs, seed=nh + hd)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    d = len(decodes)
    q = torch.randn(len(lens_t), nh, hd).to(dtype)
    libs = [(kernels.library(), {"avx512f", "avx512_bf16"} <= cpu_flags())]
    if dtype == torch.bfloat16 and "avx512_bf16" in cpu_flags():
        libs.append((kernels.library(kernels.FLAGS + ("-DTM_NO_DPBF16",)), False))
    threads = torch.get_num_threads()
    try:
        for lib, lanes in libs:
            monkeypatch.setattr(kernels, "library", lambda flags=kernels.FLAGS, lib=lib: lib)
            for softcap in (0.0, 5.0):
                plain = torch.empty_like(q)
                assert kernels.paged_decode_attention(plain, q, k_cache, v_cache, tables, lens_t, hd ** -0.5,
                                                      softcap=softcap)
                want = reference(q, k_cache, v_cache, tables, lens_t, hd ** -0.5, softcap=softcap)
                for n in (1, 2):
                    torch.set_num_threads(n)
                    out = torch.empty_like(q)
                    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, hd ** -0.5,
                                                          softcap=softcap, prefill_from=d)
                    torch.testing.assert_close(out.float(), want, **tol(dtype))
                    assert torch.equal(out[:d], plain[:d])
                    if dtype == torch.float32 or not lanes or hd % 16:
                        assert torch.equal(out, plain)
                    else:
                        assert not torch.equal(out[d:], plain[d:])  # the lane-wise tiles ran
                    for b in range(d, len(lens_t), 7):
                        alone = torch.empty(1, nh, hd, dtype=dtype)
                        assert kernels.paged_decode_attention(alone, q[b: b + 1], k_cache, v_cache, tables[b: b + 1],
                                                              lens_t[b: b + 1], hd ** -0.5, softcap=softcap,
                                                              prefill_from=0)
                        assert torch.equal(alone[0], out[b]), (n, b)
    finally:
        torch.set_num_threads(threads)


def test_rows_that_read_other_blocks_are_not_run_together() -> None:
    """Successive positions of two sequences whose tables differ in one block the shorter row reads, or
    with a shorter context after a longer one, or under a sliding window: still each row's own keys."""
    k_cache, v_cache, tables, lens_t = verification_batch([(40, 2), (40, 2)], 2, 64, 16, seed=11)
    tables[1, 1] = tables[2, 1]  # row 1 (len 41) reads another sequence's second block
    lens_t[3] = 30  # row 3 shorter than row 2
    q = torch.randn(4, 4, 64)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 0.125)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, lens_t, 0.125), **FP32)
    k_cache, v_cache, tables, lens_t = verification_batch([(40, 6)], 2, 64, 16, seed=12)
    starts = (lens_t - 20).clamp(min=0)  # each row's window starts one key later
    q = torch.randn(6, 4, 64)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 0.125, starts=starts)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, lens_t, 0.125, starts), **FP32)


def test_attention_refuses_what_it_cannot_take() -> None:
    k_cache, v_cache, tables, lens_t = make_paged(2, 2, 64, 16, [5, 9], torch.float32, seed=1)
    q = torch.randn(2, 4, 64)
    out = torch.empty_like(q)
    assert not kernels.paged_decode_attention(out, q.half(), k_cache.half(), v_cache.half(), tables, lens_t, 0.1)
    assert not kernels.paged_decode_attention(out, q, k_cache, v_cache, tables.int(), lens_t, 0.1)
    assert not kernels.paged_decode_attention(out, torch.randn(2, 3, 64), k_cache, v_cache, tables, lens_t, 0.1)
    k12, v12, t12, l12 = make_paged(2, 2, 12, 16, [5, 9], torch.float32, seed=1)
    q12 = torch.randn(2, 4, 12)
    assert not kernels.paged_decode_attention(torch.empty_like(q12), q12, k12, v12, t12, l12, 0.1)  # hd % 8


# -- greedy picks ------------------------------------------------------------------------------------
def argmax_cases(g: torch.Generator) -> list[torch.Tensor]:
    """Rows of every length class (under one run of 64, runs and a tail, exact runs), values with many ties
    (the first maximum must win), the maximum in the first or last value, and a strided view."""
    cases = []
    for rows, V in [(1, 5), (3, 64), (4, 130), (64, 49152), (7, 50257), (2, 1000)]:
        cases.append(torch.randn(rows, V, generator=g))
        cases.append(torch.randint(-3, 4, (rows, V), generator=g).float() * 0.5)  # ties everywhere
    edge = torch.randn(4, 300, generator=g)
    edge[0, 0] = edge[1, -1] = edge[2, 64] = edge[3, 63] = 50.0
    edge[2, 200] = 50.0  # a tie with an earlier maximum: the earlier one
    cases.append(edge)
    cases.append(torch.randn(6, 700, generator=g)[::2, 10:610])  # rows 1400 apart, a column offset
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_is_the_first_maximum(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(11)
    for x in argmax_cases(g):
        x = x.to(dtype)  # (fp32 keeps the strided view as it is)
        got = kernels.argmax_rows(x)
        assert got is not None
        assert torch.equal(got, x.float().max(dim=-1).indices), (dtype, tuple(x.shape))
        assert torch.equal(got, x.float().argmax(dim=-1))


def test_argmax_rows_leaves_nan_and_infinity_to_torch() -> None:
    for bad in (float("nan"), float("inf"), -float("inf")):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(3, 200).to(dtype)
            x[1, 150] = bad  # in the tail past the last run of 64
            assert kernels.argmax_rows(x) is None
            x = torch.randn(3, 200).to(dtype)
            x[2, 5] = bad  # in a run
            assert kernels.argmax_rows(x) is None
    assert kernels.argmax_rows(torch.randn(2, 8).half()) is None  # a dtype it does not take
    assert kernels.argmax_rows(torch.randn(8, 2).t()) is None  # columns not adjacent
    assert kernels.argmax_rows(torch.randn(3, 0)) is None


# -- the 8-lane build on an AVX-512 CPU ------------------------------------------------------------
def test_sixteen_lanes_agree_with_eight(monkeypatch) -> None:
    """Where the compiler targets AVX-512, silu*mul and the norm take 16 lanes with the same operations per
    element (so the same bits as the 8-lane build, -DTM_NO_AVX512), and bf16 decode attention 16-lane tiles
    (the same within bf16's rounding)."""
    if "avx512f" not in cpu_flags():
        pytest.skip("no AVX-512 here: the default build is the 8-lane one")
    narrow = kernels.library(kernels.FLAGS + ("-DTM_NO_AVX512",))
    if narrow is None:
        pytest.skip("the 8-lane build of the native kernels failed")
    wide = kernels.library()
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        gate_up = (torch.randn(33, 2 * 1544, generator=g) * 4).to(dtype)  # a tail past the 16-lane loop
        gate_up[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
        x, res, w = (torch.randn(33, 600, generator=g).to(dtype), torch.randn(33, 600, generator=g).to(dtype),
                     torch.randn(600, generator=g).to(dtype))
        got = {}
        for name, lib in (("narrow", narrow), ("wide", wide)):
            monkeypatch.setattr(kernels, "library", lambda flags=kernels.FLAGS, lib=lib: lib)
            r = res.clone()
            got[name] = (kernels.silu_and_mul(gate_up), kernels.add_rms_norm(x, r, w, 1e-5), r)
        for a, b in zip(got["narrow"], got["wide"]):
            assert a is not None and b is not None
            assert torch.equal(a.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                               b.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)), dtype
    lens = [1, 17, 100, 513, 300, 16, 256]
    for nh, nkv, hd in ((9, 3, 64), (28, 4, 128), (16, 2, 96)):
        k_cache, v_cache, tables, lens_t = make_paged(len(lens), nkv, hd, 16, lens, torch.bfloat16, seed=hd)
        q = torch.randn(len(lens), nh, hd, generator=g).to(torch.bfloat16)
        outs = []
        for lib in (narrow, wide):
            monkeypatch.setattr(kernels, "library", lambda flags=kernels.FLAGS, lib=lib: lib)
            out = torch.empty_like(q)
            assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, hd ** -0.5)
            outs.append(out.float())
        torch.testing.assert_close(outs[1], outs[0], **BF16)


# -- the portable build (no intrinsics) ------------------------------------------------------------
def test_portable_build_agrees(portable_lib, monkeypatch) -> None:
    monkeypatch.setattr(kernels, "library", lambda flags=kernels.FLAGS: portable_lib)
    x, res, w = torch.randn(3, 100), torch.randn(3, 100), torch.randn(100)
    got = kernels.add_rms_norm(x, res.clone(), w, 1e-5)
    assert got is not None
    torch.testing.assert_close(got, F.rms_norm(res + x, (100,), w, 1e-5), **FP32)
    g = torch.randn(4, 2 * 37) * 4
    got = kernels.silu_and_mul(g)
    assert got is not None
    torch.testing.assert_close(got, F.silu(g[:, :37]) * g[:, 37:], **FP32)
    lens = [1, 17, 300, 513]
    k_cache, v_cache, tables, lens_t = make_paged(4, 2, 64, 16, lens, torch.float32, seed=5)
    q = torch.randn(4, 14, 64)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 0.125)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, lens_t, 0.125), **FP32)
    k_cache, v_cache, tables, lens_t = verification_batch([(254, 5), (17, 3)], 2, 64, 16, seed=6)
    q = torch.randn(8, 14, 64)
    out = torch.empty_like(q)
    assert kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens_t, 0.125)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, lens_t, 0.125), **FP32)
    alone = torch.empty(1, 14, 64)
    assert kernels.paged_decode_attention(alone, q[2:3], k_cache, v_cache, tables[2:3], lens_t[2:3], 0.125)
    assert torch.equal(alone[0], out[2])
    for x in argmax_cases(torch.Generator().manual_seed(12)):
        assert torch.equal(kernels.argmax_rows(x), x.max(dim=-1).indices)
