"""RMSNorm over the last dimension, optionally fused with the residual add before it.

The decoder's residual stream (as in vLLM): each norm gets the sublayer output x and the running residual,
adds x into the residual and normalizes the sum, in one pass when the native kernel takes the tensors
(CPU, fp32 or bf16; tokenmill/native/kernels.py), otherwise with torch.

`unit_offset` (Gemma's form): the checkpoint stores w and the scale is (1 + w). The parameter always holds
the scale itself (its loader adds the 1), so the kernels and the fused add see one form. (Per-head q/k
norms: layers/head_norm.py.) LayerNorm: the mean taken out too, a scale and no bias (Cohere's), the same
interface, on its own native kernel.
"""

from __future__ import annotations

from typing import overload

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.native import kernels


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)  # the scale: ones == checkpoint 0s
        self.eps = eps
        self.use_native = kernels.is_enabled()  # decided once (TOKENMILL_NATIVE_KERNELS=0: torch)
        self._kernel = kernels.add_rms_norm
        if unit_offset:
            self.weight.weight_loader = _load_unit_offset  # type: ignore[attr-defined]

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (T, dim) -> rmsnorm(x) * weight. With a residual (T, dim): residual + x, normalized; returns
        (normed, new residual). The native path adds into `residual` in place and returns it, the torch
        path returns a new tensor: use the returned residual, never the one passed in."""
        if self.use_native:
            out = self._kernel(x, residual, self.weight, self.eps)
            if out is not None:
                return out if residual is None else (out, residual)
        if residual is None:
            return self._torch(x)
        residual = residual + x
        return self._torch(residual), residual

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _load_unit_offset(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
    """A checkpoint's w of a (1 + w) norm -> the scale 1 + w, computed in fp32 as HF does."""
    if param.data.shape != tensor.shape:
        raise ValueError(f"norm weight has shape {tuple(tensor.shape)}, expected {tuple(param.data.shape)}")
    param.data.copy_(tensor.to(torch.float32) + 1.0)


class LayerNorm(RMSNorm):
    """(x - mean) / sqrt(var + eps) * weight over the last dimension, no bias (Cohere's); RMSNorm's interface
    (with a residual, residual + x is normalized and returned as the new residual), on its native kernel
    (tm_add_layer_norm) where it takes the tensors, torch otherwise."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__(dim, eps)
        self._kernel = kernels.add_layer_norm

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, None, self.eps)
