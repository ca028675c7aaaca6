"""Reasoning text split from the answer: vLLM's `--reasoning-parser` (qwen3, deepseek_r1).

Models that think (Qwen3, QwQ, DeepSeek-R1 and its distills) write their reasoning between <think> and
</think>, then the answer. With a parser on, chat returns the reasoning as the message's
`reasoning_content` (and each stream delta's) and only the answer as `content`; Ollama's API returns it as
`thinking`. Both names read the same tags: where the reasoning starts is decided by the prompt, not the
name. A template may open the block itself (DeepSeek-R1's, the 2507 Qwen3 thinking models'): then the
answer starts inside the reasoning, with no <think> of its own (`prompt_opens_reasoning`). Otherwise an
answer that starts with <think> (after any whitespace) reasons until </think>, and one that does not is all
content (Qwen3 with enable_thinking false: its template closes an empty block in the prompt).

A constrained answer (response_format, structured_outputs, a forced tool call) starts outside the
reasoning whatever the prompt says: its grammar writes the document from the first token.

One state machine serves both the whole text and a stream (the whole text is a stream of one delta), so
a streamed answer's pieces join to exactly what the non-streamed one returns. A tag split across deltas is
held back until it is whole; an answer cut off inside its reasoning (max_tokens) is all reasoning.
"""

from __future__ import annotations

from typing import Any

START, END = "<think>", "</think>"
PARSERS = ("qwen3", "deepseek_r1")  # vLLM's names; both read START ... END


def prompt_opens_reasoning(prompt_tail: str) -> bool:
    """Whether a prompt ending in `prompt_tail` leaves a <think> block open: the answer starts inside it."""
    start = prompt_tail.rfind(START)
    return start >= 0 and prompt_tail.rfind(END) < start


def starts_inside(tokenizer: Any, prompt_ids: list[int], constrained: bool) -> bool:
    """Whether the answer to `prompt_ids` starts inside a <think> block: the prompt's end (its last 32
    tokens, special ones included) left one open, and no grammar writes the answer from its first token."""
    return not constrained and prompt_opens_reasoning(tokenizer.decode(prompt_ids[-32:], skip_special_tokens=False))


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag` (so must wait for more)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningStream:
    """feed(delta) -> (reasoning piece, content piece), in order; the pieces join to `split`'s result."""

    def __init__(self, in_reasoning: bool = False) -> None:
        # "start": nothing but whitespace seen yet, a <think> may come; "reasoning"; "after": just past
        # </think>, its whitespace dropped; "content"
        self.state = "reasoning" if in_reasoning else "start"
        self.pending = ""  # text held back: whitespace or a partial tag
        self.saw_reasoning = in_reasoning

    def feed(self, text: str, is_final: bool = False) -> tuple[str, str]:
        buf = self.pending + text
        self.pending = ""
        reasoning: list[str] = []
        content: list[str] = []
        while buf:
            if self.state == "start":
                body = buf.lstrip()
                if body.startswith(START):
                    self.state, self.saw_reasoning = "reasoning", True
                    buf = body[len(START):]
                    continue
                if (not body or START.startswith(body)) and not is_final:
                    self.pending = buf  # whitespace, or a tag still arriving
                    return "".join(reasoning), "".join(content)
                self.state = "content"
            elif self.state == "reasoning":
                end = buf.find(END)
                if end >= 0:
                    reasoning.append(buf[:end])
                    self.state = "after"
                    buf = buf[end + len(END):]
                    continue
                keep = 0 if is_final else _held(buf, END)
                reasoning.append(buf[: len(buf) - keep])
                self.pending = buf[len(buf) - keep:]
                return "".join(reasoning), "".join(content)
            elif self.state == "after":
                buf = buf.lstrip()
                if not buf:
                    return "".join(reasoning), "".join(content)
                self.state = "content"
            else:
                content.append(buf)
                buf = ""
        return "".join(reasoning), "".join(content)


def split(text: str, in_reasoning: bool = False) -> tuple[str | None, str]:
    """(reasoning, content) of a whole answer; reasoning None when the answer has none."""
    stream = ReasoningStream(in_reasoning)
    reasoning, content = stream.feed(text, is_final=True)
    return (reasoning if stream.saw_reasoning else None), content
