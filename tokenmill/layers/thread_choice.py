"""How many threads a small native matmul gets: one, or all of torch's, chosen by timing both as the
process runs.

On a quiet 2-core EPYC, SmolLM2's decode-step matmuls (0.3-1.8M multiply-adds at one row) run ~1.7x
faster on two threads, and one stream decodes ~20% faster. When another process holds a core, a 2-thread
region waits for a descheduled thread: up to 10-40x slower (one stream measured 49.6 tok/s on one thread
and 1.2 tok/s on two with a test suite on the other core). Neither fixed choice is right on a shared
machine, so each size class (by log2 of multiply-adds) keeps a running cost per multiply-add of the choice
it uses and, now and then, tries the other once: it switches when the other is clearly cheaper. A probe
that loses waits twice as long for the next one, up to a cap; probing all threads is capped far later
than probing one (a lost all-threads probe under contention costs ~10 ms, a lost one-thread probe at
most the thread count's factor), and a call on all threads that costs twice its running average brings
the next probe of one thread forward to the next call.

Results do not depend on the choice: ggml splits a matmul by output rows, each computed whole by one
thread (tests/model/test_gguf_method.py checks it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Below this many multiply-adds a size class starts on one thread, at and above on all (the rule before
# measurement; the output head at one row, 28M for SmolLM2, and batched steps start on all).
START_PARALLEL_MACS = 1 << 24
SWITCH_RATIO = 0.85  # the other choice must cost at most this fraction of the current one
_WARMUP_CALLS = 2  # a class's first calls (allocation, cold caches) are not timed
_FIRST_PROBE = 8  # calls of the current choice before the first probe of the other
_MAX_WAIT = {1: 256, 0: 8192}  # calls before the next probe at most: of one thread (1), of all (0)
_ALPHA_CUR, _ALPHA_PROBE = 0.2, 0.5  # running-average weights of a new timing
_JUMP = 2.0  # a call on all threads this many times its running cost brings the next probe forward


@dataclass
class _SizeClass:
    threads: int  # the current choice: 1 or the team size
    cost: dict[int, float] = field(default_factory=dict)  # threads -> running ns per multiply-add
    calls: int = 0
    next_probe: int = _WARMUP_CALLS + _FIRST_PROBE
    wait: int = _FIRST_PROBE


class ThreadChooser:
    """choose() -> the thread count for a call of `macs` multiply-adds; record() its measured time.
    With a team of one thread there is nothing to choose and nothing is timed."""

    def __init__(self, team: int, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.team = team
        self.clock = clock
        self.classes: dict[int, _SizeClass] = {}

    def run(self, macs: int, call: Callable[[int], None]) -> None:
        """call(threads) with the chosen thread count, timed."""
        if self.team <= 1:
            call(1)
            return
        cls, threads = self.choose(macs)
        t0 = self.clock()
        call(threads)
        self.record(cls, threads, self.clock() - t0, macs)

    def choose(self, macs: int) -> tuple[int, int]:
        key = max(macs, 1).bit_length()
        c = self.classes.get(key)
        if c is None:
            c = self.classes[key] = _SizeClass(1 if macs < START_PARALLEL_MACS else self.team)
        c.calls += 1
        if c.calls >= c.next_probe:
            return key, self._other(c.threads)
        return key, c.threads

    def record(self, key: int, threads: int, ns: int, macs: int) -> None:
        c = self.classes[key]
        if c.calls <= _WARMUP_CALLS:
            return
        per_mac = ns / max(macs, 1)
        if threads == c.threads:
            old = c.cost.get(threads)
            c.cost[threads] = per_mac if old is None else old + _ALPHA_CUR * (per_mac - old)
            if threads > 1 and old is not None and per_mac > _JUMP * old:
                c.next_probe = c.calls + 1  # all threads suddenly dear (a core taken?): try one now
            return
        # a probe of the other choice
        old = c.cost.get(threads)
        c.cost[threads] = per_mac if old is None else old + _ALPHA_PROBE * (per_mac - old)
        cur = c.cost.get(c.threads)
        if cur is not None and c.cost[threads] < SWITCH_RATIO * cur:
            c.threads, c.wait = threads, _FIRST_PROBE  # switch; probe the old choice again soon
        else:
            c.wait = min(2 * c.wait, _MAX_WAIT[1 if threads == 1 else 0])
        c.next_probe = c.calls + c.wait

    def _other(self, threads: int) -> int:
        return self.team if threads == 1 else 1
