"""The recurrent state of a model's recurrent layers (Qwen3.5's Gated DeltaNet, LFM2's short convs): the tensors of the
state pool. Which slot holds what is the scheduler's (engine/state_cache.py): each step's StatePlan per request
says the slot its state is read from and the slots the segments of its tokens write (a checkpoint at a block
boundary, then its private slot), so the workers keep no per-request slot of their own.

Per recurrent layer j (the j-th in ModelConfig.linear_layers), float32:
    conv[j]  (slots, conv_dim, K - 1)   the causal conv's last K - 1 inputs
    ssm[j]   (slots, Hv, dk, dv)        the delta rule's state matrix per value head (LFM2: none, zero-size)
A request appears at most once in a step, in token order (no speculative drafts: the engine refuses them for
such a model).
"""

from __future__ import annotations

import torch

from tokenmill.layers.gated_delta import RecurrentStep, StateSeq
from tokenmill.loader.model_config import ModelConfig
from tokenmill.scheduler_output import StatePlan


class RecurrentStatePool:
    def __init__(self, cfg: ModelConfig, num_slots: int, device: torch.device) -> None:
        n = len(cfg.linear_layers)
        self.conv = torch.zeros((n, num_slots, cfg.linear_conv_dim, cfg.linear_conv_kernel - 1), dtype=torch.float32,
                                device=device)
        self.ssm = torch.zeros((n, num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                cfg.linear_value_head_dim), dtype=torch.float32, device=device)
        self.num_slots = num_slots

    def step(self, seqs: list[tuple[int, int, int, StatePlan]]) -> RecurrentStep:
        """seqs: (q_start, q_len, start position, plan) per request in the step's token order -> the step's states:
        each request's rows cut at its plan's ends, segment i reading the slot the one before it wrote (the first,
        the plan's src; zeros where src is -1) and writing dsts[i]."""
        out = []
        for q0, n, start, plan in seqs:
            if plan.ends[-1] != start + n or not all(start < e for e in plan.ends):
                raise ValueError(f"state plan {plan} does not cover tokens [{start}, {start + n})")
            src, pos = plan.src, start
            for end, dst in zip(plan.ends, plan.dsts):
                out.append(StateSeq(dst, q0 + pos - start, end - pos, src < 0, None if src < 0 else src))
                src, pos = dst, end
        return RecurrentStep(out, self.conv, self.ssm)
