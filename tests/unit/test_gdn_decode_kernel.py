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
    assert kernels.gdn_decode(got, qkv, z, ba, conv_w, conv_n, ssm_n, slots, fresh, neg_a, dt, norm_w, hk, tiled, eps)
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16: one rounding of the output
    assert torch.allclose(got.float(), want, atol=tol, rtol=tol)
    assert torch.allclose(ssm_n, ssm_t, atol=1e-5, rtol=1e-5) and torch.equal(conv_n, conv_t)
    # alone: each sequence's row and state the same bits as in the batch
    for i in range(n):
        conv_1, ssm_1 = conv0.clone(), ssm0.clone()
        one = torch.empty(1, hv * dv, dtype=dtype)
        assert kernels.gdn_decode(one, qkv[i:i + 1], z[i:i + 1], ba[i:i + 1], conv_w, conv_1, ssm_1, slots[i:i + 1],
                                  fresh[i:i + 1], neg_a, dt, norm_w, hk, tiled, eps)
        assert torch.equal(one[0], got[i]) and torch.equal(ssm_1[slots[i]], ssm_n[slots[i]])


def test_kernel_refuses_what_it_does_not_take():
    hk, hv, dk, dv = 2, 4, 16, 16
    C = 2 * hk * dk + hv * dv
    args = dict(conv_w=torch.zeros(C, 4), conv_pool=torch.zeros(2, C, 3), ssm_pool=torch.zeros(2, hv, dk, dv),
                slots=torch.zeros(1, dtype=torch.int64), fresh=torch.ones(1, dtype=torch.bool), neg_a=torch.zeros(hv),
                dt_bias=torch.zeros(hv), norm_w=torch.ones(dv), num_key_heads=hk, tiled=False, eps=1e-6)
    out = torch.empty(1, hv * dv)
    assert not kernels.gdn_decode(out, torch.zeros(1, C + 1), torch.zeros(1, hv * dv), torch.zeros(1, 2 * hv), **args)
    assert not kernels.gdn_decode(out, torch.zeros(1, C, dtype=torch.float64), torch.zeros(1, hv * dv),
                                  torch.zeros(1, 2 * hv), **args)
    assert kernels.gdn_decode(out, torch.zeros(1, C), torch.zeros(1, hv * dv), torch.zeros(1, 2 * hv), **args)
