"""Shared fixtures: the default model loaded once per session, and helpers."""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
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

# One glibc arena in every test process, as `tokenmill serve` keeps (tokenmill/heap.py), so that the
# in-process servers' unload tests see a model's memory go back however many threads the process has run:
# pytest-xdist's workers inherit the variable from their start, a process running the tests itself asks now.
from tokenmill.heap import one_arena, trim  # noqa: E402 (torch-free; before anything starts threads)

if one_arena():  # (not where the environment set MALLOC_ARENA_MAX)
    os.environ["MALLOC_ARENA_MAX"] = "1"

# The GGUF method's start-up crossover measurement (~6 s of matmuls a load on 2 cores) is made once per run and
# shared by every engine and server the tests start (layers/calibration_cache.py): one file per run, named by
# the process that starts the run (pytest-xdist's workers and the servers inherit the variable).
_CALIBRATION_FILE = os.path.join(tempfile.gettempdir(), f"tokenmill-test-calibration-{os.getpid()}.json")
os.environ.setdefault("TOKENMILL_CALIBRATION_CACHE", _CALIBRATION_FILE)


def pytest_unconfigure(config: pytest.Config) -> None:
    if os.environ.get("TOKENMILL_CALIBRATION_CACHE") == _CALIBRATION_FILE:  # the process that named it
        with contextlib.suppress(OSError):
            os.unlink(_CALIBRATION_FILE)


# The test files that take longest (seconds in one of `make test`'s two processes on the 2-core Zen 2 EPYC,
# 2026-12-05), run first: `make test` hands whole files to two processes as each frees up, so a long file
# left for last kept one process busy while the other sat idle. A scheduling hint only: the order of tests
# within a file is kept.
_SLOW_FILES = {
    "tests/model/test_gguf_method.py": 168, "tests/engine/test_spec_decode_models.py": 164,
    "tests/model/test_gemma3.py": 133, "tests/engine/test_spec_decode.py": 113,
    "tests/model/test_invariance.py": 90, "tests/server/test_server_soak.py": 88,
    "tests/server/test_server_lifecycle.py": 82, "tests/server/test_structured_output_api.py": 79,
    "tests/server/test_server_preemption_storm.py": 77, "tests/model/test_prompt_logprobs.py": 61,
    "tests/model/test_native_decode.py": 60, "tests/server/test_vllm_dropin.py": 51,
    "tests/server/test_server_tool_calling.py": 49, "tests/model/test_beam_search.py": 45,
    "tests/engine/test_structured_output.py": 45, "tests/unit/test_convert.py": 38,
    "tests/server/test_multi_model.py": 38, "tests/server/test_ollama_api.py": 35,
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
    trim()


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
