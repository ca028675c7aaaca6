"""Per-head RMSNorm: each head's head_dim values normalized on their own, with one weight shared by the
heads (Qwen3's and Gemma 3's q_norm / k_norm, applied to q and k before rotary)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class HeadRMSNorm(nn.Module):
    """x (T, heads, head_dim) -> rmsnorm over head_dim, times (weight_offset + weight).

    weight_offset 0 is Qwen3's plain weight; Gemma stores w and scales by (1 + w): weight_offset=1.0.
    The weight (head_dim,) is what the checkpoint stores, loaded as is."""

    def __init__(self, head_dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight if self.weight_offset == 0.0 else self.weight + self.weight_offset
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)
