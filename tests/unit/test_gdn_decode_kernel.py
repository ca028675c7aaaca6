"""The native Gated DeltaNet decode kernel (kernels.cpp, tm_gdn_decode) against the torch path it replaces for
one-token steps (layers/gated_delta.py's conv and delta rule, then the gated norm), fp32 and bf16, grouped and
tiled value heads, fresh and continued states, several batch sizes; and the same bits alone as in a batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenmill.layers.gated_delta import StateSeq, causal_conv1d, gated_delta_rule
from tokenmill.native import kernels

pytestmark = pytest.mark.skipif(not kernels.is_enabled(), reason="native kernels not built")


def torch_path(qkv, z, ba, conv_w, conv, ssm, seqs, neg_a, dt, norm_w, hk, dk, tiled, eps):
    T, hv, dv = qkv.shape[0], ssm.shape[1], ssm.shape[3]
    b, a = ba.float().split([hv, hv], dim=-1)
    mixed = causal_conv1d(qkv, conv_w, conv, seqs)
    q, k, v = mixed.split([hk * dk, hk * dk, hv * dv], dim=-1)
    o = gated_delta_rule(q.reshape(T, hk, dk), k.reshape(T, hk, dk), v.reshape(T, hv, dv),
                         neg_a * F.softplus(a + dt), torch.sigmoid(b), ssm, seqs, v_heads_tiled=tiled).float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm_w
    return (o * F.silu(z.float().reshape(T, hv, dv))).reshape(T, hv * dv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hk,hv,dk,dv,tiled", [(2, 4, 16, 16, False), (2, 4, 16, 8, True), (3, 3, 32, 16, False)])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_kernel_matches_the_torch_path(dtype, hk, hv, dk, dv, tiled, n):
    torch.manual_seed(n + hk + dv)
    C, K, S, eps = 2 * hk * dk + hv * dv, 4, 10, 1e-6
    proj = torch.randn(n, C + hv * dv + 2 * hv).to(dtype)  # one projection's output, split as the model splits it
    qkv, z, ba = proj.split([C, hv * dv, 2 * hv], dim=-1)
    conv_w, neg_a, dt, norm_w = torch.randn(C, K) * 0.5, -torch.rand(hv) * 2, torch.randn(hv), torch.rand(dv) + 0.5
    conv0, ssm0 = torch.randn(S, C, K - 1), torch.randn(S, hv, dk, dv) * 0.3
    slots = torch.randperm(S)[:n]
    fresh = torch.tensor([i % 3 == 1 for i in range(n)])
    seqs = [StateSeq(int(s), i, 1, bool(f)) for i, (s, f) in enumerate(zip(slots, fresh))]
    conv_t, ssm_t = conv0.clone(), ssm0.clone()
    # the kernel computes in float32 whatever its inputs' dtype (the torch path rounds the conv's output to
    # bf16 at bf16): its reference is the float32 path on the same values, its output then rounded once
    want = torch_path(qkv.float(), z.float(), ba.float(), conv_w, conv_t, ssm_t, seqs, neg_a, dt, norm_w, hk, dk,
                      tiled, eps)
    conv_n, ssm_n = conv0.clone(), ssm0.clone()
    got = torch.empty(n, hv * dv, dtype=dtype)
    src = torch.where(fresh, -1, slots)
    assert kernels.gdn_decode(got, qkv, z, ba, conv_w, conv_n, ssm_n, src, slots, neg_a, dt, norm_w, hk, tiled, eps)
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16: one rounding of the output
    assert torch.allclose(got.float(), want, atol=tol, rtol=tol)
    assert torch.allclose(ssm_n, ssm_t, atol=1e-5, rtol=1e-5) and torch.equal(conv_n, conv_t)
    # alone: each sequence's row and state the same bits as in the batch
    for i in range(n):
        conv_1, ssm_1 = conv0.clone(), ssm0.clone()
        one = torch.empty(1, hv * dv, dtype=dtype)
        assert kernels.gdn_decode(one, qkv[i:i + 1], z[i:i + 1], ba[i:i + 1], conv_w, conv_1, ssm_1, src[i:i + 1],
                                  slots[i:i + 1], neg_a, dt, norm_w, hk, tiled, eps)
        assert torch.equal(one[0], got[i]) and torch.equal(ssm_1[slots[i]], ssm_n[slots[i]])


def test_kernel_refuses_what_it_does_not_take():
    hk, hv, dk, dv = 2, 4, 16, 16
    C = 2 * hk * dk + hv * dv
    args = dict(conv_w=torch.zeros(C, 4), conv_pool=torch.zeros(2, C, 3), ssm_pool=torch.zeros(2, hv, dk, dv),
                src_slots=torch.full((1,), -1), dst_slots=torch.zeros(1, dtype=torch.int64), neg_a=torch.zeros(hv),
                dt_bias=torch.zeros(hv), norm_w=torch.ones(dv), num_key_heads=hk, tiled=False, eps=1e-6)
    out = torch.empty(1, hv * dv)
    assert not kernels.gdn_decode(out, torch.zeros(1, C + 1), torch.zeros(1, hv * dv), torch.zeros(1, 2 * hv), **args)
    assert not kernels.gdn_decode(out, torch.zeros(1, C, dtype=torch.float64), torch.zeros(1, hv * dv),
                                  torch.zeros(1, 2 * hv), **args)
    for bad in (dict(src_slots=torch.zeros(1, dtype=torch.int32)), dict(dst_slots=torch.zeros(2, dtype=torch.int64)),
                dict(dst_slots=torch.zeros(1, 1, dtype=torch.int64))):
        assert not kernels.gdn_decode(out, torch.zeros(1, C), torch.zeros(1, hv * dv), torch.zeros(1, 2 * hv),
                                      **{**args, **bad})
    assert kernels.gdn_decode(out, torch.zeros(1, C), torch.zeros(1, hv * dv), torch.zeros(1, 2 * hv), **args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tiled", [False, True])
def test_kernel_reads_src_and_writes_dst(dtype, tiled):
    """src_slots != dst_slots: each row and written state are the bits of the kernel run in place on a pool whose
    dst slot holds a copy of the src state; the src slots are left as they were (two sequences read one of them;
    fresh ones, src -1, read nothing); and the torch path with StateSeq.src agrees (as the test above bounds it)."""
    torch.manual_seed(11 + tiled)
    hk, hv, dk, dv, n = 2, 4, 16, 8, 6
    C, K, S, eps = 2 * hk * dk + hv * dv, 4, 16, 1e-6
    proj = torch.randn(n, C + hv * dv + 2 * hv).to(dtype)
    qkv, z, ba = proj.split([C, hv * dv, 2 * hv], dim=-1)
    conv_w, neg_a, dt, norm_w = torch.randn(C, K) * 0.5, -torch.rand(hv) * 2, torch.randn(hv), torch.rand(dv) + 0.5
    conv0, ssm0 = torch.randn(S, C, K - 1), torch.randn(S, hv, dk, dv) * 0.3
    src = torch.tensor([3, 4, -1, 3, 9, 12])  # 3 read twice; 12 in place; -1 fresh
    dst = torch.tensor([5, 6, 7, 10, 1, 12])
    conv_n, ssm_n = conv0.clone(), ssm0.clone()
    got = torch.empty(n, hv * dv, dtype=dtype)
    assert kernels.gdn_decode(got, qkv, z, ba, conv_w, conv_n, ssm_n, src, dst, neg_a, dt, norm_w, hk, tiled, eps)

    conv_c, ssm_c = conv0.clone(), ssm0.clone()  # in place on copies: dst holds the src state (NaN where fresh)
    for s_, d in zip(src.tolist(), dst.tolist()):
        conv_c[d] = conv0[s_] if s_ >= 0 else float("nan")
        ssm_c[d] = ssm0[s_] if s_ >= 0 else float("nan")
    want = torch.empty(n, hv * dv, dtype=dtype)
    assert kernels.gdn_decode(want, qkv, z, ba, conv_w, conv_c, ssm_c, torch.where(src < 0, -1, dst), dst, neg_a, dt,
                              norm_w, hk, tiled, eps)
    assert torch.equal(got, want) and torch.equal(conv_n[dst], conv_c[dst]) and torch.equal(ssm_n[dst], ssm_c[dst])
    others = [i for i in range(S) if i not in dst.tolist()]  # the src slots 3, 4, 9 among them: unchanged
    assert torch.equal(conv_n[others], conv0[others]) and torch.equal(ssm_n[others], ssm0[others])

    seqs = [StateSeq(d, i, 1, s_ < 0, None if s_ < 0 else s_) for i, (s_, d) in enumerate(zip(src.tolist(),
                                                                                           dst.tolist()))]
    conv_t, ssm_t = conv0.clone(), ssm0.clone()
    ref = torch_path(qkv.float(), z.float(), ba.float(), conv_w, conv_t, ssm_t, seqs, neg_a, dt, norm_w, hk, dk,
                     tiled, eps)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    assert torch.allclose(got.float(), ref, atol=tol, rtol=tol)
    assert torch.allclose(ssm_n, ssm_t, atol=1e-5, rtol=1e-5) and torch.equal(conv_n, conv_t)


# ---------------------------------------------------------------------------------------------------------------
# the layer: GatedDeltaNet.forward takes the kernel for unchained decodes, torch for the rest (chained ones too)
# ---------------------------------------------------------------------------------------------------------------

def small_layer(tiled: bool):
    from types import SimpleNamespace

    from tokenmill.layers.linear import UnquantizedLinearMethod
    from tokenmill.models.qwen3_5 import GatedDeltaNet
    hk, hv, dk, dv, d, K = 2, 4, 16, 8, 24, 4
    cfg = SimpleNamespace(hidden_size=d, linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=dk,
                          linear_value_head_dim=dv, linear_conv_dim=2 * hk * dk + hv * dv, linear_value_dim=hv * dv,
                          linear_conv_kernel=K, rms_norm_eps=1e-6, linear_layers=[0], linear_v_heads_tiled=tiled)
    net = GatedDeltaNet(cfg, 0, UnquantizedLinearMethod())  # type: ignore[arg-type]
    for p in net.parameters():
        p.data.normal_(0.0, 0.3)
    net.finish(net.A_log.data, net.dt_bias.data)
    assert net.native is not None
    return net, cfg


@pytest.mark.parametrize("tiled", [False, True])
def test_layer_with_chained_segments_native_equals_torch(tiled):
    """A step of decodes at rows 0..3 (one reading a src slot, one fresh, one that starts a chain) and one sequence
    split into segments [1, 1, 9, 1, 1] chained through fresh slots, beside an independent prompt: with the kernel
    (it takes rows 0..3 only; the chained single-token segments go through torch, after it) the rows and states
    are those of the torch path alone; and the final state is that of the whole sequence in one segment."""
    torch.manual_seed(21 + tiled)
    net, cfg = small_layer(tiled)
    S, T = 16, 4 + 12 + 5
    conv = torch.randn(1, S, cfg.linear_conv_dim, cfg.linear_conv_kernel - 1)
    ssm = torch.randn(1, S, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim) * 0.3
    conv[:, 8:12] = ssm[:, 8:12] = float("nan")  # the chain's slots: any read before their write shows
    seqs = [StateSeq(0, 0, 1, False), StateSeq(1, 1, 1, False, src=5), StateSeq(2, 2, 1, True, src=6),
            StateSeq(8, 3, 1, False, src=7),  # the chain's first segment: a decode reading slot 7, writing 8
            StateSeq(9, 4, 1, False, src=8), StateSeq(10, 5, 9, False, src=9), StateSeq(11, 14, 1, False, src=10),
            StateSeq(3, 15, 1, False, src=11),  # the chain goes on into slot 3 (its last segment, length 1)
            StateSeq(4, 16, 5, True)]
    h = torch.randn(T, cfg.hidden_size)
    from tokenmill.layers.gated_delta import RecurrentStep

    def run(native: bool, seqs_, conv_, ssm_):
        saved = net.native
        net.native = saved if native else None
        try:
            return net(h, RecurrentStep(seqs_, conv_, ssm_))
        finally:
            net.native = saved

    c_n, s_n, c_t, s_t = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    got, want = run(True, seqs, c_n, s_n), run(False, seqs, c_t, s_t)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s_n, s_t, rtol=1e-4, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(c_n, c_t, rtol=0, atol=0, equal_nan=True)
    for x in (c_n, s_n):
        assert x[0, [3, 8, 9, 10, 11]].isfinite().all()
        assert torch.equal(x[0, [5, 6, 7, 12]], (conv if x is c_n else ssm)[0, [5, 6, 7, 12]])  # src slots kept
    # the chain (rows 3..15, 13 tokens) as one segment from slot 7 into slot 3, native on
    c_w, s_w = conv.clone(), ssm.clone()
    whole = run(True, [StateSeq(0, 0, 1, False), StateSeq(3, 3, 13, False, src=7)], c_w, s_w)
    torch.testing.assert_close(got[3:16], whole[3:16], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s_n[0, 3], s_w[0, 3], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c_n[0, 3], c_w[0, 3], rtol=0, atol=0)
