"""Prefix caching for models with recurrent layers (engine/state_cache.py) through the scheduler, without a model.

A fake worker applies each step's StatePlans to a pool whose "state" is the exact tuple of tokens it has absorbed,
so any wrong move shows: a request must sample from a state equal to its tokens, a checkpoint must hold the
prefix its key names, and a slot read must hold what the plan says. Targeted cases (a repeated prompt, a shared
system prompt, the next turn of a chat, preemption, no checkpoint slots) and a randomised stress with a pool small
enough to evict and preempt; StateCache.check() after every step."""

from __future__ import annotations

import random

from tokenmill.engine.block_manager import BlockManager
from tokenmill.engine.request import Request, RequestStatus
from tokenmill.engine.scheduler import Scheduler, SchedulerConfig
from tokenmill.engine.state_cache import StateCache
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput

BS = 4


class FakeStates:
    """The workers' pool: slot -> the tokens its state has absorbed (None: never written)."""

    def __init__(self, n: int) -> None:
        self.slots: list[tuple[int, ...] | None] = [None] * n

    def run(self, sched: Scheduler, out: SchedulerOutput) -> dict[str, tuple[int, ...]]:
        """Apply the step's plans; -> each request's state after its scheduled tokens."""
        after = {}
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            plan = out.state_plans[rid]
            start = req.num_computed_tokens
            assert plan.ends[-1] == start + n and plan.ends == sorted(plan.ends) and len(plan.ends) == len(plan.dsts)
            if plan.src < 0:
                assert start == 0, f"{rid} starts at {start} from zeros"
                state: tuple[int, ...] = ()
            else:
                state = self.slots[plan.src] or ()
                assert state == tuple(req.token_ids[:start]), f"{rid} reads slot {plan.src} holding another prefix"
            pos = start
            for end, dst in zip(plan.ends, plan.dsts):
                state = state + tuple(req.token_ids[pos:end])
                self.slots[dst] = state
                pos = end
            after[rid] = state
        return after


class Sim:
    def __init__(self, num_seqs: int = 4, checkpoints: int = 8, blocks: int = 64, budget: int = 64,
                 prefix_caching: bool = True) -> None:
        self.bm = BlockManager(blocks, BS, prefix_caching)
        self.sc = StateCache(num_seqs, checkpoints, BS)
        self.sched = Scheduler(SchedulerConfig(num_seqs, budget, 4096), self.bm, self.sc)
        self.pool = FakeStates(num_seqs + checkpoints)
        self.next_token = 100
        self.n = 0

    def add(self, prompt: list[int], max_tokens: int = 6) -> Request:
        self.n += 1
        req = Request(f"r{self.n}", list(prompt), SamplingParams(max_tokens=max_tokens), max_tokens)
        self.sched.add(req)
        return req

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        after = self.pool.run(self.sched, out)
        sampled = {}
        for rid, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            if req.num_computed_tokens + n == req.num_tokens:  # it samples: from exactly its tokens' state
                assert after[rid] == tuple(req.token_ids)
                self.next_token += 1
                sampled[rid] = [self.next_token % 50 + 1]
        for req in self.sched.update(out, ModelRunnerOutput(sampled)):
            if req.num_output_tokens >= req.max_tokens:
                self.sched.finish(req, RequestStatus.FINISHED_LENGTH)
        self.check()
        return out

    def check(self) -> None:
        self.sc.check()
        for (block_hash, L), k in self.sc._by_key.items():  # a checkpoint holds the prefix its key names
            state = self.pool.slots[k]
            assert state is not None and len(state) == L

    def run(self) -> None:
        while self.sched.num_unfinished:
            self.step()


def test_a_repeated_prompt_restores_its_last_boundary() -> None:
    sim = Sim()
    prompt = list(range(1, 15))  # 14 tokens: the last boundary before the last token is 12
    sim.add(prompt)
    sim.run()
    again = sim.add(prompt)
    sim.step()
    assert again.num_cached_tokens == 12
    assert sim.bm.num_hits == 12 and sim.sc.num_restored == 1
    sim.run()


def test_a_shared_system_prompt_is_checkpointed_where_prompts_diverge() -> None:
    sim = Sim()
    system = list(range(1, 11))  # 10 shared tokens: the KV hit ends at 8
    a = sim.add(system + [20, 21, 22, 23, 24])
    sim.run()
    b = sim.add(system + [30, 31, 32, 33, 34])
    sim.run()
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 0  # no checkpoint at 8 yet: b takes it
    c = sim.add(system + [40, 41, 42])
    sim.step()
    assert c.num_cached_tokens == 8
    sim.run()


def test_a_long_prompt_leaves_a_checkpoint_every_interval() -> None:
    """A second prompt on the same long document restarts from the last interval checkpoint before they part."""
    sim = Sim(blocks=64, budget=64)
    sim.sc.interval = 16
    doc = [(7 * i) % 45 + 1 for i in range(50)]
    first = sim.add(doc + [46, 47])
    sim.run()
    assert first.num_cached_tokens == 0
    assert sorted(L for _, L in sim.sc._by_key) == [16, 32, 48, 56]  # every 16, the last boundary, a decode one
    second = sim.add(doc[:45] + [48, 49, 1, 2])
    sim.step()
    assert second.num_cached_tokens == 32
    sim.run()


def test_the_next_turn_restores_the_latest_decode_boundary() -> None:
    sim = Sim()
    first = sim.add(list(range(1, 8)), max_tokens=11)  # 7 prompt + 11 out: computed 17, last boundary 16
    sim.run()
    turn2 = sim.add(first.token_ids + [44, 45])
    sim.step()
    assert turn2.num_cached_tokens == 16
    sim.run()


def test_only_the_latest_decode_checkpoint_of_a_sequence_is_kept() -> None:
    sim = Sim(checkpoints=8)
    sim.add(list(range(1, 4)), max_tokens=30)
    sim.run()
    lengths = sorted(L for _, L in sim.sc._by_key)
    assert lengths == [32]  # the prompt (3 tokens) has no boundary; decodes crossed 4 .. 32, kept the last


def test_a_sequence_drops_only_its_own_previous_decode_checkpoint() -> None:
    """A decode checkpoint evicted while its sequence runs on leaves its slot to another's checkpoint; when the
    sequence takes its next one it drops its previous one, which must not be what that slot holds now."""
    sc = StateCache(4, 3, BS)

    def step(req: Request, n: int, hashes: list[int]) -> list[int]:  # one step of n tokens; -> the slots it wrote
        req.token_ids.extend([9] * max(0, req.num_computed_tokens + n + 1 - req.num_tokens))
        plan = sc.plan(req, n)
        req.num_computed_tokens += n
        req.block_hashes = hashes
        sc.update(req)
        sc.check()
        return [k for k in plan.dsts if k >= sc.num_seqs]  # checkpoint slots (private ones are below num_seqs)

    def request(rid: str, prompt: list[int]) -> Request:
        r = Request(rid, prompt, SamplingParams(max_tokens=20), 20)
        sc.admit(r)
        return r

    a = request("a", [1, 2, 3])
    step(a, 3, [])
    [k1] = step(a, 1, [11])  # a's decode checkpoint at 4
    step(a, 1, [11])  # a moves on: k1 unreferenced
    b = request("b", [5] * 6)
    [k2] = step(b, 6, [21])  # b's prompt checkpoint at 4
    d = request("d", [7, 7, 7])
    step(d, 3, [])
    [k3] = step(d, 1, [41])  # d's decode checkpoint at 4
    step(d, 1, [41])
    for r in (b, d):
        sc.release(r)
    c = request("c", [6] * 6)
    [kc] = step(c, 6, [31])  # c's prompt checkpoint: no slot free, the oldest decode-time one (a's) evicted
    assert kc == k1 and (31, 4) in sc._by_key
    sc.release(c)
    step(a, 1, [11])
    step(a, 1, [11])
    [ka] = step(a, 1, [11, 12])  # a's next decode checkpoint, at 8: d's slot
    assert ka == k3
    assert (31, 4) in sc._by_key and (21, 4) in sc._by_key  # c's and b's prompt checkpoints kept
    sc.release(a)
    sc.check()


def test_decoding_sequences_do_not_evict_a_prompt_checkpoint() -> None:
    """Many sequences decoding past block boundaries with few checkpoint slots: their decode-time checkpoints
    churn among themselves; the shared first part's checkpoint stays, and the next request restarts from it."""
    sim = Sim(num_seqs=6, checkpoints=3)
    system = list(range(1, 11))
    sim.add(system + [20, 21])
    sim.run()
    sim.add(system + [30, 31])  # leaves the checkpoint at 8
    sim.run()
    for i in range(6):
        sim.add(system + [40 + i], max_tokens=40)
    sim.run()
    assert any(L == 8 for _, L in sim.sc._by_key)
    last = sim.add(system + [49, 48, 47])
    sim.step()
    assert last.num_cached_tokens == 8
    sim.run()


def test_preempted_requests_restart_from_their_checkpoints() -> None:
    sim = Sim(num_seqs=4, checkpoints=8, blocks=12, budget=16)
    reqs = [sim.add([i] * 9 + list(range(1, 8)), max_tokens=12) for i in range(1, 5)]
    sim.run()
    assert sim.sched.num_preemptions > 0
    assert all(r.num_output_tokens == 12 for r in reqs)


def test_without_checkpoint_slots_nothing_is_restored() -> None:
    sim = Sim(checkpoints=0)
    prompt = list(range(1, 15))
    sim.add(prompt)
    sim.run()
    again = sim.add(prompt)
    sim.run()
    assert again.num_cached_tokens == 0 and sim.sc.num_cached == 0


def test_a_request_wanting_prompt_logprobs_restores_nothing() -> None:
    sim = Sim()
    prompt = list(range(1, 15))
    sim.add(prompt)
    sim.run()
    sim.n += 1
    req = Request("lp", prompt, SamplingParams(max_tokens=2, prompt_logprobs=1), 2)
    sim.sched.add(req)
    sim.run()
    assert req.num_cached_tokens == 0


def test_random_traffic_keeps_every_state_exact() -> None:
    """Random arrivals over a few shared prefixes, chat turns built on earlier answers, aborts, a pool small
    enough to evict checkpoints and a cache small enough to preempt: every sample comes from exactly its tokens'
    state, every checkpoint holds its prefix, and at the end every slot is back."""
    for seed in range(6):
        rng = random.Random(seed)
        sim = Sim(num_seqs=rng.choice([2, 4, 6]), checkpoints=rng.choice([0, 1, 3, 8]), blocks=rng.choice([24, 48]),
                  budget=rng.choice([5, 16, 64]))
        prefixes = [[rng.randrange(1, 50) for _ in range(rng.randint(0, 13))] for _ in range(3)]
        finished: list[Request] = []
        restored = 0
        for _ in range(400):
            if rng.random() < 0.3 and len(sim.sched.requests) < 10:
                if finished and rng.random() < 0.4:  # the next turn of an earlier chat
                    base = rng.choice(finished).token_ids
                else:
                    base = rng.choice(prefixes)
                sim.add(base + [rng.randrange(1, 50) for _ in range(rng.randint(1, 9))], max_tokens=rng.randint(1, 12))
            if sim.sched.running and rng.random() < 0.03:  # a client goes away
                victim = rng.choice(sim.sched.running)
                sim.sched.finish(victim, RequestStatus.FINISHED_ABORTED)
            live = {r.request_id: r for r in list(sim.sched.running) + list(sim.sched.waiting)}
            sim.step()
            for rid, r in live.items():
                if r.is_finished and r.status is not RequestStatus.FINISHED_ABORTED:
                    finished.append(r)
                    restored += r.num_cached_tokens > 0
        sim.run()
        assert sim.sc.num_running == 0
        sim.check()
        if sim.sc.num_checkpoints >= 3:
            assert restored > 0, f"seed {seed}: no request restored a checkpoint"
