"""What the runner needs of a model: the `CausalLM` protocol."""

from __future__ import annotations

from typing import Protocol

import torch

from tokenmill.attention.backend import AttentionContext


class CausalLM(Protocol):
    # checkpoint module name -> (this model's fused module, its shard), e.g. "q_proj" -> ("qkv_proj", "q");
    # shard None: a plain rename
    packed_modules_mapping: dict[str, tuple[str, str | None]]

    def named_parameters(self) -> object: ...  # nn.Module's: the loader finds parameters by checkpoint name

    def load_extra_weight(self, name: str, tensor: torch.Tensor) -> bool:
        """A checkpoint tensor that is not a parameter (e.g. stored rotary factors); True if taken."""

    def finish_loading(self, device: torch.device, dtype: torch.dtype) -> None:
        """After every weight is loaded: move to device/dtype and let linear methods convert weights."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                num_layers: int | None = None) -> torch.Tensor:
        """input_ids, positions (T,) -> final hidden states (T, D), after the first `num_layers` layers
        (None: all) and the final norm."""

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """(S, D) -> (S, V) float32 logits; with float32=False a model may leave them in its head's dtype
        (widening is exact, so their argmax is the float32 logits' argmax, ties included): greedy rows
        with nothing else to do skip a copy of (S, V) floats."""
