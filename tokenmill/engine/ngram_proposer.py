"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the sequence's last n
tokens, for n from `max_n` down to `min_n` (the longest match wins; among equals the latest).

Token ids are searched as a str of code points (one character per token) with str.rfind, which runs in C;
the text is built once per request and extended as tokens arrive (NgramIndex).
"""

from __future__ import annotations


class NgramIndex:
    """One sequence's tokens as a str (chr(token)), kept in step with its token list."""

    def __init__(self) -> None:
        self.text = ""

    def sync(self, token_ids: list[int]) -> str:
        n = len(self.text)
        if n > len(token_ids) or (n and ord(self.text[-1]) != token_ids[n - 1]):
            self.text, n = "", 0  # the sequence was rewritten (cannot happen today): start over
        if n < len(token_ids):
            self.text += "".join(map(chr, token_ids[n:]))
        return self.text


def propose(text: str, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k draft tokens for the sequence whose tokens are `text` (NgramIndex); [] without a match."""
    L = len(text)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = text[L - n:]
        j = text.rfind(suffix, 0, L - 1)  # an earlier occurrence (it may overlap the suffix, not be it)
        if j != -1:
            follow = text[j + n: j + n + k]
            if follow:
                return [ord(c) for c in follow]
    return []
