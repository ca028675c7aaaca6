"""ServerProcess with the tests' model settings; the helper itself is tokenmill.benchmarks.server_process."""

from __future__ import annotations

import time
from collections.abc import Callable

from tokenmill.benchmarks.server_process import ServerProcess as _ServerProcess
from tokenmill.benchmarks.server_process import free_port, rss_bytes

__all__ = ["MODEL_ARGS", "ServerProcess", "free_port", "rss_bytes", "wait_for"]

MODEL_ARGS = ["--kv-cache-memory", "256MiB", "--max-model-len", "2048"]
# fp32 and dequantized weights unless a test asks otherwise: HTTP outputs are compared exactly with the
# offline `llm` and across loads, which only that mode guarantees (bf16 matmuls and the GGUF-block method
# pick kernels by batch size; see test_bf16.py and test_gguf_method.py)
DEFAULT_DTYPE = ["--dtype", "float32"]
DEFAULT_QUANTIZATION = ["--quantization", "dequantize"]


class ServerProcess(_ServerProcess):
    """A `tokenmill serve` process with MODEL_ARGS, fp32 and dequantized weights unless `extra_args` say
    otherwise (later flags win)."""

    def __init__(self, *extra_args: str, env: dict[str, str] | None = None) -> None:
        super().__init__(*MODEL_ARGS, *([] if "--dtype" in extra_args else DEFAULT_DTYPE),
                         *([] if "--quantization" in extra_args else DEFAULT_QUANTIZATION), *extra_args, env=env)


def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll `cond` until it holds (True) or `timeout` s pass (False): for states, not for speed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False
