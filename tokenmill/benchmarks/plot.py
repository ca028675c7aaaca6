"""`tokenmill bench plot results/*.json -o out.png`: serving results of several servers on one figure.

Left panel: TTFT p50 (solid) and p99 (dashed) against max concurrency, log-scaled; right panel: output
token throughput against concurrency. One color per server label; a label's records are sorted by
concurrency (records without a concurrency limit are skipped).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def load_records(paths: list[str]) -> list[dict[str, Any]]:
    """Benchmark records from JSON files (each a record or a list of records)."""
    records: list[dict[str, Any]] = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        for rec in data if isinstance(data, list) else [data]:
            if isinstance(rec, dict) and "output_throughput" in rec:
                records.append(rec)
    return records


def by_label(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """label -> records with a concurrency, sorted by it (later files win on duplicates)."""
    groups: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for rec in records:
        c = rec.get("max_concurrency")
        if c:
            groups[str(rec.get("label", "?"))][int(c)] = rec
    return {label: [levels[c] for c in sorted(levels)] for label, levels in groups.items()}


def plot(records: list[dict[str, Any]], out: str | Path, title: str | None = None) -> Path:
    """Draw the figure into `out` (PNG); returns the path."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("tokenmill bench plot needs matplotlib: pip install 'tokenmill[bench]' "
                         "(or pip install matplotlib)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    groups = by_label(records)
    if not groups:
        raise ValueError("no records with a max concurrency to plot")
    fig, (ax_ttft, ax_tput) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, recs) in enumerate(sorted(groups.items())):
        color = colors[i % len(colors)]
        cs = [r["max_concurrency"] for r in recs]
        ax_ttft.plot(cs, [r["median_ttft_ms"] / 1000 for r in recs], "o-", color=color, label=f"{label} p50")
        ax_ttft.plot(cs, [r["p99_ttft_ms"] / 1000 for r in recs], "s--", color=color, alpha=0.6,
                     label=f"{label} p99")
        ax_tput.plot(cs, [r["output_throughput"] for r in recs], "o-", color=color, label=label)
    all_cs = sorted({r["max_concurrency"] for recs in groups.values() for r in recs})
    for ax in (ax_ttft, ax_tput):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_cs, [str(c) for c in all_cs])
        ax.set_xlabel("max concurrency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_ttft.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}")
    ax_ttft.yaxis.set_major_formatter(plain)
    ax_ttft.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2.0, 5.0)))
    ax_ttft.yaxis.set_minor_formatter(plain)
    ax_ttft.set_ylabel("time to first token (s)")
    ax_ttft.set_title("TTFT p50 (solid) and p99 (dashed)")
    ax_tput.set_ylabel("output tokens/s")
    ax_tput.set_title("output token throughput")
    ax_tput.set_ylim(bottom=0)
    first = next(iter(groups.values()))[0]
    ds = first.get("dataset", {})
    fig.suptitle(title or f"{first.get('model', '')}: {ds.get('name', '')} {ds.get('input_len', '')} in / "
                          f"{ds.get('output_len', '')} out, {first.get('endpoint', '')}, "
                          f"{first.get('machine', {}).get('num_cpus', '?')} CPUs, {first.get('date', '')[:10]}")
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="JSON files written by `tokenmill bench serve`")
    p.add_argument("-o", "--output", default="bench.png", help="PNG to write")
    p.add_argument("--title", default=None)


def cmd_bench_plot(args: argparse.Namespace) -> int:
    print(plot(load_records(args.results), args.output, args.title))
    return 0
