"""Gated activations of the MLP, from the fused gate|up projection: silu(gate) * up, gelu_tanh(gate) * up, and
gpt-oss's clamped form."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.native import kernels


class SiluAndMul(nn.Module):
    """(T, 2I) = gate | up (the fused projection's output) -> silu(gate) * up, (T, I). One pass with the
    native kernel when it takes the tensor (CPU, fp32 or bf16), otherwise torch."""

    def __init__(self) -> None:
        super().__init__()
        self.use_native = kernels.is_enabled()  # decided once (TOKENMILL_NATIVE_KERNELS=0: torch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_native:
            out = kernels.silu_and_mul(x)
            if out is not None:
                return out
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluTanhAndMul(nn.Module):
    """(T, 2I) = gate | up -> gelu(gate, tanh approximation) * up, (T, I): Gemma's MLP (HF's
    "gelu_pytorch_tanh"). One pass with the native kernel when it takes the tensor, otherwise torch."""

    def __init__(self) -> None:
        super().__init__()
        self.use_native = kernels.is_enabled()  # decided once, as SiluAndMul's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_native:
            out = kernels.gelu_tanh_and_mul(x)
            if out is not None:
                return out
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


class SwigluOAI(nn.Module):
    """(T, 2I) = gate | up -> (up' + 1) * g * sigmoid(alpha g), (T, I), where g = min(gate, limit) and up' =
    up clamped to [-limit, limit]: gpt-oss's experts (HF's swiglu_alpha 1.702 and swiglu_limit 7.0, the
    constants llama.cpp's graph uses)."""

    def __init__(self, alpha: float, limit: float) -> None:
        super().__init__()
        self.alpha, self.limit = alpha, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        return (up.clamp(-self.limit, self.limit) + 1) * (gate * torch.sigmoid(gate * self.alpha))


def sigmoid_gate(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """x (T, H, hd) times sigmoid(g) (T, H, hd): Qwen3.5's attention output gate. In place on the native kernel where
    it takes them (x's heads adjacent), else torch (a new tensor)."""
    if kernels.is_enabled() and kernels.sigmoid_mul_(x, g):
        return x
    return x * torch.sigmoid(g)
