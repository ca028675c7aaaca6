"""DecodeMirror rows always equal what the paged cache holds for each decoding request, through joins,
departures, stale rows (a request recomputed elsewhere) and growth; over budget it steps aside."""

from __future__ import annotations

import random

import torch

from tokenmill.attention.decode_mirror import DecodeMirror

L, NB, BS, NKV, HD = 2, 64, 4, 2, 8


def expected_row(kv: torch.Tensor, table: list[int], n: int) -> torch.Tensor:
    blocks = kv[:, :, table].reshape(2, L, -1, NKV, HD)[:, :, :n]
    return blocks.transpose(2, 3)  # (2, L, nkv, n, hd)


def test_rows_track_the_paged_cache() -> None:
    rng = random.Random(0)
    kv = torch.randn(2, L, NB, BS, NKV, HD)
    m = DecodeMirror(kv, budget_bytes=2**30)
    live: dict[str, tuple[list[int], int]] = {}  # id -> (block table, start)
    free = list(range(NB))
    rng.shuffle(free)
    for step in range(300):
        if len(live) < 6 and rng.random() < 0.3:
            rid = f"r{step}"
            live[rid] = ([free.pop() for _ in range(6)], rng.randint(1, 8))
        if live and rng.random() < 0.1:
            rid = rng.choice(list(live))
            free.extend(live.pop(rid)[0])
        if live and rng.random() < 0.05:  # recomputed elsewhere: new blocks, new values, start moved
            rid = rng.choice(list(live))
            table, start = live[rid]
            kv[:, :, table] = torch.randn(2, L, len(table), BS, NKV, HD)
            live[rid] = (table, max(1, start - 3))
        if not live:
            continue
        ids = [r for r in live if rng.random() < 0.9] or list(live)  # some skip a step (e.g. budget)
        starts = [live[r][1] for r in ids]
        order = m.plan(ids, starts, [live[r][0] for r in ids])
        assert order is not None and sorted(order) == list(range(len(ids)))
        step_in = m.step_inputs([starts[i] for i in order])
        for slot, i in enumerate(order):
            table, start = live[ids[i]]
            want = expected_row(kv, table, start)
            assert torch.equal(step_in.k[:, slot, :, :start], want[0])
            assert torch.equal(step_in.v[:, slot, :, :start], want[1])
            # the step appends position `start` to both the blocks and the row
            newk, newv = torch.randn(L, NKV, HD), torch.randn(L, NKV, HD)
            kv[0, :, table[start // BS], start % BS] = newk
            kv[1, :, table[start // BS], start % BS] = newv
            step_in.k[:, slot, :, start] = newk
            step_in.v[:, slot, :, start] = newv
            live[ids[i]] = (table, min(start + 1, len(table) * BS - 1) if start + 1 < len(table) * BS else 1)
            if live[ids[i]][1] == 1:  # wrapped: simulate a fresh request in the same blocks
                kv[:, :, table] = torch.randn(2, L, len(table), BS, NKV, HD)


def test_over_budget_returns_none() -> None:
    kv = torch.randn(2, L, NB, BS, NKV, HD)
    m = DecodeMirror(kv, budget_bytes=1000)
    assert m.plan(["a"], [5], [[0, 1]]) is None


def test_fresh_rows_are_finite_even_on_recycled_memory() -> None:
    """Masked keys still multiply their values by 0: a NaN left in recycled memory would poison the
    output. Rows must start as zeros."""
    junk = torch.full((1 << 20,), float("nan"))
    del junk  # the allocator may hand these pages to the mirror
    kv = torch.randn(2, L, NB, BS, NKV, HD)
    m = DecodeMirror(kv, budget_bytes=2**30)
    assert m.plan(["a"], [3], [[0, 1]]) is not None
    assert m.k is not None and m.v is not None
    assert torch.isfinite(m.k).all() and torch.isfinite(m.v).all()
