"""The Mamba2 selective scan (SSD; the recurrent layers of IBM's Granite 4.0-H) over a step's flat token axis.

A step's tokens lie on one axis of T rows holding several sequences back to back (gated_delta.StateSeq: rows
[q_start, q_start + q_len)); each sequence's state lives in a slot of the state pool (S, H, P, N) float32: per
head h, the (head_dim P, d_state N) matrix transformers' Mamba2 cache keeps (ModelConfig maps it onto the pool's
(Hv, dk, dv): Hv = heads, dk = head_dim, dv = d_state). Slots, src / dst and chaining are gated_delta.py's (its
module docstring): a seq reads its initial state from `read_slot` (zeros when fresh) and writes its final state
to `slot`, leaving a different src unchanged; a seq chained on an earlier one runs after it.

Per token t of a sequence, per head h of group g = h // (H / G) (transformers' repeat_interleave of B and C):
    dt = softplus(dt_raw + dt_bias)          (H,)
    S  = exp(dt A) S + (dt x) B^T             S (P, N), x (P,), B (N,) the group's; A = -exp(A_log) < 0
    y  = S C + D x                            C (N,) the group's, D the skip
(transformers' mamba2_selective_state_update / mamba2_chunk_scan; its dt clamp to time_step_limit (0, inf) is a
no-op after softplus, and other limits are refused at config load.)

Paths, as gated_delta's: every unchained single-token seq (decodes) in one batched update (their read slots
gathered, updated, written to their write slots; in place through a view where they are the same consecutive
slots); every other one, one sequence at a time in list order, in the chunked form: chunks of `chunk_size`
tokens, in each with a_t = dt_t A and its running sum G_t from the chunk's start,
    Y = ((C B^T) * L) (dt X) + exp(G) (C S0^T)          L_ts = exp(G_t - G_s) for s <= t, else 0
    S = exp(G_end) S0 + sum_s exp(G_end - G_s) (dt_s x_s) B_s^T
so memory stays O(chunk) whatever the length. B and C stay per group, shared by the group's heads through
broadcasting views (never repeated). Every exp is of a value <= 0: nothing overflows. Arithmetic in float32;
outputs cast to x's dtype once; no host syncs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmill.layers.gated_delta import StateSeq, _copy_state, _output, _put, _Singles, _split, _take


def mamba2_scan(x: Tensor, dt: Tensor, B: Tensor, C: Tensor, A: Tensor, D: Tensor, dt_bias: Tensor, state: Tensor,
                seqs: list[StateSeq], chunk_size: int = 128) -> Tensor:
    """x (T, H, P) the conv's output for the heads; dt (T, H) before dt_bias and softplus; B, C (T, G, N); A (H,)
    = -exp(A_log); D, dt_bias (H,); state (S, H, P, N) float32 pool: every seq reads its read slot and writes its
    slot. Returns y (T, H, P) in x's dtype, the D skip included (rows of no seq: zeros)."""
    T, H, P = x.shape
    G, N = B.shape[1:]
    if (dt.shape != (T, H) or B.shape != (T, G, N) or C.shape != B.shape or H % G or A.shape != (H,)
            or D.shape != (H,) or dt_bias.shape != (H,) or state.shape[1:] != (H, P, N)):
        raise ValueError(f"mamba2_scan: x {tuple(x.shape)}, dt {tuple(dt.shape)}, B {tuple(B.shape)}, "
                         f"C {tuple(C.shape)}, A {tuple(A.shape)}, state {tuple(state.shape)}")
    if state.dtype != torch.float32:
        raise ValueError(f"mamba2_scan: the state pool must be float32, not {state.dtype}")
    r = H // G
    xf = x.float().unflatten(1, (G, r))  # (T, G, r, P)
    dtf = F.softplus(dt.float() + dt_bias.float()).unflatten(1, (G, r))  # (T, G, r)
    Af = A.float().view(G, r)
    Df = D.float().view(G, r, 1)
    Bf, Cf = B.float(), C.float()  # (T, G, N)
    out = _output(x, (T, H, P), seqs, x.dtype)
    singles, loop = _split(seqs)

    if singles:
        ix = _Singles(singles, x.device)
        rows = ix.rows
        s = ix.initial(state)  # (n, H, P, N): a copy, or (in place) a view updated there
        xs, dts = _take(xf, rows), _take(dtf, rows)  # (n, G, r, P), (n, G, r)
        s5 = s.unflatten(1, (G, r))  # (n, G, r, P, N)
        decay = (dts * Af).exp()[..., None, None]  # (n, G, r, 1, 1)
        dbx = (dts[..., None] * xs).unsqueeze(-1) * _take(Bf, rows)[:, :, None, None, :]  # (n, G, r, P, N)
        s5.mul_(decay).add_(dbx)
        y = (s5 @ _take(Cf, rows)[:, :, None, :, None]).squeeze(-1) + Df * xs  # (n, G, r, P)
        _put(out, rows, y.flatten(1, 2).to(out.dtype))
        _put(state, ix.dst, s)

    for seq in loop:  # in list order: a chained seq after the seq it reads from
        if seq.q_len == 0:
            _copy_state(state, seq)
            continue
        r0, r1 = seq.q_start, seq.q_start + seq.q_len
        # the state before the seq (H, P, N): a view of the read slot, which _chunked does not modify
        s0 = state.new_zeros(H, P, N) if seq.fresh else state[seq.read_slot]
        state[seq.slot] = _chunked(xf[r0:r1], dtf[r0:r1], Bf[r0:r1], Cf[r0:r1], Af, Df, s0.unflatten(0, (G, r)),
                                   chunk_size, out[r0:r1])
    return out


def _chunked(x: Tensor, dt: Tensor, B: Tensor, C: Tensor, A: Tensor, D: Tensor, s: Tensor, chunk_size: int,
             out: Tensor) -> Tensor:
    """One sequence of L tokens, c at a time: x (L, G, r, P), dt (L, G, r) after softplus, B, C (L, G, N), A (G, r),
    D (G, r, 1), s (G, r, P, N) the state before it (not modified); writes y into out (L, H, P); returns the state
    after it (H, P, N)."""
    L = x.shape[0]
    c = min(chunk_size, L)
    later = torch.ones(c, c, dtype=torch.bool, device=x.device).triu(1)  # s > t: masked out of the decay
    for t0 in range(0, L, c):
        n = min(c, L - t0)
        rows = slice(t0, t0 + n)
        xc = x[rows].permute(1, 2, 0, 3)  # (G, r, n, P)
        a = (dt[rows] * A).permute(1, 2, 0)  # (G, r, n) log-decay per token
        Gc = a.cumsum(-1)
        xdt = xc * dt[rows].permute(1, 2, 0).unsqueeze(-1)  # (G, r, n, P)
        Bc, Cc = B[rows].transpose(0, 1), C[rows].transpose(0, 1)  # (G, n, N)
        decay = (Gc.unsqueeze(-1) - Gc.unsqueeze(-2)).masked_fill(later[:n, :n], float("-inf")).exp()  # (G, r, n, n)
        cb = (Cc @ Bc.transpose(-1, -2)).unsqueeze(1)  # (G, 1, n, n): C_t . B_s, shared by the group's heads
        y = (cb * decay) @ xdt  # (G, r, n, P)
        y = y + Gc.exp().unsqueeze(-1) * (Cc.unsqueeze(1) @ s.transpose(-1, -2))  # + exp(G_t) S0 C_t
        y = y + D.unsqueeze(-1) * xc
        out[rows] = y.permute(2, 0, 1, 3).flatten(1, 2).to(out.dtype)
        G_end = Gc[..., -1:]
        w = (G_end - Gc).exp().unsqueeze(-1)  # (G, r, n, 1)
        s = torch.addcmul((xdt * w).transpose(-1, -2) @ Bc.unsqueeze(1), s, G_end.exp().unsqueeze(-1))
    return s.flatten(0, 1)


def gated_rms_norm(y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float) -> Tensor:
    """Mamba2's gated norm (transformers' GraniteMoeHybridRMSNormGated, norm_before_gate False): y (T, I) the scan's
    output, z (T, I) the gate -> weight * rmsnorm(y * silu(z)) over each of `groups` groups of I / groups channels,
    in float32, then cast to z's dtype (the reference's order: normed, cast, times the weight)."""
    T, I = y.shape
    h = y.float() * F.silu(z.float())
    hg = h.view(T, groups, I // groups)
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * hg.view(T, I).to(z.dtype)).to(z.dtype)
