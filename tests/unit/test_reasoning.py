"""The reasoning split (entrypoints/openai/reasoning.py): where the reasoning starts and ends, and a stream's
pieces joining to exactly the whole answer's split, however the text is cut into deltas."""

from __future__ import annotations

import random

import pytest

from tokenmill.entrypoints.openai.reasoning import ReasoningStream, prompt_opens_reasoning, split

CASES = [
    # (answer, prompt opened a block, reasoning, content)
    ("<think>\nLet me see: 2+2=4.\n</think>\n\nIt is 4.", False, "\nLet me see: 2+2=4.\n", "It is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("It is 4.", False, None, "It is 4."),
    ("The tag <think> later is content", False, None, "The tag <think> later is content"),
    ("<thin", False, None, "<thin"),  # an answer that ends in half a tag: content
    ("   ", False, None, "   "),
    ("", False, None, ""),
    ("<think>cut off by max_tokens", False, "cut off by max_tokens", ""),
    ("<think>x</thi", False, "x</thi", ""),
    # the template opened the block (DeepSeek-R1): no <think> of its own
    ("I should add.</think>\n\n4", True, "I should add.", "4"),
    ("still thinking", True, "still thinking", ""),
    ("</think>", True, "", ""),
    ("a</think>b</think>c", True, "a", "b</think>c"),  # only the first end tag ends it
]


@pytest.mark.parametrize(("text", "opened", "reasoning", "content"), CASES)
def test_split(text: str, opened: bool, reasoning: str | None, content: str) -> None:
    assert split(text, opened) == (reasoning, content)


@pytest.mark.parametrize(("text", "opened", "reasoning", "content"), CASES)
def test_any_cut_into_deltas_joins_to_the_split(text: str, opened: bool, reasoning: str | None, content: str) -> None:
    rng = random.Random(len(text))
    cuts = [[1] * len(text)] + [[rng.randint(1, 5) for _ in range(len(text))] for _ in range(20)]
    for sizes in cuts:
        stream, r, c, i = ReasoningStream(opened), [], [], 0
        for n in sizes:
            if i >= len(text):
                break
            piece = text[i : i + n]
            i += n
            dr, dc = stream.feed(piece, is_final=i >= len(text))
            r.append(dr)
            c.append(dc)
        if not text:
            dr, dc = stream.feed("", is_final=True)
            r.append(dr)
            c.append(dc)
        assert ("".join(r) if stream.saw_reasoning else None, "".join(c)) == (reasoning, content), sizes


def test_a_tag_is_held_back_until_whole() -> None:
    stream = ReasoningStream()
    assert stream.feed("\n<th") == ("", "")
    assert stream.feed("ink>I am") == ("I am", "")
    assert stream.feed(" sure</") == (" sure", "")  # "</" may start the end tag
    assert stream.feed("think>\n") == ("", "")
    assert stream.feed("\nYes.", is_final=True) == ("", "Yes.")


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking false
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert not prompt_opens_reasoning("<think>a</think> earlier turn; <|im_start|>assistant\n")
