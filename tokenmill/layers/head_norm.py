"""Per-head RMSNorm: each head's head_dim values normalized on their own, with one weight shared by the
heads (Qwen3's and Gemma 3's q_norm / k_norm, applied to q and k before rotary). `normalize_` does it in place
on the native kernel (kernels.cpp tm_head_rms_norm, the row arithmetic of the model's other norms; a (1 + w)
weight's sum taken in fp32, as HF takes it), which the
native decode step (models/native_decode.py) calls with the same arguments; torch where that does not apply."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.native import kernels


class HeadRMSNorm(nn.Module):
    """x (T, heads, head_dim) -> rmsnorm over head_dim, times (weight_offset + weight).

    weight_offset 0 is Qwen3's plain weight; Gemma stores w and scales by (1 + w): weight_offset=1.0.
    The weight (head_dim,) is what the checkpoint stores, loaded as is."""

    def __init__(self, head_dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset
        self.use_native = kernels.is_enabled()  # decided once, as RMSNorm's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight if self.weight_offset == 0.0 else self.weight + self.weight_offset
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def normalize_(self, x: torch.Tensor) -> bool:
        """x (T, heads, head_dim), heads adjacent (a view into the projection's rows), normalized in place on the
        native kernel. False: not for it (nothing written; call forward)."""
        return self.use_native and kernels.head_rms_norm_(x, self.weight, self.eps, self.weight_offset)
