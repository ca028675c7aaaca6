"""ModelRunner: SchedulerOutput in, sampled tokens out. Owns the model, the KV cache and the generators.

Per step it builds, for the T scheduled tokens (decodes first, then prefill chunks):
    input_ids (T,), positions (T,), slot_mapping (T,), decode block tables (D, max_blocks) and masks,
then runs the model, computes logits only at the S positions that sample, and samples them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenmill.engine.scheduler import ScheduledRequest, SchedulerOutput
from tokenmill.layers.attention import AttentionMetadata, PrefillChunk
from tokenmill.layers.sampler import SamplingBatch, SamplerOutput, sample
from tokenmill.models.llama import LlamaModel
from tokenmill.outputs import Logprob, TokenLogprobs
from tokenmill.platforms import Platform
from tokenmill.worker.decode_mirror import DecodeMirror


@dataclass
class ModelRunnerOutput:
    sampled: dict[str, int] = field(default_factory=dict)  # request id -> new token
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: LlamaModel, platform: Platform, num_blocks: int, block_size: int,
                 eog_token_ids: frozenset[int], seed: int = 0) -> None:
        cfg = model.cfg
        self.model = model
        self.platform = platform
        self.device = platform.device
        self.block_size = block_size
        self.vocab_size = cfg.vocab_size
        self.eog_token_ids = sorted(eog_token_ids)
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        # One allocation for all layers: (2, layers, blocks, bs, nkv, hd), zeroed so that its pages are
        # committed now: the memory the plan promised is taken at start, and RSS stays flat afterwards
        # (with torch.empty it crept up as the LRU free queue cycled through never-touched blocks).
        self.kv = torch.zeros((2, cfg.num_layers, *shape), dtype=platform.dtype, device=self.device)
        self.kv_caches = [(self.kv[0, i], self.kv[1, i]) for i in range(cfg.num_layers)]
        self.generators: dict[str, torch.Generator] = {}
        budget = platform.decode_mirror_bytes()
        self.mirror = DecodeMirror(self.kv, budget) if budget > 0 else None
        torch.manual_seed(seed)

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    # -- inputs ----------------------------------------------------------------------------------------
    def _prepare_inputs(self, sched: list[ScheduledRequest]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        sample_idx: list[int] = []
        decodes = [s for s in sched if s.num_new_tokens == 1 and s.start > 0]
        prefills = [s for s in sched if not (s.num_new_tokens == 1 and s.start > 0)]
        mirror_step = None
        if self.mirror is not None:
            if decodes:
                slot_order = self.mirror.plan([s.request.request_id for s in decodes], [s.start for s in decodes],
                                         [s.request.block_ids for s in decodes])
                if slot_order is not None:
                    decodes = [decodes[i] for i in slot_order]
                    mirror_step = self.mirror.step_inputs([s.start for s in decodes])
            else:
                self.mirror.reset()
        chunks: list[PrefillChunk] = []
        for s in decodes + prefills:
            table = s.request.block_ids
            q_start = len(ids)
            ids.extend(s.token_ids)
            for p in range(s.start, s.start + s.num_new_tokens):
                pos.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            if s.samples:
                sample_idx.append(len(ids) - 1)
            if not (s.num_new_tokens == 1 and s.start > 0):
                chunks.append(PrefillChunk(q_start, s.num_new_tokens, s.start,
                                           torch.tensor(table, dtype=torch.long, device=self.device)))
        dev = self.device
        decode_tables = decode_mask = None
        if decodes and mirror_step is None:
            max_blocks = max(len(s.request.block_ids) for s in decodes)
            tables = [s.request.block_ids + [0] * (max_blocks - len(s.request.block_ids)) for s in decodes]
            decode_tables = torch.tensor(tables, dtype=torch.long, device=dev)
            ctx = torch.tensor([s.start + 1 for s in decodes], device=dev)
            decode_mask = (torch.arange(max_blocks * bs, device=dev)[None, :] < ctx[:, None])[:, None, None, :]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decodes=len(decodes), decode_block_tables=decode_tables, decode_mask=decode_mask,
            prefills=chunks, mirror=mirror_step,
        )
        sched[:] = decodes + prefills  # the caller reads results in this order
        return (torch.tensor(ids, dtype=torch.long, device=dev), torch.tensor(pos, dtype=torch.long, device=dev),
                meta, sample_idx)

    def _prepare_sampling(self, rows: list[ScheduledRequest]) -> SamplingBatch:
        dev, V = self.device, self.vocab_size
        params = [s.request.sampling_params for s in rows]
        S = len(rows)
        temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
        all_greedy = all(p.temperature == 0 for p in params)
        top_k = top_p = min_p = None
        if any(0 < p.top_k < V and p.temperature > 0 for p in params):
            top_k = torch.tensor([p.top_k if 0 < p.top_k < V else V for p in params], dtype=torch.long, device=dev)
        if any(p.top_p < 1.0 and p.temperature > 0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)
        if any(p.min_p > 0 and p.temperature > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev)
        gens: list[torch.Generator | None] = []
        for s in rows:
            seed = s.request.seed
            if seed is None or s.request.sampling_params.temperature == 0:
                gens.append(None)
                continue
            g = self.generators.get(s.request.request_id)
            if g is None:
                g = torch.Generator(device=dev)
                g.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)  # torch takes 64-bit seeds; fold any int in
                self.generators[s.request.request_id] = g
            gens.append(g)
        b = SamplingBatch(temp, top_k, top_p, min_p, gens, all_greedy)
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            outs = [s.request.output_token_ids for s in rows]
            width = max(1, max(len(o) for o in outs))
            b.output_ids = torch.tensor([o + [V] * (width - len(o)) for o in outs], dtype=torch.long, device=dev)
            b.presence = torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, device=dev)
            b.frequency = torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32, device=dev)
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = [s.request.token_ids for s in rows]
            width = max(len(x) for x in seen)
            b.seen_ids = torch.tensor([x + [V] * (width - len(x)) for x in seen], dtype=torch.long, device=dev)
            b.repetition = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=dev)
        bias = [(i, t, v) for i, p in enumerate(params) for t, v in (p.logit_bias or {}).items()]
        if bias:
            b.bias_rows = torch.tensor([x[0] for x in bias], dtype=torch.long, device=dev)
            b.bias_tokens = torch.tensor([x[1] for x in bias], dtype=torch.long, device=dev)
            b.bias_values = torch.tensor([x[2] for x in bias], dtype=torch.float32, device=dev)
        block: list[tuple[int, int]] = []
        for i, s in enumerate(rows):
            p = s.request.sampling_params
            if s.request.num_output_tokens < p.min_tokens:
                banned = set(p.stop_token_ids or [])
                if not p.ignore_eos:
                    banned |= set(s.request.eog_token_ids)
                block.extend((i, t) for t in sorted(banned))
        if block:
            b.block_rows = torch.tensor([x[0] for x in block], dtype=torch.long, device=dev)
            b.block_tokens = torch.tensor([x[1] for x in block], dtype=torch.long, device=dev)
        wants = [p.logprobs for p in params if p.logprobs is not None]
        b.max_logprobs = max(wants) if wants else -1
        del S
        return b

    # -- the step --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        sched = list(out.scheduled)
        input_ids, positions, meta, sample_idx = self._prepare_inputs(sched)
        hidden = self.model(input_ids, positions, meta, self.kv_caches)
        rows = [s for s in sched if s.samples]
        result = ModelRunnerOutput()
        if not rows:
            return result
        logits = self.model.compute_logits(hidden[sample_idx])
        so = sample(logits, self._prepare_sampling(rows))
        for i, s in enumerate(rows):
            rid = s.request.request_id
            result.sampled[rid] = so.token_ids[i]
            n = s.request.sampling_params.logprobs
            if n is not None:
                result.logprobs[rid] = self._logprobs_row(so, i, n)
        return result

    @staticmethod
    def _logprobs_row(so: SamplerOutput, i: int, n: int) -> TokenLogprobs:
        assert so.logprobs is not None and so.ranks is not None
        top: list[Logprob] = []
        if n > 0 and so.top_ids is not None and so.top_logprobs is not None:
            ids = so.top_ids[i, :n].tolist()
            lps = so.top_logprobs[i, :n].tolist()
            top = [Logprob(t, lp, r + 1) for r, (t, lp) in enumerate(zip(ids, lps))]
        return TokenLogprobs(so.token_ids[i], float(so.logprobs[i]), int(so.ranks[i]), top)
