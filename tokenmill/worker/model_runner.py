"""ModelRunner: SchedulerOutput in, ModelRunnerOutput out. Owns the model, the KV cache, the attention
backend, the logits processors and each request's state (by id; no `Request` object reaches it).

Per step it first applies the contract to its request states (drop finished, add new, apply deltas),
then builds, for the T scheduled tokens (decodes first, in the backend's order, then prefill chunks):
    input_ids (T,), positions (T,), and the backend's metadata (slot mapping, block tables, masks),
runs the model, computes logits only at the S positions that sample, and samples them. Requests that
asked for prompt logprobs also get logits at their prompt positions in this chunk (nobody else pays).
"""

from __future__ import annotations

import torch

from dataclasses import dataclass

from tokenmill.attention.backend import AttentionBackend, AttentionContext, AttentionStep, ScheduledSeq
from tokenmill.models.interface import CausalLM
from tokenmill.outputs import Logprob, TokenLogprobs
from tokenmill.sample.grammar_bitmask import GrammarBitmaskProcessor
from tokenmill.sample.logits_processor import LogitsProcessor, default_processors
from tokenmill.sample.sampler import SamplerOutput, SamplingBatch, argmax_only, sample
from tokenmill.sample.spec_verify import accepted_prefix
from tokenmill.scheduler_output import ModelRunnerOutput, PromptLogprobsChunk, SchedulerOutput
from tokenmill.worker.drafter import ModelDrafter
from tokenmill.worker.kv_cache import per_layer_views
from tokenmill.worker.recurrent_state import RecurrentStatePool
from tokenmill.worker.request_state import CachedRequestState


# prompt logprobs: logits rows computed at once, so a long prompt never holds (T, V) floats at a time
_PROMPT_LOGITS_ELEMENTS = 1 << 24


class _DraftRow:
    """A sampling row at draft position j of a speculating request: the request's state seen with its
    first j draft tokens appended (what penalties and min_tokens must see there). Its generator is the
    request's own."""

    def __init__(self, base: CachedRequestState, drafts: list[int]) -> None:
        self.base = base
        self.req_id = base.req_id
        self.sampling_params = base.sampling_params
        self.prompt_token_ids = base.prompt_token_ids
        self.seed = base.seed
        self.token_ids = base.token_ids + drafts

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def generator(self) -> torch.Generator | None:
        return self.base.generator

    @generator.setter
    def generator(self, g: torch.Generator | None) -> None:
        self.base.generator = g


@dataclass
class _PromptRows:
    """One request's prompt positions in this step that score a prompt token: hidden rows
    [row, row + len(targets)) predict prompt tokens start, start + 1, ... (= targets)."""

    req_id: str
    row: int
    start: int
    targets: list[int]
    num_top: int


class ModelRunner:
    def __init__(self, model: CausalLM, kv: torch.Tensor, attn_backend: AttentionBackend, device: torch.device,
                 block_size: int, vocab_size: int, eog_token_ids: frozenset[int], seed: int = 0,
                 states: RecurrentStatePool | None = None) -> None:
        """kv: the paged cache, (2, layers, num_blocks, block_size, nkv, hd); states: the recurrent layers'
        per-sequence states, for a model that has such layers."""
        self.model = model
        self.kv = kv
        self.kv_caches = per_layer_views(kv)
        self.attn_backend = attn_backend
        self.device = device
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.requests: dict[str, CachedRequestState] = {}
        self.grammar = GrammarBitmaskProcessor(device)  # last: nothing may re-allow what a grammar forbids
        self.processors: list[LogitsProcessor] = [*default_processors(vocab_size, eog_token_ids, device), self.grammar]
        # rows without a seed of their own draw from this engine's generator (never torch's global one:
        # several engines in one process must not reseed each other)
        self.shared_generator = torch.Generator(device=device)
        self.shared_generator.manual_seed(seed)
        self.verify = accepted_prefix  # how many drafts a step keeps (a test swaps in a wrong one)
        self.drafter: ModelDrafter | None = None  # fills placeholder drafts (draft_model, layer_skip)
        self.states = states

    # -- the contract ----------------------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        if so.finished_req_ids:
            for rid in so.finished_req_ids:
                self.requests.pop(rid, None)
            self.attn_backend.release(so.finished_req_ids)
            if self.drafter is not None:
                self.drafter.release(so.finished_req_ids)
        for new in so.new_reqs:
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, new.prompt_token_ids, new.sampling_params, new.seed, list(new.block_ids),
                new.num_computed_tokens, new.prompt_token_ids + new.output_token_ids)
        c = so.cached_reqs
        for i, rid in enumerate(c.req_ids):
            st = self.requests[rid]
            st.token_ids.extend(c.new_token_ids[i])
            if c.resumed_from_preemption[i]:
                st.block_ids = list(c.new_block_ids[i])
            else:
                st.block_ids.extend(c.new_block_ids[i])
            st.num_computed_tokens = c.num_computed_tokens[i]

    # -- inputs ----------------------------------------------------------------------------------------
    def _prepare_inputs(self, so: SchedulerOutput, spec: dict[str, list[int]]) -> tuple[
            torch.Tensor, torch.Tensor, AttentionContext, list[int], list[CachedRequestState | _DraftRow],
            list[_PromptRows]]:
        """spec: the step's drafts (placeholders filled). -> input_ids (T,), positions (T,), attention context,
        the token index of each sampling row, the sampling rows' states (in the step's order), and the rows
        that score prompt tokens."""
        decodes: list[ScheduledSeq] = []
        prefills: list[ScheduledSeq] = []
        split = self.attn_backend.multi_token_decode
        for rid, n in so.num_scheduled_tokens.items():
            st = self.requests[rid]
            seq = ScheduledSeq(rid, st.num_computed_tokens, n, st.block_ids)
            if split and n > 1 and n == 1 + len(spec.get(rid, ())) and seq.start == len(st.token_ids) - 1:
                # a decode verifying drafts: one decode entry per position (the backend writes the step's K/V
                # before attending, so entry j sees the drafts before it), not a prefill chunk
                decodes.extend(ScheduledSeq(rid, seq.start + j, 1, st.block_ids) for j in range(n))
            else:
                (decodes if n == 1 and seq.start > 0 else prefills).append(seq)
        meta = self.attn_backend.build_metadata(AttentionStep(decodes, prefills))
        ordered = [decodes[i] for i in meta.decode_order] + prefills
        ids: list[int] = []
        pos: list[int] = []
        sample_idx: list[int] = []
        rows: list[CachedRequestState | _DraftRow] = []
        prompt_rows: list[_PromptRows] = []
        for seq in ordered:
            st = self.requests[seq.req_id]
            drafts = spec.get(seq.req_id, [])
            if drafts and seq.num_tokens == 1:  # one position of a split verification (entries in order)
                j = seq.start - (len(st.token_ids) - 1)  # 0: the last known token, j: draft j
                ids.append(drafts[j - 1] if j else st.token_ids[-1])
                pos.append(seq.start)
                sample_idx.append(len(ids) - 1)
                rows.append(_DraftRow(st, drafts[:j]) if j else st)
                continue
            end = seq.start + seq.num_tokens - len(drafts)  # the known tokens this step computes end here
            n_top = st.sampling_params.prompt_logprobs
            last = min(end, len(st.prompt_token_ids) - 1)  # position p's logits score prompt token p + 1
            if n_top is not None and seq.start < last:
                prompt_rows.append(_PromptRows(seq.req_id, len(ids), seq.start + 1,
                                               st.prompt_token_ids[seq.start + 1 : last + 1], n_top))
            ids.extend(st.token_ids[seq.start : end])
            ids.extend(drafts)
            pos.extend(range(seq.start, end + len(drafts)))
            if end == len(st.token_ids):  # reaches the last known token: a new one is sampled
                # with k drafts: k + 1 rows, row j scoring the token after draft j - 1 (verification)
                first = len(ids) - 1 - len(drafts)
                sample_idx.extend(range(first, len(ids)))
                rows.append(st)
                rows.extend(_DraftRow(st, drafts[:j]) for j in range(1, len(drafts) + 1))
        dev = self.device
        attn = AttentionContext(self.attn_backend, meta, self.kv_caches)
        if self.states is not None:
            q0, seqs = 0, []
            for seq in ordered:
                seqs.append((q0, seq.num_tokens, seq.start, so.state_plans[seq.req_id]))
                q0 += seq.num_tokens
            attn.recurrent = self.states.step(seqs)
        return (torch.tensor(ids, dtype=torch.long, device=dev), torch.tensor(pos, dtype=torch.long, device=dev),
                attn, sample_idx, rows, prompt_rows)

    def _prepare_sampling(self, rows: list[CachedRequestState | _DraftRow]) -> SamplingBatch:
        dev, V = self.device, self.vocab_size
        params = [r.sampling_params for r in rows]
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
        for r in rows:
            if r.seed is None or r.sampling_params.temperature == 0:
                gens.append(None)
                continue
            if r.generator is None:
                r.generator = torch.Generator(device=dev)
                r.generator.manual_seed(r.seed & 0xFFFF_FFFF_FFFF_FFFF)  # torch takes 64-bit seeds; fold any int in
            gens.append(r.generator)
        wants = [p.logprobs for p in params if p.logprobs is not None]
        return SamplingBatch(temp, top_k, top_p, min_p, gens, all_greedy, self.shared_generator,
                             max(wants) if wants else -1)

    # -- the step --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(so)
        result = ModelRunnerOutput()
        if so.is_empty:
            return result
        spec = so.spec_token_ids
        if self.drafter is not None:
            for rid, num in so.num_scheduled_tokens.items():
                st = self.requests[rid]
                self.drafter.target_writes(st.block_ids, st.num_computed_tokens, num)
            spec = self.drafter.fill(self.requests, spec)  # before the target: its forward verifies them
        input_ids, positions, attn, sample_idx, rows, prompt_rows = self._prepare_inputs(so, spec)
        hidden = self.model.forward(input_ids, positions, attn)
        for pr in prompt_rows:
            result.prompt_logprobs[pr.req_id] = self._prompt_logprobs(hidden, pr)
        if not rows:
            return result
        self._set_grammar(so, rows)
        active = [p for p in self.processors if p.prepare(rows)]
        batch = self._prepare_sampling(rows)
        # rows that need only their argmax take the head's output as it is (bf16 at bf16: a 64-row step of
        # SmolLM2 skips a 12 MB float32 copy)
        logits = self.model.compute_logits(hidden[sample_idx],
                                           float32=not argmax_only(batch, active, hidden.device))
        out = sample(logits, batch, active)
        i = 0
        while i < len(rows):
            r = rows[i]
            drafts = spec.get(r.req_id, [])
            n_keep = self.verify(out.token_ids[i : i + len(drafts) + 1], drafts) if drafts else 0  # spec_verify.py
            if drafts and self.drafter is not None:
                self.drafter.verified(self.requests[r.req_id], len(drafts), n_keep)
            result.sampled_token_ids[r.req_id] = drafts[:n_keep] + [out.token_ids[i + n_keep]]
            n = r.sampling_params.logprobs
            if n is not None:
                result.logprobs[r.req_id] = [self._logprobs_row(out, i + j, n) for j in range(n_keep + 1)]
            i += len(drafts) + 1
        return result

    def _set_grammar(self, so: SchedulerOutput, rows: list[CachedRequestState | _DraftRow]) -> None:
        """Give the grammar processor this step's constrained rows and their bitmask rows (a speculating
        request owns consecutive bitmask rows, one per draft position, from its first)."""
        owners = so.structured_output_request_ids
        if not owners or so.grammar_bitmask is None:
            self.grammar.set_step([], None)
            return
        picked = [(i, owners[r.req_id] + (len(r.token_ids) - len(r.base.token_ids) if isinstance(r, _DraftRow) else 0))
                  for i, r in enumerate(rows) if r.req_id in owners]
        mask = torch.from_numpy(so.grammar_bitmask)[[g for _, g in picked]] if picked else None
        self.grammar.set_step([i for i, _ in picked], mask)

    def _prompt_logprobs(self, hidden: torch.Tensor, pr: _PromptRows) -> PromptLogprobsChunk:
        """Raw log-softmax of the prompt tokens pr scores, from hidden (T, D), in slices of rows."""
        entries: list[TokenLogprobs] = []
        step = max(1, _PROMPT_LOGITS_ELEMENTS // self.vocab_size)
        for a in range(0, len(pr.targets), step):
            tgt = pr.targets[a : a + step]
            logits = self.model.compute_logits(hidden[pr.row + a : pr.row + a + len(tgt)])  # (S, V) float32
            lp = torch.log_softmax(logits, dim=-1)
            t = torch.tensor(tgt, dtype=torch.long, device=lp.device).unsqueeze(1)
            chosen = lp.gather(1, t)  # (S, 1)
            ranks = ((lp > chosen).sum(dim=1) + 1).tolist()
            top_lp, top_ids = lp.topk(pr.num_top, dim=-1) if pr.num_top > 0 else (None, None)
            for j, tok in enumerate(tgt):
                top: list[Logprob] = []
                if top_lp is not None and top_ids is not None:
                    top = [Logprob(int(i), float(v), r + 1)
                           for r, (i, v) in enumerate(zip(top_ids[j].tolist(), top_lp[j].tolist()))]
                entries.append(TokenLogprobs(tok, float(chosen[j, 0]), int(ranks[j]), top))
        return PromptLogprobsChunk(pr.start, entries)

    @staticmethod
    def _logprobs_row(so: SamplerOutput, i: int, n: int) -> TokenLogprobs:
        assert so.logprobs is not None and so.ranks is not None
        top: list[Logprob] = []
        if n > 0 and so.top_ids is not None and so.top_logprobs is not None:
            ids = so.top_ids[i, :n].tolist()
            lps = so.top_logprobs[i, :n].tolist()
            top = [Logprob(t, lp, r + 1) for r, (t, lp) in enumerate(zip(ids, lps))]
        return TokenLogprobs(so.token_ids[i], float(so.logprobs[i]), int(so.ranks[i]), top)
