"""ModelDrafter: draft tokens from a model, inside the step that verifies them (speculative decoding's
draft_model and layer_skip methods).

The engine asks for k drafts by sending k DRAFT_PLACEHOLDERs in `spec_token_ids` for a request that
decodes; the scheduler reserved slots for its positions e - 1 .. e - 1 + k (e = its known tokens). Before
the target's forward the runner hands those requests to `fill`, which drafts greedily:

    pass 0   the request's tokens the draft has not seen, through its last known token at e - 1 -> d_1
             (draft_model: from its first invalid slot on, a catch-up chunk; layer_skip: the last token only, as
             the target wrote every earlier position of the layers both share)
    pass j   d_j at position e - 1 + j, one decode per request that wants more       -> d_{j+1}

All requests go through each pass together. Every position written lies in the request's reserved slots,
and the target's forward then writes its own K/V at the same positions (layer_skip shares the target's
cache: the same layers, tokens and positions give the same keys and values). The drafts are argmax, a
point mass, so the runner's verification (sample/spec_verify.py) stays exact at any temperature.

draft_model's own cache uses the target's block ids, and which of its slots hold valid draft K/V is kept
per block (`valid[block]`: its leading slots that match the tokens there now), so a prefix-cache hit, a
sibling of an n > 1 request or a request resumed after preemption reuses what the draft computed before:
    the target writes positions p.. of a block (any step)       -> valid[block] = min(valid, p's slot)
    the draft's catch-up wrote known tokens [start, e)          -> those slots valid
    the step kept a of k drafts: d_1..d_min(a, k-1) were fed    -> those slots valid too (d_k never was)
A request's catch-up starts at the first invalid slot of its block table.
"""

from __future__ import annotations

import torch

from tokenmill.attention.backend import AttentionBackend, AttentionContext, AttentionStep, ScheduledSeq
from tokenmill.models.interface import CausalLM
from tokenmill.scheduler_output import DRAFT_PLACEHOLDER
from tokenmill.worker.request_state import CachedRequestState


class ModelDrafter:
    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, device: torch.device, vocab_size: int, block_size: int, *,
                 num_layers: int | None, own_cache: bool) -> None:
        """model: the draft (draft_model) or the target itself run for `num_layers` layers (layer_skip);
        kv_caches: per layer (k, v), the draft's own or the target's; vocab_size: the target's (argmax
        over those ids only)."""
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.device = device
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.own_cache = own_cache
        self.block_size = block_size
        self.valid: dict[int, int] = {}  # draft_model: block id -> leading slots with valid draft K/V
        self.num_catch_up_tokens = 0  # known tokens the draft computed besides each request's last one

    # -- draft K/V validity (draft_model) ------------------------------------------------------------
    def release(self, req_ids: set[str]) -> None:
        self.backend.release(req_ids)

    def target_writes(self, block_table: list[int], start: int, num_tokens: int) -> None:
        """The target computes positions [start, start + num_tokens) of a request this step."""
        if not self.own_cache or num_tokens <= 0:
            return
        bs = self.block_size
        first, last = start // bs, (start + num_tokens - 1) // bs
        b = block_table[first]
        self.valid[b] = min(self.valid.get(b, 0), start % bs)
        for i in range(first + 1, last + 1):
            self.valid.pop(block_table[i], None)

    def _mark(self, block_table: list[int], start: int, end: int) -> None:
        """The draft's K/V at positions [start, end) now match the tokens there (kept only where they
        extend a block's valid run)."""
        bs = self.block_size
        for i in range(start // bs, (end - 1) // bs + 1 if end > start else 0):
            a, z = max(start, i * bs) - i * bs, min(end, (i + 1) * bs) - i * bs
            b = block_table[i]
            if self.valid.get(b, 0) >= a:
                self.valid[b] = max(self.valid.get(b, 0), z)

    def _computed(self, block_table: list[int]) -> int:
        """Leading positions of a request whose draft K/V are valid."""
        n = 0
        for b in block_table:
            v = self.valid.get(b, 0)
            n += v
            if v < self.block_size:
                break
        return n

    def verified(self, st: CachedRequestState, num_drafts: int, num_accepted: int) -> None:
        """The step verified `num_drafts` drafts after st's known tokens and kept `num_accepted`."""
        if self.own_cache:
            e = len(st.token_ids)
            self._mark(st.block_ids, e, e + min(num_accepted, num_drafts - 1))

    # -- drafting ------------------------------------------------------------------------------------
    def fill(self, requests: dict[str, CachedRequestState], spec: dict[str, list[int]]) -> dict[str, list[int]]:
        """spec_token_ids with every placeholder run replaced by the draft's tokens (same lengths)."""
        want = {rid: len(d) for rid, d in spec.items() if d and d[0] == DRAFT_PLACEHOLDER}
        if not want:
            return spec
        rids = list(want)
        seqs, tokens = [], []
        for rid in rids:
            st = requests[rid]
            e = len(st.token_ids)
            start = min(self._computed(st.block_ids), e - 1) if self.own_cache else e - 1
            seqs.append(ScheduledSeq(rid, start, e - start, st.block_ids))
            tokens.append(st.token_ids[start:e])
            self.num_catch_up_tokens += e - 1 - start
        drafts = {rid: [t] for rid, t in zip(rids, self._greedy(seqs, tokens))}
        if self.own_cache:
            for s in seqs:
                self._mark(s.block_table, s.start, s.start + s.num_tokens)
        for j in range(1, max(want.values())):
            active = [rid for rid in rids if want[rid] > j]
            seqs = [ScheduledSeq(rid, len(requests[rid].token_ids) - 1 + j, 1, requests[rid].block_ids)
                    for rid in active]
            for rid, t in zip(active, self._greedy(seqs, [[drafts[rid][-1]] for rid in active])):
                drafts[rid].append(t)
        return {**spec, **drafts}

    def _greedy(self, seqs: list[ScheduledSeq], tokens: list[list[int]]) -> list[int]:
        """One forward of the draft over `seqs` (tokens[i] at positions seqs[i].start ...): the argmax
        token after each sequence's last, in the order of `seqs`."""
        by_id = dict(zip((s.req_id for s in seqs), tokens))
        decodes = [s for s in seqs if s.num_tokens == 1 and s.start > 0]
        prefills = [s for s in seqs if not (s.num_tokens == 1 and s.start > 0)]
        meta = self.backend.build_metadata(AttentionStep(decodes, prefills))
        ordered = [decodes[i] for i in meta.decode_order] + prefills
        ids: list[int] = []
        pos: list[int] = []
        last: list[int] = []
        for s in ordered:
            ids.extend(by_id[s.req_id])
            pos.extend(range(s.start, s.start + s.num_tokens))
            last.append(len(ids) - 1)
        dev = self.device
        hidden = self.model.forward(torch.tensor(ids, dtype=torch.long, device=dev),
                                    torch.tensor(pos, dtype=torch.long, device=dev),
                                    AttentionContext(self.backend, meta, self.kv_caches), num_layers=self.num_layers)
        best = self.model.compute_logits(hidden[last], float32=False)[:, : self.vocab_size].argmax(dim=-1).tolist()
        chosen = {s.req_id: int(b) for s, b in zip(ordered, best)}
        return [chosen[s.req_id] for s in seqs]
