"""A sparse mixture-of-experts MLP: a router picks top_k of num_experts gated MLPs per token.

    logits = gate(x)                       (T, E)   the router, a Linear like any other
    probs  = softmax(logits)               (T, E)   in float32
    w, ids = topk(probs, k)                (T, k)   renormalized to sum to 1 where the family does
    y[t]   = sum_j w[t, j] * expert[ids[t, j]](x[t])
           (+ sigmoid(shared_gate(x[t])) * shared_expert(x[t]), Qwen2-MoE;
            + shared_expert(x[t]), ungated, GraniteMoeShared)

Mixtral's rule (softmax over the top-k logits) is softmax, top-k, renormalize; Qwen3-MoE renormalizes
when norm_topk_prob, Qwen2-MoE does not. ERNIE 4.5 MoE chooses by probs + a per-expert bias
(`moe_statics.bias`, its e_score_correction_bias) and weighs by the chosen probs, renormalized. LFM2-MoE
scores each expert by sigmoid(logit) instead of the softmax (`sigmoid`), chooses by scores + its expert_bias
(the same selection-only bias), renormalizes the chosen scores and multiplies them by routed_scaling.

Grouped by expert: the T*k (token, choice) slots are sorted by expert id (stably: token order within an
expert), each expert that has slots multiplies its rows in one batch, and the results are put back in
slot order and summed over the k choices:

    ids (T, k) -> flat (T k,) -> order = argsort(flat)         slots grouped: [e0 e0 e0 | e1 | e3 e3 ...]
    x[order // k] -> expert e on its contiguous run of rows -> y[order] = out -> (T, k, D) -> weighted sum

Under the gguf method, with every expert on ggml's kernels, the whole layer runs in one native call
(`_one_call`, GGUFLinearMethod.apply_moe, ggml_shim.cpp tm_moe): the router (inside where it is one ggml weight),
the same routing rules, the rows grouped by expert, every chosen expert's gate|up, activation (SwiGLU, gpt-oss's
clamped one) and down in one ggml graph and thread team with the intermediate rows in fp32, and each token's
choices summed in their order. Otherwise the routing is torch's (`route`), all experts' gate|up matmuls run as
one call and all their downs as another (GGUFLinearMethod.apply_grouped), the activation and the sum in torch,
or expert by expert.

A token's result depends only on its own row (its routing and its experts' rows), not on which other
tokens share the step. Each expert is a GatedMLP of Linear layers, so its weights stay in whatever form
the linear method keeps (GGUF blocks included).
"""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.layers.activation import SiluAndMul, SwigluOAI
from tokenmill.layers.ggml_linear import GGUFLinearMethod
from tokenmill.layers.linear import Linear, LinearMethod
from tokenmill.layers.mlp import GatedMLP
from tokenmill.native import ggml, kernels

# the experts' activations the one-call path (GGUFLinearMethod.apply_moe) computes itself
_NATIVE_ACTS: dict[type, int] = {SiluAndMul: ggml.ACT_SILU, SwigluOAI: ggml.ACT_SWIGLU_OAI}
# the most (token, choice) slots a step routes in Python for the one-call path: decode batches (64 sequences of
# 8 experts); prompts' big batches take the grouped matmuls (which go dense past the crossover anyway)
_ONE_CALL_SLOTS = 512


class SelectionBias(nn.Module):
    """A per-expert bias that takes part in choosing the experts only (ERNIE 4.5 MoE's e_score_correction_bias)."""

    def __init__(self, num_experts: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_experts), requires_grad=False)


class SparseMoE(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, renormalize: bool,
                 method: LinearMethod, shared_intermediate_size: int = 0, shared_gated: bool = True,
                 selection_bias: bool = False, sigmoid: bool = False, routed_scaling: float = 1.0) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"{top_k} experts per token out of {num_experts}")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.sigmoid, self.routed_scaling = sigmoid, routed_scaling  # LFM2-MoE's scoring and scale
        self.gate = Linear(hidden_size, num_experts, method)  # the router
        self.experts = nn.ModuleList(GatedMLP(hidden_size, intermediate_size, method) for _ in range(num_experts))
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: Linear | None = None
        if shared_intermediate_size:
            self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size, method)
            self.shared_expert_gate = Linear(hidden_size, 1, method) if shared_gated else None
        self.moe_statics: SelectionBias | None = SelectionBias(num_experts) if selection_bias else None
        self._native: tuple[ggml.MoeLayer, bool, bool] | None = None  # the one-call path's (decided at the first call)
        self._native_known = False
        self._sel32: torch.Tensor | None = None  # moe_statics' bias in fp32, read by the native layer

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h (T, D) -> the chosen experts' weights (T, k) float32 and ids (T, k) int64."""
        logits = self.gate(h).float()
        probs = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
        if self.moe_statics is None:
            weights, ids = torch.topk(probs, self.top_k, dim=-1)
        else:  # chosen by probs + bias, weighed by probs
            ids = torch.topk(probs + self.moe_statics.bias.float(), self.top_k, dim=-1).indices
            weights = probs.gather(-1, ids)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-12)
        if self.routed_scaling != 1.0:
            weights = weights * self.routed_scaling
        return weights, ids

    def _experts_grouped(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor | None:
        """Every expert on its run of x's rows with one ggml call for all the gate|up matmuls and one for
        all the downs (the gguf method, where each expert would take ggml's path alone), else None."""
        method = self.gate.method
        if not isinstance(method, GGUFLinearMethod):
            return None
        experts: list[GatedMLP] = [self.experts[e] for e, n in enumerate(counts) if n]  # type: ignore[misc]
        rows = [n for n in counts if n]
        gate_up = method.apply_grouped([m.gate_up_proj for m in experts], x, rows)
        if gate_up is None:
            return None
        act = experts[0].act(gate_up)
        down = method.apply_grouped([m.down_proj for m in experts], act, rows)
        if down is None:  # the downs would not all take ggml's path: one by one
            down = torch.cat([m.down_proj(a) for m, a in zip(experts, act.split(rows))])
        return down

    def one_call_layer(self) -> tuple[ggml.MoeLayer, bool, bool] | None:
        """The one-call path's (native layer, whether its experts' matrices can go dense, whether its shared
        expert's can), decided once after loading (and so on the first call); None where it never applies."""
        if not self._native_known:
            self._native, self._native_known = self._native_layer(), True
        return self._native

    def _one_call(self, h: torch.Tensor) -> torch.Tensor | None:
        """The layer's output (T, D) from one native call, router, routing and the shared expert included
        (GGUFLinearMethod.apply_moe) where it applies: the gguf method with every expert on ggml's kernels, an
        activation it computes, at most _ONE_CALL_SLOTS (token, choice) slots, no expert past the crossover;
        else None. A shared expert the call does not take (its rows past the crossover) is added here."""
        if self.one_call_layer() is None or type(self.experts[0].act) not in _NATIVE_ACTS \
                or h.shape[0] * self.top_k > _ONE_CALL_SLOTS:
            return None
        method = self.gate.method
        assert isinstance(method, GGUFLinearMethod)
        assert self._native is not None
        layer, dense_ok, shared_dense = self._native
        logits = None if layer.has_router else self.gate(h)
        inside = layer.has_shared and (h.shape[0] <= method.max_ggml_rows or not shared_dense)
        gate = self.shared_expert_gate
        sw = _shared_weights(gate(h)) if inside and gate is not None else None
        out = method.apply_moe(layer, h, logits, dense_ok, inside, sw)
        if out is None or inside:
            return out
        return self._add_shared(h, out)

    def _native_layer(self) -> tuple[ggml.MoeLayer, bool, bool] | None:
        """The one-call path's native layer, whether its experts' and whether its shared expert's matrices can go
        dense (decided once, after loading), or None where it never applies (a subclass with its own `route`
        keeps torch's routing)."""
        method = self.gate.method
        experts: list[GatedMLP] = list(self.experts)  # type: ignore[arg-type]
        act = _NATIVE_ACTS.get(type(experts[0].act))
        if not isinstance(method, GGUFLinearMethod) or act is None or type(self).route is not SparseMoE.route:
            return None
        gate_up, down = [m.gate_up_proj for m in experts], [m.down_proj for m in experts]
        parts = method.moe_parts(gate_up, down)
        if parts is None:
            return None
        oai = experts[0].act
        alpha, limit = (oai.alpha, oai.limit) if isinstance(oai, SwigluOAI) else (0.0, 0.0)
        self._sel32 = None if self.moe_statics is None else self.moe_statics.bias.detach().float().contiguous()
        se = self.shared_expert
        shared = None if se is None or type(se.act) is not type(experts[0].act) else (se.gate_up_proj, se.down_proj)
        layer = method.moe_layer(self.gate, gate_up, down, parts, self.sigmoid, self._sel32, self.renormalize,
                                 self.routed_scaling, self.top_k, act, alpha, limit, shared)
        dense = any(lyr.dense_ok or lyr.packed is not None for lyr in gate_up + down)
        shared_dense = se is not None and any(lyr.dense_ok or lyr.packed is not None
                                              for lyr in (se.gate_up_proj, se.down_proj))
        return layer, dense, shared_dense

    def mark_experts(self) -> None:
        """Mark the routed and shared experts' matrices (and the shared expert's gate) as experts'
        (Linear.expert), as GGUFFile.matrices names them, before the weights are finished (a subclass may have
        replaced the experts built here)."""
        experts = [*self.experts, *(m for m in (self.shared_expert, self.shared_expert_gate) if m is not None)]
        for lin in (m for e in experts for m in e.modules()):
            if isinstance(lin, Linear):
                lin.expert = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (T, D) -> (T, D)."""
        out = self._one_call(h)
        return out if out is not None else self._add_shared(h, self._grouped(h))

    def _add_shared(self, h: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """The routed experts' sum (T, D) plus the shared expert's result (gated where the family gates it)."""
        if self.shared_expert is None:
            return mixed
        shared = self.shared_expert(h)
        gate = self.shared_expert_gate
        return mixed + (shared if gate is None else torch.sigmoid(gate(h)) * shared)

    def _grouped(self, h: torch.Tensor) -> torch.Tensor:
        """The experts' weighted sum (T, D), routed in torch, expert by expert over its rows (grouped matmuls
        where they apply)."""
        T, D = h.shape
        weights, ids = self.route(h)
        flat = ids.flatten()  # (T k,): slot s is token s // k, choice s % k
        order = torch.argsort(flat, stable=True)  # slots grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        x = h.index_select(0, order // self.top_k)  # (T k, D), expert by expert
        out = self._experts_grouped(x, counts)
        if out is None:
            out = torch.empty_like(x)
            start = 0
            for e, n in enumerate(counts):  # one batched call per expert that has tokens
                if n:
                    out[start : start + n] = self.experts[e](x[start : start + n])
                    start += n
        y = torch.empty_like(out)
        y[order] = out  # back to slot order
        return (y.view(T, self.top_k, D) * weights.unsqueeze(-1).to(y.dtype)).sum(dim=1)


def _shared_weights(logits: torch.Tensor) -> torch.Tensor:
    """A gated shared expert's gate logits (T, 1) -> its weights sigmoid(logits) (T,) fp32: on the native kernel the
    native decode step calls (the same bits), else torch."""
    if kernels.is_enabled():
        sw = kernels.sigmoid_f32(logits)
        if sw is not None:
            return sw
    return torch.sigmoid(logits.float()).flatten()
