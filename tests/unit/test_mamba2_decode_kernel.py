"""The native Mamba2 decode kernel (kernels.cpp, tm_mamba2_decode) against the torch path it replaces for one-token
steps (layers/gated_delta.py's conv, layers/mamba2.py's scan and gated norm), fp32 and bf16, one and two groups,
fresh and continued states, src != dst, several batch sizes; the same bits alone as in a batch; and Mamba2Mixer
with the kernel against its torch path on a mixed step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenmill.layers.gated_delta import RecurrentStep, StateSeq, causal_conv1d
from tokenmill.layers.mamba2 import gated_rms_norm, mamba2_scan
from tokenmill.native import kernels

pytestmark = pytest.mark.skipif(not kernels.is_enabled(), reason="native kernels not built")

EPS = 1e-5


def torch_path(xbc, z, dt, conv_w, conv_b, conv, ssm, seqs, neg_a, dt_bias, skip, norm_w, groups, eps=EPS):
    T = xbc.shape[0]
    _, H, P, N = ssm.shape
    I = H * P
    mixed = causal_conv1d(xbc, conv_w, conv, seqs, bias=conv_b)
    x, B, C = mixed.split([I, groups * N, groups * N], dim=-1)
    y = mamba2_scan(x.reshape(T, H, P), dt, B.reshape(T, groups, N), C.reshape(T, groups, N), neg_a, skip, dt_bias,
                    ssm, seqs)
    return gated_rms_norm(y.reshape(T, I), z, norm_w, groups, eps)


def make(dtype, n, H, G, P, N, S=12, K=4, seed=0):
    torch.manual_seed(seed)
    I, C = H * P, H * P + 2 * G * N
    proj = torch.randn(n, I + C + H).to(dtype)  # one in_proj output, split as the mixer splits it: z | xBC | dt
    z, xbc, dt = proj.split([I, C, H], dim=-1)
    w = dict(conv_w=torch.randn(C, K) * 0.5, conv_b=torch.randn(C) * 0.1, neg_a=-torch.rand(H) * 2 - 0.1,
             dt_bias=torch.randn(H), skip=torch.randn(H), norm_w=torch.rand(I) + 0.5)
    conv0, ssm0 = torch.randn(S, C, K - 1), torch.randn(S, H, P, N) * 0.3
    return z, xbc, dt, w, conv0, ssm0


def run_kernel(out, xbc, z, dt, w, conv, ssm, src, dst, groups):
    return kernels.mamba2_decode(out, xbc, z, dt, w["conv_w"], w["conv_b"], conv, ssm, src, dst, w["neg_a"],
                                 w["dt_bias"], w["skip"], w["norm_w"], groups, EPS)


def tol(dtype):
    return 1e-5 if dtype == torch.float32 else 8e-3  # bf16: the output's rounding (as test_gdn_decode_kernel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,G,P,N", [(4, 1, 8, 16), (4, 2, 8, 12), (6, 2, 4, 8)])
@pytest.mark.parametrize("n", [1, 3, 7])
def test_kernel_matches_the_torch_path(dtype, H, G, P, N, n):
    z, xbc, dt, w, conv0, ssm0 = make(dtype, n, H, G, P, N, seed=n + H + N)
    S = conv0.shape[0]
    slots = torch.randperm(S)[:n]
    fresh = torch.tensor([i % 3 == 1 for i in range(n)])
    seqs = [StateSeq(int(s), i, 1, bool(f)) for i, (s, f) in enumerate(zip(slots, fresh))]
    conv_t, ssm_t = conv0.clone(), ssm0.clone()
    # the kernel keeps the conv's output and the scan's in float32 (the torch path rounds them at bf16): its
    # reference is the float32 path on the same values
    want = torch_path(xbc.float(), z.float(), dt.float(), w["conv_w"], w["conv_b"], conv_t, ssm_t, seqs, w["neg_a"],
                      w["dt_bias"], w["skip"], w["norm_w"], G)
    conv_n, ssm_n = conv0.clone(), ssm0.clone()
    got = torch.empty(n, H * P, dtype=dtype)
    src = torch.where(fresh, -1, slots)
    assert run_kernel(got, xbc, z, dt, w, conv_n, ssm_n, src, slots, G)
    assert torch.allclose(got.float(), want, atol=tol(dtype), rtol=tol(dtype))
    assert torch.allclose(ssm_n, ssm_t, atol=1e-5, rtol=1e-5) and torch.equal(conv_n, conv_t)
    others = [i for i in range(S) if i not in slots.tolist()]
    assert torch.equal(conv_n[others], conv0[others]) and torch.equal(ssm_n[others], ssm0[others])
    for i in range(n):  # alone: each sequence's row and state the same bits as in the batch
        conv_1, ssm_1 = conv0.clone(), ssm0.clone()
        one = torch.empty(1, H * P, dtype=dtype)
        assert run_kernel(one, xbc[i:i + 1], z[i:i + 1], dt[i:i + 1], w, conv_1, ssm_1, src[i:i + 1], slots[i:i + 1],
                          G)
        assert torch.equal(one[0], got[i]) and torch.equal(ssm_1[slots[i]], ssm_n[slots[i]])
        assert torch.equal(conv_1[slots[i]], conv_n[slots[i]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_continues_a_torch_prompt(dtype):
    """A prompt of 5 tokens through the torch path, then 3 decode steps by the kernel and by torch: the same rows
    (within the bounds above) and states."""
    H, G, P, N = 4, 2, 8, 8
    I, C = H * P, H * P + 2 * G * N
    z, xbc, dt, w, conv0, ssm0 = make(dtype, 8, H, G, P, N, seed=5)
    conv, ssm = torch.zeros_like(conv0), torch.zeros_like(ssm0)
    torch_path(xbc[:5], z[:5], dt[:5], w["conv_w"], w["conv_b"], conv, ssm, [StateSeq(2, 0, 5, True)], w["neg_a"],
               w["dt_bias"], w["skip"], w["norm_w"], G)
    conv_t, ssm_t, conv_n, ssm_n = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    for t in range(5, 8):
        want = torch_path(xbc[t:t + 1].float(), z[t:t + 1].float(), dt[t:t + 1].float(), w["conv_w"], w["conv_b"],
                          conv_t, ssm_t, [StateSeq(2, 0, 1, False)], w["neg_a"], w["dt_bias"], w["skip"],
                          w["norm_w"], G)
        got = torch.empty(1, I, dtype=dtype)
        assert run_kernel(got, xbc[t:t + 1], z[t:t + 1], dt[t:t + 1], w, conv_n, ssm_n, torch.tensor([2]),
                          torch.tensor([2]), G)
        assert torch.allclose(got.float(), want, atol=tol(dtype), rtol=tol(dtype))
        assert torch.allclose(ssm_n, ssm_t, atol=1e-5, rtol=1e-5) and torch.equal(conv_n, conv_t)
    assert C == conv.shape[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_reads_src_and_writes_dst(dtype):
    """src_slots != dst_slots: the bits of the kernel run in place on a pool whose dst slot holds a copy of the src
    state; the src slots left as they were (3 read twice; -1 fresh reads nothing); the torch path agrees."""
    H, G, P, N, n = 4, 2, 8, 8, 6
    z, xbc, dt, w, conv0, ssm0 = make(dtype, n, H, G, P, N, S=16, seed=11)
    src = torch.tensor([3, 4, -1, 3, 9, 12])
    dst = torch.tensor([5, 6, 7, 10, 1, 12])
    conv_n, ssm_n = conv0.clone(), ssm0.clone()
    got = torch.empty(n, H * P, dtype=dtype)
    assert run_kernel(got, xbc, z, dt, w, conv_n, ssm_n, src, dst, G)

    conv_c, ssm_c = conv0.clone(), ssm0.clone()  # in place on copies: dst holds the src state (NaN where fresh)
    for s_, d in zip(src.tolist(), dst.tolist()):
        conv_c[d] = conv0[s_] if s_ >= 0 else float("nan")
        ssm_c[d] = ssm0[s_] if s_ >= 0 else float("nan")
    want = torch.empty(n, H * P, dtype=dtype)
    assert run_kernel(want, xbc, z, dt, w, conv_c, ssm_c, torch.where(src < 0, -1, dst), dst, G)
    assert torch.equal(got, want) and torch.equal(conv_n[dst], conv_c[dst]) and torch.equal(ssm_n[dst], ssm_c[dst])
    others = [i for i in range(16) if i not in dst.tolist()]  # the src slots 3, 4, 9 among them: unchanged
    assert torch.equal(conv_n[others], conv0[others]) and torch.equal(ssm_n[others], ssm0[others])

    seqs = [StateSeq(d, i, 1, s_ < 0, None if s_ < 0 else s_) for i, (s_, d) in enumerate(zip(src.tolist(),
                                                                                           dst.tolist()))]
    conv_t, ssm_t = conv0.clone(), ssm0.clone()
    ref = torch_path(xbc.float(), z.float(), dt.float(), w["conv_w"], w["conv_b"], conv_t, ssm_t, seqs, w["neg_a"],
                     w["dt_bias"], w["skip"], w["norm_w"], G)
    assert torch.allclose(got.float(), ref, atol=tol(dtype), rtol=tol(dtype))
    assert torch.allclose(ssm_n, ssm_t, atol=1e-5, rtol=1e-5) and torch.equal(conv_n, conv_t)


def test_kernel_softplus_threshold():
    """dt + dt_bias above 20: softplus is the value itself (torch's threshold), so dA underflows to 0 as torch's."""
    H, G, P, N = 2, 1, 8, 8
    z, xbc, dt, w, conv0, ssm0 = make(torch.float32, 2, H, G, P, N, seed=3)
    dt = torch.tensor([[25.0, -30.0], [19.5, 0.0]])
    src, dst = torch.tensor([0, 1]), torch.tensor([0, 1])
    conv_t, ssm_t, conv_n, ssm_n = conv0.clone(), ssm0.clone(), conv0.clone(), ssm0.clone()
    want = torch_path(xbc, z, dt, w["conv_w"], w["conv_b"], conv_t, ssm_t,
                      [StateSeq(0, 0, 1, False), StateSeq(1, 1, 1, False)], w["neg_a"], w["dt_bias"], w["skip"],
                      w["norm_w"], G)
    got = torch.empty(2, H * P)
    assert run_kernel(got, xbc, z, dt, w, conv_n, ssm_n, src, dst, G)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5) and torch.allclose(ssm_n, ssm_t, atol=1e-5, rtol=1e-5)


def test_kernel_refuses_what_it_does_not_take():
    H, G, P, N = 4, 2, 8, 8
    I, C = H * P, H * P + 2 * G * N
    w = dict(conv_w=torch.zeros(C, 4), conv_b=torch.zeros(C), neg_a=torch.zeros(H), dt_bias=torch.zeros(H),
             skip=torch.zeros(H), norm_w=torch.ones(I))
    conv, ssm = torch.zeros(2, C, 3), torch.zeros(2, H, P, N)
    src, dst = torch.full((1,), -1), torch.zeros(1, dtype=torch.int64)
    out = torch.empty(1, I)

    def call(xbc=torch.zeros(1, C), z=torch.zeros(1, I), dt=torch.zeros(1, H), groups=G, out=out, w=w, src=src,
             dst=dst, conv=conv, ssm=ssm):
        return run_kernel(out, xbc, z, dt, w, conv, ssm, src, dst, groups)

    assert not call(xbc=torch.zeros(1, C + 1))
    assert not call(xbc=torch.zeros(1, C, dtype=torch.float64))
    assert not call(z=torch.zeros(1, I, dtype=torch.bfloat16))
    assert not call(dt=torch.zeros(1, H + 1))
    assert not call(groups=3)  # H % G
    assert not call(groups=1)  # C != I + 2 G N
    assert not call(src=torch.zeros(1, dtype=torch.int32))
    assert not call(dst=torch.zeros(2, dtype=torch.int64))
    assert not call(w={**w, "norm_w": torch.ones(I, dtype=torch.bfloat16)})
    assert not call(w={**w, "conv_b": torch.zeros(C + 1)})
    assert not call(ssm=torch.zeros(2, H, P, N, dtype=torch.bfloat16))
    assert not call(out=torch.empty(1, I, dtype=torch.float64))
    assert call()


# ---------------------------------------------------------------------------------------------------------------
# the layer: Mamba2Mixer.forward takes the kernel for unchained decodes, torch for the rest
# ---------------------------------------------------------------------------------------------------------------

def small_mixer(groups: int):
    from tokenmill.layers.linear import UnquantizedLinearMethod
    from tokenmill.models.granite_hybrid import Mamba2Mixer
    H, P, N, d, K = 4, 8, 8, 24, 4
    cfg = SimpleNamespace(hidden_size=d, linear_num_value_heads=H, linear_key_head_dim=P, linear_num_key_heads=groups,
                          linear_value_head_dim=N, linear_value_dim_mamba=H * P, linear_conv_dim=H * P + 2 * groups * N,
                          linear_conv_kernel=K, rms_norm_eps=EPS, linear_layers=[0])
    mixer = Mamba2Mixer(cfg, 0, UnquantizedLinearMethod())  # type: ignore[arg-type]
    for p in mixer.parameters():
        p.data.normal_(0.0, 0.3)
    mixer.norm.weight.data.add_(1.0)
    mixer.finish()
    assert mixer.native is not None
    return mixer, cfg


@pytest.mark.parametrize("groups", [1, 2])
def test_layer_native_equals_torch(groups):
    """Decodes at rows 0..3 (one continuing in place, one reading a src slot, one fresh, one starting a chain), a
    single-token segment chained on that one, and an independent prompt: with the kernel (rows 0..3) the rows and
    states are those of the torch path alone."""
    torch.manual_seed(31 + groups)
    mixer, cfg = small_mixer(groups)
    S, T = 16, 4 + 1 + 6
    conv = torch.randn(1, S, cfg.linear_conv_dim, cfg.linear_conv_kernel - 1)
    ssm = torch.randn(1, S, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim) * 0.3
    conv[:, 8] = ssm[:, 8] = float("nan")  # the chain's middle slot: a read before its write shows
    seqs = [StateSeq(0, 0, 1, False), StateSeq(1, 1, 1, False, src=5), StateSeq(2, 2, 1, True, src=6),
            StateSeq(8, 3, 1, False, src=7), StateSeq(9, 4, 1, False, src=8), StateSeq(4, 5, 6, True)]
    h = torch.randn(T, cfg.hidden_size)

    def run(native: bool, conv_, ssm_):
        saved = mixer.native
        mixer.native = saved if native else None
        try:
            return mixer(h, RecurrentStep(seqs, conv_, ssm_))
        finally:
            mixer.native = saved

    c_n, s_n, c_t, s_t = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    got, want = run(True, c_n, s_n), run(False, c_t, s_t)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s_n, s_t, rtol=1e-4, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(c_n, c_t, rtol=0, atol=0, equal_nan=True)
    for x in (c_n, s_n):
        assert x[0, [0, 1, 2, 4, 8, 9]].isfinite().all()
        assert torch.equal(x[0, [5, 6, 7]], (conv if x is c_n else ssm)[0, [5, 6, 7]])  # src slots kept
