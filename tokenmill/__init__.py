"""tokenmill: a small, readable LLM inference server with paged KV cache and continuous batching."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenmill.outputs import CompletionOutput, FinishReason, RequestOutput
from tokenmill.sampling_params import SamplingParams
from tokenmill.version import __version__

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "FinishReason", "__version__"]

if TYPE_CHECKING:
    from tokenmill.entrypoints.llm import LLM


def __getattr__(name: str) -> Any:  # LLM pulls in torch: import it only when asked for
    if name == "LLM":
        from tokenmill.entrypoints.llm import LLM

        return LLM
    raise AttributeError(name)
