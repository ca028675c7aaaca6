"""Token embedding: a (vocab, hidden) table looked up by id."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        # torch.empty, not nn.Embedding's random init: the checkpoint overwrites it (and an 8B model's
        # table would take seconds to initialise)
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T,) int64 -> (T, embedding_dim)."""
        return F.embedding(input_ids, self.weight)
