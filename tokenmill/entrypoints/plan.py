"""`tokenmill plan`: the memory arithmetic from the model's header alone, before anything is loaded.

Reads the GGUF header or config.json (no weights, no torch), then prints weight bytes, KV bytes per token
and per block, how many tokens the cache holds, how many sequences of a given length fit at once, and a
verdict. `serve` and the engine run the same arithmetic (tokenmill.memory_plan) and refuse the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

from tokenmill.compute import (DENSE_COPY_CHOICES, DTYPE_BYTES, QUANTIZATION_CHOICES, Matrix, choose_compute,
                               choose_dense_copy, default_token_budget, int8_panel_covers, vnni_packs)
from tokenmill.cpu_features import (auto_dtype, bf16_reason, cpu_has_amx_bf16, cpu_has_avx512_vnni,
                                    cpu_has_native_bf16)
from tokenmill.config import EngineConfig, SpeculativeConfig, format_size, parse_size
from tokenmill.loader.model_config import ModelConfig
from tokenmill.loader.model_source import resolve_model
from tokenmill.memory_plan import (CacheTooSmallError, MemoryPlan, available_ram, default_kv_cache_bytes,
                                   dense_copy_bytes, make_plan, total_ram)
from tokenmill.native.block_matmul import VNNI_SWITCH, vnni_asked


def read_model_config(model: str) -> tuple[ModelConfig, int, str, list[Matrix] | None]:
    """(config, bytes of the weights on disk, "gguf" or "hf", the GGUF file's matrices) from headers only."""
    source = resolve_model(model)
    if source.kind == "gguf":
        from tokenmill.loader.gguf import GGUFFile
        gf = GGUFFile(source.path)
        try:
            return (ModelConfig.from_gguf(gf.metadata, set(gf.tensors), gf.quantization()),
                    source.path.stat().st_size, "gguf", gf.matrices())
        finally:
            gf.close()
    size = sum(p.stat().st_size for p in source.path.glob("*.safetensors"))
    return ModelConfig.from_hf_dir(source.path), size, "hf", None


def plan_model(model: str, device: str, dtype: str, quantization: str | None, block_size: int, kv_bytes: int,
               max_model_len: int | None, max_chunk_tokens: int | None,
               spec: SpeculativeConfig | None = None, dense_copy: str = "auto",
               max_num_seqs: int = 64, state_checkpoints: int | None = None) -> tuple[ModelConfig, int, MemoryPlan]:
    """(config, bytes on disk, memory plan) of a model from its header, as the engine will plan it: the
    compute rule serve uses (the CPU's flags, whether ggml is built here), and a draft model's weights and
    KV cache when `spec` names one. `device`: "cpu" or "cuda"; max_model_len None: the model's context."""
    from tokenmill.native import ggml

    cfg, disk_bytes, kind, matrices = read_model_config(model)
    compute = choose_compute(device, dtype, quantization, weights=kind, ggml_available=ggml.available)
    # from the CPU's flags alone (plan imports no torch); serve also asks oneDNN whether it can prepack, so
    # on a bf16 CPU whose torch build cannot, serve keeps no copy where this plan counts one
    compute = choose_dense_copy(dense_copy, compute, dense_copy_bytes(cfg, compute.dtype_bytes), total_ram(),
                                device == "cpu" and compute.dtype == "bfloat16" and cpu_has_native_bf16(),
                                int8_panel_covers(matrices, device == "cpu" and compute.dtype == "bfloat16"
                                                  and cpu_has_avx512_vnni() and vnni_asked()
                                                  and not cpu_has_amx_bf16() and ggml.available()))
    # the 16-bit VNNI kernel is the bf16 panel where the library builds it (AVX512 F/BW/VNNI), without AMX and
    # unless the 8-bit one is asked for or the VNNI panel switched off (native/block_matmul.vnni_bits)
    vnni16 = (device == "cpu" and cpu_has_avx512_vnni() and not cpu_has_amx_bf16() and not vnni_asked()
              and os.environ.get(VNNI_SWITCH) != "0" and ggml.available())
    compute = dataclasses.replace(compute, vnni_pack=compute.linear_method == "gguf" and vnni_packs(
        compute.dtype == "bfloat16", 16 if vnni16 else 0))
    max_len = max_model_len or cfg.max_position_embeddings
    max_chunk_tokens = max_chunk_tokens or default_token_budget(device, compute)
    plan = make_plan(cfg, compute, block_size, kv_bytes, max_len, matrices, max_chunk_tokens, max_num_seqs,
                     state_checkpoints)
    if spec is not None and spec.method == "draft_model" and spec.model:
        dcfg, _, dkind, dmatrices = read_model_config(spec.model)
        dquant = quantization if spec.quantization is None else (
            None if spec.quantization == "auto" else spec.quantization)
        dcompute = choose_compute(device, dtype, dquant, weights=dkind, ggml_available=ggml.available)
        plan = plan.with_draft(make_plan(dcfg, dcompute, block_size, kv_bytes, max_len, dmatrices))
    return cfg, disk_bytes, plan


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default", help="a .gguf file, an HF directory, or 'default'")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--kv-cache-memory", default=None, help="e.g. 2GiB (default: what serve would pick here)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--state-checkpoints", type=int, default=None, metavar="N",
                   help="as for serve: a recurrent model's states kept for prefix caching (default: a quarter of the "
                        "KV cache's budget, at most --max-num-seqs)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="as for serve: a prefill chunk's most (what a sliding-window sequence adds to its window)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPE_BYTES])
    p.add_argument("--quantization", choices=QUANTIZATION_CHOICES, default=None, help="as for serve")
    p.add_argument("--dense-copy", choices=DENSE_COPY_CHOICES, default="auto", help="as for serve")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where it would run (default cpu; the GPU's free memory is not probed here)")
    p.add_argument("--seq-len", type=int, default=None, help="length for 'how many fit at once' (default: max_model_len)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="as for serve: a draft_model's weights and KV cache join the plan")


def run_plan(args: argparse.Namespace) -> int:
    try:  # serve's checks of the same settings, in its words
        kv = parse_size(args.kv_cache_memory)
        EngineConfig(max_model_len=args.max_model_len, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                     max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=kv, dtype=args.dtype,
                     quantization=args.quantization, dense_copy=args.dense_copy,
                     state_checkpoints=args.state_checkpoints)
        if args.seq_len is not None and args.seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {args.seq_len}")
    except ValueError as e:
        print(f"tokenmill plan: {e}", file=sys.stderr)
        return 2
    if kv is None:
        if args.device == "cuda":
            print("tokenmill plan: --kv-cache-memory is needed with --device cuda (GPU memory is not probed)",
                  file=sys.stderr)
            return 2
        kv = default_kv_cache_bytes(False, available_ram())
    cfg, disk_bytes, plan = plan_model(args.model, args.device, args.dtype, args.quantization, args.block_size, kv,
                                       args.max_model_len, args.max_num_batched_tokens,
                                       SpeculativeConfig.parse(args.speculative_config), args.dense_copy,
                                       args.max_num_seqs, args.state_checkpoints)
    max_len = plan.max_model_len
    seq_len = args.seq_len or max_len
    print(f"model: {cfg.name or args.model} ({cfg.architecture}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_heads} heads / {cfg.num_kv_heads} KV heads of {cfg.head_dim}), context {cfg.max_position_embeddings}")
    print(f"on disk: {format_size(disk_bytes)} ({cfg.quantization})")
    if args.dtype == "auto":
        dtype = auto_dtype(args.device)
        why = "CUDA" if args.device == "cuda" else bf16_reason()
        print(f"compute: {dtype} on {args.device} (--dtype auto: {why})")
    else:
        print(f"compute: {args.dtype} on {args.device} (--dtype {args.dtype})")
    for line in plan.lines():
        print(line)
    per_seq_blocks = -(-min(seq_len, plan.max_seq_tokens) // args.block_size)  # a window frees the rest
    fit = plan.num_blocks // per_seq_blocks if per_seq_blocks else 0
    if plan.num_state_slots:  # a recurrent model runs at most as many sequences as it holds states for
        fit = min(fit, plan.num_state_slots)
    print(f"sequences of {seq_len} tokens that fit at once: {fit} (max_num_seqs {args.max_num_seqs})")
    if max_len > cfg.max_position_embeddings:
        print(f"warning: max_model_len {max_len} is beyond the model's trained context {cfg.max_position_embeddings}")
    try:
        plan.check()
    except CacheTooSmallError as e:
        print(f"verdict: cannot work. {e}")
        return 1
    if cfg.linear_layers and args.speculative_config:  # serve's refusal (engine/llm_engine.py), in its words
        print("verdict: cannot work. Speculative decoding is not supported for this model: its linear-attention "
              "layers keep a recurrent state that rejected drafts would have to roll back.")
        return 1
    if fit < args.max_num_seqs:
        # a recurrent model's prefix-cache checkpoints: as asked, else up to max_num_seqs (a quarter of the budget)
        ckpts = args.max_num_seqs if args.state_checkpoints is None else args.state_checkpoints
        need = (args.max_num_seqs * (per_seq_blocks * plan.kv_bytes_per_block + plan.state_bytes_per_seq)
                + ckpts * plan.state_bytes_per_seq)
        print(f"verdict: works. At most {fit} sequences of {seq_len} tokens run at once; with more, requests "
              f"wait or are preempted (recompute). For {args.max_num_seqs} at once use --kv-cache-memory "
              f"{format_size(_rounded_up(need))}"
              + (f" (their KV cache and recurrent states, and {ckpts} of the prefix cache's checkpoints)."
                 if plan.state_bytes_per_seq else "."))
    else:
        print("verdict: works.")
    return 0


def _rounded_up(num_bytes: int) -> float:
    """num_bytes rounded up to the tenth of the unit format_size prints it in, so advice taken as printed suffices."""
    unit = 1
    while num_bytes >= 1024 * unit and unit < 1024 ** 4:
        unit *= 1024
    return math.ceil(num_bytes * 10 / unit) * unit / 10
