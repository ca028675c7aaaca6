"""Structured output in the engine: grammars constrain what is sampled, end requests when they are
complete, and leave the other requests in the batch alone.

Exactness claims run on the `llm` fixture (fp32, dequantized: rows of a batch are independent there), so
"unchanged" means the same tokens, not similar ones.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.outputs import FinishReason
from tokenmill.sample.grammar_bitmask import GrammarBitmaskProcessor
from tokenmill.sampling_params import ParamError, StructuredOutputsParams as SO

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0,
                                                                             "maximum": 120}}}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4, 5,"]


def chat_ids(llm: LLM, text: str) -> list[int]:
    return llm.engine.input_processor.render_chat_ids([{"role": "user", "content": text}], True)


def test_bitmask_processor_masks_only_its_rows() -> None:
    """Bit t % 32 of word t // 32 allows token t; rows without a mask keep their logits bit for bit."""
    V = 70  # three words, the last one partial
    logits = torch.randn(3, V)
    allowed = [0, 31, 32, 69]
    words = torch.zeros(1, 3, dtype=torch.int64)
    for t in allowed:
        words[0, t // 32] |= 1 << (t % 32)
    mask = words.to(torch.int32)  # bit 31 set: a negative int32, as llguidance writes it
    proc = GrammarBitmaskProcessor(torch.device("cpu"))
    proc.set_step([1], mask)
    assert proc.prepare([])
    out = proc.apply(logits)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    finite = torch.isfinite(out[1]).nonzero().flatten().tolist()
    assert finite == allowed
    assert torch.equal(out[1, allowed], logits[1, allowed])
    proc.set_step([], None)
    assert not proc.prepare([])


def test_json_schema_output_validates_and_stops_at_its_end(llm: LLM) -> None:
    ids = chat_ids(llm, "Give me a person as JSON.")
    outs = llm.generate([ids] * 3, [SamplingParams(temperature=t, seed=i, max_tokens=120, structured_outputs=SO(json=PERSON))
                                    for i, t in enumerate((0.0, 1.0, 1.0))])
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason is FinishReason.STOP, c
        jsonschema.validate(json.loads(c.text), PERSON)
        assert c.text.endswith("}")  # the token that completes the grammar is text (no EOS was needed)
        assert llm.tokenizer.decode(c.token_ids) == c.text


def test_regex_choice_and_grammars(llm: LLM) -> None:
    specs = {
        "regex": (SO(regex=r"[a-z]{3,8}@[a-z]{3,6}\.(com|org)"), lambda t: re.fullmatch(r"[a-z]{3,8}@[a-z]{3,6}\.(com|org)", t)),
        "choice": (SO(choice=["yes", "no", "maybe so"]), lambda t: t in ("yes", "no", "maybe so")),
        "lark": (SO(grammar='start: "[" DIGIT ("," DIGIT)* "]"\nDIGIT: /[0-9]/'), lambda t: re.fullmatch(r"\[\d(,\d)*\]", t)),
        "gbnf": (SO(grammar='root ::= ("Yes" | "No") ", because " [a-z ]{1,20} "."'),
                 lambda t: re.fullmatch(r"(Yes|No), because [a-z ]{1,20}\.", t)),
    }
    prompts = ["Write an email address:", "Is the sky blue?", "A list of digits:", "Do cats fly?"]
    for temp in (0.0, 1.0):
        outs = llm.generate(prompts, [SamplingParams(temperature=temp, seed=7, max_tokens=60, structured_outputs=s)
                                      for s, _ in specs.values()])
        for (name, (_, ok)), o in zip(specs.items(), outs):
            c = o.outputs[0]
            assert c.finish_reason is FinishReason.STOP and ok(c.text), (name, temp, c.text)


def test_unconstrained_neighbours_are_unchanged(llm: LLM) -> None:
    """Constrained and unconstrained requests in one batch: the unconstrained greedy tokens are the same
    as when they run without the constrained ones."""
    plain = SamplingParams(temperature=0, max_tokens=24)
    alone = llm.generate(PROMPTS, plain)
    constrained = [SamplingParams(temperature=0, max_tokens=60, structured_outputs=SO(json=PERSON)),
                   SamplingParams(temperature=1.0, seed=3, max_tokens=40, structured_outputs=SO(regex="[0-9]{4,30}"))]
    mixed = llm.generate([*PROMPTS[:2], "Person:", "Number:", *PROMPTS[2:]],
                         [plain, plain, *constrained, plain, plain])
    got = [mixed[i].outputs[0].token_ids for i in (0, 1, 4, 5)]
    assert got == [o.outputs[0].token_ids for o in alone]
    assert re.fullmatch("[0-9]{4,30}", mixed[3].outputs[0].text)


def test_n_and_seeds_each_sequence_has_its_own_grammar_state(llm: LLM) -> None:
    p = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=120, structured_outputs=SO(json=PERSON))
    ids = chat_ids(llm, "Give me a person as JSON.")
    first, again = llm.generate(ids, p)[0], llm.generate(ids, p)[0]
    for c in first.outputs:
        jsonschema.validate(json.loads(c.text), PERSON)
    assert [c.text for c in first.outputs] == [c.text for c in again.outputs]  # seeded: reproducible


def test_preempted_and_prefix_cached_equal_ample() -> None:
    """A cache so small that requests are preempted and recomputed, and the prefix cache off: the same
    greedy constrained outputs (the grammar state survives a preemption: the tokens are kept)."""
    base = dict(progress=False, max_model_len=160, dtype="float32", quantization="dequantize")
    ample = LLM(kv_cache_memory=64 * 2**20, **base)
    tiny = LLM(kv_cache_memory=11 * 16 * 45 * 2**10, enable_prefix_caching=False, **base)  # 11 blocks of 16 tokens
    prompts = [chat_ids(ample, f"Give me person number {i} as JSON.") for i in range(6)]
    p = SamplingParams(temperature=0, max_tokens=80, structured_outputs=SO(json=PERSON))
    want = [o.outputs[0].token_ids for o in ample.generate(prompts, p)]
    got = tiny.generate(prompts, p)
    assert tiny.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in got] == want
    assert tiny.engine.block_manager.usage == 0


def test_max_tokens_cuts_a_constrained_output_with_length(llm: LLM) -> None:
    out = llm.generate("Digits:", SamplingParams(temperature=0, max_tokens=5, structured_outputs=SO(regex="[0-9]{20}")))[0]
    c = out.outputs[0]
    assert c.finish_reason is FinishReason.LENGTH and len(c.token_ids) == 5 and c.text.isdigit()


@pytest.mark.parametrize("spec, words", [
    (SO(json={"type": "strin"}), "Invalid type"),
    (SO(json={"type": "array", "uniqueItems": True}), "uniqueItems"),
    (SO(json='{"type": '), "not valid JSON"),
    (SO(regex="a(b"), "unclosed group"),
    (SO(grammar="start: undefined_rule"), "undefined_rule"),
])
def test_a_constraint_that_does_not_compile_is_refused_before_anything_runs(llm: LLM, spec: SO, words: str) -> None:
    good = SamplingParams(max_tokens=4)
    with pytest.raises(ParamError, match=words) as e:
        llm.generate(["a", "b"], [good, SamplingParams(max_tokens=4, structured_outputs=spec)])
    assert e.value.field == "structured_outputs"
    assert not llm.engine.has_unfinished_requests()  # the good one was not queued either


def test_bad_specs_are_refused_when_made() -> None:
    with pytest.raises(ParamError, match="exactly one"):
        SO(regex="a", choice=["b"])
    with pytest.raises(ParamError, match="exactly one"):
        SO()
    with pytest.raises(ParamError, match="non-empty list"):
        SO(choice=[])


def test_compiled_grammars_are_cached_by_their_text(llm: LLM) -> None:
    mgr = llm.engine.structured
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"], "title": "cache-test"}
    before = mgr.num_compiled
    for _ in range(3):
        llm.generate("x", SamplingParams(temperature=0, max_tokens=20, structured_outputs=SO(json=dict(schema))))
    assert mgr.num_compiled == before + 1
    llm.generate("x", SamplingParams(temperature=0, max_tokens=20, structured_outputs=SO(json=schema, disable_any_whitespace=True)))
    assert mgr.num_compiled == before + 2  # whitespace settings are part of the grammar


def test_declared_properties_only_unless_the_schema_opens_them(llm: LLM) -> None:
    """An object schema that declares properties and is silent on additionalProperties gets only those (as
    vLLM's default backend and OpenAI's strict mode): the model, asked for more, writes none of its own; a
    schema that says additionalProperties true still may; allOf members stay open; nothing else changes."""
    from tokenmill.structured_output.grammar import closed_objects

    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}
    nested = {"type": "object", "properties": {"a": city, "b": {"type": "array", "items": city}},
              "$defs": {"c": city}, "anyOf": [city], "allOf": [city]}
    closed = closed_objects(nested)
    assert closed["additionalProperties"] is False and "additionalProperties" not in nested  # a copy
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["b"]["items"]["additionalProperties"] is False
    assert closed["$defs"]["c"]["additionalProperties"] is False and closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in closed["allOf"][0]
    for kept in ({"type": "object"}, {**city, "additionalProperties": True}, {**city, "patternProperties": {"x": {}}},
                 {"type": "object", "properties": {}}):
        assert closed_objects(kept) == kept
    prompt = chat_ids(llm, "Describe the weather in Paris as a JSON object with many fields: city, temperature, "
                           "wind, humidity, forecast.")
    for schema, open_ in ((city, False), ({**city, "additionalProperties": True}, True)):
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=48,
                                                    structured_outputs=SO(json=schema)))[0].outputs[0]
        if open_:
            assert out.finish_reason == FinishReason.LENGTH or set(json.loads(out.text)) >= {"city"}
        else:
            assert set(json.loads(out.text)) == {"city"} and out.finish_reason == FinishReason.STOP
