"""The recurrent state of a model's recurrent layers (Qwen3.5's Gated DeltaNet, LFM2's short convs): one slot per running
sequence, assigned by the runner the first time the sequence is scheduled and freed when it finishes or is
preempted (a preempted sequence recomputes from position 0, where its state starts at zero again).

Per recurrent layer j (the j-th in ModelConfig.linear_layers), float32:
    conv[j]  (slots, conv_dim, K - 1)   the causal conv's last K - 1 inputs
    ssm[j]   (slots, Hv, dk, dv)        the delta rule's state matrix per value head (LFM2: none, zero-size)
A sequence's state covers exactly its tokens [0, num_computed_tokens): every step that computes its next
tokens reads the slot and writes it back, so a sequence appears at most once in a step, in token order (no
speculative drafts, no prefix cache: the engine refuses or turns them off for such a model).
"""

from __future__ import annotations

import heapq

import torch

from tokenmill.layers.gated_delta import RecurrentStep, StateSeq
from tokenmill.loader.model_config import ModelConfig


class RecurrentStatePool:
    def __init__(self, cfg: ModelConfig, num_slots: int, device: torch.device) -> None:
        n = len(cfg.linear_layers)
        self.conv = torch.zeros((n, num_slots, cfg.linear_conv_dim, cfg.linear_conv_kernel - 1), dtype=torch.float32,
                                device=device)
        self.ssm = torch.zeros((n, num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                cfg.linear_value_head_dim), dtype=torch.float32, device=device)
        self.num_slots = num_slots
        self._free = list(range(num_slots))  # a heap: the lowest free slot first, so a small batch's slots tend
        # to be consecutive (layers/gated_delta.py then updates them in place)
        self._slot_of: dict[str, int] = {}

    def slot(self, req_id: str) -> int:
        """req_id's slot, assigned now if it has none."""
        s = self._slot_of.get(req_id)
        if s is None:
            if not self._free:
                raise RuntimeError(f"no recurrent-state slot left for {req_id}: {self.num_slots} sequences hold them "
                                   "(the scheduler runs at most that many)")
            s = self._slot_of[req_id] = heapq.heappop(self._free)
        return s

    def release(self, req_ids: object) -> None:
        """These requests finished or were preempted: their slots are free (their contents are stale)."""
        for rid in req_ids:  # type: ignore[attr-defined]
            s = self._slot_of.pop(rid, None)
            if s is not None:
                heapq.heappush(self._free, s)

    @property
    def num_used(self) -> int:
        return len(self._slot_of)

    def step(self, seqs: list[tuple[str, int, int, int]]) -> RecurrentStep:
        """seqs: (req_id, q_start, q_len, start position) in the step's token order -> the step's states. A
        sequence seen for the first time must start at position 0: no slot holds the state of tokens it did not
        compute (a shared or cached prefix), and reading one anyway would be silently wrong."""
        out = []
        for rid, q0, n, start in seqs:
            if start and rid not in self._slot_of:
                raise RuntimeError(f"{rid} starts at token {start} without the recurrent state of the tokens before "
                                   "it: a model with recurrent layers computes every sequence from its first token")
            out.append(StateSeq(self.slot(rid), q0, n, start == 0))
        return RecurrentStep(out, self.conv, self.ssm)
