"""Scheduler: each step, hand out tokens under a budget; no prefill or decode phases (torch-free).

Per step, with `token_budget = max_num_batched_tokens`:
  1. Running requests, oldest first, get `num_tokens - num_computed_tokens` tokens (1 for a decode, the
     rest of a prompt chunk otherwise), capped by the budget. If the cache has no block for one, the
     newest running request is preempted (recompute: its blocks are freed, it goes back to the front of
     the waiting queue with num_computed_tokens = 0) until the block fits; a request may preempt itself.
     A decode with draft tokens (speculative decoding) asks for 1 + k tokens, drafts cut to the budget
     and dropped rather than preempt anyone for them; after the step, the rejected drafts' positions are
     taken off num_computed_tokens again (their KV is overwritten when those positions are computed).
  2. If nothing was preempted, waiting requests are admitted in order while the budget, `max_num_seqs`
     and the free blocks allow: prefix-cache hits first (they cost no budget), then a chunk of what is
     left. A request that cannot get its blocks now waits; later ones wait behind it (FCFS).
Requests that could never fit (longer than max_model_len or than the whole cache) are refused before
they get here, so waiting never turns into waiting forever.

A model with recurrent layers (Qwen3.5, LFM2, Granite 4.0-H) also has a StateCache (engine/state_cache.py): an
admitted request takes a private state slot and its prefix-cache hits only as far as a checkpoint of the state
reaches; every scheduled request gets a StatePlan (which slot its state is read from, which slots it writes), and
`update` registers the checkpoints a step wrote.

With `sliding_window` W (a model whose every layer attends over the last W keys), `update` frees each
request's blocks that left the window (BlockManager.free_outside_window), and an admitted request takes
no prefix-cache hit the window no longer reaches: a sequence then holds at most ceil((W - 1) / bs) + 1
blocks plus the ones its next chunk needs, however long it grows (so its prompt may exceed the cache).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from tokenmill.engine.block_manager import LEFT_WINDOW, BlockManager
from tokenmill.engine.request import Request, RequestStatus
from tokenmill.engine.state_cache import StateCache
from tokenmill.scheduler_output import CachedRequestData, ModelRunnerOutput, NewRequestData, SchedulerOutput


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    watermark_blocks: int = 0  # admit new requests only while this many blocks stay free
    sliding_window: int = 0  # W > 0: every layer windowed by W, blocks that leave the window are freed


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, states: StateCache | None = None) -> None:
        """states: a model with recurrent layers' state slots (engine/state_cache.py); its running sequences are
        at most its private slots, and a cached prefix is reused only as far as a checkpoint of the state reaches."""
        self.config = config
        self.bm = block_manager
        self.states = states
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.num_preemptions = 0
        self._finished_req_ids: set[str] = set()  # finished since the last step: the workers drop them

    # -- queue management ------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Take req out of the queues for good and free its blocks (abort, stop, error)."""
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        req.status = status
        self.bm.free(req)
        if self.states is not None:
            self.states.release(req)
        self.requests.pop(req.request_id, None)
        if req.is_known_to_workers:
            self._finished_req_ids.add(req.request_id)

    def take_finished_req_ids(self) -> set[str]:
        """Ids of the requests the workers know that finished since this was last asked (each told once)."""
        ids, self._finished_req_ids = self._finished_req_ids, set()
        return ids

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self.bm.free(victim)
        if self.states is not None:
            self.states.release(victim)
        victim.num_computed_tokens = 0
        victim.num_sent_blocks = 0  # re-admitted: the workers get its whole new block table
        victim.spec_token_ids = []
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    # -- the step --------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self.take_finished_req_ids())
        budget = self.config.max_num_batched_tokens
        now = time.monotonic()

        # 1. running requests, in admission order
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:  # nothing to compute (cannot happen for live requests); keep it honest
                i += 1
                continue
            drafts, req.spec_token_ids = req.spec_token_ids, []
            if req.num_tokens - req.num_computed_tokens == 1:  # a decode may verify drafts too
                drafts = drafts[: budget - 1]
                if drafts and not self.bm.can_allocate(req, 1 + len(drafts)):  # drafts never cost a preemption
                    drafts = []
                num_new += len(drafts)
            else:
                drafts = []
            while not self.bm.can_allocate(req, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted_req_ids.append(victim.request_id)
                if victim is req:
                    break
            if req.status is RequestStatus.PREEMPTED:
                break  # it preempted itself: everything after it is already gone too
            self.bm.allocate(req, num_new)
            if drafts:
                out.spec_token_ids[req.request_id] = drafts
            self._emit(out, req, num_new)
            budget -= num_new
            i += 1

        # 2. waiting requests, unless this step had to preempt
        if not out.preempted_req_ids:
            skipped: list[Request] = []
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                req = self.waiting[0]
                leader = req.fork_of
                if leader is not None and not leader.is_finished and leader.num_computed_tokens < leader.num_prompt_tokens:
                    skipped.append(self.waiting.popleft())  # wait for the sibling's prefill, let others by
                    continue
                restore, diverged_at = -1, 0
                if self.states is not None:
                    shared, restore, diverged_at = self._restorable_prefix(req)
                    from_cache = self.bm.enable_prefix_caching and req.sampling_params.prompt_logprobs is None
                else:
                    shared, from_cache = self._shared_prefix(req)
                req.num_computed_tokens = len(shared) * self.bm.block_size
                if self.config.sliding_window:  # hits the window no longer reaches are not taken at all
                    unread = (req.num_computed_tokens - self.config.sliding_window + 1) // self.bm.block_size
                    shared = [LEFT_WINDOW] * max(unread, 0) + shared[max(unread, 0):]
                num_new = min(req.num_tokens - req.num_computed_tokens, budget)
                if not self.bm.can_allocate(req, num_new, shared, reserve=self.config.watermark_blocks):
                    req.num_computed_tokens = 0
                    break
                self.waiting.popleft()
                self.bm.allocate(req, num_new, shared)
                if self.states is not None:
                    self.states.admit(req, restore, diverged_at)
                if from_cache:
                    self.bm.record_query(req.num_tokens, req.num_computed_tokens)
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
                    req.num_cached_tokens = req.num_computed_tokens
                req.status = RequestStatus.RUNNING
                self.running.append(req)
                self._emit(out, req, num_new)
                budget -= num_new
            self.waiting.extendleft(reversed(skipped))

        out.total_num_scheduled_tokens = self.config.max_num_batched_tokens - budget
        return out

    def _shared_prefix(self, req: Request) -> tuple[list[int], bool]:
        """Blocks req can reuse: a prefilled sibling's full prompt blocks (n > 1), else prefix-cache hits.
        The flag says whether they came from the cache. A request that wants prompt logprobs computes its
        whole prompt (as vLLM does); its full blocks still go into the cache for others."""
        leader = req.fork_of
        if leader is not None and not leader.is_finished and leader.status is RequestStatus.RUNNING:
            n_full = min(leader.num_computed_tokens, req.num_tokens - 1) // self.bm.block_size
            if (leader.token_ids[: n_full * self.bm.block_size] == req.token_ids[: n_full * self.bm.block_size]
                    and LEFT_WINDOW not in leader.block_ids[:n_full]):
                return leader.block_ids[:n_full], False
        if req.sampling_params.prompt_logprobs is not None:
            return [], False  # cached blocks hold KV, not the logits the prompt's logprobs come from
        return self.bm.find_cached_prefix(req), True

    def _restorable_prefix(self, req: Request) -> tuple[list[int], int, int]:
        """A model with recurrent layers: the cached KV blocks req can take, up to the longest prefix with a
        checkpoint of the state (StateCache.find), that checkpoint's slot (-1: none) and where its prompt left the
        cached blocks if that is further (0: it is not), a place to take a checkpoint for the next such request.
        n > 1 siblings find the leader's prompt checkpoint once it has prefilled; prompt logprobs take nothing."""
        assert self.states is not None
        if req.sampling_params.prompt_logprobs is not None:
            return [], -1, 0
        hits = self.bm.find_cached_prefix(req)
        j, slot = self.states.find(req, len(hits))
        return hits[:j], slot, (len(hits) * self.bm.block_size if len(hits) > j else 0)

    def _emit(self, out: SchedulerOutput, req: Request, num_new: int) -> None:
        """Put req's share of the step into the contract: all of it the first time, deltas after."""
        out.num_scheduled_tokens[req.request_id] = num_new
        if self.states is not None:
            out.state_plans[req.request_id] = self.states.plan(req, num_new)
        if not req.is_known_to_workers:
            out.new_reqs.append(NewRequestData(
                req.request_id, list(req.prompt_token_ids), req.output_token_ids, req.sampling_params, req.seed,
                list(req.block_ids), req.num_computed_tokens))
            req.is_known_to_workers = True
        else:
            c = out.cached_reqs
            c.req_ids.append(req.request_id)
            c.new_token_ids.append(req.token_ids[req.num_sent_tokens :])
            c.new_block_ids.append(req.block_ids[req.num_sent_blocks :])
            c.num_computed_tokens.append(req.num_computed_tokens)
            c.resumed_from_preemption.append(req.num_sent_blocks == 0)  # only a preemption empties it
        req.num_sent_tokens = req.num_tokens
        req.num_sent_blocks = len(req.block_ids)

    def update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[Request]:
        """Advance the scheduled requests by the tokens they computed and append the tokens they sampled
        (blocks that became full are hashed for the prefix cache). Returns the requests that got new
        tokens; their status is not touched here (the engine's StopChecker decides that)."""
        updated: list[Request] = []
        now = time.monotonic()
        for req_id, num_new in out.num_scheduled_tokens.items():
            req = self.requests.get(req_id)
            if req is None or req.is_finished:  # aborted while the step ran
                continue
            new_ids = result.sampled_token_ids.get(req_id)
            num_drafts = len(out.spec_token_ids.get(req_id, ()))
            if num_drafts and new_ids:  # rejected drafts' KV is not kept: their positions are computed again
                num_new -= num_drafts - (len(new_ids) - 1)
            req.num_computed_tokens += num_new
            if new_ids:
                req.token_ids.extend(new_ids)
                if req.first_token_time is None:
                    req.first_token_time = now
                updated.append(req)
            self.bm.cache_full_blocks(req)
            if self.states is not None:
                self.bm.compute_block_hashes(req)  # a checkpoint is keyed by its last block's hash
                self.states.update(req)
            if self.config.sliding_window:
                self.bm.free_outside_window(req, self.config.sliding_window)
        return updated
