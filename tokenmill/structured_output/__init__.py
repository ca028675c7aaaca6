"""Structured output: grammars that constrain what a request may generate, on llguidance.

    grammar.py   a StructuredOutputsParams -> llguidance's grammar text (JSON schema, regex, choice, Lark/GBNF)
    manager.py   StructuredOutputManager: compiles and caches grammars, gives each sequence its matcher,
                 fills the step's token bitmask and advances matchers as tokens are accepted

The engine owns the matchers (one per sequence, on the Request); the workers only see the step's bitmask
in the SchedulerOutput (plain data) and apply it before sampling (sample/grammar_bitmask.py).
"""

from tokenmill.structured_output.manager import StructuredOutputManager

__all__ = ["StructuredOutputManager"]
