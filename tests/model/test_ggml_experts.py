"""ggml_shim.cpp's tm_moe (native/ggml.py MoeLayer): a mixture-of-experts layer in one call (the router, the
routing, each chosen expert's gate|up, activation and down in one ggml graph, each token's weighted sum), against
SparseMoE.route (torch's routing, the production one) and the same ggml matmuls called one by one with torch's
activation and sum between them (fp32): every routing rule the families use (softmax with and without
renormalizing, sigmoid with a selection bias and a scale, a softmax with a selection bias), SwiGLU with gate|up
as one weight and as two, gpt-oss's clamped SwiGLU with biases and a biased router, a shared expert ungated
(Granite) and gated per token (Qwen2-MoE), one and two threads; a token alone equals it among others; the
crossover refusal; a control with gate and up swapped in the reference shows the comparison can fail."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.native import ggml

sys.path.insert(0, str(Path(__file__).parent))
from gguf_blocks import quantized  # noqa: E402

pytestmark = pytest.mark.skipif(not ggml.available(), reason="needs ggml")

K, INTER, D, E, TOP = 256, 96, 128, 6, 2
ALPHA, LIMIT = 1.702, 7.0
# name -> (sigmoid, selection bias, renormalize, scaling): Qwen3-MoE, Qwen2-MoE, LFM2-MoE, ERNIE 4.5 MoE
RULES = {"softmax-renorm": (False, False, True, 1.0), "softmax": (False, False, False, 1.0),
         "sigmoid-bias-scaled": (True, True, True, 2.5), "softmax-bias": (False, True, True, 1.0)}


def _weight(n: int, k: int, seed: int, keep: list[Any], type_name: str = "Q5_0") -> ggml.GgmlWeight:
    qtype, blocks, _ = quantized(type_name, n, k, seed)  # Q5_0: a type only ggml multiplies (never our kernels)
    keep.append(blocks)
    return ggml.GgmlWeight(qtype, k, n, blocks.ctypes.data, False, blocks)


def _mm(w: ggml.GgmlWeight, x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty(x.shape[0], w.n)
    ggml.matmul_grouped([w], [x.shape[0]], x.data_ptr(), w.k, y.data_ptr(), w.n, 1)
    return y


class _Logits(nn.Module):
    """A router that answers fixed logits (the rows asked for)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.logits[: h.shape[0]]


def _torch_route(logits: torch.Tensor, rule: str, sel: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseMoE.route on these logits (the module's own code, its router answering them)."""
    from tokenmill.layers.moe import SparseMoE

    sigmoid, _, renorm, scaling = RULES[rule]
    moe = SparseMoE.__new__(SparseMoE)
    nn.Module.__init__(moe)
    moe.num_experts, moe.top_k, moe.renormalize, moe.sigmoid, moe.routed_scaling = E, TOP, renorm, sigmoid, scaling
    moe.gate = _Logits(logits)  # type: ignore[assignment]
    moe.moe_statics = None
    if sel is not None:
        from tokenmill.layers.moe import SelectionBias

        moe.moe_statics = SelectionBias(E)
        moe.moe_statics.bias.data.copy_(sel)
    return moe.route(torch.zeros(logits.shape[0], K))


class _Case:
    def __init__(self, rule: str, apart: bool, oai: bool, biased: bool, seed: int = 7) -> None:
        keep: list[Any] = []
        self.keep = keep
        self.rule, self.oai = rule, oai
        gen = torch.Generator().manual_seed(seed)
        self.gate_up = [[_weight(INTER, K, 10 * e + j, keep) for j in range(2)] if apart
                        else [_weight(2 * INTER, K, 10 * e, keep)] for e in range(E)]
        self.down = [_weight(D, INTER, 100 + e, keep) for e in range(E)]
        self.gu_bias = self.dn_bias = None
        if biased:
            self.gu_bias = [[torch.randn(w.n, generator=gen) for w in ws] for ws in self.gate_up]
            self.dn_bias = [torch.randn(D, generator=gen) for _ in self.down]
        self.sel = torch.randn(E, generator=gen) * 0.2 if RULES[rule][1] else None
        self.shared: tuple[list[ggml.GgmlWeight], ggml.GgmlWeight] | None = None

    def with_shared(self) -> "_Case":
        """A shared expert of twice the experts' width (gate|up as the experts have it), no biases."""
        apart = len(self.gate_up[0]) == 2
        self.shared = ([_weight(2 * INTER, K, 500 + j, self.keep) for j in range(2)] if apart
                       else [_weight(4 * INTER, K, 500, self.keep)], _weight(D, 2 * INTER, 600, self.keep))
        return self

    def layer(self, router: ggml.GgmlWeight | None = None, router_bias: torch.Tensor | None = None) -> ggml.MoeLayer:
        sigmoid, _, renorm, scaling = RULES[self.rule]
        return ggml.MoeLayer(router, 0 if router_bias is None else router_bias.data_ptr(), sigmoid,
                             0 if self.sel is None else self.sel.data_ptr(), renorm, scaling, TOP, self.gate_up,
                             self.down, ggml.ACT_SWIGLU_OAI if self.oai else ggml.ACT_SILU, ALPHA, LIMIT,
                             None if self.gu_bias is None else [[b.data_ptr() for b in bs] for bs in self.gu_bias],
                             None if self.dn_bias is None else [b.data_ptr() for b in self.dn_bias], self.shared)

    def expert(self, e: int, x: torch.Tensor, swap: bool = False) -> torch.Tensor:
        """Expert e (-1: the shared one) on rows x: the ggml matmuls, torch's activation between them."""
        assert e >= 0 or self.shared is not None
        gate_up, down = (self.gate_up[e], self.down[e]) if e >= 0 else self.shared  # type: ignore[misc]
        parts = [_mm(w, x) for w in gate_up]
        if self.gu_bias is not None and e >= 0:
            parts = [p + b for p, b in zip(parts, self.gu_bias[e])]
        h = torch.cat(parts, dim=1)
        inter = h.shape[1] // 2
        gate, up = (h[:, inter:], h[:, :inter]) if swap else (h[:, :inter], h[:, inter:])
        if self.oai:
            g = gate.clamp(max=LIMIT)
            a = (up.clamp(-LIMIT, LIMIT) + 1) * (g * torch.sigmoid(g * ALPHA))
        else:
            a = F.silu(gate) * up
        y = _mm(down, a)
        return y if self.dn_bias is None or e < 0 else y + self.dn_bias[e]

    def reference(self, x: torch.Tensor, logits: torch.Tensor, swap: bool = False,
                  shared_weight: torch.Tensor | None = None) -> torch.Tensor:
        weights, ids = _torch_route(logits, self.rule, self.sel)
        out = torch.zeros(x.shape[0], D)
        for t in range(x.shape[0]):
            for j in range(TOP):
                out[t] += weights[t, j] * self.expert(int(ids[t, j]), x[t : t + 1], swap)[0]
            if self.shared is not None:
                w = 1.0 if shared_weight is None else shared_weight[t]
                out[t] += w * self.expert(-1, x[t : t + 1], swap)[0]
        return out


def _call(layer: ggml.MoeLayer, x: torch.Tensor, logits: torch.Tensor | None, threads: int = 1,
          max_rows: int = 1 << 40, shared_weight: torch.Tensor | None = None) -> tuple[bool, torch.Tensor]:
    x = x.contiguous()
    lg = None if logits is None else logits.contiguous()
    out = torch.full((x.shape[0], D), float("nan"))
    ok = layer.call(x.data_ptr(), x.shape[0], out.data_ptr(), 0 if lg is None else lg.data_ptr(), max_rows, threads,
                    layer.has_shared, 0 if shared_weight is None else shared_weight.data_ptr())
    return ok, out


def _inputs(n: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, K, generator=gen), torch.randn(n, E, generator=gen) * 2


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("experts", ["silu-fused", "silu-apart", "oai-biases"])
def test_one_call_equals_torch_routing_and_the_matmuls(rule: str, experts: str, threads: int) -> None:
    case = _Case(rule, apart=experts != "silu-fused", oai=experts.startswith("oai"), biased="biases" in experts)
    x, logits = _inputs(7)
    ok, got = _call(case.layer(), x, logits, threads)
    assert ok
    want = case.reference(x, logits)
    # the down matmul rounds its input to 8 bits per block, so an activation that differs in its last bit
    # may round the other way: bounded well below what any real difference moves (the control below)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-4, err
    wrong = case.reference(x, logits, swap=True)
    assert float((got - wrong).abs().max() / wrong.abs().max()) > 1e-2, "gate and up swapped must differ"


@pytest.mark.parametrize("gated", [False, True], ids=["ungated", "gated"])
@pytest.mark.parametrize("apart", [False, True], ids=["fused", "apart"])
def test_a_shared_expert_inside_the_call(apart: bool, gated: bool) -> None:
    """Granite's ungated shared MLP, Qwen2-MoE's gated one: every token through it once more, added (times its
    weight) after the routed choices."""
    case = _Case("softmax-renorm", apart=apart, oai=False, biased=False).with_shared()
    x, logits = _inputs(5)
    sw = torch.rand(5, generator=torch.Generator().manual_seed(5)) if gated else None
    ok, got = _call(case.layer(), x, logits, threads=2, shared_weight=sw)
    assert ok
    want = case.reference(x, logits, shared_weight=sw)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    routed_only = _Case("softmax-renorm", apart=apart, oai=False, biased=False).reference(x, logits)
    assert float((got - routed_only).abs().max() / want.abs().max()) > 1e-2, "the shared expert must count"


def test_the_router_inside_equals_logits_given() -> None:
    """gpt-oss's shape of layer: a biased router (an F32 ggml weight) inside the call gives what its logits,
    computed outside by the same ggml matmul plus the bias, give."""
    case = _Case("softmax-renorm", apart=True, oai=True, biased=True)
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(E, K, generator=gen) * 0.1
    router = ggml.GgmlWeight(0, K, E, w.data_ptr(), False, w)  # F32
    bias = torch.randn(E, generator=gen)
    x, _ = _inputs(5)
    logits = _mm(router, x) + bias
    ok_in, inside = _call(case.layer(router, bias), x, None)
    ok_out, outside = _call(case.layer(), x, logits)
    assert ok_in and ok_out and torch.equal(inside, outside)
    assert float((inside - case.reference(x, logits)).abs().max() / inside.abs().max()) < 1e-4


def test_a_token_does_not_depend_on_the_others() -> None:
    case = _Case("sigmoid-bias-scaled", apart=False, oai=False, biased=False)
    x, logits = _inputs(6)
    _, together = _call(case.layer(), x, logits, threads=2)
    for t in range(6):
        _, alone = _call(case.layer(), x[t : t + 1], logits[t : t + 1])
        assert torch.equal(alone[0], together[t])


def test_more_rows_than_the_crossover_are_refused_untouched() -> None:
    """An expert with more rows than max_rows: nothing computed, nothing written (the caller goes dense)."""
    case = _Case("softmax-renorm", apart=False, oai=False, biased=False)
    x = torch.randn(4, K)
    logits = torch.zeros(4, E)
    logits[:, 0] = 5.0  # every token picks expert 0: 4 rows
    ok, out = _call(case.layer(), x, logits, max_rows=3)
    assert not ok and torch.isnan(out).all()
    ok, out = _call(case.layer(), x, logits, max_rows=4)
    assert ok and not torch.isnan(out).any()
