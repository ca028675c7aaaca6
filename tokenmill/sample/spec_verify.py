"""Verifying draft tokens (speculative decoding).

A request with k drafts d_1..d_k gets k + 1 sampling rows; row j samples x_j from the target's
distribution (every logits processor and sampling setting applied) given the tokens before it with
d_1..d_j in place. The drafts kept are the longest prefix with x_j == d_j; the step emits those and then
x at the first mismatch (or the bonus x_k+1 after all k).

Why this is exact: the drafts here are deterministic (a point mass q at d_j). Rejection sampling keeps
d_j with probability min(1, p(d_j) / q(d_j)) = p(d_j), and on rejection draws from the residual
max(0, p - q) renormalised, which is p with d_j removed. "Draw x_j ~ p and keep d_j iff x_j == d_j, else
emit x_j" gives d_j with probability p(d_j) and any other t with p(t): the same distribution. Greedy rows
(x_j = argmax) reduce to "keep the drafts that match the greedy tokens", so greedy output is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence


def accepted_prefix(sampled: Sequence[int], drafts: Sequence[int]) -> int:
    """How many of `drafts` to keep, given `sampled` (len(drafts) + 1 tokens, one per row)."""
    n = 0
    while n < len(drafts) and sampled[n] == drafts[n]:
        n += 1
    return n
