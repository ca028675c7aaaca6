"""What the host CPU computes fast, read from /proc/cpuinfo (no torch, so `tokenmill plan` can use it).

The compute dtype on CPU hinges on one fact: whether oneDNN has native bf16 arithmetic here.
- AMX (Intel Sapphire Rapids and later): bf16 matmuls on tile units, measured at 5-7x fp32 for batches of
  64-512 rows and equal at one row (benchmarks/README.md, "bf16 on AMX").
- AVX512_BF16 without AMX (AMD Zen 4 and later, Intel Cooper Lake): `vdpbf16ps`, oneDNN's
  avx512_core_bf16 kernels; measured on a 2-core Zen 4 EPYC at 2.1-3.3x fp32 for 16-512 rows on the default
  model's layer shapes with prepacked weights, and the engine's offline throughput 2.1x (benchmarks/README.md,
  "bf16 on AVX512_BF16").
- Neither (AVX2-only CPUs such as Zen 3): bf16 matmul falls back to slow paths (~300x slower than fp32), so
  such CPUs compute in fp32.
"""

from __future__ import annotations

import functools

@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_has_amx_bf16() -> bool:
    return {"amx_bf16", "amx_tile"} <= cpu_flags()


def cpu_has_native_bf16() -> bool:
    """oneDNN multiplies bf16 natively here: AMX tiles, or AVX-512's bf16 dot product (`avx512_bf16`)."""
    return cpu_has_amx_bf16() or cpu_has_avx512_bf16()


def cpu_has_avx512_vnni() -> bool:
    """AVX-512's 8-bit dot product (`vpdpbusd`), with the byte and word forms native/vnni_matmul.cpp uses."""
    return {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_flags()


def cpu_has_avx512_bf16() -> bool:
    return {"avx512f", "avx512_bf16"} <= cpu_flags()


def bf16_reason() -> str:
    """Why `--dtype auto` is what it is on this CPU, in a few words (for `tokenmill plan`)."""
    if cpu_has_amx_bf16():
        return "this CPU has AMX"
    if cpu_has_avx512_bf16():
        return "this CPU has AVX512_BF16"
    return "no AMX or AVX512_BF16 here, where bf16 matmul is far slower than fp32"


def auto_dtype(device_type: str) -> str:
    """What `--dtype auto` means here, by the CPU flags alone (the rule is compute.choose_compute)."""
    from tokenmill.compute import choose_compute

    return choose_compute(device_type).dtype
