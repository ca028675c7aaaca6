"""What the host CPU computes fast, read from /proc/cpuinfo (no torch, so `tokenmill plan` can use it).

The compute dtype on CPU hinges on one fact: with AMX (Intel Sapphire Rapids and later), oneDNN runs
bf16 matmuls on tile units, measured here at 5-7x fp32 for batches of 64-512 rows and equal at one row
(benchmarks/README.md, "bf16 on AMX"). Without AMX, bf16 matmul falls back to slow paths (~300x slower
than fp32 on an AVX2-only CPU), so such CPUs compute in fp32.
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


def cpu_has_amx_bf16() -> bool:
    return {"amx_bf16", "amx_tile"} <= cpu_flags()


def auto_dtype(device_type: str) -> str:
    """What `--dtype auto` means here, by the CPU flags alone (the rule is compute.choose_compute)."""
    from tokenmill.compute import choose_compute

    return choose_compute(device_type).dtype
