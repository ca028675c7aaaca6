"""The one place that knows the device: which one, which dtype, how much memory, how many threads."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import torch

from tokenmill.compute import ComputeChoice, Matrix, choose_compute, choose_dense_copy, int8_panel_covers, vnni_packs
from tokenmill.config import EngineConfig
from tokenmill.memory_plan import available_ram, default_kv_cache_bytes, kv_bytes_for_gpu_share, total_ram
from tokenmill.native import kernels as native_kernels

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """compute.ComputeChoice's dtype name -> the torch dtype."""
    return _DTYPES[name]


@dataclass(frozen=True)
class Platform:
    device: torch.device
    compute: ComputeChoice  # the dtype and the linear method (compute.choose_compute decided them)

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.compute.dtype]

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def available_memory(self) -> int:
        """Bytes free for the KV cache right now (after weights are loaded)."""
        if self.is_cuda:
            free, _total = torch.cuda.mem_get_info(self.device)
            return int(free)
        return available_ram()

    def with_dense_copy(self, setting: str, copy_bytes: int,
                        matrices: list[Matrix] | None = None) -> Platform:
        """This platform with the gguf method's dense copy decided (compute.choose_dense_copy), against
        this machine's RAM, whether oneDNN can prepack here, and whether the 8-bit VNNI panel kernel takes
        every one of the file's `matrices` (rows, row length, type name) here; and with it whether the
        blocks are repacked for the 16-bit VNNI kernel (compute.vnni_packs), which the memory plan counts."""
        from tokenmill.native import block_matmul

        vnni = not self.is_cuda and self.compute.dtype == "bfloat16" and block_matmul.int8_panel_runs()
        compute = choose_dense_copy(setting, self.compute, copy_bytes, total_ram(),
                                    self.compute.dtype == "bfloat16" and not self.is_cuda and can_prepack_here(),
                                    int8_panel_covers(matrices, vnni))
        bits = block_matmul.vnni_bits() if not self.is_cuda and block_matmul.available() else 0
        compute = dataclasses.replace(compute, vnni_pack=compute.linear_method == "gguf" and vnni_packs(
            compute.dtype == "bfloat16", bits))
        return Platform(self.device, compute)

    def default_kv_cache_memory(self) -> int:
        return default_kv_cache_bytes(self.is_cuda, self.available_memory())

    def kv_cache_memory_for_share(self, share: float, weight_bytes: int) -> int:
        """The KV cache under vLLM's --gpu-memory-utilization (CUDA; memory_plan.kv_bytes_for_gpu_share), with
        the weights not loaded yet."""
        assert self.is_cuda
        free, total = torch.cuda.mem_get_info(self.device)
        return kv_bytes_for_gpu_share(share, int(total), int(free), weight_bytes)

    def decode_mirror_bytes(self) -> int:
        """Memory for DecodeMirror (contiguous K/V rows for decoding requests). On CPU, gathering blocks
        every step costs more than keeping the copy; a GPU gathers fast enough. 0 disables it.
        TOKENMILL_DECODE_MIRROR_MEMORY (bytes) overrides, e.g. for A/B measurements."""
        env = os.environ.get("TOKENMILL_DECODE_MIRROR_MEMORY")
        if env is not None:
            return int(env)
        if self.is_cuda:
            return 0
        return min(2 * 2**30, available_ram() // 8)

    def attention_backend(self) -> tuple[str, int]:
        """Which attention backend (attention/registry.py) and its memory. On CPU: `native`, the native
        decode kernel reading the paged cache in place, when the kernels are built and not switched off,
        in fp32 (measured 1.4-2.4x the decode mirror's SDPA on a 2-core Zen 3, batch 1-64, SmolLM2 and 7B
        head shapes: benchmarks/results/2026-12-01-kernels) and in bf16 (8-15x on CPUs without AMX, where
        SDPA has no native bf16; on an AMX Xeon the engine's one-stream decode 2x, since the whole decode
        step then runs in one native call, and 64 x 200 -> 64 offline 1.1x: benchmarks/README.md, "AMX").
        Otherwise on CPU the decode mirror, where gathering every block of every decoding request
        each step costs more than keeping a contiguous copy; the paged gather path on a GPU, or when the
        mirror is given no memory. TOKENMILL_ATTENTION_BACKEND names one instead, e.g. for A/B runs."""
        forced = os.environ.get("TOKENMILL_ATTENTION_BACKEND")
        if forced:
            return forced, self.decode_mirror_bytes() if forced == "decode_mirror" else 0
        if not self.is_cuda and native_kernels.is_enabled() and self.dtype in (torch.float32, torch.bfloat16):
            return "native", 0
        mirror_bytes = self.decode_mirror_bytes()
        return ("decode_mirror", mirror_bytes) if mirror_bytes > 0 else ("paged", 0)


def can_prepack_here() -> bool:
    """oneDNN can prepack bf16 weights on this CPU (platforms/onednn.py probes it once).
    TOKENMILL_PREPACK=0 turns it off, e.g. for A/B measurements."""
    from tokenmill.platforms.onednn import can_prepack

    return os.environ.get("TOKENMILL_PREPACK", "1") != "0" and can_prepack()


def cpu_bf16_is_fast() -> bool:
    """oneDNN has native bf16 arithmetic here (cpu_features.cpu_has_native_bf16): AMX that PyTorch may use
    (the OS grants the tiles; a private API, so a missing function counts as yes: the flag check already
    passed), or AVX512_BF16 with oneDNN in this torch build."""
    from tokenmill.cpu_features import cpu_has_amx_bf16, cpu_has_avx512_bf16

    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if cpu_has_amx_bf16() and (bool(check()) if check is not None else True):
        return True
    return cpu_has_avx512_bf16() and torch.backends.mkldnn.is_available()


def ggml_available() -> bool:
    """ggml's kernels are built here (native/ggml.py says why not, once, in the log)."""
    from tokenmill.native import ggml

    return ggml.available()


def resolve_platform(config: EngineConfig, weights: str = "hf") -> Platform:
    """`weights`: the checkpoint's format, "gguf" or "hf" (a GGUF file on CPU keeps its blocks)."""
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device=cuda was asked for, but PyTorch sees no CUDA GPU; use --device cpu")
    compute = choose_compute(device.type, config.dtype, config.quantization, weights=weights,
                             ggml_available=ggml_available, bf16_is_fast=cpu_bf16_is_fast,
                             can_prepack=can_prepack_here)
    if device.type == "cpu":
        threads = config.num_threads or int(os.environ.get("TOKENMILL_NUM_THREADS", 0)) or os.cpu_count() or 1
        torch.set_num_threads(threads)
    return Platform(device, compute)
