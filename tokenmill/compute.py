"""The one rule for how a model computes: the dtype and the matmul (linear) method, and what each
method's weights cost in bytes. Torch-free, so `tokenmill plan`, `serve` and the engine's memory plan
all ask the same function.

    device  weights  quantization  ->  dtype      linear method
    cpu     GGUF     - (auto)      ->  (below)    gguf           the file's blocks on ggml's kernels (if built)
    cpu     any      q8_0, q4_k... ->  (below)    gguf           (re)quantized at load by ggml's quantizer
    cpu     any      int8          ->  (below)    int8           weight-only int8, bf16 activations (torch)
    cuda    any      -             ->  bfloat16   unquantized    GGUF dequantized (no CUDA kernels for blocks yet)
    cpu     any      dequantize    ->  (below)    prepacked / unquantized, as for an unquantized checkpoint
    cpu     HF       -             ->  bfloat16   prepacked      CPU has native bf16 (and oneDNN can prepack)
    cpu     HF       -             ->  float32    unquantized    no native bf16: bf16 matmul is far slower there

The compute dtype (activations, norms, KV cache) is bf16 on CUDA and on CPUs with native bf16 arithmetic
(AMX, or AVX512_BF16 as on AMD Zen 4: cpu_features), else fp32.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from tokenmill.cpu_features import cpu_has_amx_bf16, cpu_has_native_bf16


class Matrix(NamedTuple):
    """One matrix of a GGUF file as the memory plan counts it (GGUFFile.matrices): rows (a 3-D experts' stack:
    all experts' rows together), row length, ggml type name ("q4_k", "f32"), and whether it is a mixture of
    experts' matrix (routed or shared: the gguf method leaves some of those in the file's blocks, _packs)."""
    rows: int
    k: int
    type: str
    expert: bool = False


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LINEAR_METHODS = ("unquantized", "prepacked", "int8", "gguf")
# --quantization values that requantize at load with ggml's quantizer (no importance matrix needed)
REQUANT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
QUANTIZATION_CHOICES = ("dequantize", "int8", *REQUANT_TYPES)


@dataclass(frozen=True)
class ComputeChoice:
    dtype: str  # float32 | bfloat16 | float16: activations, non-matmul weights and the KV cache
    linear_method: str  # one of LINEAR_METHODS
    requant_type: str | None = None  # gguf method: quantize unquantized weights at load to this type
    # gguf method: also a dense copy of every matmul weight at the compute dtype (oneDNN-prepacked at bf16),
    # multiplied by batches past the block kernels' crossover (choose_dense_copy)
    dense_copy: bool = False
    # gguf method with a bf16 dense copy on a CPU whose bf16 panel is the 16-bit VNNI kernel: the Q4_0 / Q4_1 /
    # Q8_0 matrices of the decoder and the output layer are repacked at load into that kernel's layout
    # (vnni_packs), which is not the file's size for every type (VNNI_PACKED_PIECE); the memory plan counts it
    vnni_pack: bool = False

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def choose_compute(device_type: str, dtype: str = "auto", quantization: str | None = None, *,
                   weights: str = "hf", ggml_available: Callable[[], bool] | None = None,
                   bf16_is_fast: Callable[[], bool] | None = None,
                   can_prepack: Callable[[], bool] | None = None) -> ComputeChoice:
    """`weights`: "gguf" or "hf" (the checkpoint's format). `ggml_available` says whether ggml's kernels are
    built here (native/ggml.py); `bf16_is_fast` and `can_prepack` are the torch-side probes (platforms
    passes them); without them the rule goes by the CPU flags alone."""
    if dtype == "auto":
        if device_type == "cuda":
            dtype = "bfloat16"
        else:
            fast = cpu_has_native_bf16() and (bf16_is_fast() if bf16_is_fast is not None else True)
            dtype = "bfloat16" if fast else "float32"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    if quantization is not None and quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization {quantization!r} is not supported (supported: "
                         f"{', '.join(QUANTIZATION_CHOICES)})")
    has_ggml = ggml_available() if ggml_available is not None else False
    if quantization in REQUANT_TYPES:
        if device_type == "cuda":
            raise ValueError(f"quantization {quantization} runs on ggml's CPU kernels; use it with --device cpu")
        if not has_ggml:
            raise ValueError(f"quantization {quantization} needs ggml's kernels, which are not built here "
                             "(run `python -m tokenmill.native.build`; it needs cmake and g++)")
        return ComputeChoice(dtype, "gguf", quantization)
    if quantization is None and weights == "gguf" and device_type == "cpu" and has_ggml:
        return ComputeChoice(dtype, "gguf")
    if quantization == "int8":
        if device_type == "cuda":
            raise ValueError("quantization int8 is a CPU mode (torch's int8 weight-only CPU kernel); "
                             "use it with --device cpu")
        return ComputeChoice(dtype, "int8")
    if device_type == "cpu" and dtype == "bfloat16":
        packable = can_prepack() if can_prepack is not None else cpu_has_native_bf16()
        if packable:
            return ComputeChoice(dtype, "prepacked")
    return ComputeChoice(dtype, "unquantized")


# --max-num-batched-tokens when not given: the tokens one step may schedule (prefill chunks + decodes)
TOKEN_BUDGET = 512
# ... where a step's big matmuls run on oneDNN's bf16 tiles: bf16 on a CPU with AMX, with the gguf method's
# dense copy or prepacked weights (not for the gguf blocks alone, as a 7B file has: unmeasured). There, on the
# default model at C=64 (200 in / 64 out, served, 2-core AMX Xeon, 2026-12-05), 512 / 1024 / 2048 gave 545 / 582 / 664
# output tok/s (and 560 / 547 against 636 / 619 in two alternating pairs), at C=16 474 / 473 / 479 with TTFT
# p50 0.35 / 0.54 / 0.61 s. vLLM's CPU server schedules 2048 too. On AVX2 CPUs (fp32) 2048 gained nothing and
# doubled TTFT (2026-12-04), so they keep 512 (benchmarks/README.md, "The AMX Xeon again"); so do CPUs with
# AVX512_BF16 and no AMX (Zen 4: bf16 on the copy, 1024 served 0.97-1.0x at C=16 / 64 with twice the TTFT,
# 2026-12-06, benchmarks/README.md "Where C=64 and a verification row still go on Zen 4").
AMX_TOKEN_BUDGET = 2048


def default_token_budget(device_type: str, compute: ComputeChoice) -> int:
    """The step's token budget when --max-num-batched-tokens is not given, for `compute` with its dense copy
    decided. CUDA keeps TOKEN_BUDGET (not measured there yet)."""
    onednn_bf16 = compute.dense_copy or compute.linear_method == "prepacked"
    if device_type == "cpu" and compute.dtype == "bfloat16" and onednn_bf16 and cpu_has_amx_bf16():
        return AMX_TOKEN_BUDGET
    return TOKEN_BUDGET


DENSE_COPY_CHOICES = ("auto", "on", "off")
DENSE_COPY_RAM_SHARE = 8  # auto keeps the dense copy only where it takes at most 1/8 of the machine's RAM


# the GGUF types the 8-bit VNNI panel kernel multiplies (native/vnni_matmul.cpp), as gguf.py names them
INT8_PANEL_TYPES = frozenset({"q4_0", "q4_1", "q8_0"})


def int8_panel_covers(matrices: list[Matrix] | None, kernel_here: bool) -> bool:
    """The 8-bit VNNI panel kernel (`kernel_here`: built and running on this CPU, which has no AMX) takes
    every matrix of a GGUF file (`matrices`: (rows, row length, type name)) past the block kernels'
    crossover, so the dense copy has no batch left to take."""
    return kernel_here and bool(matrices) and all(m.type in INT8_PANEL_TYPES for m in matrices or ())


def choose_dense_copy(setting: str, compute: ComputeChoice, copy_bytes: int, ram_bytes: int,
                      packable: bool, int8_panel: bool = False) -> ComputeChoice:
    """`compute` with dense_copy decided (`--dense-copy`). Only the gguf method has one. Its blocks are
    the fastest at a few rows (they are fewer bytes to read); past the crossover that `calibrate` measures,
    the block kernels do integer work per row while a dense matmul does it on the matrix units. On a CPU
    with AMX, oneDNN's prepacked bf16 matmul ran the default model's C=16 / C=64 serving at 1.6x the
    blocks' dequantize-a-tile path (benchmarks/README.md, "AMX"). auto: on where that holds (bf16 compute
    that oneDNN can prepack) and the copy (`copy_bytes`, memory_plan.dense_copy_bytes) takes at most
    1/DENSE_COPY_RAM_SHARE of `ram_bytes`, so a model that must load in its own size still does; on: at
    any dtype (fp32: a plain copy for F.linear), ValueError without the gguf method; off: never. auto is also
    off where the 8-bit VNNI panel kernel, asked for (TOKENMILL_VNNI_MATMUL=1), takes every matrix
    (`int8_panel`, int8_panel_covers): on a 2-core
    Zen 4 it ran the default model's layers at 1.3-1.6x the prepacked bf16 copy from 8 to 512 rows (the
    (576, 1536) ones 0.9-1.2x) and its C=16 / C=64 serving 1.3x / 1.2x faster (benchmarks/README.md,
    "8-bit VNNI panels"), without the copy's 256 MiB."""
    if setting not in DENSE_COPY_CHOICES:
        raise ValueError(f"dense_copy must be one of {', '.join(DENSE_COPY_CHOICES)}, got {setting!r}")
    if setting == "off":
        return compute
    if compute.linear_method != "gguf":
        if setting == "on":
            raise ValueError(f"dense_copy on is for GGUF blocks on CPU (the gguf linear method); here the "
                             f"method is {compute.linear_method}, whose weights are dense already")
        return compute
    if setting == "auto" and (int8_panel or not (compute.dtype == "bfloat16" and packable
                                                 and copy_bytes * DENSE_COPY_RAM_SHARE <= ram_bytes)):
        return compute
    return dataclasses.replace(compute, dense_copy=True)


VNNI_PACK_SWITCH = "TOKENMILL_VNNI_PACK"  # =0: the blocks stay plain (A/B runs)
# Bytes of one piece of the 16-bit VNNI kernel's packed layout (native/vnni_matmul.cpp, tm_vnni_packed_bytes):
# 16 rows' blocks of 32 values. Q4_1's and Q5_1's pieces are their 16 blocks' bytes exactly (16 x 20, 16 x 24);
# Q4_0 and IQ4_NL take 320 for 16 x 18 (+11%), Q5_0 384 for 16 x 22 (+9%), Q8_0 576 for 16 x 34 (+6%).
VNNI_PACKED_PIECE = {"q4_0": 320, "q4_1": 320, "q5_0": 384, "q5_1": 384, "q8_0": 576, "iq4_nl": 320}
# ... of which a mixture of experts' matrices are not packed (the one-call MoE path multiplies them on ggml)
VNNI_PACKED_NOT_EXPERTS = frozenset({"q5_0", "q5_1", "iq4_nl"})
VNNI_PACK_ROWS = 16


def vnni_packs(bf16: bool, vnni_bits: int) -> bool:
    """The gguf method repacks the Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL blocks of the decoder and the output
    layer (not an untied embedding's) for the 16-bit VNNI kernel: at bf16 compute (`bf16`) where the bf16 panel
    here is that kernel (`vnni_bits` 16: native/block_matmul.vnni_bits), with the dense copy or without it (the
    packed blocks then take every batch), unless TOKENMILL_VNNI_PACK=0. The platform decides it
    (compute.vnni_pack, which the method is given) and `tokenmill plan` asks the same."""
    return bf16 and vnni_bits == 16 and os.environ.get(VNNI_PACK_SWITCH) != "0"


def vnni_packed_bytes(out_features: int, in_features: int, stored_type: str) -> int | None:
    """Bytes of an (out, in) matrix of `stored_type` in the 16-bit VNNI kernel's packed layout (whole 16-row
    groups), or None for a type it does not take."""
    piece = VNNI_PACKED_PIECE.get(stored_type)
    if piece is None or in_features % 32:
        return None
    return -(-out_features // VNNI_PACK_ROWS) * (in_features // 32) * piece


def linear_weight_bytes(method: str, out_features: int, in_features: int, dtype_bytes: int) -> int:
    """Bytes one (out, in) matmul weight takes under `method` (layers/linear.py's methods report this)."""
    if method == "int8":
        return out_features * in_features + out_features * 2  # int8 values + one bf16 scale per row
    if method in ("unquantized", "prepacked"):
        return out_features * in_features * dtype_bytes
    raise ValueError(f"unknown linear method {method!r}")


def quantized_row_bytes(type_name: str, in_features: int) -> int:
    """Bytes of one row of `in_features` values in a ggml type (e.g. "q4_k"); ValueError if the row is not
    a whole number of the type's blocks. Torch-free (gguf's table)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[type_name.upper()]
    block, type_size = GGML_QUANT_SIZES[qtype]
    if in_features % block:
        raise ValueError(f"rows of {in_features} are not a multiple of the {type_name} block ({block})")
    return in_features // block * type_size


def requant_type_for(type_name: str, in_features: int) -> str:
    """The type a row of `in_features` is requantized to: `type_name`, or q8_0 where the row is not a whole
    number of its blocks (K-quants need multiples of 256; llama.cpp falls back the same way)."""
    for t in (type_name, "q8_0"):
        try:
            quantized_row_bytes(t, in_features)
            return t
        except ValueError:
            continue
    return "f16"


def held_type(stored_type: str, requant_type: str | None, in_features: int) -> str:
    """The type the gguf method holds a checkpoint matrix of `stored_type` at: its own without a requant type;
    with one, that type (requant_type_for), whatever the file stored. A matrix the file already quantized to
    another type is requantized from its dequantized values, as llama-quantize --allow-requantize does: its
    error is at least the larger of the two types' (the loader logs it)."""
    return stored_type if requant_type is None else requant_type_for(requant_type, in_features)


def stored_matrix_bytes(method: str, out_features: int, in_features: int, stored_type: str,
                        requant_type: str | None) -> int:
    """Bytes a checkpoint matrix (embedding or matmul weight) of `stored_type` takes under the gguf method:
    its own blocks, or requantized when a requant type is asked for (held_type)."""
    assert method == "gguf"
    return out_features * quantized_row_bytes(held_type(stored_type, requant_type, in_features), in_features)


UNQUANTIZED_TYPES = ("f32", "f16", "bf16")
