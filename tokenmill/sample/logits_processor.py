"""Logits processors: per-step hooks that change the logits of the rows that sample, before sampling.

Each step the runner calls `prepare(rows)` with the S rows that sample (their per-request state); a
processor builds whatever tensors it needs and says whether any row uses it; `apply(logits)` then
returns the changed (S, V) logits. `is_argmax_invariant()` tells the sampler whether the processor can
change a greedy row's pick: if it cannot, greedy batches skip it (their fast path).

Built-in, applied in this order: penalties (presence, frequency, repetition), logit_bias, min_tokens (EOS
and stop token ids forbidden until min_tokens are out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

import torch

from tokenmill.sampling_params import SamplingParams


class SamplingRow(Protocol):
    """What a processor may read of a request (the runner's per-request state)."""

    sampling_params: SamplingParams
    prompt_token_ids: list[int]
    token_ids: list[int]  # prompt + output so far

    @property
    def output_token_ids(self) -> list[int]: ...


class LogitsProcessor(ABC):
    @abstractmethod
    def prepare(self, rows: Sequence[SamplingRow]) -> bool:
        """Build this step's state for these rows; False if no row needs the processor (then `apply` is
        not called)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """(S, V) -> (S, V); must not modify its input in place."""

    def is_argmax_invariant(self) -> bool:
        """True if apply() never changes which token has the largest logit."""
        return False


class PenaltiesProcessor(LogitsProcessor):
    """presence / frequency penalties over the output so far; repetition penalty over prompt + output
    (positive logits divided by it, negative ones multiplied); with a penalty_window W, over only the last W
    of those tokens."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size, self.device = vocab_size, device
        self.output_ids: torch.Tensor | None = None  # (S, max_out) int64, padded with V (a dropped column)
        self.presence: torch.Tensor | None = None  # (S,)
        self.frequency: torch.Tensor | None = None  # (S,)
        self.seen_ids: torch.Tensor | None = None  # (S, max_seen) prompt + output ids, padded with V
        self.repetition: torch.Tensor | None = None  # (S,)

    def prepare(self, rows: Sequence[SamplingRow]) -> bool:
        dev, V = self.device, self.vocab_size
        params = [r.sampling_params for r in rows]
        self.output_ids = self.presence = self.frequency = self.seen_ids = self.repetition = None
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            outs = [_last(r.output_token_ids, r.sampling_params.penalty_window) for r in rows]
            width = max(1, max(len(o) for o in outs))
            self.output_ids = torch.tensor([o + [V] * (width - len(o)) for o in outs], dtype=torch.long, device=dev)
            self.presence = torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, device=dev)
            self.frequency = torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32, device=dev)
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = [_last(r.token_ids, r.sampling_params.penalty_window) for r in rows]
            width = max(len(x) for x in seen)
            self.seen_ids = torch.tensor([x + [V] * (width - len(x)) for x in seen], dtype=torch.long, device=dev)
            self.repetition = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=dev)
        return self.output_ids is not None or self.seen_ids is not None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        S, V = logits.shape
        if self.output_ids is not None:
            assert self.presence is not None and self.frequency is not None
            counts = torch.zeros(S, V + 1, dtype=logits.dtype, device=logits.device)
            counts.scatter_add_(1, self.output_ids, torch.ones_like(self.output_ids, dtype=logits.dtype))
            counts = counts[:, :V]
            logits = logits - self.frequency[:, None] * counts - self.presence[:, None] * (counts > 0).to(logits.dtype)
        if self.seen_ids is not None:
            assert self.repetition is not None
            seen = torch.zeros(S, V + 1, dtype=torch.bool, device=logits.device)
            seen.scatter_(1, self.seen_ids, True)
            seen = seen[:, :V]
            rp = self.repetition[:, None]
            penalised = torch.where(logits > 0, logits / rp, logits * rp)
            logits = torch.where(seen, penalised, logits)
        return logits


def _last(ids: list[int], window: int | None) -> list[int]:
    """The last `window` ids (all of them when None)."""
    return ids if window is None or len(ids) <= window else ids[-window:]


class LogitBiasProcessor(LogitsProcessor):
    """OpenAI's logit_bias: a value added to the logit of each listed token; then vLLM's allowed_token_ids:
    every other token's logit -inf."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows: torch.Tensor | None = None  # (nb,) entries: row, token, value
        self.tokens: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.allowed: list[tuple[int, torch.Tensor]] = []  # (row, its allowed ids)

    def prepare(self, rows: Sequence[SamplingRow]) -> bool:
        bias = [(i, t, v) for i, r in enumerate(rows) for t, v in (r.sampling_params.logit_bias or {}).items()]
        dev = self.device
        self.allowed = [(i, torch.tensor(r.sampling_params.allowed_token_ids, dtype=torch.long, device=dev))
                        for i, r in enumerate(rows) if r.sampling_params.allowed_token_ids is not None]
        self.rows = self.tokens = self.values = None
        if bias:
            self.rows = torch.tensor([x[0] for x in bias], dtype=torch.long, device=dev)
            self.tokens = torch.tensor([x[1] for x in bias], dtype=torch.long, device=dev)
            self.values = torch.tensor([x[2] for x in bias], dtype=torch.float32, device=dev)
        return bool(bias or self.allowed)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.rows is not None and self.tokens is not None and self.values is not None:
            logits = logits.index_put((self.rows, self.tokens), self.values, accumulate=True)
        if self.allowed:
            logits = logits.clone()
            for row, ids in self.allowed:  # the row's allowed logits kept, every other one -inf
                kept = logits[row, ids]
                logits[row] = float("-inf")
                logits[row, ids] = kept
        return logits


class MinTokensProcessor(LogitsProcessor):
    """Until a row has min_tokens outputs, its end-of-generation tokens (unless ignore_eos) and its stop
    token ids get -inf."""

    def __init__(self, eog_token_ids: frozenset[int], device: torch.device) -> None:
        self.eog_token_ids, self.device = eog_token_ids, device
        self.rows: torch.Tensor | None = None  # (nm,) forbidden this step: row, token
        self.tokens: torch.Tensor | None = None

    def prepare(self, rows: Sequence[SamplingRow]) -> bool:
        block: list[tuple[int, int]] = []
        for i, r in enumerate(rows):
            p = r.sampling_params
            if len(r.token_ids) - len(r.prompt_token_ids) < p.min_tokens:
                banned = set(p.stop_token_ids or [])
                if not p.ignore_eos:
                    banned |= set(self.eog_token_ids)
                block.extend((i, t) for t in sorted(banned))
        if not block:
            return False
        self.rows = torch.tensor([x[0] for x in block], dtype=torch.long, device=self.device)
        self.tokens = torch.tensor([x[1] for x in block], dtype=torch.long, device=self.device)
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None and self.tokens is not None
        return logits.index_put((self.rows, self.tokens), torch.tensor(float("-inf"), device=logits.device))


def default_processors(vocab_size: int, eog_token_ids: frozenset[int], device: torch.device) -> list[LogitsProcessor]:
    return [PenaltiesProcessor(vocab_size, device), LogitBiasProcessor(device),
            MinTokensProcessor(eog_token_ids, device)]
