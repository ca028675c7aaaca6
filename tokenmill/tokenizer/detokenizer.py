"""Incremental (streaming) detokenization.

Decoding every generated token on its own is wrong (a character can span several byte-level tokens, and
SentencePiece-style decoders treat the first token of a string specially); re-decoding the whole output at
each step is correct but quadratic. Like vLLM, this keeps two offsets into the generated ids:

* ``prefix_offset``: start of a short window of already-emitted tokens, decoded again as context;
* ``read_offset``: end of the emitted tokens.

At each step the window ``ids[prefix_offset:]`` and its emitted part ``ids[prefix_offset:read_offset]`` are
decoded; the difference is the new text. If the new text ends in U+FFFD the last character is still
incomplete (its remaining bytes are in tokens not generated yet), so nothing is emitted and the offsets stay
put until it completes (or :meth:`IncrementalDetokenizer.flush` is called). Only the window is kept, so the
cost per token does not grow with the length of the output.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str: ...

    def is_special(self, token_id: int) -> bool: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas.

    The concatenation of everything returned by :meth:`push` and a final :meth:`flush` equals
    ``tokenizer.decode(all_ids, skip_special_tokens)``. No delta ends inside a multi-byte UTF-8 character.
    """

    def __init__(self, tokenizer: _Decoder, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._window: list[int] = []  # ids[prefix_offset:], the only ids kept
        self._read = 0  # read_offset - prefix_offset: how much of the window has been emitted
        self._num_tokens = 0

    @property
    def num_tokens(self) -> int:
        """How many token ids have been pushed (skipped special tokens included)."""
        return self._num_tokens

    def _delta(self) -> tuple[str, str]:
        decode = self._tokenizer.decode
        emitted = decode(self._window[: self._read], skip_special_tokens=self._skip_special) if self._read else ""
        full = decode(self._window, skip_special_tokens=self._skip_special)
        return emitted, full

    def _advance(self) -> None:
        # The tokens emitted in this step become the next step's context window.
        del self._window[: self._read]
        self._read = len(self._window)

    def push(self, new_token_ids: Iterable[int]) -> str:
        """Add newly generated token ids; return the text they complete (possibly empty)."""
        added = False
        for token_id in new_token_ids:
            self._num_tokens += 1
            # decode(skip_special_tokens=True) drops special tokens before running the decoder, so leaving
            # them out here changes nothing and keeps the context window made of real text tokens.
            if self._skip_special and self._tokenizer.is_special(token_id):
                continue
            self._window.append(int(token_id))
            added = True
        if not added:
            return ""
        emitted, full = self._delta()
        if len(full) <= len(emitted) or full.endswith(_REPLACEMENT):
            return ""  # nothing new yet, or a character is still incomplete
        self._advance()
        return full[len(emitted):]

    def flush(self) -> str:
        """Return whatever is still held back (e.g. an incomplete character at the end of the output)."""
        if self._read == len(self._window):
            return ""
        emitted, full = self._delta()
        self._advance()
        return full[len(emitted):]
