"""StructuredOutputManager: one compiled grammar per distinct constraint, one matcher per sequence.

    compile(spec)       -> the constraint's template matcher, compiled once and cached by spec.key (LRU);
                           ParamError with llguidance's message if it does not compile. Thread-safe and
                           GIL-free while compiling, so the server runs it off the event loop and the engine
                           thread keeps stepping (a slow grammar delays only its own request).
    template.deep_copy() -> a fresh matcher for one sequence (no recompile)
    fill_bitmask(ms)    -> (G, W) int32 bitmask, row g = the tokens matcher g allows next, bit t % 32 of
                           word t // 32 (W = ceil(V / 32)); a token id past the tokenizer's is never allowed
    accept(m, token)    -> advance a matcher by a sampled token; False if the grammar refused it

A matcher that has consumed a complete output with nothing allowed after it `is_stopped()`: the stop
checker finishes that request. Torch-free (numpy only), so it lives with the engine core.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance
import numpy as np

from tokenmill.sampling_params import ParamError, StructuredOutputsParams
from tokenmill.structured_output.grammar import WHAT, grammar_text

if TYPE_CHECKING:
    from tokenmill.tokenizer.tokenizer import Tokenizer

CACHE_SIZE = 256  # compiled templates kept


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class StructuredOutputManager:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        """vocab_size: the model's logits width (may exceed the tokenizer's; the extra ids are never allowed)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lltok: llguidance.LLTokenizer | None = None
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: llguidance.LLExecutor | None = None
        self._producible: dict[str, bool] = {}  # character -> the tokenizer can write it
        self.num_compiled = 0  # grammars compiled (not served from the cache)
        self.mask_seconds = 0.0  # spent filling bitmasks and advancing matchers (the bench reports it per token)
        self.num_masks = 0  # bitmask rows filled

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of our tokenizer (built on first use, ~0.3 s for a 49k vocabulary)."""
        with self._lock:
            if self._lltok is None:
                t = self.tokenizer
                self._lltok = llguidance.LLTokenizer(t.backend.to_str(), n_vocab=self.vocab_size,
                                                     eos_token=sorted(t.eog_token_ids) or None)
            return self._lltok

    def compile(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        key = spec.key
        with self._lock:
            hit = self._templates.get(key)
            if hit is not None:
                self._templates.move_to_end(key)
                return hit
        if spec.choice is not None:
            self._check_producible(spec)
        grammar = grammar_text(spec)
        matcher = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ParamError(spec.source, f"{WHAT[spec.kinds()[0]]} does not compile: {matcher.get_error().strip()}")
        with self._lock:
            self.num_compiled += 1
            self._templates[key] = matcher
            while len(self._templates) > CACHE_SIZE:
                self._templates.popitem(last=False)
        return matcher

    def _check_producible(self, spec: StructuredOutputsParams) -> None:
        """A choice must be text this vocabulary can write: a byte-level vocabulary may lack some bytes
        (SmolLM2's has no token for 0xF1, 0xF2 or a few control bytes), and then no sampled token could
        ever match, so the request is refused before it runs. A character counts as writable when the
        tokenizer's round trip keeps it (cached per character)."""
        for choice in spec.choice or []:
            for ch in dict.fromkeys(choice):
                ok = self._producible.get(ch)
                if ok is None:
                    ok = self._producible[ch] = ch in self.tokenizer.decode(
                        self.tokenizer.encode(ch, add_special_tokens=False), skip_special_tokens=False)
                if not ok:
                    raise ParamError(spec.source, f"choice {choice!r} has a character this model's vocabulary "
                                                  f"cannot write: U+{ord(ch):04X}")

    def fill_bitmask(self, matchers: list[llguidance.LLMatcher], drafts: list[list[int]] | None = None) -> np.ndarray:
        """(G, W) int32: the next-token masks of these matchers, in order. With drafts (speculative
        decoding), matcher i takes 1 + len(drafts[i]) rows: its mask now, then after each of its drafts
        (the matcher is left as it was)."""
        t0 = time.perf_counter()
        rows = len(matchers) + sum(len(d) for d in drafts or [])
        mask = np.full((rows, bitmask_width(self.vocab_size)), -1, dtype=np.int32)
        row_bytes = mask.shape[1] * 4
        if len(matchers) == 1 and not (drafts and drafts[0]):
            matchers[0].unsafe_compute_mask_ptr(mask.ctypes.data, row_bytes)
        else:
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            plain: list[tuple[llguidance.LLMatcher, int]] = []
            with_drafts: list[tuple[llguidance.LLMatcher, int, list[int]]] = []
            g = 0
            for m, d in zip(matchers, drafts or [[]] * len(matchers)):
                if d:
                    with_drafts.append((m, g, list(d)))
                else:
                    plain.append((m, g))
                g += 1 + len(d)
            if plain:
                self._executor.unsafe_compute_mask_ptr(plain, mask.ctypes.data, row_bytes, rows)
            if with_drafts:
                self._executor.unsafe_compute_mask_ptr_with_draft_token(with_drafts, mask.ctypes.data, row_bytes, rows)
        self.mask_seconds += time.perf_counter() - t0
        self.num_masks += len(matchers)
        return mask

    def accept(self, matcher: llguidance.LLMatcher, token_id: int) -> bool:
        t0 = time.perf_counter()
        ok = bool(matcher.consume_token(token_id))
        self.mask_seconds += time.perf_counter() - t0
        return ok
