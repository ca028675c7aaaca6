"""Randomised stress of Scheduler + BlockManager without a model: thousands of steps, random arrivals,
lengths, shared prefixes, n > 1 forks and aborts, with a cache small enough to force preemption.
Invariants checked every step: no block owned twice by one request, reference counts equal the number
of owners, free queue == blocks with no owner, token budget and sequence limit respected; at the end
every block is free. With a sliding window on every layer, blocks that left it are freed as requests
advance (BlockManager.free_outside_window): LEFT_WINDOW entries only before the window."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tokenmill.engine.block_manager import LEFT_WINDOW, BlockManager
from tokenmill.engine.request import Request, RequestStatus
from tokenmill.engine.scheduler import Scheduler, SchedulerConfig
from tokenmill.engine.stop_checker import token_stop
from tokenmill.sampling_params import ParamError, SamplingParams
from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput

EOS = 0


def sampling_ids(sched: Scheduler, out: SchedulerOutput) -> list[str]:
    """The scheduled requests whose chunk reaches their last known token (drafts past it): they sample."""
    return [rid for rid, n in out.num_scheduled_tokens.items() if (r := sched.requests.get(rid)) is not None
            and r.num_computed_tokens + n - len(out.spec_token_ids.get(rid, ())) == r.num_tokens]


def update(sched: Scheduler, out: SchedulerOutput, sampled: dict[str, list[int]]) -> None:
    """What the engine does after a step: advance, then apply the token stop rules to each new token in
    turn (no text here), dropping the tokens after a stop."""
    for req in sched.update(out, ModelRunnerOutput(dict(sampled))):
        new = sampled[req.request_id]
        del req.token_ids[len(req.token_ids) - len(new) + 1 :]
        for j, t in enumerate(new):
            if j:
                req.token_ids.append(t)
            status, _ = token_stop(req, sched.config.max_model_len)
            if status is not None:
                sched.finish(req, status)
                break


def random_tokens(rng: random.Random, sched: Scheduler, out: SchedulerOutput) -> dict[str, list[int]]:
    """Each sampling request's tokens: with k drafts, a random number of them accepted (the drafts
    themselves), then one more token; without, one token (EOS now and then)."""
    sampled = {}
    for rid in sampling_ids(sched, out):
        drafts = out.spec_token_ids.get(rid, [])
        keep = rng.randint(0, len(drafts))
        sampled[rid] = drafts[:keep] + [EOS if rng.random() < 0.02 else rng.randrange(1, 50)]
    return sampled


def propose_random(rng: random.Random, sched: Scheduler) -> None:
    """Random drafts for the running requests that decode next, within max_tokens and the context (as
    engine/spec_decode.py cuts them)."""
    for r in sched.running:
        if r.num_tokens - r.num_computed_tokens == 1 and rng.random() < 0.7:
            k = min(rng.randint(0, 5), r.max_tokens - r.num_output_tokens - 1, sched.config.max_model_len - r.num_tokens - 1)
            r.spec_token_ids = [rng.randrange(1, 50) for _ in range(max(k, 0))]


def check_invariants(sched: Scheduler, bm: BlockManager, live: list[Request]) -> None:
    owners: Counter[int] = Counter()
    window = sched.config.sliding_window
    for r in live:
        held = [b for b in r.block_ids if b != LEFT_WINDOW]
        assert len(set(held)) == len(held), "a request owns a block twice"
        owners.update(held)
        left = [i for i, b in enumerate(r.block_ids) if b == LEFT_WINDOW]
        if left:  # freed blocks lie wholly before the window of the next query
            assert window and (max(left) + 1) * bm.block_size <= r.num_computed_tokens - window + 1
        assert r.num_computed_tokens <= r.num_tokens, "computed positions past the known tokens (a draft kept)"
        if r.status is RequestStatus.RUNNING:
            assert len(r.block_ids) * bm.block_size >= r.num_computed_tokens
        else:
            assert not r.block_ids, "a waiting request holds blocks"
    for blk in bm.blocks:
        assert blk.ref_count == owners.get(blk.block_id, 0), f"block {blk.block_id} ref count is off"
        assert (blk.ref_count == 0) == (blk.block_id in bm.free_queue)
    for h, bid in bm.cached.items():
        assert bm.blocks[bid].block_hash == h


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("window", [0, 7])
def test_random_schedule(seed: int, prefix_caching: bool, window: int) -> None:
    run_random_schedule(seed, prefix_caching, window, drafts=False)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_random_schedule_with_random_drafts(seed: int, prefix_caching: bool) -> None:
    """Speculative decoding's side of it: random draft lengths, a random number accepted each step."""
    run_random_schedule(100 + seed, prefix_caching, 0, drafts=True)


def run_random_schedule(seed: int, prefix_caching: bool, window: int, drafts: bool) -> None:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    num_blocks = rng.randint(24, 80) if bs > 1 else rng.randint(200, 400)
    max_len = num_blocks * bs // 2
    bm = BlockManager(num_blocks, bs, prefix_caching)
    cfg = SchedulerConfig(max_num_seqs=rng.randint(2, 16), max_num_batched_tokens=rng.randint(8, 128),
                          max_model_len=max_len, watermark_blocks=rng.randint(0, 2), sliding_window=window)
    sched = Scheduler(cfg, bm)
    live: list[Request] = []
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randint(1, 3 * bs))] for _ in range(4)]
    n_made = n_done = n_verified = 0
    for step in range(2000):
        if step < 1500 and rng.random() < 0.2:
            prompt = (rng.choice(prefixes) if rng.random() < 0.5 else []) + \
                     [rng.randrange(1, 50) for _ in range(rng.randint(1, max_len // 3))]
            prompt = prompt[: max_len - 1]
            max_tokens = rng.randint(1, min(rng.choice([8, 32, max_len]), max_len - len(prompt)))
            n = rng.choice([1, 1, 1, 2, 3])
            params = SamplingParams(max_tokens=max_tokens, n=n)
            first = None
            for i in range(n):
                r = Request(f"r{n_made}-{i}", prompt, params, max_tokens, frozenset({EOS}), fork_of=first)
                first = first or r
                sched.add(r)
                live.append(r)
            n_made += 1
        if live and rng.random() < 0.05:  # abort someone, wherever they are
            victim = rng.choice(live)
            sched.finish(victim, RequestStatus.FINISHED_ABORTED)
        if drafts:
            propose_random(rng, sched)
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert len(sched.running) <= cfg.max_num_seqs
        assert sum(out.num_scheduled_tokens.values()) == out.total_num_scheduled_tokens
        assert all(out.num_scheduled_tokens[rid] == 1 + len(d) for rid, d in out.spec_token_ids.items())
        n_verified += len(out.spec_token_ids)
        sampled = random_tokens(rng, sched, out)
        if live and rng.random() < 0.05:  # abort mid-step, as a disconnect would
            sched.finish(rng.choice(live), RequestStatus.FINISHED_ABORTED)
        update(sched, out, sampled)
        for r in [r for r in live if r.is_finished]:
            live.remove(r)
            n_done += 1
            assert r.num_tokens <= max_len
        check_invariants(sched, bm, live)
    # drain
    for _ in range(200_000):
        if not sched.num_unfinished:
            break
        if drafts:
            propose_random(rng, sched)
        out = sched.schedule()
        update(sched, out, random_tokens(rng, sched, out))
        live = [r for r in live if not r.is_finished]
        check_invariants(sched, bm, live)
    assert not drafts or n_verified > 100, "drafts were hardly ever scheduled"
    assert sched.num_unfinished == 0, "requests left waiting forever"
    assert bm.num_free_blocks == num_blocks, "blocks leaked"
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_hit_is_confirmed_against_tokens() -> None:
    bm = BlockManager(8, 4)
    a = Request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(max_tokens=1), 1)
    bm.allocate(a, 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    b = Request("b", [1, 2, 3, 4, 5, 6, 7, 8, 10], SamplingParams(max_tokens=1), 1)
    assert bm.find_cached_prefix(b) == a.block_ids[:2]
    # forge a collision: same hash entry, different tokens must not hit
    c = Request("c", [1, 2, 3, 9, 5, 6, 7, 8, 10], SamplingParams(max_tokens=1), 1)
    bm.compute_block_hashes(c)
    c.block_hashes[0] = a.block_hashes[0]
    assert bm.find_cached_prefix(c) == []


def test_cache_salt_partitions_the_prefix_cache() -> None:
    """Blocks are shared only between requests of one salt: an unsalted or differently salted twin misses,
    the same salt hits."""
    bm = BlockManager(16, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]

    def cached(salt: str | None) -> Request:
        r = Request(f"r{salt}", prompt, SamplingParams(max_tokens=1, cache_salt=salt), 1)
        bm.allocate(r, 9)
        r.num_computed_tokens = 9
        bm.cache_full_blocks(r)
        return r

    a = cached("tenant-a")
    for salt in (None, "tenant-b"):
        assert bm.find_cached_prefix(Request("x", prompt, SamplingParams(max_tokens=1, cache_salt=salt), 1)) == []
    assert bm.find_cached_prefix(Request("y", prompt, SamplingParams(max_tokens=1, cache_salt="tenant-a"),
                                         1)) == a.block_ids[:2]
    plain = cached(None)
    assert bm.find_cached_prefix(Request("z", prompt, SamplingParams(max_tokens=1), 1)) == plain.block_ids[:2]
    assert plain.block_ids[:2] != a.block_ids[:2]
    with pytest.raises(ParamError, match="cache_salt"):
        SamplingParams(cache_salt="")


def test_freed_blocks_stay_cached_until_evicted() -> None:
    bm = BlockManager(4, 2)
    a = Request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1), 1)
    bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = Request("b", [1, 2, 3, 4, 9], SamplingParams(max_tokens=1), 1)
    hit = bm.find_cached_prefix(b)
    assert len(hit) == 2
    # fill the cache with something else: LRU evicts, and the hit is gone
    c = Request("c", [7] * 8, SamplingParams(max_tokens=1), 1)
    bm.allocate(c, 8)
    assert bm.find_cached_prefix(b) == []


def test_preemption_requeues_at_front_and_recomputes() -> None:
    bm = BlockManager(4, 4)  # 16 tokens in all
    sched = Scheduler(SchedulerConfig(4, 64, 16), bm)
    a = Request("a", list(range(1, 7)), SamplingParams(max_tokens=8), 8)
    b = Request("b", list(range(11, 17)), SamplingParams(max_tokens=8), 8)
    sched.add(a)
    sched.add(b)
    preempted = False
    for _ in range(100):
        out = sched.schedule()
        preempted |= bool(out.preempted_req_ids)
        update(sched, out, {rid: [5] for rid in sampling_ids(sched, out)})
        if not sched.num_unfinished:
            break
    assert preempted and sched.num_preemptions > 0
    assert a.status is RequestStatus.FINISHED_LENGTH and b.status is RequestStatus.FINISHED_LENGTH
    assert a.num_output_tokens == 8 and b.num_output_tokens == 8
    assert bm.num_free_blocks == 4


def test_prefix_hits_counted_once_per_admission() -> None:
    bm = BlockManager(16, 16)
    sched = Scheduler(SchedulerConfig(4, 256, 128), bm)
    prompt = list(range(1, 41))
    for name in ("a", "b"):
        r = Request(name, prompt, SamplingParams(max_tokens=2), 2)
        sched.add(r)
        while sched.num_unfinished:
            out = sched.schedule()
            update(sched, out, {rid: [7] for rid in sampling_ids(sched, out)})
    assert bm.num_queries == 80  # 40 prompt tokens, twice
    assert bm.num_hits == 32  # b reused a's two full blocks
