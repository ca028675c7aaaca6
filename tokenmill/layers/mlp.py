"""The gated MLP: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul; and the ungated one,
down(relu(up(x)) ** 2) (Arcee's)."""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.layers.activation import SiluAndMul
from tokenmill.layers.linear import Linear, LinearMethod


class GatedMLP(nn.Module):
    """(T, hidden) -> (T, hidden) through `intermediate` SwiGLU units. Parameters gate_up_proj (the
    checkpoint's gate_proj | up_proj rows) and down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int, method: LinearMethod, bias: bool = False,
                 act: nn.Module | None = None) -> None:
        """`bias`: both projections have one (gpt-oss's experts); `act`: (T, 2I) gate | up -> (T, I), SwiGLU's
        silu(gate) * up by default."""
        super().__init__()
        d, i = hidden_size, intermediate_size
        self.gate_up_proj = Linear(d, 2 * i, method, bias=bias, shards={"gate": i, "up": i})
        self.act = act if act is not None else SiluAndMul()
        self.down_proj = Linear(i, d, method, bias=bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(h)))


class ReLUSquared(nn.Module):
    """relu(x) ** 2 (HF's "relu2")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.square(torch.relu(x))


class UpDownMLP(nn.Module):
    """(T, hidden) -> (T, hidden) through `intermediate` units without a gate: down(relu(up(x)) ** 2).
    Parameters up_proj and down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int, method: LinearMethod) -> None:
        super().__init__()
        self.up_proj = Linear(hidden_size, intermediate_size, method)
        self.act = ReLUSquared()
        self.down_proj = Linear(intermediate_size, hidden_size, method)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(h)))
