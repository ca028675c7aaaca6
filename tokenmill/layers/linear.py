"""Linear layers: plain, prepacked for oneDNN (bf16 on CPU), or int8 weight-only (per output channel).

Prepacked: with bf16 on a CPU, F.linear hands oneDNN a plain weight that it reorders into its AMX
layout at every call. Reordering once at load (`prepack`) and calling oneDNN's linear on the packed
weight measured 1.3-2x faster for decode-sized batches (1-64 rows) and ~1.1-1.3x for prefill-sized
ones: one request decodes 26.7 -> 35.8 tok/s, offline throughput +9% (benchmarks/README.md).

On CPUs without native bf16, a decode step at batch 1 is bound by reading fp32 weights. int8 weights
with bf16 activations (`torch._weight_int8pack_mm`) were measured 2.4x faster than fp32 at batch 1 on
this class of CPU, equal at batch 16 and slower beyond (benchmarks/README.md), so int8 is an opt-in
mode for latency-bound, few-user serving. Within the mode every batch size uses the same kernel, so a
request's tokens still do not depend on its neighbours.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> int8 (N, K) and bf16 scales (N,), symmetric per output channel."""
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales.to(torch.bfloat16)


@functools.cache
def can_prepack() -> bool:
    """oneDNN's reorder and linear ops exist in this torch build and give F.linear's answer on this CPU
    (private ops, so probed once with a small bf16 matmul rather than assumed)."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(64, 32, generator=g).to(torch.bfloat16)
        x = torch.randn(3, 32, generator=g).to(torch.bfloat16)
        return bool(torch.allclose(packed_linear(x, prepack(w)).float(), F.linear(x, w).float(), atol=0.05, rtol=0.02))
    except RuntimeError:
        return False


def prepack(w: torch.Tensor) -> torch.Tensor:
    """(N, K) bf16 weight -> an opaque oneDNN tensor in its compute layout, for `linear(..., packed=)`."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) @ W.T (+ bias) with W prepacked by `prepack`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def convert_weight(w: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(N, K) weight -> (weight, scales, packed) for `linear(x, weight, scales, packed=packed)`.
    mode "int8": int8 weight and its per-channel scales; "prepack": an empty weight and the oneDNN copy."""
    if mode == "int8":
        q, s = quantize_int8(w)
        return q, s, None
    if mode == "prepack":
        return w.new_empty(0), None, prepack(w)
    raise ValueError(f"unknown weight mode {mode!r}")


def linear(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, packed: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) @ w.T (+ bias). With `packed` (from `prepack`), w is not read. With `scales`, w is int8
    (N, K): computed in bf16, returned in x's dtype."""
    if packed is not None:
        return packed_linear(x, packed, bias)
    if scales is None:
        return F.linear(x, w, bias)
    y = torch._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), w, scales).to(x.dtype)
    return y if bias is None else y + bias
