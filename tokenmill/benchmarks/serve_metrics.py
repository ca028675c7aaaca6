"""Aggregate per-request timings into the serving benchmark's metrics (vLLM's definitions).

- Throughput: completed requests, output tokens and input+output tokens per second of benchmark wall
  time (first send to last completion).
- TTFT, TPOT, E2EL: one value per successful request; ITL: every inter-chunk gap of every request.
  Each reported as mean, median, p90 and p99, in milliseconds.
- Goodput: successful requests per second that meet every SLO given (`ttft`, `tpot`, `e2el`, in ms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # client.py imports httpx, which only `bench serve` needs at run time
    from tokenmill.benchmarks.client import RequestResult

SLO_KEYS = ("ttft", "tpot", "e2el")
PERCENTILES = (50, 90, 99)


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:100"]` -> {"ttft": 500.0, "tpot": 100.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or ():
        key, sep, value = item.partition(":")
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--goodput takes KEY:MS with KEY in {', '.join(SLO_KEYS)}; got {item!r}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if slos[key] <= 0:
            raise ValueError(f"--goodput {item!r}: the SLO must be positive")
    return slos


@dataclass(frozen=True)
class Distribution:
    """Summary of one latency metric in milliseconds."""

    mean: float
    median: float
    p90: float
    p99: float
    std: float

    @classmethod
    def of(cls, seconds: list[float]) -> Distribution:
        if not seconds:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0)
        ms = np.asarray(seconds, dtype=np.float64) * 1000.0
        p50, p90, p99 = np.percentile(ms, PERCENTILES)
        return cls(float(ms.mean()), float(p50), float(p90), float(p99), float(ms.std()))


def meets_slos(r: RequestResult, slos: dict[str, float]) -> bool:
    """Whether a successful request is within every SLO (ms); a missing TPOT (one token) passes."""
    if "ttft" in slos and r.ttft * 1000 > slos["ttft"]:
        return False
    tpot = r.tpot
    if "tpot" in slos and tpot is not None and tpot * 1000 > slos["tpot"]:
        return False
    return not ("e2el" in slos and r.e2el * 1000 > slos["e2el"])


def summarize(results: list[RequestResult], duration_s: float, slos: dict[str, float]) -> dict[str, Any]:
    """The metrics dict of one benchmark run (the core of its JSON record)."""
    ok = [r for r in results if r.success]
    num_in = sum(r.prompt_len for r in ok)
    num_out = sum(r.output_len for r in ok)
    dur = max(duration_s, 1e-9)
    out: dict[str, Any] = {
        "duration_s": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": num_in,
        "total_output_tokens": num_out,
        "mean_input_len": num_in / len(ok) if ok else 0.0,
        "mean_output_len": num_out / len(ok) if ok else 0.0,
        "request_throughput": len(ok) / dur,
        "output_throughput": num_out / dur,
        "total_token_throughput": (num_in + num_out) / dur,
    }
    if slos:
        good = sum(1 for r in ok if meets_slos(r, slos))
        out["goodput_slos_ms"] = slos
        out["goodput_requests"] = good
        out["request_goodput"] = good / dur
    dists = {
        "ttft": Distribution.of([r.ttft for r in ok]),
        "tpot": Distribution.of([t for r in ok if (t := r.tpot) is not None]),
        "itl": Distribution.of([g for r in ok for g in r.itl]),
        "e2el": Distribution.of([r.e2el for r in ok]),
    }
    for name, d in dists.items():
        out[f"mean_{name}_ms"] = d.mean
        out[f"median_{name}_ms"] = d.median
        out[f"p90_{name}_ms"] = d.p90
        out[f"p99_{name}_ms"] = d.p99
        out[f"std_{name}_ms"] = d.std
    errors = sorted({r.error for r in results if not r.success})
    if errors:
        out["errors"] = errors[:10]
    return out


def format_summary(label: str, m: dict[str, Any]) -> str:
    """A human-readable block for one run (printed after each concurrency level)."""
    lines = [
        f"{'=' * 22} {label} {'=' * 22}",
        f"{'Successful requests:':<40}{m['completed']:>12}",
        f"{'Failed requests:':<40}{m['failed']:>12}",
        f"{'Benchmark duration (s):':<40}{m['duration_s']:>12.2f}",
        f"{'Total input tokens:':<40}{m['total_input_tokens']:>12}",
        f"{'Total generated tokens:':<40}{m['total_output_tokens']:>12}",
        f"{'Request throughput (req/s):':<40}{m['request_throughput']:>12.3f}",
        f"{'Output token throughput (tok/s):':<40}{m['output_throughput']:>12.2f}",
        f"{'Total token throughput (tok/s):':<40}{m['total_token_throughput']:>12.2f}",
    ]
    if "request_goodput" in m:
        lines.append(f"{'Request goodput (req/s):':<40}{m['request_goodput']:>12.3f}")
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append(f"{'-' * 14}{title}{'-' * 14}")
        for stat in ("mean", "median", "p90", "p99"):
            lines.append(f"{f'{stat.capitalize()} {name.upper()} (ms):':<40}{m[f'{stat}_{name}_ms']:>12.2f}")
    for e in m.get("errors", []):
        lines.append(f"error: {e}")
    return "\n".join(lines)
