"""The native LFM2 short conv decode kernel (kernels.cpp, tm_shortconv_decode) against the torch path it replaces for
one-token steps (gated_delta.causal_conv1d between the B * x and C * multiplies), fp32 and bf16, K = 3 and 4 (the
kernel's unrolled cases) and 2 and 5 (its general loop): fresh and restored windows, src != dst (src left unchanged)
and src == dst (in place), the same bits alone as in a batch; a control (the taps reversed) that the comparison
catches; and ShortConv with the kernel against its torch path on a mixed step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenmill.layers.gated_delta import RecurrentStep, StateSeq, causal_conv1d
from tokenmill.native import kernels

pytestmark = pytest.mark.skipif(not kernels.is_enabled(), reason="native kernels not built")


def torch_path(bcx: torch.Tensor, conv_w: torch.Tensor, pool: torch.Tensor, seqs: list[StateSeq]) -> torch.Tensor:
    """bcx (T, 3C) -> C * conv(B * x) (T, C), as ShortConv's torch path (its pool updated)."""
    b, c, x = bcx.chunk(3, dim=-1)
    return c * causal_conv1d(b * x, conv_w, pool, seqs, activation=False)


def make(dtype: torch.dtype, n: int, C: int, K: int, S: int = 12, seed: int = 0):
    """bcx (n, 3C) of dtype, conv_w (C, K) and a pool (S, C, K - 1) float32. The pool holds values of dtype (what the
    torch path writes there), so both paths read the same window."""
    g = torch.Generator().manual_seed(seed)
    bcx = torch.randn(n, 3 * C, generator=g).to(dtype)
    conv_w = torch.randn(C, K, generator=g) * 0.5
    pool = torch.randn(S, C, K - 1, generator=g).to(dtype).float()
    return bcx, conv_w, pool


def run_kernel(bcx, conv_w, pool, src, dst) -> torch.Tensor:
    out = torch.empty(bcx.shape[0], bcx.shape[1] // 3, dtype=bcx.dtype)
    assert kernels.shortconv_decode(out, bcx, conv_w, pool, src, dst)
    return out


def seqs_for(src: torch.Tensor, dst: torch.Tensor) -> list[StateSeq]:
    return [StateSeq(d, i, 1, s < 0, None if s < 0 or s == d else s)
            for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist()))]


def reference(bcx, conv_w, pool, src, dst):
    """The torch path in float32 on the same values (the kernel keeps B * x and the conv in float32; at bf16 the
    torch path rounds them): its output (n, C) and pool."""
    ref_pool = pool.clone()
    want = torch_path(bcx.float(), conv_w, ref_pool, seqs_for(src, dst))
    return want, ref_pool


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    if dtype == torch.float32:
        return torch.allclose(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))
    return torch.allclose(got.float(), want, rtol=8e-3, atol=8e-3)  # bf16: the output's one rounding (2^-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 5])
def test_kernel_matches_the_torch_path_in_place(dtype, K, n):
    """src == dst (every other one fresh): the rows within bounds, the windows the same bits, other slots untouched;
    and each sequence alone the same bits as in the batch."""
    C, S = 72, 12
    bcx, conv_w, pool0 = make(dtype, n, C, K, S, seed=n + K)
    slots = torch.randperm(S, generator=torch.Generator().manual_seed(K))[:n]
    src = torch.where(torch.arange(n) % 2 == 1, -1, slots)
    pool = pool0.clone()
    got = run_kernel(bcx, conv_w, pool, src, slots)
    want, ref_pool = reference(bcx, conv_w, pool0, src, slots)
    assert close(got, want, dtype)
    assert torch.equal(pool, ref_pool)  # B * x of two bf16 values is exact in float32
    others = [i for i in range(S) if i not in slots.tolist()]
    assert torch.equal(pool[others], pool0[others])
    for i in range(n):  # alone: the row and the window the same bits as in the batch
        pool_1 = pool0.clone()
        one = run_kernel(bcx[i:i + 1], conv_w, pool_1, src[i:i + 1], slots[i:i + 1])
        assert torch.equal(one[0], got[i]) and torch.equal(pool_1[slots[i]], pool[slots[i]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [3, 5])
def test_kernel_reads_src_and_writes_dst(dtype, K):
    """src != dst: the src slots left as they were (3 read twice; -1 reads nothing), the dst ones as the torch path
    writes them; the rows the bits of the kernel run in place on a pool whose dst slots hold copies of the src ones
    (NaN where fresh: a fresh window is never read)."""
    C, S, n = 40, 16, 6
    bcx, conv_w, pool0 = make(dtype, n, C, K, S, seed=11 + K)
    src = torch.tensor([3, 4, -1, 3, 9, 12])
    dst = torch.tensor([5, 6, 7, 10, 1, 12])
    pool = pool0.clone()
    got = run_kernel(bcx, conv_w, pool, src, dst)
    want, ref_pool = reference(bcx, conv_w, pool0, src, dst)
    assert close(got, want, dtype)
    assert torch.equal(pool, ref_pool)
    others = [i for i in range(S) if i not in dst.tolist()]  # the src slots 3, 4, 9 among them
    assert torch.equal(pool[others], pool0[others])

    pool_c = pool0.clone()
    for s, d in zip(src.tolist(), dst.tolist()):
        pool_c[d] = pool0[s] if s >= 0 else float("nan")
    again = run_kernel(bcx, conv_w, pool_c, torch.where(src < 0, -1, dst), dst)
    assert torch.equal(again, got) and torch.equal(pool_c[dst], pool[dst])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_continues_a_torch_prompt(dtype):
    """A prompt of 5 tokens through the torch path, then 3 decode steps by the kernel and by torch (float32 on the
    same values): the same rows within the bounds above."""
    C, K = 48, 3
    bcx, conv_w, _ = make(dtype, 8, C, K, seed=5)
    pool = torch.zeros(4, C, K - 1)
    torch_path(bcx[:5], conv_w, pool, [StateSeq(2, 0, 5, True)])
    pool_t, pool_n = pool.clone(), pool.clone()
    for t in range(5, 8):
        want = torch_path(bcx[t:t + 1].float(), conv_w, pool_t, [StateSeq(2, 0, 1, False)])
        got = run_kernel(bcx[t:t + 1], conv_w, pool_n, torch.tensor([2]), torch.tensor([2]))
        assert close(got, want, dtype)
    assert torch.equal(pool_n, pool_t)


def test_control_reversed_taps_differ():
    """The comparison can fail: taps in the wrong order (the newest input on w[0]) give other rows."""
    C, K, n = 64, 3, 4
    bcx, conv_w, pool0 = make(torch.float32, n, C, K, seed=7)
    src = dst = torch.arange(n)
    want, _ = reference(bcx, conv_w, pool0, src, dst)
    got = run_kernel(bcx, conv_w.flip(1).contiguous(), pool0.clone(), src, dst)
    assert not close(got, want, torch.float32)
    assert close(run_kernel(bcx, conv_w, pool0.clone(), src, dst), want, torch.float32)


def test_kernel_refuses_what_it_does_not_take():
    C, K = 16, 3
    pool = torch.zeros(2, C, K - 1)
    w = torch.zeros(C, K)
    src, dst = torch.full((1,), -1), torch.zeros(1, dtype=torch.int64)

    def call(bcx=torch.zeros(1, 3 * C), out=torch.empty(1, C), w=w, pool=pool, src=src, dst=dst):
        return kernels.shortconv_decode(out, bcx, w, pool, src, dst)

    assert not call(bcx=torch.zeros(1, 3 * C + 1))
    assert not call(bcx=torch.zeros(1, 3 * C, dtype=torch.bfloat16))
    assert not call(bcx=torch.zeros(3 * C, 2).t()[:1])  # not unit stride
    assert not call(out=torch.empty(1, C, dtype=torch.float64), bcx=torch.zeros(1, 3 * C, dtype=torch.float64))
    assert not call(w=torch.zeros(C, K, dtype=torch.bfloat16))
    assert not call(w=torch.zeros(C, K + 1))  # the pool's K - 1
    assert not call(pool=torch.zeros(2, C, K - 1, dtype=torch.bfloat16))
    assert not call(src=torch.zeros(1, dtype=torch.int32))
    assert not call(dst=torch.zeros(2, dtype=torch.int64))
    assert call()


# ---------------------------------------------------------------------------------------------------------------
# the layer: ShortConv.forward takes the kernel for unchained decodes, torch for the rest
# ---------------------------------------------------------------------------------------------------------------

def small_short_conv(K: int):
    from tokenmill.layers.linear import UnquantizedLinearMethod
    from tokenmill.models.lfm2 import ShortConv
    d = 32
    cfg = SimpleNamespace(hidden_size=d, linear_conv_kernel=K, linear_layers=[0])
    layer = ShortConv(cfg, 0, UnquantizedLinearMethod())  # type: ignore[arg-type]
    for p in layer.parameters():
        p.data.normal_(0.0, 0.3)
    layer.finish_native()
    assert layer.native is not None
    return layer, d


@pytest.mark.parametrize("K", [3, 5])
def test_layer_native_equals_torch(K):
    """Decodes at rows 0..3 (one continuing in place, one reading a src slot, one fresh, one starting a chain), a
    single-token segment chained on that one, and an independent prompt: with the kernel (rows 0..3) the rows and
    windows are those of the torch path alone (fp32)."""
    torch.manual_seed(41 + K)
    layer, d = small_short_conv(K)
    S, T = 16, 4 + 1 + 6
    conv = torch.randn(1, S, d, K - 1)
    conv[:, 8] = float("nan")  # the chain's middle slot: a read before its write shows
    seqs = [StateSeq(0, 0, 1, False), StateSeq(1, 1, 1, False, src=5), StateSeq(2, 2, 1, True, src=6),
            StateSeq(8, 3, 1, False, src=7), StateSeq(9, 4, 1, False, src=8), StateSeq(4, 5, 6, True)]
    h = torch.randn(T, d)

    def run(native: bool, conv_: torch.Tensor) -> torch.Tensor:
        saved = layer.native
        layer.native = saved if native else None
        try:
            return layer(h, RecurrentStep(seqs, conv_, torch.zeros(1, S, 0, 0, 0)))
        finally:
            layer.native = saved

    c_n, c_t = conv.clone(), conv.clone()
    got, want = run(True, c_n), run(False, c_t)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c_n, c_t, rtol=0, atol=0, equal_nan=True)
    assert c_n[0, [0, 1, 2, 4, 8, 9]].isfinite().all()
    assert torch.equal(c_n[0, [5, 6, 7]], conv[0, [5, 6, 7]])  # src slots kept
