"""oneDNN's prepacked linear on CPU (private torch ops, so probed once rather than assumed).

With bf16 on a CPU, F.linear hands oneDNN a plain weight that it reorders into its compute (AMX) layout
at every call; `prepack` does that once, and `packed_linear` multiplies by the packed copy
(layers/linear.py's prepacked method).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def can_prepack() -> bool:
    """oneDNN's reorder and linear ops exist in this torch build and give F.linear's answer on this CPU."""
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
    """(N, K) bf16 weight -> an opaque oneDNN tensor in its compute layout."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) @ W.T (+ bias) with W prepacked by `prepack`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
