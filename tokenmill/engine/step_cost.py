"""StepCost: what one more row costs in a decode step, measured on the engine's own steps (torch-free).

Speculative decoding pays only if the rows a verification adds cost less than the tokens they save. How
much a row costs depends on the machine, the model and its weights: on a 2-core CPU with GGUF blocks the
matmuls are compute-bound per row (a 5-row step ~2 one-row steps), with fp32 weights they are bound by
reading the weights (5 rows ~1.2 steps), on a GPU rows are nearly free. So it is measured, not assumed:
the engine reports each step in which every request decodes (rows = the step's tokens, drafts included)
with its wall time, and a least-squares line t(R) = a + b R is kept over them, older steps weighing less
(each observation multiplies the weight of those before by `decay`), a step slower than 3x the line's
time for its rows counting as 3x.

    row_cost(B) = b / (a + b B)      the time of one more row, as a fraction of a step of B rows

Until steps of at least two sizes have been seen it answers the prior; the answer is kept in
[MIN_ROW_COST, 1].
"""

from __future__ import annotations

MIN_ROW_COST = 0.02


class StepCost:
    def __init__(self, prior: float, decay: float = 0.95) -> None:
        self.prior = prior
        self.decay = decay
        self._w = self._x = self._y = self._xx = self._xy = 0.0  # decayed sums: weights, R, t, R^2, R t

    def observe(self, rows: int, seconds: float) -> None:
        """A step of `rows` decode rows took `seconds` (the whole step: schedule, forward, sample, outputs)."""
        if rows <= 0 or not seconds > 0.0:
            return
        fit = self.line()
        if fit is not None and fit[0] + fit[1] * rows > 0.0:  # one stall (a busy host, a GC) counts as 3x at most
            seconds = min(seconds, 3.0 * (fit[0] + fit[1] * rows))
        d = self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + rows
        self._y = d * self._y + seconds
        self._xx = d * self._xx + rows * rows
        self._xy = d * self._xy + rows * seconds

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
