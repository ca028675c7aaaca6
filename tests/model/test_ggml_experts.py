"""ggml_shim.cpp's tm_moe (native/ggml.py moe): a mixture-of-experts layer's experts after routing in one call
(rows gathered by expert, each expert's MLP in one ggml graph, the weighted sum per token), against the same ggml
matmuls called one by one with torch's activation and sum between them (fp32), for SwiGLU with gate|up as one
weight and as two, gpt-oss's clamped SwiGLU with biases, an expert without rows, and one or two threads; a
control with gate and up swapped in the reference shows the comparison can fail."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokenmill.native import ggml

sys.path.insert(0, str(Path(__file__).parent))
from gguf_blocks import quantized  # noqa: E402

pytestmark = pytest.mark.skipif(not ggml.available(), reason="needs ggml")

K, INTER, D = 256, 96, 128
ALPHA, LIMIT = 1.702, 7.0


def _weight(n: int, k: int, seed: int, keep: list[np.ndarray]) -> ggml.GgmlWeight:
    qtype, blocks, _ = quantized("Q5_0", n, k, seed)  # a type only ggml multiplies (never our block kernels)
    keep.append(blocks)
    return ggml.GgmlWeight(qtype, k, n, blocks.ctypes.data, False, blocks)


def _mm(w: ggml.GgmlWeight, x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty(x.shape[0], w.n)
    ggml.matmul_grouped([w], [x.shape[0]], x.data_ptr(), w.k, y.data_ptr(), w.n, 1)
    return y


def _reference(gate_up: list[list[ggml.GgmlWeight]], down: list[ggml.GgmlWeight], counts: list[int], x: torch.Tensor,
               oai: bool, gu_bias: list[list[torch.Tensor]] | None, dn_bias: list[torch.Tensor] | None,
               swap: bool = False) -> torch.Tensor:
    out, r0 = [], 0
    for g, n in enumerate(counts):
        xs = x[r0 : r0 + n]
        r0 += n
        parts = [_mm(w, xs) for w in gate_up[g]]
        if gu_bias is not None:
            parts = [p + b for p, b in zip(parts, gu_bias[g])]
        h = torch.cat(parts, dim=1)
        gate, up = h[:, :INTER], h[:, INTER:]
        if swap:
            gate, up = up, gate
        if oai:
            gc = gate.clamp(max=LIMIT)
            a = (up.clamp(-LIMIT, LIMIT) + 1) * (gc * torch.sigmoid(gc * ALPHA))
        else:
            a = F.silu(gate) * up
        y = _mm(down[g], a)
        out.append(y if dn_bias is None else y + dn_bias[g])
    return torch.cat(out)


def test_routing_groups_the_slots_by_expert() -> None:
    r = ggml.MoeRouting([[3, 1], [1, 0], [3, 2]])
    assert (r.experts, r.counts) == ([0, 1, 2, 3], [1, 2, 1, 2])
    # grouped rows: e0 (t1), e1 (t0, t1), e2 (t2), e3 (t0, t2)
    assert list(r.row_token) == [1, 0, 1, 2, 0, 2]
    assert list(r.slot_row) == [4, 1, 2, 0, 5, 3]  # slot t * 2 + j -> its grouped row


def _run(gate_up, down, ids: list[list[int]], x: torch.Tensor, w: torch.Tensor, threads: int, oai: bool,
         gu_bias, dn_bias) -> torch.Tensor:
    r = ggml.MoeRouting(ids)
    pick = r.experts
    out = torch.full((x.shape[0], D), float("nan"))
    ggml.moe([gate_up[e] for e in pick], [down[e] for e in pick], r, x.data_ptr(), K, w.data_ptr(), out.data_ptr(),
             D, threads, ggml.ACT_SWIGLU_OAI if oai else ggml.ACT_SILU, ALPHA, LIMIT,
             None if gu_bias is None else [[b.data_ptr() for b in gu_bias[e]] for e in pick],
             None if dn_bias is None else [dn_bias[e].data_ptr() for e in pick])
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["silu-fused", "silu-apart", "oai-biases", "oai-fused-biases"])
def test_one_call_equals_the_matmuls_with_torch_activation(case: str, threads: int) -> None:
    """Four tokens, two choices each over four experts (one left without rows): each token's weighted sum of
    its experts against the same ggml matmuls called one by one with torch's activation and sum."""
    keep: list[np.ndarray] = []
    oai, apart, biased = case.startswith("oai"), case in ("silu-apart", "oai-biases"), "biases" in case
    E = 4
    gate_up = [[_weight(INTER, K, 10 * g + j, keep) for j in range(2)] if apart else [_weight(2 * INTER, K, 10 * g, keep)]
               for g in range(E)]
    down = [_weight(D, INTER, 100 + g, keep) for g in range(E)]
    gen = torch.Generator().manual_seed(7)
    ids = [[3, 0], [0, 3], [2, 0], [0, 2]]  # expert 1 unused
    x = torch.randn(len(ids), K, generator=gen)
    w = torch.rand(len(ids), 2, generator=gen)
    gu_bias = dn_bias = None
    if biased:
        gu_bias = [[torch.randn(wt.n, generator=gen) for wt in ws] for ws in gate_up]
        dn_bias = [torch.randn(D, generator=gen) for _ in down]
    got = _run(gate_up, down, ids, x, w, threads, oai, gu_bias, dn_bias)

    def reference(swap: bool = False) -> torch.Tensor:
        rows = []
        for t, choice in enumerate(ids):
            acc = torch.zeros(D)
            for j, e in enumerate(choice):
                y = _reference([gate_up[e]], [down[e]], [1], x[t : t + 1], oai,
                               None if gu_bias is None else [gu_bias[e]], None if dn_bias is None else [dn_bias[e]],
                               swap)
                acc += w[t, j] * y[0]
            rows.append(acc)
        return torch.stack(rows)

    want = reference()
    # the down matmul rounds its input to 8 bits per block, so an activation that differs in its last bit
    # may round the other way: bounded well below what any real difference moves (the control below)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-4, err
    wrong = reference(swap=True)
    assert float((got - wrong).abs().max() / wrong.abs().max()) > 1e-2, "gate and up swapped must differ"


def test_a_token_does_not_depend_on_the_others() -> None:
    """A token's result is the same bits alone as among other tokens sharing its experts (mul_mat is per row,
    the sum per token in its choices' order)."""
    keep: list[np.ndarray] = []
    gate_up = [[_weight(2 * INTER, K, e, keep)] for e in range(3)]
    down = [_weight(D, INTER, 50 + e, keep) for e in range(3)]
    ids = [[0, 2], [2, 1], [1, 0], [0, 1], [2, 0]]
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, K, generator=gen), torch.rand(5, 2, generator=gen)
    together = _run(gate_up, down, ids, x, w, 2, False, None, None)
    for t in range(5):
        alone = _run(gate_up, down, [ids[t]], x[t : t + 1].contiguous(), w[t : t + 1].contiguous(), 1, False, None,
                     None)
        assert torch.equal(alone[0], together[t])
