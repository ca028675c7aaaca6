"""StepCost: what a decode step of R rows costs, measured on the engine's own steps (torch-free).

Speculative decoding pays only if the rows a verification adds cost less than the tokens they save. How
much a row costs depends on the machine, the model and its weights: on a 2-core CPU with GGUF blocks the
matmuls are compute-bound per row (a 5-row step ~2 one-row steps), with fp32 weights they are bound by
reading the weights (5 rows ~1.2 steps), on a GPU rows are nearly free. So it is measured, not assumed:
the engine reports each step in which every request decodes (rows = the step's tokens, drafts included)
with its wall time (proposing the next step's drafts included), and two estimates are kept, older steps
weighing less (each observation multiplies the weight of those before by `decay`), a step slower than 3x
the estimate for its rows counting as 3x:

- a least-squares line t(R) = a + b R over all of them, which the draft length rests on:

    row_cost(B) = b / (a + b B)      the time of one more row, as a fraction of a step of B rows

  (until steps of at least two sizes have been seen it answers the prior; kept in [MIN_ROW_COST, 1]);
- a table: per row count, the mean time of its steps (its own earlier steps weighing less), trusted once
  seen twice, the last time within _STALE steps: `time(R)`, what the check on drafting's gain compares
  against (the line pools all sizes and so is the steadier guide for draft lengths: a table that trusted
  sizes it had seen a few times, and tried the ones it had not, drafted longer at lower acceptance: 1.10x
  on the summarising prompt where the line gave 1.25x, benchmarks/README.md).
"""

from __future__ import annotations

MIN_ROW_COST = 0.02
_ENTRY_DECAY = 0.8  # weight of a row count's earlier steps in its table entry, per step of that count
_STALE = 256  # a table entry not refreshed for this many steps is no longer trusted (the machine drifts)


class StepCost:
    def __init__(self, prior: float, decay: float = 0.95) -> None:
        self.prior = prior
        self.decay = decay
        self._w = self._x = self._y = self._xx = self._xy = 0.0  # decayed sums: weights, R, t, R^2, R t
        self._n = 0  # observations so far
        # R -> [decayed weight, decayed seconds, steps seen, the observation that last refreshed it]
        self._table: dict[int, list[float]] = {}

    def observe(self, rows: int, seconds: float) -> float:
        """A step of `rows` decode rows took `seconds` (the whole step: schedule, forward, sample, outputs).
        -> the seconds recorded (a stall counted as 3x the estimate at most; 0 for a step not recorded)."""
        if rows <= 0 or not seconds > 0.0:
            return 0.0
        est = self.time(rows)
        if est is not None:  # one stall (a busy host, a GC) counts as 3x at most
            seconds = min(seconds, 3.0 * est)
        d = self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + rows
        self._y = d * self._y + seconds
        self._xx = d * self._xx + rows * rows
        self._xy = d * self._xy + rows * seconds
        self._n += 1
        e = self._table.setdefault(rows, [0.0, 0.0, 0.0, 0.0])
        e[0], e[1], e[2], e[3] = e[0] * _ENTRY_DECAY + 1.0, e[1] * _ENTRY_DECAY + seconds, e[2] + 1, self._n
        return seconds

    def knows(self, rows: int) -> bool:
        """Whether the table holds `rows`: seen at least twice, the last time within _STALE steps."""
        e = self._table.get(rows)
        return e is not None and e[2] >= 2 and self._n - e[3] <= _STALE

    @property
    def observed(self) -> bool:
        return self._w > 0.0

    def line(self) -> tuple[float, float] | None:
        """(a, b) of t(R) = a + b R, or None while the steps seen do not tell rows apart."""
        if self._w <= 0.0:
            return None
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        if var < 0.1:  # (almost) every step had the same number of rows
            return None
        b = (self._xy / self._w - mx * my) / var
        return my - b * mx, b

    def time(self, rows: int) -> float | None:
        """The estimated seconds of a step of `rows` rows: the table's mean where it knows the size, else
        the line's; None while neither has it."""
        if self.knows(rows):
            e = self._table[rows]
            return e[1] / e[0]
        fit = self.line()
        if fit is not None and fit[0] + fit[1] * rows > 0.0:
            return fit[0] + fit[1] * rows
        return None

    def row_cost(self, base_rows: int) -> float:
        fit = self.line()
        if fit is None:
            return self.prior
        a, b = fit
        base = a + b * max(1, base_rows)
        if base <= 0.0:
            return self.prior
        return min(1.0, max(MIN_ROW_COST, b / base))


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a step gives a request that verifies k drafts, each accepted with probability alpha once the
    ones before it were: 1 + alpha + ... + alpha^k (the token after the last accepted draft included)."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_draft_length(alpha: float, row_cost: float, k_max: int) -> int:
    """The k in [0, k_max] with the most tokens per unit of time, expected_tokens / (1 + row_cost k); the
    smaller k on a tie. 0 when no draft pays (alpha <= row_cost, roughly)."""
    best, best_rate = 0, 1.0
    for k in range(1, k_max + 1):
        rate = expected_tokens(alpha, k) / (1.0 + row_cost * k)
        if rate > best_rate * (1.0 + 1e-9):
            best, best_rate = k, rate
    return best
