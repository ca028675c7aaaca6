"""Shared fixtures: the default model loaded once per session, and helpers."""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _threads_per_process() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)  # pytest-xdist's test processes
    return str(max(1, cores // (2 * workers)))


# The test process (a client, or a reference model) and a server process often compute side by side. With
# every OpenMP team as wide as the machine, they wait on each other at every barrier: on 2 cores the server
# tests ran 2-3x slower (the soak 100 s instead of 51 s). So each process gets half the cores, divided among
# pytest-xdist's test processes (`make test` runs two: on 2 cores one thread each, and the suite took 15 min
# instead of 25 on the AMX Xeon, since a one-thread test process left the other core idle), unless the
# environment says otherwise; server subprocesses inherit this. Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", _threads_per_process())
os.environ.setdefault("TOKENMILL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])


# The test files that take longest (seconds in one process on the 2-core AMX Xeon, 2026-12-03), run first:
# `make test` hands whole files to two processes as each frees up, so a long file left for last kept one
# process busy while the other sat idle. A scheduling hint only: the order of tests within a file is kept.
_SLOW_FILES = {
    "tests/engine/test_spec_decode_models.py": 140, "tests/engine/test_spec_decode.py": 80,
    "tests/server/test_server_lifecycle.py": 95, "tests/model/test_invariance.py": 82,
    "tests/model/test_gemma3.py": 79, "tests/server/test_server_soak.py": 65,
    "tests/server/test_structured_output_api.py": 64, "tests/model/test_gguf_method.py": 58,
    "tests/server/test_server_preemption_storm.py": 57, "tests/model/test_beam_search.py": 53,
    "tests/model/test_native_decode.py": 52, "tests/model/test_prompt_logprobs.py": 40,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def weight(item: pytest.Item) -> int:
        return -_SLOW_FILES.get(item.nodeid.split("::")[0], 0)

    items.sort(key=weight)  # stable: files and their tests otherwise in collection order


@pytest.fixture(autouse=True, scope="module")
def _return_freed_memory() -> Iterator[None]:
    """After each test file: collect garbage and hand freed heap back to the OS (glibc keeps it otherwise),
    so that two test processes side by side do not each hold the peak of every file they ran."""
    yield
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@pytest.fixture(scope="session")
def default_model_path() -> str:
    from tokenmill.loader.model_source import default_model_path

    return str(default_model_path())


@pytest.fixture(scope="session")
def llm():
    """The default model with a modest cache, shared by tests that do not change engine settings. fp32, so
    it can be held to an fp32 reference whatever `--dtype auto` picks on this CPU; dequantized, so it is
    exact against transformers on the same weights (the gguf method is held to a bound: test_gguf_method.py)."""
    from tokenmill import LLM

    return LLM(progress=False, kv_cache_memory=256 * 2**20, max_model_len=2048, dtype="float32",
               quantization="dequantize")



@pytest.fixture(scope="session")
def small_llm():
    """The default model with a 256-token context and a 32 MiB cache (fp32): for tests at the context limit,
    where a prompt as long as the context is cheap, and for in-process apps (schemathesis)."""
    from tokenmill import LLM

    return LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, max_num_batched_tokens=256,
               dtype="float32", quantization="dequantize")


@pytest.fixture(scope="session")
def reference(default_model_path: str):
    """HF transformers loading the default GGUF on its own (it dequantises and un-permutes itself), fp32:
    the independent implementation greedy tokens, logits and logprobs are held to."""
    transformers = pytest.importorskip("transformers")
    import torch
    from pathlib import Path

    p = Path(default_model_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
    model.eval()
    return model
