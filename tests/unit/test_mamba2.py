"""tokenmill/layers/mamba2.py against transformers' Granite 4.0-H (GraniteMoeHybrid) reference functions
(mamba2_chunk_scan with initial and final states, mamba2_selective_state_update, GraniteMoeHybridRMSNormGated)
and a naive per-token recurrence, each run per sequence.

A step packs several sequences on one token axis with uncovered rows between them; slots are taken out of order,
fresh sequences' slots hold NaN garbage (which must not leak), untouched slots must not change. Seqs may read one
slot and write another (src), and one sequence may be cut into chained segments within a step. Tolerances (fp32):
the chunked form sums in another order than the token loop.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from transformers.models.granitemoehybrid import modeling_granitemoehybrid as ref  # noqa: E402

from tokenmill.layers.gated_delta import StateSeq  # noqa: E402
from tokenmill.layers.mamba2 import gated_rms_norm, mamba2_scan  # noqa: E402

FP32: dict[str, Any] = dict(rtol=1e-4, atol=1e-5)
H, P, G, N = 4, 8, 2, 16  # heads, head_dim, groups, d_state


def params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return dict(A=-torch.rand(H, generator=g).mul(4).add(0.5), D=torch.randn(H, generator=g),
                dt_bias=torch.randn(H, generator=g) * 0.5)


def inputs(T: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(T, H, P, generator=g), dt=torch.randn(T, H, generator=g),
                B=torch.randn(T, G, N, generator=g), C=torch.randn(T, G, N, generator=g))


def naive(x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, A: torch.Tensor, D: torch.Tensor,
          dt_bias: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence token by token: x (L, H, P), ..., s (H, P, N) -> (y (L, H, P), final state)."""
    s = s.clone()
    r = H // G
    ys = []
    for t in range(x.shape[0]):
        d = F.softplus(dt[t] + dt_bias)  # (H,)
        Bh, Ch = B[t].repeat_interleave(r, 0), C[t].repeat_interleave(r, 0)  # (H, N)
        s = s * torch.exp(d * A)[:, None, None] + (d[:, None] * x[t])[..., None] * Bh[:, None, :]
        ys.append((s @ Ch[..., None]).squeeze(-1) + D[:, None] * x[t])
    return torch.stack(ys), s


def pack(lengths: list[int], slots: list[int], fresh: list[bool], gap: int = 1) -> tuple[list[StateSeq], int]:
    seqs, t = [], 0
    for n, slot, f in zip(lengths, slots, fresh):
        t += gap
        seqs.append(StateSeq(slot=slot, q_start=t, q_len=n, fresh=f))
        t += n
    return seqs, t + gap


def run(seqs: list[StateSeq], T: int, pool: torch.Tensor, chunk: int = 16, seed: int = 1
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    inp, par = inputs(T, seed), params()
    return mamba2_scan(inp["x"], inp["dt"], inp["B"], inp["C"], par["A"], par["D"], par["dt_bias"], pool, seqs,
                       chunk_size=chunk), inp


@pytest.mark.parametrize("lengths", [[1, 1, 1], [5, 1, 40, 1, 17], [33], [1, 64, 2]])
def test_packed_sequences_match_the_naive_recurrence(lengths: list[int]) -> None:
    S = 8
    slots = [6, 1, 4, 0, 3][:len(lengths)]
    fresh = [i % 2 == 0 for i in range(len(lengths))]
    seqs, T = pack(lengths, slots, fresh)
    pool = torch.randn(S, H, P, N)
    for s in seqs:
        if s.fresh:
            pool[s.slot] = float("nan")
    before = pool.clone()
    y, inp = run(seqs, T, pool)
    par = params()
    covered = torch.zeros(T, dtype=torch.bool)
    for s in seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        covered[rows] = True
        s0 = torch.zeros(H, P, N) if s.fresh else before[s.slot]
        want_y, want_s = naive(inp["x"][rows], inp["dt"][rows], inp["B"][rows], inp["C"][rows], **par, s=s0)
        torch.testing.assert_close(y[rows], want_y, **FP32)
        torch.testing.assert_close(pool[s.slot], want_s, **FP32)
    assert not y[~covered].any() and torch.isfinite(y).all()
    for k in set(range(S)) - set(slots):
        assert torch.equal(pool[k], before[k])


def test_chunked_form_matches_transformers_chunk_scan() -> None:
    """One sequence from a non-zero state: transformers' mamba2_chunk_scan (its chunk 32, padded) == ours (16)."""
    L = 45
    seqs, T = pack([L], [2], [False], gap=0)
    pool = torch.randn(4, H, P, N)
    s0 = pool[2].clone()
    y, inp = run(seqs, T, pool)
    par = params()
    want_y, want_s = ref.mamba2_chunk_scan(inp["x"][None], inp["dt"][None], par["A"], inp["B"][None], inp["C"][None],
                                           chunk_size=32, D=par["D"], dt_bias=par["dt_bias"],
                                           initial_states=s0[None], dt_softplus=True, return_final_states=True)
    torch.testing.assert_close(y, want_y[0], **FP32)
    torch.testing.assert_close(pool[2], want_s[0], **FP32)


def test_decodes_match_transformers_state_update() -> None:
    """Single-token seqs batched (out-of-order slots, one fresh) == mamba2_selective_state_update per seq."""
    seqs = [StateSeq(5, 0, 1, False), StateSeq(2, 1, 1, True), StateSeq(3, 2, 1, False)]
    pool = torch.randn(6, H, P, N)
    pool[2] = float("nan")
    before = pool.clone()
    y, inp = run(seqs, 3, pool)
    par = params()
    for s in seqs:
        state = torch.zeros(1, H, P, N) if s.fresh else before[s.slot][None].clone()
        t = s.q_start
        out = ref.mamba2_selective_state_update(
            state, inp["x"][t][None], inp["dt"][t][None, :, None].expand(-1, -1, P),
            par["A"][:, None, None].expand(-1, P, N), inp["B"][t][None], inp["C"][t][None],
            par["D"][:, None].expand(-1, P), dt_bias=par["dt_bias"][:, None].expand(-1, P), dt_softplus=True)
        torch.testing.assert_close(y[t], out[0], **FP32)
        torch.testing.assert_close(pool[s.slot], state[0], **FP32)


@pytest.mark.parametrize("n", [1, 9])
def test_src_slot_is_left_unchanged(n: int) -> None:
    """Reading slot 1 and writing slot 4 == running in place on a copy of slot 1; slot 1 keeps its state."""
    pool = torch.randn(6, H, P, N)
    before = pool.clone()
    y, _ = run([StateSeq(4, 0, n, False, src=1)], n, pool)
    copy = before.clone()
    copy[4] = before[1]
    y2, _ = run([StateSeq(4, 0, n, False)], n, copy)
    assert torch.equal(pool[1], before[1])
    torch.testing.assert_close(y, y2, rtol=0, atol=0)
    torch.testing.assert_close(pool[4], copy[4], rtol=0, atol=0)


@pytest.mark.parametrize("cuts", [[10, 1, 20], [1, 1, 1], [7, 24]])
def test_chained_segments_equal_one_segment(cuts: list[int]) -> None:
    """One sequence cut into chained segments (each writing its own slot, the next reading it), a second sequence
    beside them == the whole sequence in one segment; every segment's slot holds the state at its end."""
    L = sum(cuts)
    whole_pool = torch.randn(8, H, P, N)
    pool = whole_pool.clone()
    y1, inp = run([StateSeq(0, 0, L, False), StateSeq(7, L, 3, True)], L + 3, whole_pool)
    seqs, src, t = [], 0, 0
    for i, n in enumerate(cuts):
        seqs.append(StateSeq(i + 1, t, n, False, src=src))
        src, t = i + 1, t + n
    seqs.append(StateSeq(7, L, 3, True))
    before = pool.clone()
    y2, _ = run(seqs, L + 3, pool)
    torch.testing.assert_close(y2, y1, **FP32)
    torch.testing.assert_close(pool[len(cuts)], whole_pool[0], **FP32)
    torch.testing.assert_close(pool[7], whole_pool[7], **FP32)
    assert torch.equal(pool[0], before[0])  # the first segment's src
    par, t = params(), 0
    for i, n in enumerate(cuts):  # each segment's slot: the state after its tokens
        _, want = naive(inp["x"][:t + n], inp["dt"][:t + n], inp["B"][:t + n], inp["C"][:t + n], **par, s=before[0])
        torch.testing.assert_close(pool[i + 1], want, **FP32)
        t += n


def test_fresh_ignores_the_slot_and_empty_seqs_copy() -> None:
    pool = torch.full((3, H, P, N), float("nan"))
    y, inp = run([StateSeq(0, 0, 5, True)], 5, pool)
    want, s = naive(inp["x"], inp["dt"], inp["B"], inp["C"], **params(), s=torch.zeros(H, P, N))
    torch.testing.assert_close(y, want, **FP32)
    torch.testing.assert_close(pool[0], s, **FP32)
    run([StateSeq(2, 0, 0, False, src=0), StateSeq(1, 0, 0, True, src=0)], 1, pool)
    assert torch.equal(pool[2], pool[0]) and not pool[1].any()


@pytest.mark.parametrize("groups", [1, 2])
def test_gated_norm_matches_transformers(groups: int) -> None:
    I = 32
    norm = ref.GraniteMoeHybridRMSNormGated(I, group_size=I // groups, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    y, z = torch.randn(7, I), torch.randn(7, I)
    torch.testing.assert_close(gated_rms_norm(y, z, norm.weight.detach(), groups, 1e-5), norm(y, z).detach(), **FP32)
