"""The one rule for how a model computes: the dtype and the matmul (linear) method, and what each
method's weights cost in bytes. Torch-free, so `tokenmill plan`, `serve` and the engine's memory plan
all ask the same function.

    device  dtype asked  quantization  ->  dtype      linear method
    cuda    auto         -             ->  bfloat16   unquantized
    cpu     auto         -             ->  bfloat16   prepacked      CPU lists AMX (and oneDNN can prepack)
    cpu     auto         -             ->  float32    unquantized    no AMX: bf16 matmul is far slower there
    cpu     any          int8          ->  (as above) int8           weight-only int8, bf16 activations
    any     bfloat16     -             ->  bfloat16   prepacked on CPU when oneDNN can, else unquantized
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tokenmill.cpu_features import cpu_has_amx_bf16

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LINEAR_METHODS = ("unquantized", "prepacked", "int8")


@dataclass(frozen=True)
class ComputeChoice:
    dtype: str  # float32 | bfloat16 | float16: activations, non-matmul weights and the KV cache
    linear_method: str  # one of LINEAR_METHODS

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def choose_compute(device_type: str, dtype: str = "auto", quantization: str | None = None, *,
                   bf16_is_fast: Callable[[], bool] | None = None,
                   can_prepack: Callable[[], bool] | None = None) -> ComputeChoice:
    """`bf16_is_fast` and `can_prepack` are the torch-side probes (platforms passes them); without them
    the rule goes by the CPU flags alone, which is what `tokenmill plan` can know without torch."""
    if dtype == "auto":
        if device_type == "cuda":
            dtype = "bfloat16"
        else:
            fast = cpu_has_amx_bf16() and (bf16_is_fast() if bf16_is_fast is not None else True)
            dtype = "bfloat16" if fast else "float32"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    if quantization == "int8":
        if device_type == "cuda":
            raise ValueError("quantization int8 is a CPU mode (torch's int8 weight-only CPU kernel); "
                             "use it with --device cpu")
        return ComputeChoice(dtype, "int8")
    if quantization is not None:
        raise ValueError(f"quantization {quantization!r} is not supported (supported: int8)")
    if device_type == "cpu" and dtype == "bfloat16":
        packable = can_prepack() if can_prepack is not None else cpu_has_amx_bf16()
        if packable:
            return ComputeChoice(dtype, "prepacked")
    return ComputeChoice(dtype, "unquantized")


def linear_weight_bytes(method: str, out_features: int, in_features: int, dtype_bytes: int) -> int:
    """Bytes one (out, in) matmul weight takes under `method` (layers/linear.py's methods report this)."""
    if method == "int8":
        return out_features * in_features + out_features * 2  # int8 values + one bf16 scale per row
    if method in ("unquantized", "prepacked"):
        return out_features * in_features * dtype_bytes
    raise ValueError(f"unknown linear method {method!r}")
