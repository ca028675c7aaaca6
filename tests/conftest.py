"""Shared fixtures: the default model loaded once per session, and helpers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_model_path() -> str:
    from tokenmill.loader.model_source import default_model_path

    return str(default_model_path())


@pytest.fixture(scope="session")
def llm():
    """The default model with a modest cache, shared by tests that do not change engine settings. fp32, so
    it can be held to an fp32 reference whatever `--dtype auto` picks on this CPU."""
    from tokenmill import LLM

    return LLM(progress=False, kv_cache_memory=256 * 2**20, max_model_len=2048, dtype="float32")

