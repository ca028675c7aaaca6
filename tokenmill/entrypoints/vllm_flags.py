"""vLLM's `vllm serve` flags on `tokenmill serve`, so that a command line (or a compose file) written for vLLM
starts this server. Each flag is one of three kinds, and nothing is taken and dropped unsaid:

- mapped: it means something here, and is applied (--model, --enable-prefix-caching and its negation,
  --disable-log-requests, --gpu-memory-utilization on CUDA);
- moot: what it asks for is already so here, and the log says once what it means (--trust-remote-code: no
  checkpoint code is ever run; --enforce-eager: there are no graphs to capture; --enable-chunked-prefill:
  prefills are always chunked; --enable-auto-tool-choice: tool_choice "auto" works whenever a parser is
  found; --disable-log-stats: no periodic stats are logged; --enable-server-load-tracking: /load always
  answers; --swap-space: preemption recomputes, as in vLLM V1; a parallel size of 1; --kv-cache-dtype auto);
- refused: it asks for what this server does not do, and `serve` stops at once with the reason and what to
  use instead (a parallel size above 1, an fp8 KV cache, --no-enable-chunked-prefill,
  --gpu-memory-utilization on CPU).

The offline API's LLM(...) takes vLLM's keyword arguments the same way (`llm_arguments`).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

log = logging.getLogger("tokenmill")


def add_vllm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM's flags", "accepted so that vLLM command lines run; each is applied, or "
                             "logged as already so here, or refused with the reason (README, 'vLLM's flags')")
    g.add_argument("--model", dest="vllm_model", default=None, help="the model (as vLLM names it; the same as "
                   "the positional argument)")
    g.add_argument("--enable-prefix-caching", dest="vllm_prefix_caching", default=None,
                   action=argparse.BooleanOptionalAction, help="on by default; --no-enable-prefix-caching "
                   "is --no-prefix-caching")
    g.add_argument("--enable-chunked-prefill", dest="vllm_chunked_prefill", default=None,
                   action=argparse.BooleanOptionalAction, help="always on (prompts are cut at "
                   "--max-num-batched-tokens)")
    for flags, dest in ((("--tensor-parallel-size", "-tp"), "vllm_tp"), (("--pipeline-parallel-size", "-pp"), "vllm_pp"),
                        (("--data-parallel-size", "-dp"), "vllm_dp")):
        g.add_argument(*flags, dest=dest, type=int, default=None, help="1 only: one device per process")
    g.add_argument("--gpu-memory-utilization", dest="vllm_gpu_util", type=float, default=None,
                   help="CUDA: the share of the GPU's memory for this server (weights, activations, KV cache); "
                        "sizes the KV cache unless --kv-cache-memory does")
    g.add_argument("--kv-cache-dtype", dest="vllm_kv_dtype", default=None, help="auto only (the compute dtype)")
    g.add_argument("--swap-space", dest="vllm_swap", type=float, default=None,
                   help="reserves nothing: preemption recomputes")
    for flag in ("--trust-remote-code", "--enforce-eager", "--enable-auto-tool-choice", "--disable-log-stats",
                 "--enable-server-load-tracking", "--disable-log-requests"):
        g.add_argument(flag, dest="vllm_" + flag[2:].replace("-", "_"), action="store_true",
                       help=argparse.SUPPRESS if flag != "--disable-log-requests" else
                       "no line per finished request in the log")


_MOOT = {
    "trust_remote_code": "--trust-remote-code: tokenmill never runs code from a checkpoint (a GGUF or "
                         "safetensors file and JSON configs are all it reads)",
    "enforce_eager": "--enforce-eager: tokenmill captures no CUDA graphs; every step runs eagerly",
    "enable_auto_tool_choice": "--enable-auto-tool-choice: tool_choice 'auto' works whenever --tool-call-parser "
                               "(default auto) finds a parser for the model",
    "disable_log_stats": "--disable-log-stats: tokenmill logs no periodic stats (scrape /metrics)",
    "enable_server_load_tracking": "--enable-server-load-tracking: /load always answers the requests being served",
}


def apply_vllm_args(args: argparse.Namespace) -> None:
    """Fold vLLM's flags into tokenmill's own on `args` (serve's namespace), logging the moot ones once; a
    ValueError names a refused one and what to use instead."""
    if args.vllm_model is not None:
        if args.vllm_model not in args.model:
            args.model = [args.vllm_model, *args.model]
    if args.vllm_prefix_caching is not None:
        if args.vllm_prefix_caching and args.no_prefix_caching:
            raise ValueError("--enable-prefix-caching and --no-prefix-caching contradict each other")
        args.no_prefix_caching = args.no_prefix_caching or not args.vllm_prefix_caching
    if args.vllm_chunked_prefill is False:
        raise ValueError("--no-enable-chunked-prefill: tokenmill always cuts prompts at --max-num-batched-tokens; "
                         "to run every prompt in one step, set --max-num-batched-tokens to --max-model-len")
    for flag, value in (("--tensor-parallel-size", args.vllm_tp), ("--pipeline-parallel-size", args.vllm_pp),
                        ("--data-parallel-size", args.vllm_dp)):
        _one_device(flag + " ", value)
    if args.vllm_kv_dtype not in (None, "auto"):
        raise ValueError(f"--kv-cache-dtype {args.vllm_kv_dtype}: only auto (the KV cache at the compute dtype, "
                         "--dtype) is supported")
    if args.vllm_gpu_util is not None and not 0 < args.vllm_gpu_util <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {args.vllm_gpu_util}")
    if args.vllm_swap is not None:
        if args.vllm_swap < 0:
            raise ValueError(f"--swap-space must not be negative, got {args.vllm_swap}")
        log.info("--swap-space: tokenmill preempts by recomputing (as vLLM V1 does); no swap space is reserved")
    for name, note in _MOOT.items():
        if getattr(args, "vllm_" + name):
            log.info(note)


def _one_device(name: str, value: object) -> None:
    """A parallel size (`name` as the caller spells it, with its separator) must be 1 (or unset)."""
    if value is not None and value != 1:
        raise ValueError(f"{name}{value}: tokenmill runs a model on one device per process (1 only); for more "
                         "throughput run several servers behind a load balancer")


# vLLM's names for dtypes (its LLM(dtype=...) and --dtype) -> tokenmill's
_DTYPE_NAMES = {"float": "float32", "half": "float16"}


def llm_arguments(model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM's LLM(...) keywords as the offline API's (EngineConfig's): the same three kinds as the flags. Moot
    (the serve flags' moot ones, swap_space, a parallel size of 1, `tokenizer` naming the model itself) are
    dropped; dtype "half" / "float" or a torch dtype is the dtype it names; a parallel size above 1 or another
    tokenizer is a ValueError; everything else passes on (an unknown one fails there, named)."""
    out = dict(kwargs)
    for name in (*_MOOT, "swap_space"):
        out.pop(name, None)
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        _one_device(name + "=", out.pop(name, None))
    tok = out.pop("tokenizer", None)
    if tok not in (None, model):
        raise ValueError(f"tokenizer={tok!r}: the tokenizer is the model's own ({model!r}); another is not supported")
    dtype = out.get("dtype")
    if dtype is not None:
        name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")  # torch.bfloat16 -> bfloat16
        out["dtype"] = _DTYPE_NAMES.get(name, name)
    return out
