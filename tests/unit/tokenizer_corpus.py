"""The tokenizer corpus shared by the tokenizer and detokenizer tests: loaded from the script that made
the llama.cpp fixture, so both test the same texts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def load_fixture_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_tokenizer_fixture", FIXTURES / "make_tokenizer_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mkfx = load_fixture_module()
