"""Gated DeltaNet ops (the linear-attention layers of Qwen3.5 / Qwen3-Next) over a step's flat token axis.

A step's tokens lie on one axis of T rows holding several sequences back to back (`StateSeq`: rows
[q_start, q_start + q_len)). Each sequence's state lives in slots of two state pools:

- conv pool (S, C, K-1): the last K-1 inputs of the depthwise causal conv (older first, zeros before the
  sequence's start). transformers' cache keeps K columns; the oldest never reaches an output, so K-1 suffice.
- recurrent pool (S, Hv, dk, dv) float32: the delta-rule memory, read as o_t = S_t^T q_t.

Source and destination: a seq reads its initial state from slot `read_slot` (`src`, or `slot` when src is None;
zeros when fresh, src then not read) and writes its final state to slot `slot`; in place when they are equal, and
when they differ the src slot is left unchanged (a snapshot of a prefix's state stays there). Chaining: a seq
whose read slot is the write slot of an EARLIER seq of the list (and that is not fresh) is chained on it and sees
that seq's written state, so one sequence's tokens may be split within a step into consecutive segments
(segment 1 writes slot A, segment 2 reads A and writes B, ...).

Per token t of a sequence (reference: transformers' torch_recurrent_gated_delta_rule, use_qk_l2norm_in_kernel):
    q = l2norm(q) * dk**-0.5,  k = l2norm(k),  l2norm(x) = x * rsqrt(sum(x^2) + 1e-6)
    S = exp(g) * S;  S = S + k (beta * (v - S^T k))^T;  o = S^T q

Paths: every unchained single-token sequence (decodes) goes through one batched update first (index_select their
read slots, update, index_copy into their write slots; in place, through a view, where read slots == write slots
and are consecutive); then every other one (longer ones, and chained ones whatever their length), one sequence at a
time in list order, through the chunked form: a scan over chunks of `chunk_size` tokens, each a few matmuls and one
triangular solve (the UT transform), so memory stays O(chunk) whatever the length. Query/key heads are shared with
value heads through broadcasting views, never repeated. Invariants the caller keeps: the seqs' row ranges do not
overlap and lie inside [0, T); no two seqs write the same slot; a slot one seq writes is read by no other seq but
LATER ones chained on it (so no seq reads a slot a later seq writes, and running the unchained decodes first
changes nothing). An empty seq (q_len 0) whose read slot is not its write slot copies its state over (zeros
when fresh); an empty in-place one is skipped. Rows not covered by a seq come back as zeros. Arithmetic is
float32 throughout (conv included); outputs are cast to the input's dtype once. No host syncs: CPU and CUDA run
the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

L2NORM_EPS = 1e-6  # inside the rsqrt, as in FLA / transformers (not F.normalize's clamp of the norm)


@dataclass
class StateSeq:
    """One sequence's tokens in a step: rows [q_start, q_start + q_len) of the step's token axis; its state read
    from pool slot `read_slot` (src, or `slot` when src is None: in place) and written, after its rows, to `slot`;
    fresh: the sequence starts here (position 0), so its state starts at zero (src, or the slot, is not read)."""
    slot: int  # the slot this sequence's state is written to after its rows
    q_start: int
    q_len: int
    fresh: bool
    src: int | None = None  # the slot its state is read from; None: `slot`

    @property
    def read_slot(self) -> int:
        return self.slot if self.src is None else self.src


@dataclass
class RecurrentStep:
    """A step's recurrent states as the model's Gated DeltaNet layers see them: the step's seqs and the pools of all
    such layers, conv (n_layers, S, C, K-1) and ssm (n_layers, S, Hv, dk, dv) float32; layer j uses conv[j], ssm[j]."""
    seqs: list[StateSeq]
    conv: Tensor
    ssm: Tensor


def chained(seqs: list[StateSeq]) -> list[bool]:
    """Per seq: whether it reads (not fresh) the slot that an earlier seq of the list writes, so it must run after
    that one, never in a batch with it."""
    written: set[int] = set()
    out = []
    for s in seqs:
        out.append(not s.fresh and s.read_slot in written)
        written.add(s.slot)
    return out


def leading_decodes(seqs: list[StateSeq]) -> list[StateSeq]:
    """The seqs a native decode kernel takes: single-token ones not chained on an earlier seq, when they lead the
    step at rows 0..n-1 (decodes come first in a step); [] otherwise. The rest may be chained on them, so the kernel
    runs before the torch path takes the others."""
    decodes = [s for s, c in zip(seqs, chained(seqs)) if s.q_len == 1 and not c]
    return decodes if [s.q_start for s in decodes] == list(range(len(decodes))) else []


def slot_tensors(decodes: list[StateSeq]) -> tuple[Tensor, Tensor]:
    """A native decode kernel's slots, (n,) int64 CPU tensors each: the read slot (-1: fresh, a zero state) and the
    write slot of each decode."""
    return (torch.tensor([-1 if s.fresh else s.read_slot for s in decodes], dtype=torch.int64),
            torch.tensor([s.slot for s in decodes], dtype=torch.int64))


def kernel_then_torch(seqs: list[StateSeq], decodes: list[StateSeq], out: Tensor,
                      torch_path: Callable[[list[StateSeq]], Tensor]) -> Tensor:
    """A recurrent layer's mixed output (T, W) when a native kernel wrote `out[:n]` for the n `decodes` (rows
    0..n-1, leading_decodes'; none: it took nothing): torch_path(seqs) (T, W) computes the others (rows past them,
    other rows zeros), and the kernel's rows go in."""
    n = len(decodes)
    if n == 0:
        return torch_path(seqs) if seqs else out
    taken = {id(s) for s in decodes}
    rest = [s for s in seqs if id(s) not in taken]
    if not rest:
        return out
    mixed = torch_path(rest)
    mixed[:n] = out[:n]
    return mixed


def _split(seqs: list[StateSeq]) -> tuple[list[StateSeq], list[StateSeq]]:
    """(unchained single-token seqs: the batched path; the others, in list order: the per-sequence path). Empty
    seqs go to the second list, where one whose read slot is not its write slot copies its state over."""
    singles: list[StateSeq] = []
    loop: list[StateSeq] = []
    for s, c in zip(seqs, chained(seqs)):
        if s.q_len == 1 and not c:
            singles.append(s)
        elif s.q_len > 1 or c or s.read_slot != s.slot:
            loop.append(s)
    return singles, loop


Index = Tensor | slice  # rows or slots: an index tensor, or a slice where they are consecutive (no copies)


class _Singles:
    """The batched path's indices for N single-token seqs: rows, read and write slots, each (N,) or a slice (decodes
    lead the step at rows 0..N-1, and a small batch often holds consecutive slots); fresh (N,) bool or None when
    no seq is fresh. `in_place`: every seq reads the slot it writes, so the state is taken as a view of the pool
    where the slots are consecutive, updated there, and the write-back is a no-op."""

    def __init__(self, singles: list[StateSeq], device: torch.device) -> None:
        reads, writes = [s.read_slot for s in singles], [s.slot for s in singles]
        self.rows: Index = _consecutive([s.q_start for s in singles], device)
        self.in_place = reads == writes
        self.dst: Index = _consecutive(writes, device)
        self.src: Index = self.dst if self.in_place else _consecutive(reads, device)
        self.fresh = None
        if any(s.fresh for s in singles):
            self.fresh = torch.tensor([s.fresh for s in singles], dtype=torch.bool, device=device)

    def read(self, pool: Tensor) -> Tensor:
        """(N, ...) the seqs' states: a view into the pool when in place over consecutive slots, else a copy (so
        updating it never touches a src slot)."""
        if self.in_place:
            return _take(pool, self.src)
        return pool[self.src].clone() if isinstance(self.src, slice) else pool.index_select(0, self.src)

    def initial(self, pool: Tensor) -> Tensor:
        """`read`, with the fresh seqs' states zeroed (in the pool too when it is a view: they start there)."""
        s = self.read(pool)
        if self.fresh is not None:
            s.masked_fill_(self.fresh.view(-1, *[1] * (s.dim() - 1)), 0.0)
        return s


def _consecutive(idx: list[int], device: torch.device) -> Index:
    if idx == list(range(idx[0], idx[0] + len(idx))):
        return slice(idx[0], idx[0] + len(idx))
    return torch.tensor(idx, dtype=torch.long, device=device)


def _take(x: Tensor, idx: Index) -> Tensor:
    """x's rows idx: a view for a slice, a copy for an index tensor."""
    return x[idx] if isinstance(idx, slice) else x.index_select(0, idx)


def _put(x: Tensor, idx: Index, src: Tensor) -> None:
    """x's rows idx = src (a no-op where src is already that view of x)."""
    if isinstance(idx, slice):
        if src.data_ptr() != x[idx].data_ptr():
            x[idx] = src
    else:
        x.index_copy_(0, idx, src)


def _copy_state(pool: Tensor, s: StateSeq) -> None:
    """An empty seq: its write slot gets its initial state (the read slot's, or zeros when fresh)."""
    if s.fresh:
        pool[s.slot] = 0.0
    else:
        pool[s.slot] = pool[s.read_slot]


def _output(like: Tensor, shape: tuple[int, ...], seqs: list[StateSeq], dtype: torch.dtype) -> Tensor:
    """The step's output buffer: zeros unless the seqs cover every row (they never overlap, so q_lens summing to T
    means all rows are written)."""
    full = sum(s.q_len for s in seqs) == shape[0]
    return (like.new_empty if full else like.new_zeros)(shape, dtype=dtype)


# ---------------------------------------------------------------------------------------------------------------
# depthwise causal conv1d (+ SiLU)
# ---------------------------------------------------------------------------------------------------------------

def causal_conv1d(x: Tensor, weight: Tensor, state: Tensor, seqs: list[StateSeq], activation: bool = True,
                  bias: Tensor | None = None) -> Tensor:
    """x (T, C) the step's inputs; weight (C, K) a depthwise kernel; state (S, C, K-1) the pool, each slot holding its
    sequence's last K-1 inputs (older first; zeros before the sequence's start): every seq reads its read slot and
    writes its slot (the module docstring's src/dst and chaining); bias (C,) added to the conv (Mamba2's), or none.
    Returns SiLU(conv) (T, C) in x's dtype, or the conv itself without `activation` (LFM2's short conv). Rows of x
    not covered by any seq are returned as zeros."""
    T, C = x.shape
    K = weight.shape[1]
    if weight.shape != (C, K) or state.shape[1:] != (C, K - 1):
        raise ValueError(f"causal_conv1d: x {tuple(x.shape)}, weight {tuple(weight.shape)}, state {tuple(state.shape)}")
    w = weight.float()
    b = None if bias is None else bias.float()
    out = _output(x, (T, C), seqs, x.dtype)
    singles, loop = _split(seqs)

    if singles:  # one window per seq: (N, C, K) = [its K-1 saved inputs, the new one]
        ix = _Singles(singles, x.device)
        # (N, C, K-1): a copy, or (in place) a view into the pool, whose fresh slots are then rightly zeroed
        prev = ix.initial(state).float()  # (N, C, K-1): a copy, or (in place) a view into the pool
        window = torch.cat([prev, _take(x, ix.rows).float().unsqueeze(-1)], dim=-1)
        y1 = (window * w).sum(-1)
        if b is not None:
            y1 = y1 + b
        _put(out, ix.rows, (F.silu(y1) if activation else y1).to(out.dtype))
        _put(state, ix.dst, window[..., 1:].to(state.dtype))

    wt = w.t()  # (K, C): tap j multiplies the input K-1-j rows back
    for s in loop:  # in list order: a chained seq after the seq it reads from
        n, r0 = s.q_len, s.q_start
        if n == 0:
            _copy_state(state, s)
            continue
        xs = x.new_empty(K - 1 + n, C, dtype=torch.float32)  # (K-1+L, C): left context, then the seq's inputs
        if s.fresh:
            xs[:K - 1] = 0.0
        else:
            xs[:K - 1] = state[s.read_slot].t()
        xs[K - 1:] = x[r0:r0 + n]
        y = xs[:n] * wt[0]
        for j in range(1, K):
            y.addcmul_(xs[j:j + n], wt[j])
        if b is not None:
            y += b
        out[r0:r0 + n] = F.silu(y, inplace=True) if activation else y
        state[s.slot] = xs[n:].t()  # the last K-1 rows (xs[-(K-1):] would take all of them when K == 1)
    return out


# ---------------------------------------------------------------------------------------------------------------
# gated delta rule
# ---------------------------------------------------------------------------------------------------------------

def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


@dataclass(frozen=True)
class _Heads:
    """How Hv = r * Hk value heads share the Hk query/key heads, as views: a value-head axis splits into two axes,
    (Hk, r) when grouped (head j = h * r + i reads key head h) or (r, Hk) when tiled (j = i * Hk + h reads h), and a
    key-head axis gets a size-1 axis in r's place, so key tensors broadcast against value tensors without copies."""
    hk: int
    r: int
    tiled: bool

    def v(self, x: Tensor, dim: int) -> Tensor:
        return x.unflatten(dim, (self.r, self.hk) if self.tiled else (self.hk, self.r))

    def k(self, x: Tensor, dim: int) -> Tensor:
        return x.unsqueeze(dim if self.tiled else dim + 1)


def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, seqs: list[StateSeq],
                     v_heads_tiled: bool = False, chunk_size: int = 64) -> Tensor:
    """q, k (T, Hk, dk), v (T, Hv, dv), g (T, Hv) log-decay (<= 0), beta (T, Hv); state (S, Hv, dk, dv) float32 pool:
    every seq reads its read slot and writes its slot (the module docstring's src/dst and chaining). q and k are
    l2-normalized (eps 1e-6) and q scaled by dk**-0.5 inside. Value head j reads query/key head j // (Hv // Hk)
    (grouped, transformers' layout), or j % Hk when v_heads_tiled (llama.cpp's GGUF layout, which permutes value
    heads to tiled order). Returns (T, Hv, dv) in v's dtype. All arithmetic in float32."""
    T, Hk, dk = k.shape
    Hv, dv = v.shape[1:]
    if (q.shape != k.shape or v.shape[0] != T or g.shape != (T, Hv) or beta.shape != (T, Hv)
            or Hv % Hk or state.shape[1:] != (Hv, dk, dv)):
        raise ValueError(f"gated_delta_rule: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}, state {tuple(state.shape)}")
    if state.dtype != torch.float32:
        raise ValueError(f"gated_delta_rule: the state pool must be float32, not {state.dtype}")
    heads = _Heads(Hk, Hv // Hk, v_heads_tiled)
    qn = _l2norm(q.float()) * dk ** -0.5  # (T, Hk, dk)
    kn = _l2norm(k.float())
    vf, gf, bf = v.float(), g.float(), beta.float()
    out = _output(v, (T, Hv, dv), seqs, v.dtype)
    singles, loop = _split(seqs)

    if singles:
        ix = _Singles(singles, v.device)
        rows = ix.rows
        s = ix.initial(state)  # (N, Hv, dk, dv): a copy, or (in place) a view updated there
        o = _recurrent_step(_take(qn, rows), _take(kn, rows), _take(vf, rows), _take(gf, rows), _take(bf, rows), s,
                            heads)
        _put(out, rows, o.to(out.dtype))
        _put(state, ix.dst, s)

    for seq in loop:  # in list order: a chained seq after the seq it reads from
        if seq.q_len == 0:
            _copy_state(state, seq)
            continue
        r0, r1 = seq.q_start, seq.q_start + seq.q_len
        # the state before the seq (Hv, dk, dv): a view of the read slot, which _chunked does not modify
        s0 = state.new_zeros(Hv, dk, dv) if seq.fresh else state[seq.read_slot]
        state[seq.slot] = _chunked(qn[r0:r1], kn[r0:r1], vf[r0:r1], gf[r0:r1], bf[r0:r1], s0, chunk_size, heads,
                                   out[r0:r1])
    return out


def _recurrent_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s: Tensor, heads: _Heads) -> Tensor:
    """One token for each of N sequences: q, k (N, Hk, dk) normalized (q scaled), v (N, Hv, dv), g, beta (N, Hv);
    s (N, Hv, dk, dv) updated in place. Returns o (N, Hv, dv).

    With a = exp(g): S' = a S + k d^T where d = beta (v - a S^T k), and o = S'^T q = a S^T q + (q.k) d, so one
    matmul of the old state gives both reads (S^T k, S^T q), and S' is formed in place."""
    kq = heads.k(torch.stack([k, q], dim=2), 1)  # (N, Hk, 1, 2, dk) grouped / (N, 1, Hk, 2, dk) tiled
    s5 = heads.v(s, 1)  # (N, A, B, dk, dv)
    a = heads.v(g.exp(), 1).unsqueeze(-1)  # (N, A, B, 1)
    read = kq @ s5  # (N, A, B, 2, dv): S^T k, S^T q
    delta = heads.v(beta, 1).unsqueeze(-1) * (heads.v(v, 1) - a * read[..., 0, :])  # (N, A, B, dv)
    o = a * read[..., 1, :] + heads.k((q * k).sum(-1, keepdim=True), 1) * delta
    s5.mul_(a.unsqueeze(-1)).addcmul_(kq[..., 0, :].unsqueeze(-1), delta.unsqueeze(-2))
    return o.flatten(1, 2)


def _chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s: Tensor, chunk_size: int, heads: _Heads,
             out: Tensor) -> Tensor:
    """One sequence of L tokens, c at a time: q, k (L, Hk, dk) normalized (q scaled), v (L, Hv, dv), g, beta (L, Hv),
    s (Hv, dk, dv) the state before it (not modified); writes o into out (L, Hv, dv), returns the state after it.

    Inside a chunk, with G_t = g_1 + ... + g_t (log decay from the chunk's start through t) and D_ts = exp(G_t - G_s)
    for s <= t (0 for s > t), from the state S before the chunk (rows of Q, K, V are tokens):
        (I + strict_tril(diag(beta) K K^T * D)) V' = diag(beta) (V - exp(G) K S)    (V': the delta rule's corrections)
        O = exp(G) Q S + (Q K^T * D) V'
        S = exp(G_c) S + (exp(G_c - G) K)^T V'
    the reference's UT transform, solved per chunk. Every exp is of a value <= 0 (g <= 0): nothing overflows."""
    L = k.shape[0]
    c = min(chunk_size, L)
    later = torch.ones(c, c, dtype=torch.bool, device=v.device).triu(1)  # s > t: masked out of D
    s = heads.v(s, 0)  # (A, B, dk, dv)
    for t0 in range(0, L, c):
        n = min(c, L - t0)
        rows = slice(t0, t0 + n)
        kq = heads.k(torch.cat([k[rows], q[rows]]).transpose(0, 1), 0)  # (Hk, 1, 2n, dk) / (1, Hk, 2n, dk): K; Q
        gram = kq @ kq[..., :n, :].transpose(-1, -2)  # (.., 2n, n): K K^T; Q K^T
        G = heads.v(g[rows].t(), 0).cumsum(-1)  # (A, B, n)
        b = heads.v(beta[rows].t(), 0).unsqueeze(-1)  # (A, B, n, 1)
        D = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(later[:n, :n], float("-inf")).exp()  # (A, B, n, n)
        read = kq @ s  # (A, B, 2n, dv): K S; Q S
        eG = G.exp().unsqueeze(-1)
        rhs = b * (heads.v(v[rows].transpose(0, 1), 0) - eG * read[..., :n, :])
        v_new = torch.linalg.solve_triangular(gram[..., :n, :] * D * b, rhs, upper=False, unitriangular=True)
        o = torch.addcmul((gram[..., n:, :] * D) @ v_new, eG, read[..., n:, :])  # (A, B, n, dv)
        out[rows] = o.flatten(0, 1).transpose(0, 1)
        G_end = G[..., -1:]
        s = torch.addcmul(kq[..., :n, :].transpose(-1, -2) @ ((G_end - G).exp().unsqueeze(-1) * v_new),
                          s, G_end.exp().unsqueeze(-1))
    return s.flatten(0, 1)
