"""The grammar bitmask as a logits processor: tokens a row's grammar does not allow get -inf.

The step contract carries a (G, W) int32 bitmask (W = ceil(V / 32); token t allowed iff bit t % 32 of word
t // 32 is set) and which request owns each row. The runner hands this processor, per step, the sampling
rows that are constrained and their bitmask rows; unconstrained rows are not touched (their logits, and so
their greedy picks, are exactly what they would be alone). Applied last, after penalties, logit_bias and
min_tokens, so nothing can re-allow a token the grammar forbids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenmill.sample.logits_processor import LogitsProcessor, SamplingRow


class GrammarBitmaskProcessor(LogitsProcessor):
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        self.rows: torch.Tensor | None = None  # (g,) int64 indexes into this step's S sampling rows
        self.bitmask: torch.Tensor | None = None  # (g, W) int32

    def set_step(self, rows: list[int], bitmask: torch.Tensor | None) -> None:
        """This step's constrained sampling rows and their (len(rows), W) bitmask rows (None: none)."""
        if not rows or bitmask is None:
            self.rows = self.bitmask = None
            return
        self.rows = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.bitmask = bitmask.to(self.device)

    def prepare(self, rows: Sequence[SamplingRow]) -> bool:
        return self.rows is not None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None and self.bitmask is not None
        S, V = logits.shape
        allowed = ((self.bitmask.unsqueeze(-1) >> self._shifts) & 1).flatten(1)[:, :V].bool()  # (g, V)
        out = logits.clone()
        out[self.rows] = logits[self.rows].masked_fill(~allowed, float("-inf"))
        return out
