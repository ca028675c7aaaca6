"""Linear layers, optionally with int8 weight-only quantisation (per output channel).

On CPUs without native bf16, a decode step at batch 1 is bound by reading fp32 weights. int8 weights
with bf16 activations (`torch._weight_int8pack_mm`) were measured 2.4x faster than fp32 at batch 1 on
this class of CPU, equal at batch 16 and slower beyond (benchmarks/README.md), so int8 is an opt-in
mode for latency-bound, few-user serving. Within the mode every batch size uses the same kernel, so a
request's tokens still do not depend on its neighbours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> int8 (N, K) and bf16 scales (N,), symmetric per output channel."""
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales.to(torch.bfloat16)


def linear(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor | None = None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) @ w.T (+ bias). With `scales`, w is int8 (N, K): computed in bf16, returned in x's dtype."""
    if scales is None:
        return F.linear(x, w, bias)
    y = torch._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), w, scales).to(x.dtype)
    return y if bias is None else y + bias
