"""Prompt sets for the serving benchmark: random, shared-prefix, and a JSONL file.

Every sample is a `SampleRequest`: the prompt text, the prompt's length in tokens under the benchmark's
tokenizer (the served model's own, so the length the server sees is the one asked for), and the number
of tokens to generate (sent as `max_tokens` with `ignore_eos`, so every request yields exactly that many).

Random prompts are built from "word" tokens (a leading space then letters, e.g. `Ġhouse`): text made of
them tokenizes back to the same ids, so a prompt of N such tokens is N tokens long on the server too.
Each prompt starts with a different token, so no prefix cache can reuse one request's work for another
(the shared-prefix set does the opposite on purpose).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class SampleRequest:
    """One benchmark request: what to send and how long it is."""

    prompt: str
    prompt_len: int  # tokens, under the benchmark tokenizer (a chat template adds its own on top)
    output_len: int  # tokens to generate (max_tokens with ignore_eos)


class TextTokenizer(Protocol):
    """What the datasets need from a tokenizer (tokenmill's `Tokenizer` has it)."""

    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def id_to_token(self, token_id: int) -> str: ...


_WORD = re.compile(r"[A-Za-z]{2,}")


def word_token_ids(tok: TextTokenizer) -> list[int]:
    """Ids of tokens that decode to a space followed by 2+ ASCII letters and round-trip alone.

    Text made of these tokens re-tokenizes to the same ids under a word-splitting pre-tokenizer, which is
    what makes a prompt's length predictable. Sorted for determinism.
    """
    ids = []
    for i in range(tok.vocab_size):
        try:
            text = tok.decode([i])
        except Exception:  # noqa: BLE001 - ids without a text form are simply not words
            continue
        if text.startswith(" ") and _WORD.fullmatch(text[1:]) and tok.encode(text, add_special_tokens=False) == [i]:
            ids.append(i)
    if len(ids) < 256:
        raise ValueError(f"the tokenizer has only {len(ids)} ' word' tokens; random prompts need at least 256")
    return ids


def fit_to_length(tok: TextTokenizer, ids: list[int], length: int, filler: list[int]) -> tuple[str, int]:
    """Text from `ids` that re-tokenizes to exactly `length` tokens (best effort); returns (text, length).

    Decoding and re-encoding can merge or split tokens at the seams; the loop trims or pads with `filler`
    ids until the re-encoded length matches, which takes one or two rounds for word tokens.
    """
    cur = list(ids[:length])
    text = tok.decode(cur)
    n = len(tok.encode(text, add_special_tokens=False))
    for k in range(8):
        if n == length:
            break
        if n > length:
            cur = tok.encode(text, add_special_tokens=False)[:length]
        else:
            cur = cur + filler[k * length:k * length + (length - n)]
        text = tok.decode(cur)
        n = len(tok.encode(text, add_special_tokens=False))
    return text, n


def _lengths(rng: random.Random, mean: int, ratio: float, n: int) -> list[int]:
    """n lengths uniform in [mean*(1-ratio), mean*(1+ratio)], at least 1 (vLLM's range-ratio convention)."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {ratio}")
    lo, hi = max(1, round(mean * (1 - ratio))), max(1, round(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def random_dataset(tok: TextTokenizer, num_prompts: int, input_len: int, output_len: int,
                   range_ratio: float = 0.0, seed: int = 0) -> list[SampleRequest]:
    """`num_prompts` prompts of random word tokens, each starting with a different token."""
    rng = random.Random(seed)
    pool = word_token_ids(tok)
    if num_prompts > len(pool):
        raise ValueError(f"at most {len(pool)} random prompts with distinct first tokens, asked for {num_prompts}")
    firsts = rng.sample(pool, num_prompts)
    in_lens = _lengths(rng, input_len, range_ratio, num_prompts)
    out_lens = _lengths(rng, output_len, range_ratio, num_prompts)
    samples = []
    for first, n_in, n_out in zip(firsts, in_lens, out_lens):
        ids = [first] + rng.choices(pool, k=n_in - 1)
        text, n = fit_to_length(tok, ids, n_in, rng.choices(pool, k=8 * n_in))
        samples.append(SampleRequest(text, n, n_out))
    return samples


def shared_prefix_dataset(tok: TextTokenizer, num_prompts: int, num_groups: int, prefix_len: int,
                          suffix_len: int, output_len: int, seed: int = 0) -> list[SampleRequest]:
    """`num_groups` long system prompts, each shared by num_prompts/num_groups requests with their own
    question; requests are interleaved across groups (round-robin), as concurrent users would be."""
    if num_groups < 1:
        raise ValueError("--prefix-num-groups must be >= 1")
    rng = random.Random(seed)
    pool = word_token_ids(tok)
    firsts = rng.sample(pool, num_groups + num_prompts)
    prefixes = []
    for g in range(num_groups):
        text, _ = fit_to_length(tok, [firsts[g]] + rng.choices(pool, k=prefix_len - 1), prefix_len,
                                rng.choices(pool, k=8 * prefix_len))
        prefixes.append(text)
    samples = []
    for i in range(num_prompts):
        prefix = prefixes[i % num_groups]
        suffix, _ = fit_to_length(tok, [firsts[num_groups + i]] + rng.choices(pool, k=suffix_len - 1), suffix_len,
                                  rng.choices(pool, k=8 * suffix_len))
        text = prefix + "\n\n" + suffix.lstrip()
        samples.append(SampleRequest(text, len(tok.encode(text, add_special_tokens=False)), output_len))
    return samples


def jsonl_dataset(path: str | Path, tok: TextTokenizer | None, num_prompts: int, output_len: int,
                  seed: int = 0, shuffle: bool = False) -> list[SampleRequest]:
    """Requests from a JSONL file: one object per line with `prompt` (or `text`), optional `output_len`
    (or `max_tokens`); the first `num_prompts` lines (cycled if fewer, shuffled with `shuffle`)."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("prompt", row.get("text")), str):
                raise ValueError(f"{path}:{lineno}: each line needs a string 'prompt' (or 'text')")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no requests")
    if shuffle:
        random.Random(seed).shuffle(rows)
    samples = []
    for i in range(num_prompts):
        row = rows[i % len(rows)]
        text = str(row.get("prompt", row.get("text")))
        n_out = int(row.get("output_len", row.get("max_tokens", output_len)))
        n_in = len(tok.encode(text, add_special_tokens=False)) if tok is not None else 0
        samples.append(SampleRequest(text, n_in, n_out))
    return samples
