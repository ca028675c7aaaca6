"""ModelDrafter: draft tokens from a model, inside the step that verifies them (speculative decoding's
draft_model and layer_skip methods).

The engine asks for k drafts by sending k DRAFT_PLACEHOLDERs in `spec_token_ids` for a request that
decodes; the scheduler reserved slots for its positions e - 1 .. e - 1 + k (e = its known tokens). Before
the target's forward the runner hands those requests to `fill`, which drafts greedily:

    pass 0   the request's tokens the draft has not seen, through its last known token at e - 1 -> d_1
             (draft_model: from draft_computed on, a catch-up chunk; layer_skip: the last token only, as
             the target wrote every earlier position of the layers both share)
    pass j   d_j at position e - 1 + j, one decode per request that wants more       -> d_{j+1}

All requests go through each pass together. Every position written lies in the request's reserved slots,
and the target's forward then writes its own K/V at the same positions (layer_skip shares the target's
cache: the same layers, tokens and positions give the same keys and values). The drafts are argmax, a
point mass, so the runner's verification (sample/spec_verify.py) stays exact at any temperature.

draft_model's own cache uses the target's block ids. `draft_computed[req]`: positions whose draft K/V
are valid; after a step that kept a of k drafts it is e + min(a, k - 1) (d_k was never fed to the draft).
A new or resumed request starts at 0: its blocks may come from the prefix cache, which the draft did not
necessarily compute.
"""

from __future__ import annotations

import torch

from tokenmill.attention.backend import AttentionBackend, AttentionContext, AttentionStep, ScheduledSeq
from tokenmill.models.interface import CausalLM
from tokenmill.scheduler_output import DRAFT_PLACEHOLDER
from tokenmill.worker.request_state import CachedRequestState


class ModelDrafter:
    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, device: torch.device, vocab_size: int, *, num_layers: int | None,
                 own_cache: bool) -> None:
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
        self.draft_computed: dict[str, int] = {}

    # -- request state -------------------------------------------------------------------------------
    def release(self, req_ids: set[str]) -> None:
        for rid in req_ids:
            self.draft_computed.pop(rid, None)
        self.backend.release(req_ids)

    def reset(self, req_id: str) -> None:
        """The request's blocks changed (resumed after preemption): its draft K/V are no longer known."""
        self.draft_computed.pop(req_id, None)

    def verified(self, req_id: str, num_known: int, num_drafts: int, num_accepted: int) -> None:
        """The step verified `num_drafts` drafts after `num_known` known tokens and kept `num_accepted`."""
        if self.own_cache:
            self.draft_computed[req_id] = num_known + min(num_accepted, num_drafts - 1)

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
            start = min(self.draft_computed.get(rid, 0), e - 1) if self.own_cache else e - 1
            seqs.append(ScheduledSeq(rid, start, e - start, st.block_ids))
            tokens.append(st.token_ids[start:e])
        drafts = {rid: [t] for rid, t in zip(rids, self._greedy(seqs, tokens))}
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
        best = self.model.compute_logits(hidden[last])[:, : self.vocab_size].argmax(dim=-1).tolist()
        chosen = {s.req_id: int(b) for s, b in zip(ordered, best)}
        return [chosen[s.req_id] for s in seqs]
