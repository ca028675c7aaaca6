"""tokenmill/layers/gated_delta.py against transformers' Qwen3.5 reference functions (causal_conv1d_update /
causal_conv1d_fn, torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule), each run per sequence.

A step packs several sequences on one token axis, with uncovered rows between them; state slots are taken out
of order, fresh sequences' slots hold NaN garbage (which must not leak), and untouched slots must not change.
Seqs may read one slot and write another (StateSeq.src), and one sequence may be cut into chained segments
within a step: each checked against in-place runs on copies, and against runs that stop at each segment's end.
Tolerances (fp32): the chunked form sums in another order than the token loop, measured errors ~1e-6.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from transformers.models.qwen3_5.modeling_qwen3_5 import (  # noqa: E402
    causal_conv1d_fn,
    causal_conv1d_update,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from tokenmill.layers.gated_delta import StateSeq, causal_conv1d, chained, gated_delta_rule  # noqa: E402

FP32: dict[str, Any] = dict(rtol=1e-4, atol=1e-5)
BF16: dict[str, Any] = dict(rtol=1.6e-2, atol=1.6e-2)  # two bf16 ulps: ours rounds once, at the end


def pack(lengths: list[int], slots: list[int], fresh: list[bool], gap: int = 1) -> tuple[list[StateSeq], int]:
    """Seqs back to back with `gap` uncovered rows before each; returns (seqs, T)."""
    seqs, t = [], 0
    for n, slot, f in zip(lengths, slots, fresh):
        t += gap
        seqs.append(StateSeq(slot=slot, q_start=t, q_len=n, fresh=f))
        t += n
    return seqs, t + gap


def uncovered(seqs: list[StateSeq], T: int) -> torch.Tensor:
    mask = torch.ones(T, dtype=torch.bool)
    for s in seqs:
        mask[s.q_start:s.q_start + s.q_len] = False
    return mask


def untouched(seqs: list[StateSeq], S: int) -> list[int]:
    return sorted(set(range(S)) - {s.slot for s in seqs})


def pool_with_garbage(pool: torch.Tensor, seqs: list[StateSeq]) -> torch.Tensor:
    for s in seqs:
        if s.fresh:
            pool[s.slot] = float("nan")
    return pool


# ---------------------------------------------------------------------------------------------------------------
# conv
# ---------------------------------------------------------------------------------------------------------------

def ref_conv(x: torch.Tensor, w: torch.Tensor, prev: torch.Tensor | None,
             activation: str | None = "silu") -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: x (L, C), prev (C, K-1) or None (fresh) -> (out (L, C), final state (C, K-1))."""
    K = w.shape[1]
    xt = x.t().unsqueeze(0)  # (1, C, L)
    if prev is None:
        out = causal_conv1d_fn(xt, w, None, activation=activation)
        state = F.pad(xt, (K - 1, 0))[0, :, -(K - 1):]
    else:
        st = prev.clone().unsqueeze(0)
        out = causal_conv1d_update(xt, st, w, None, activation=activation)
        state = st[0]
    return out[0].t(), state


def test_conv_mixed_step_matches_reference():
    torch.manual_seed(0)
    C, K, S = 12, 4, 9
    lengths = [1, 3, 70, 1, 2, 1, 3]
    slots = [5, 0, 7, 2, 8, 3, 1]
    fresh = [False, True, False, True, False, False, False]
    seqs, T = pack(lengths, slots, fresh)
    x, w = torch.randn(T, C), torch.randn(C, K)
    pool = pool_with_garbage(torch.randn(S, C, K - 1), seqs)
    before = pool.clone()

    out = causal_conv1d(x, w, pool, seqs)

    assert out.shape == (T, C) and out.dtype == x.dtype
    for s in seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        ref_out, ref_state = ref_conv(x[rows], w, None if s.fresh else before[s.slot])
        torch.testing.assert_close(out[rows], ref_out, **FP32)
        torch.testing.assert_close(pool[s.slot], ref_state, **FP32)
    assert out[uncovered(seqs, T)].eq(0).all()
    keep = untouched(seqs, S)
    assert torch.equal(pool[keep], before[keep])


def test_conv_without_activation_matches_reference():
    """activation=False (LFM2's short conv, K = 3): the bare conv, the same state updates, for decodes and longer
    sequences alike; a control: it differs from the SiLU'd output."""
    torch.manual_seed(2)
    C, K, S = 10, 3, 6
    seqs, T = pack([1, 5, 1, 40, 2], [4, 1, 0, 5, 2], [False, True, True, False, False])
    x, w = torch.randn(T, C), torch.randn(C, K)
    pool = pool_with_garbage(torch.randn(S, C, K - 1), seqs)
    before = pool.clone()

    out = causal_conv1d(x, w, pool, seqs, activation=False)

    for s in seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        ref_out, ref_state = ref_conv(x[rows], w, None if s.fresh else before[s.slot], activation=None)
        torch.testing.assert_close(out[rows], ref_out, **FP32)
        torch.testing.assert_close(pool[s.slot], ref_state, **FP32)
    assert out[uncovered(seqs, T)].eq(0).all()
    silu = causal_conv1d(x, w, pool_with_garbage(before.clone(), seqs), seqs)
    assert (silu - out).abs().max() > 0.1


def test_conv_fresh_short_sequence_pads_state_with_zeros():
    torch.manual_seed(1)
    C, K = 5, 4
    x, w = torch.randn(2, C), torch.randn(C, K)
    pool = torch.full((1, C, K - 1), float("nan"))
    out = causal_conv1d(x, w, pool, [StateSeq(0, 0, 2, True)])
    ref_out, ref_state = ref_conv(x, w, None)
    torch.testing.assert_close(out, ref_out, **FP32)
    torch.testing.assert_close(pool[0], ref_state, **FP32)
    assert pool[0, :, 0].eq(0).all()  # K-1 = 3 > 2 inputs: the oldest column is the zero before the start


# ---------------------------------------------------------------------------------------------------------------
# gated delta rule
# ---------------------------------------------------------------------------------------------------------------

def delta_inputs(T: int, Hk: int, Hv: int, dk: int, dv: int, dtype: torch.dtype = torch.float32):
    q, k = torch.randn(T, Hk, dk, dtype=dtype), torch.randn(T, Hk, dk, dtype=dtype)
    v = torch.randn(T, Hv, dv, dtype=dtype)
    g = -F.softplus(torch.randn(T, Hv) - 1.0)  # log decay <= 0, as the model computes it (float)
    beta = torch.rand(T, Hv).to(dtype)
    return q, k, v, g, beta


def ref_delta(q, k, v, g, beta, s0):
    """One sequence through transformers' token loop: (L, ...) inputs, s0 (Hv, dk, dv) -> (out, final state)."""
    o, s = torch_recurrent_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                            initial_state=s0[None], output_final_state=True,
                                            use_qk_l2norm_in_kernel=True)
    return o[0], s[0]


@pytest.mark.parametrize("chunk_size", [64, 16])
def test_delta_rule_mixed_step_matches_reference(chunk_size):
    torch.manual_seed(2)
    Hk, Hv, dk, dv, S = 2, 4, 16, 8, 8
    lengths = [1, 5, 64, 130, 1, 1]
    slots = [6, 1, 3, 0, 4, 7]
    fresh = [False, True, False, True, True, False]
    seqs, T = pack(lengths, slots, fresh)
    q, k, v, g, beta = delta_inputs(T, Hk, Hv, dk, dv)
    pool = pool_with_garbage(torch.randn(S, Hv, dk, dv) * 0.5, seqs)
    before = pool.clone()

    out = gated_delta_rule(q, k, v, g, beta, pool, seqs, chunk_size=chunk_size)

    assert out.shape == (T, Hv, dv) and out.dtype == torch.float32
    for s in seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        s0 = torch.zeros(Hv, dk, dv) if s.fresh else before[s.slot]
        ref_out, ref_state = ref_delta(q[rows], k[rows], v[rows], g[rows], beta[rows], s0)
        torch.testing.assert_close(out[rows], ref_out, **FP32)
        torch.testing.assert_close(pool[s.slot], ref_state, **FP32)
    assert out[uncovered(seqs, T)].eq(0).all()
    keep = untouched(seqs, S)
    assert torch.equal(pool[keep], before[keep])


def test_delta_rule_long_prompt_matches_reference_chunked():
    """A 300-token prompt (5 chunks, padded) from a nonzero state, against transformers' own chunked form."""
    torch.manual_seed(3)
    Hk, Hv, dk, dv = 2, 4, 16, 8
    q, k, v, g, beta = delta_inputs(300, Hk, Hv, dk, dv)
    s0 = torch.randn(Hv, dk, dv)
    pool = s0.clone().unsqueeze(0)
    out = gated_delta_rule(q, k, v, g, beta, pool, [StateSeq(0, 0, 300, False)])
    ref_out, ref_state = torch_chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                                      initial_state=s0[None], output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, ref_out[0], **FP32)
    torch.testing.assert_close(pool[0], ref_state[0], **FP32)


def test_split_across_calls_equals_one_call():
    """A 100-token sequence fed in pieces of 1, 7 and 33 tokens over several steps == the whole of it in one step
    (conv and delta rule alike); each step also carries another sequence in a neighbouring slot."""
    torch.manual_seed(4)
    Hk, Hv, dk, dv, C, K = 2, 4, 16, 8, 6, 4
    L = 100
    q, k, v, g, beta = delta_inputs(L, Hk, Hv, dk, dv)
    x, w = torch.randn(L, C), torch.randn(C, K)

    whole_pool, whole_conv = torch.zeros(1, Hv, dk, dv), torch.zeros(1, C, K - 1)
    whole = gated_delta_rule(q, k, v, g, beta, whole_pool, [StateSeq(0, 0, L, True)])
    whole_x = causal_conv1d(x, w, whole_conv, [StateSeq(0, 0, L, True)])

    pool = torch.full((2, Hv, dk, dv), float("nan"))
    conv_pool = torch.full((2, C, K - 1), float("nan"))
    outs, xs, t = [], [], 0
    for n in [1, 7, 33, 1, 1, 33, 7, 17]:
        other = 3  # a neighbour's tokens first, in slot 1
        q2, k2, v2, g2, b2 = delta_inputs(other, Hk, Hv, dk, dv)
        seqs = [StateSeq(1, 0, other, True), StateSeq(0, other, n, t == 0)]
        cat = lambda a, b: torch.cat([a, b[t:t + n]])  # noqa: E731
        outs.append(gated_delta_rule(cat(q2, q), cat(k2, k), cat(v2, v), cat(g2, g), cat(b2, beta), pool, seqs)[other:])
        xs.append(causal_conv1d(cat(torch.randn(other, C), x), w, conv_pool, seqs)[other:])
        t += n
    assert t == L
    torch.testing.assert_close(torch.cat(outs), whole, **FP32)
    torch.testing.assert_close(pool[0], whole_pool[0], **FP32)
    torch.testing.assert_close(torch.cat(xs), whole_x, **FP32)
    torch.testing.assert_close(conv_pool[0], whole_conv[0], **FP32)


def test_tiled_value_heads_are_a_permutation_of_grouped():
    """llama.cpp's layout: value head p = i * Hk + h (tiled) is grouped head h * r + i; permuting v, g, beta and
    the state to tiled order and passing v_heads_tiled gives the grouped results, permuted the same way."""
    torch.manual_seed(5)
    Hk, Hv, dk, dv, S = 2, 6, 16, 8, 3
    r = Hv // Hk
    perm = [h * r + i for i, h in (divmod(p, Hk) for p in range(Hv))]
    seqs, T = pack([1, 40, 1], [2, 0, 1], [False, False, True])
    q, k, v, g, beta = delta_inputs(T, Hk, Hv, dk, dv)
    pool = torch.randn(S, Hv, dk, dv)
    tiled_pool = pool[:, perm].clone()

    grouped = gated_delta_rule(q, k, v, g, beta, pool, seqs)
    tiled = gated_delta_rule(q, k, v[:, perm], g[:, perm], beta[:, perm], tiled_pool, seqs, v_heads_tiled=True)

    torch.testing.assert_close(tiled, grouped[:, perm], **FP32)
    torch.testing.assert_close(tiled_pool, pool[:, perm], **FP32)
    # control: the layouts really differ (reading the tiled inputs as grouped gives something else)
    wrong = gated_delta_rule(q, k, v[:, perm], g[:, perm], beta[:, perm], pool[:, perm].clone(), seqs)
    assert not torch.allclose(wrong, grouped[:, perm], atol=1e-3)


def test_continued_state_is_read_and_fresh_ignores_it():
    """Control: the same tokens from a nonzero slot give other outputs when continued (fresh=False) than when fresh,
    for decodes and prompts alike, in both ops."""
    torch.manual_seed(6)
    Hk, Hv, dk, dv, C, K = 1, 2, 8, 4, 5, 4
    seqs_cont, T = pack([1, 9], [0, 1], [False, False], gap=0)
    seqs_fresh = [StateSeq(s.slot, s.q_start, s.q_len, True) for s in seqs_cont]
    q, k, v, g, beta = delta_inputs(T, Hk, Hv, dk, dv)
    x, w = torch.randn(T, C), torch.randn(C, K)
    pool, conv_pool = torch.randn(2, Hv, dk, dv), torch.randn(2, C, K - 1)

    cont = gated_delta_rule(q, k, v, g, beta, pool.clone(), seqs_cont)
    fresh = gated_delta_rule(q, k, v, g, beta, pool.clone(), seqs_fresh)
    zero = gated_delta_rule(q, k, v, g, beta, torch.zeros_like(pool), seqs_cont)
    conv_cont = causal_conv1d(x, w, conv_pool.clone(), seqs_cont)
    conv_fresh = causal_conv1d(x, w, conv_pool.clone(), seqs_fresh)

    for s in seqs_cont:
        rows = slice(s.q_start, s.q_start + s.q_len)
        assert (cont[rows] - fresh[rows]).abs().max() > 1e-3
        assert (conv_cont[s.q_start] - conv_fresh[s.q_start]).abs().max() > 1e-3  # the first token sees the state
    torch.testing.assert_close(fresh, zero, rtol=0, atol=0)  # fresh == continuing from an all-zero state


def test_bf16_inputs():
    torch.manual_seed(7)
    Hk, Hv, dk, dv, S, C, K = 2, 4, 16, 8, 4, 10, 4
    seqs, T = pack([1, 70, 1, 4], [3, 0, 1, 2], [False, True, True, False])
    q, k, v, g, beta = delta_inputs(T, Hk, Hv, dk, dv, dtype=torch.bfloat16)
    pool = torch.randn(S, Hv, dk, dv)
    pool32 = pool.clone()
    out = gated_delta_rule(q, k, v, g, beta, pool, seqs)
    out32 = gated_delta_rule(q.float(), k.float(), v.float(), g, beta.float(), pool32, seqs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), out32, **BF16)
    torch.testing.assert_close(pool, pool32, rtol=0, atol=0)  # the state never left fp32

    x, w = torch.randn(T, C, dtype=torch.bfloat16), torch.randn(C, K, dtype=torch.bfloat16)
    conv_pool = torch.randn(S, C, K - 1, dtype=torch.bfloat16)
    conv_before = conv_pool.clone()
    conv_pool32 = conv_pool.float()
    y = causal_conv1d(x, w, conv_pool, seqs)
    y32 = causal_conv1d(x.float(), w.float(), conv_pool32, seqs)
    assert y.dtype == torch.bfloat16 and conv_pool.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y32, **BF16)
    torch.testing.assert_close(conv_pool.float(), conv_pool32, rtol=0, atol=0)  # it holds bf16 inputs exactly
    for s in seqs:  # and against transformers run in bf16 (it convolves in the weight's dtype)
        rows = slice(s.q_start, s.q_start + s.q_len)
        ref, _ = ref_conv(x[rows], w, None if s.fresh else conv_before[s.slot])
        assert ref.dtype == torch.bfloat16
        torch.testing.assert_close(y[rows].float(), ref.float(), **BF16)


def test_consecutive_slots_in_place_equal_gathered_slots():
    """Decodes in consecutive slots (rows 0..N-1) are updated in place; the same decodes scattered over the pool
    (gathered and written back) give the same outputs and states, fresh ones included."""
    torch.manual_seed(3)
    N, Hk, Hv, dk, dv, C, K = 4, 2, 4, 16, 8, 24, 4
    q, k, v, g, beta = delta_inputs(N, Hk, Hv, dk, dv)
    x, w = torch.randn(N, C), torch.randn(C, K)
    fresh = [False, True, False, False]
    results = []
    for slots in ([2, 3, 4, 5], [5, 0, 3, 1]):
        seqs = [StateSeq(s, i, 1, f) for i, (s, f) in enumerate(zip(slots, fresh))]
        torch.manual_seed(4)  # the same pools (garbage in the other slots) and per-sequence states either way
        ssm, conv = torch.randn(6, Hv, dk, dv), torch.randn(6, C, K - 1)
        base_ssm, base_conv = torch.randn(N, Hv, dk, dv), torch.randn(N, C, K - 1)
        for i, s in enumerate(slots):
            ssm[s], conv[s] = base_ssm[i], base_conv[i]
        o = gated_delta_rule(q, k, v, g, beta, ssm, seqs)
        y = causal_conv1d(x, w, conv, seqs)
        results.append((o, y, torch.stack([ssm[s] for s in slots]), torch.stack([conv[s] for s in slots])))
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------------------
# src / dst slots and chained segments
# ---------------------------------------------------------------------------------------------------------------

NAN_EQ: dict[str, Any] = dict(rtol=0, atol=0, equal_nan=True)


def in_place_copy(pool: torch.Tensor, seqs: list[StateSeq]) -> tuple[torch.Tensor, list[StateSeq]]:
    """The same step done in place: a copy of the pool whose write slots hold the read slots' states (NaN when
    fresh), and the seqs without src."""
    ref = pool.clone()
    for s in seqs:
        ref[s.slot] = float("nan") if s.fresh else pool[s.read_slot]
    return ref, [StateSeq(s.slot, s.q_start, s.q_len, s.fresh) for s in seqs]


def test_src_dst_equals_in_place_on_a_copy():
    """Reading src and writing slot gives the bits of the in-place run on a copy holding the src states in the write
    slots: batched singles (consecutive src slots into consecutive dst slots; two reading one src; a fresh one whose
    src holds NaN; one in place), longer ones (from a src, fresh from a NaN src, in place); src slots unchanged."""
    torch.manual_seed(8)
    Hk, Hv, dk, dv, C, K, S = 2, 4, 16, 8, 12, 4, 16
    seqs = [StateSeq(8, 0, 1, False, src=2), StateSeq(9, 1, 1, False, src=3), StateSeq(10, 2, 1, False, src=4),
            StateSeq(11, 3, 1, False, src=4), StateSeq(12, 4, 1, True, src=5), StateSeq(0, 5, 1, False),
            StateSeq(13, 7, 20, False, src=6), StateSeq(14, 28, 70, True, src=7), StateSeq(1, 99, 5, False)]
    T = 105
    assert not any(chained(seqs))
    q, k, v, g, beta = delta_inputs(T, Hk, Hv, dk, dv)
    x, w = torch.randn(T, C), torch.randn(C, K)
    ssm, conv = torch.randn(S, Hv, dk, dv) * 0.5, torch.randn(S, C, K - 1)
    ssm[[5, 7]] = conv[[5, 7]] = float("nan")
    ssm_before, conv_before = ssm.clone(), conv.clone()
    ssm_ref, ref_seqs = in_place_copy(ssm, seqs)
    conv_ref, _ = in_place_copy(conv, seqs)

    o = gated_delta_rule(q, k, v, g, beta, ssm, seqs, chunk_size=16)
    y = causal_conv1d(x, w, conv, seqs)
    o_ref = gated_delta_rule(q, k, v, g, beta, ssm_ref, ref_seqs, chunk_size=16)
    y_ref = causal_conv1d(x, w, conv_ref, ref_seqs)

    assert o.isfinite().all() and y.isfinite().all()
    torch.testing.assert_close(o, o_ref, **NAN_EQ)
    torch.testing.assert_close(y, y_ref, **NAN_EQ)
    dst = [s.slot for s in seqs]
    torch.testing.assert_close(ssm[dst], ssm_ref[dst], **NAN_EQ)
    torch.testing.assert_close(conv[dst], conv_ref[dst], **NAN_EQ)
    keep = [i for i in range(S) if i not in dst]  # the src slots 2..7 among them
    torch.testing.assert_close(ssm[keep], ssm_before[keep], **NAN_EQ)
    torch.testing.assert_close(conv[keep], conv_before[keep], **NAN_EQ)
    # and against the reference for the sequences read from a src
    for s in seqs[:3] + seqs[6:8]:
        rows = slice(s.q_start, s.q_start + s.q_len)
        s0 = torch.zeros(Hv, dk, dv) if s.fresh else ssm_before[s.read_slot]
        ref_out, ref_state = ref_delta(q[rows], k[rows], v[rows], g[rows], beta[rows], s0)
        torch.testing.assert_close(o[rows], ref_out, **FP32)
        torch.testing.assert_close(ssm[s.slot], ref_state, **FP32)


@pytest.mark.parametrize("cuts", [[1, 39], [1, 1, 30, 8], [17, 1, 22], [5, 33, 1, 1], [20, 20]])
@pytest.mark.parametrize("fresh", [False, True])
def test_chained_segments_equal_one_segment(cuts, fresh):
    """One 40-token sequence cut into chained segments in one call (segment i reads the slot segment i-1 wrote,
    starting from a checkpoint slot, or fresh), among independent decodes and a prompt: every row and the final
    state are those of the whole sequence as one segment, each segment's slot holds the state a call stopping at
    that segment's end leaves, the checkpoint slot is unchanged, and the independent seqs are unaffected."""
    torch.manual_seed(9 + len(cuts))
    Hk, Hv, dk, dv, C, K, S, L = 2, 4, 16, 8, 10, 4, 12, 40
    src0, dsts = 5, [6 + i for i in range(len(cuts))]
    others = [StateSeq(0, 0, 1, False), StateSeq(1, 1, 1, False, src=4), StateSeq(2, 2, 7, True)]
    c0 = 9  # the chain's rows: [9, 49)
    chain, pos, src = [], 0, src0
    for n, d in zip(cuts, dsts):
        chain.append(StateSeq(d, c0 + pos, n, fresh and pos == 0, src=src))
        src, pos = d, pos + n
    tail = [StateSeq(3, c0 + L, 1, False)]  # a decode after them
    seqs, T = others + chain + tail, c0 + L + 1
    assert chained(seqs) == [False] * 3 + [False] + [True] * (len(cuts) - 1) + [False]
    q, k, v, g, beta = delta_inputs(T, Hk, Hv, dk, dv)
    x, w = torch.randn(T, C), torch.randn(C, K)
    ssm, conv = torch.randn(S, Hv, dk, dv) * 0.5, torch.randn(S, C, K - 1)
    ssm[dsts] = conv[dsts] = float("nan")  # a read of a segment's slot before its write shows
    ssm_before, conv_before = ssm.clone(), conv.clone()

    o = gated_delta_rule(q, k, v, g, beta, ssm, seqs, chunk_size=16)
    y = causal_conv1d(x, w, conv, seqs)

    rows = slice(c0, c0 + L)

    def prefix(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The chain's first n tokens alone, one segment from the checkpoint into slot 0 of fresh pools:
        (outputs, state, conv outputs, conv state)."""
        one = [StateSeq(0, 0, n, fresh, src=1)]
        r = slice(c0, c0 + n)
        p_ssm, p_conv = torch.full((2, Hv, dk, dv), float("nan")), torch.full((2, C, K - 1), float("nan"))
        p_ssm[1], p_conv[1] = ssm_before[src0], conv_before[src0]
        po = gated_delta_rule(q[r], k[r], v[r], g[r], beta[r], p_ssm, one, chunk_size=16)
        py = causal_conv1d(x[r], w, p_conv, one)
        return po, p_ssm[0], py, p_conv[0]

    whole_o, whole_s, whole_y, whole_c = prefix(L)
    torch.testing.assert_close(o[rows], whole_o, **FP32)
    torch.testing.assert_close(y[rows], whole_y, **FP32)
    torch.testing.assert_close(ssm[dsts[-1]], whole_s, **FP32)
    torch.testing.assert_close(conv[dsts[-1]], whole_c, **FP32)
    end = 0
    for n, d in zip(cuts, dsts):
        end += n
        _, s_end, _, c_end = prefix(end)
        torch.testing.assert_close(ssm[d], s_end, **FP32)
        torch.testing.assert_close(conv[d], c_end, **FP32)
    torch.testing.assert_close(ssm[src0], ssm_before[src0], **NAN_EQ)
    torch.testing.assert_close(conv[src0], conv_before[src0], **NAN_EQ)
    # the independent seqs: what a call without the chain gives (not always its bits: the batched conv's sum may
    # round otherwise in another batch)
    alone = others + tail
    a_ssm, a_conv = ssm_before.clone(), conv_before.clone()
    a_o = gated_delta_rule(q, k, v, g, beta, a_ssm, alone, chunk_size=16)
    a_y = causal_conv1d(x, w, a_conv, alone)
    for s in alone:
        r = slice(s.q_start, s.q_start + s.q_len)
        torch.testing.assert_close(o[r], a_o[r], **FP32)
        torch.testing.assert_close(y[r], a_y[r], **FP32)
        torch.testing.assert_close(ssm[s.slot], a_ssm[s.slot], **FP32)
        torch.testing.assert_close(conv[s.slot], a_conv[s.slot], **FP32)


def test_chained_single_reads_the_state_written_before_it():
    """Control: two one-token segments in one call (the second chained on the first, both singles) give what two
    calls in turn give, which differs from the second reading its slot's old (finite) contents, as it would in
    the batched path beside the first."""
    torch.manual_seed(10)
    Hk, Hv, dk, dv, C, K = 2, 4, 16, 8, 10, 4
    q, k, v, g, beta = delta_inputs(2, Hk, Hv, dk, dv)
    x, w = torch.randn(2, C), torch.randn(C, K)
    ssm, conv = torch.randn(4, Hv, dk, dv) * 0.5, torch.randn(4, C, K - 1)
    seqs = [StateSeq(2, 0, 1, False, src=1), StateSeq(3, 1, 1, False, src=2)]
    assert chained(seqs) == [False, True]

    def run(seqs_: list[StateSeq], ssm_: torch.Tensor, conv_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gated_delta_rule(q, k, v, g, beta, ssm_, seqs_), causal_conv1d(x, w, conv_, seqs_)

    one_ssm, one_conv = ssm.clone(), conv.clone()
    o, y = run(seqs, one_ssm, one_conv)
    two_ssm, two_conv = ssm.clone(), conv.clone()
    o1, y1 = run(seqs[:1], two_ssm, two_conv)
    o2, y2 = run(seqs[1:], two_ssm, two_conv)
    stale_o, stale_y = run(seqs[1:], ssm.clone(), conv.clone())  # slot 2 as it was before the call
    torch.testing.assert_close(o, o1 + o2, **FP32)  # each call writes its row, zeros the other
    torch.testing.assert_close(y, y1 + y2, **FP32)
    torch.testing.assert_close(one_ssm, two_ssm, **FP32)
    torch.testing.assert_close(one_conv, two_conv, **FP32)
    assert (o[1] - stale_o[1]).abs().max() > 1e-3 and (y[1] - stale_y[1]).abs().max() > 1e-3


def test_empty_seq_with_a_src_copies_its_state():
    """q_len 0 and src != slot: the write slot gets the src state (zeros when fresh), which a chained seq reads."""
    torch.manual_seed(12)
    Hk, Hv, dk, dv, C, K = 1, 2, 8, 4, 5, 4
    q, k, v, g, beta = delta_inputs(3, Hk, Hv, dk, dv)
    x, w = torch.randn(3, C), torch.randn(C, K)
    ssm, conv = torch.randn(4, Hv, dk, dv), torch.randn(4, C, K - 1)
    seqs = [StateSeq(1, 0, 0, False, src=0), StateSeq(2, 0, 3, False, src=1), StateSeq(3, 3, 0, True, src=0)]
    ref_ssm, ref_conv = ssm.clone(), conv.clone()
    o = gated_delta_rule(q, k, v, g, beta, ssm, seqs)
    y = causal_conv1d(x, w, conv, seqs)
    ref_o = gated_delta_rule(q, k, v, g, beta, ref_ssm, [StateSeq(2, 0, 3, False, src=0)])
    ref_y = causal_conv1d(x, w, ref_conv, [StateSeq(2, 0, 3, False, src=0)])
    torch.testing.assert_close(o, ref_o, rtol=0, atol=0)
    torch.testing.assert_close(y, ref_y, rtol=0, atol=0)
    assert torch.equal(ssm[1], ssm[0]) and torch.equal(conv[1], conv[0]) and torch.equal(ssm[2], ref_ssm[2])
    assert ssm[3].eq(0).all() and conv[3].eq(0).all()
