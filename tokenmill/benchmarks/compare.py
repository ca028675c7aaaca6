"""`tokenmill bench compare results/*.json --baseline tokenmill`: ratio tables across servers.

For each concurrency level, the baseline's output tok/s and TTFT p50 next to every peer's, with the ratio
baseline / peer (throughput: > 1 means the baseline is faster; TTFT: < 1 means the baseline answers
sooner). Markdown, so it can go straight into a README.
"""

from __future__ import annotations

import argparse
from typing import Any

from tokenmill.benchmarks.plot import by_label, load_records


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def ratio_table(records: list[dict[str, Any]], baseline: str) -> str:
    """A Markdown table: one row per concurrency level, columns per server plus baseline/peer ratios."""
    groups = by_label(records)
    if baseline not in groups:
        raise ValueError(f"no results labelled {baseline!r}; labels: {', '.join(sorted(groups)) or 'none'}")
    peers = sorted(label for label in groups if label != baseline)
    levels = sorted({r["max_concurrency"] for recs in groups.values() for r in recs})
    at = {label: {r["max_concurrency"]: r for r in recs} for label, recs in groups.items()}

    head = ["C", f"{baseline} out tok/s", f"{baseline} TTFT p50 s"]
    for p in peers:
        head += [f"{p} out tok/s", f"{p} TTFT p50 s", f"tput ratio vs {p}", f"TTFT ratio vs {p}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in levels:
        b = at[baseline].get(c)
        b_tput = b["output_throughput"] if b else None
        b_ttft = b["median_ttft_ms"] / 1000 if b else None
        row = [str(c), _fmt(b_tput, ".1f"), _fmt(b_ttft, ".2f")]
        for p in peers:
            r = at[p].get(c)
            p_tput = r["output_throughput"] if r else None
            p_ttft = r["median_ttft_ms"] / 1000 if r else None
            t_ratio = b_tput / p_tput if b_tput is not None and p_tput else None
            l_ratio = b_ttft / p_ttft if b_ttft is not None and p_ttft else None
            row += [_fmt(p_tput, ".1f"), _fmt(p_ttft, ".2f"), _fmt(t_ratio, ".2f") + ("x" if t_ratio else ""),
                    _fmt(l_ratio, ".2f") + ("x" if l_ratio else "")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _load(rec: dict[str, Any]) -> str:
    """1-minute load average when the level started / ended: on a shared machine, a load well above the
    server's own thread count means something else competed for the cores during the level."""
    m = rec.get("machine", {})
    start, end = m.get("loadavg_at_start"), m.get("loadavg_at_end")
    return f"{start[0]:.1f}/{end[0]:.1f}" if start and end else (f"{start[0]:.1f}/-" if start else "-")


def summary_table(records: list[dict[str, Any]]) -> str:
    """A Markdown table of every server and level: throughput and latency percentiles."""
    head = ["server", "C", "prompts", "failed", "out tok/s", "total tok/s", "TTFT p50 s", "TTFT p99 s",
            "TPOT p50 ms", "ITL p50 ms", "E2EL p50 s", "load 1m start/end"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, recs in sorted(by_label(records).items()):
        for r in recs:
            lines.append("| " + " | ".join([
                label, str(r["max_concurrency"]), str(r["num_prompts"]), str(r["failed"]),
                f"{r['output_throughput']:.1f}", f"{r['total_token_throughput']:.1f}",
                f"{r['median_ttft_ms'] / 1000:.2f}", f"{r['p99_ttft_ms'] / 1000:.2f}",
                f"{r['median_tpot_ms']:.1f}", f"{r['median_itl_ms']:.1f}", f"{r['median_e2el_ms'] / 1000:.2f}",
                _load(r),
            ]) + " |")
    return "\n".join(lines)


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="JSON files written by `tokenmill bench serve`")
    p.add_argument("--baseline", default="tokenmill", help="the label the ratios are taken against")


def cmd_bench_compare(args: argparse.Namespace) -> int:
    records = load_records(args.results)
    print(summary_table(records))
    print()
    if args.baseline in by_label(records):
        print(ratio_table(records, args.baseline))
    else:
        print(f"(no {args.baseline!r} results: no ratio table)")
    return 0
