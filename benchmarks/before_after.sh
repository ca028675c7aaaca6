#!/usr/bin/env bash
# Before/after speed of a change, on this machine, in one run: the same benchmarks on two checkouts,
# interleaved (before, after, before, after for the offline ones), so load drifts hit both alike.
#
#   BEFORE=/path/to/old/checkout benchmarks/before_after.sh     # AFTER defaults to this checkout
#
# Each checkout runs with its own code (PYTHONPATH) in this checkout's venv. Per checkout:
#   tokenmill bench latency      one request, 200 prompt tokens -> 128 (prefill and decode tok/s)
#   tokenmill bench throughput   64 prompts x 200 -> 64, offline
#   tokenmill bench serve        a sweep at C=1,16,64 against `tokenmill serve` (200 -> 64, random)
# Results: $RESULTS_DIR (default benchmarks/results/<date>-before-after/): JSONs, lscpu, load, summary.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BEFORE="${BEFORE:?set BEFORE to the old checkout}"
AFTER="${AFTER:-$ROOT}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${RESULTS_DIR:-$ROOT/benchmarks/results/$(date +%Y-%m-%d)-before-after}"
LEVELS="${LEVELS:-1,16,64}"
PORT="${PORT:-8331}"
mkdir -p "$OUT"
lscpu | grep -E "Model name|^CPU\(s\)" > "$OUT/lscpu.txt"
for f in avx2 avx512f amx_bf16; do grep -qw "$f" /proc/cpuinfo && echo "flag $f: yes" || echo "flag $f: no"; done >> "$OUT/lscpu.txt"
uptime > "$OUT/load.txt"

cli_of() {  # the CLI module of a checkout (it moved from entrypoints/ to the package top)
  [[ -f "$1/tokenmill/cli.py" ]] && echo tokenmill.cli || echo tokenmill.entrypoints.cli
}
run() {  # run LABEL TREE cmd...
  local label=$1 tree=$2; shift 2
  (cd "$tree" && PYTHONPATH="$tree" "$PY" -m "$(cli_of "$tree")" "$@")
}
for round in 1 2; do
  for side in before after; do
    tree=$([[ $side == before ]] && echo "$BEFORE" || echo "$AFTER")
    run $side "$tree" bench latency --input-len 200 --output-len 128 --result-json "$OUT/latency-$side-$round.json" >/dev/null
    run $side "$tree" bench throughput --num-prompts 64 --input-len 200 --output-len 64 \
      --result-json "$OUT/throughput-$side-$round.json" >/dev/null
  done
done
for side in before after; do
  tree=$([[ $side == before ]] && echo "$BEFORE" || echo "$AFTER")
  (cd "$tree" && PYTHONPATH="$tree" exec "$PY" -m "$(cli_of "$tree")" serve --port "$PORT" \
     --max-model-len 2048 > "$OUT/server-$side.log" 2>&1) &
  srv=$!
  "$PY" -m tokenmill.cli bench serve --base-url "http://127.0.0.1:$PORT" --wait-for-server 300 \
    --label "$side" --random-input-len 200 --random-output-len 64 --sweep "$LEVELS" --prompts-per-concurrency 2 \
    --min-prompts 8 --num-warmups 2 --result-json "$OUT/serve-$side.json" > "$OUT/serve-$side.txt"
  kill -TERM "$srv"; wait "$srv" || true
done
uptime >> "$OUT/load.txt"
"$PY" - "$OUT" <<'PYEOF'
import json, sys, glob, os
out = sys.argv[1]
def load(p): return json.load(open(p))
rows = []
def mean(xs): return sum(xs) / len(xs)
for kind, keys in (("latency", ("prefill_tok_per_s", "decode_tok_per_s")), ("throughput", ("output_tok_per_s",))):
    for key in keys:
        vals = {}
        for side in ("before", "after"):
            recs = [load(p) for p in sorted(glob.glob(f"{out}/{kind}-{side}-*.json"))]
            vals[side] = [r[kind].get(key) for r in recs]
        if None in vals["before"] + vals["after"]:
            rows.append(f"| {kind} | {key} | (missing) | | |"); continue
        b, a = mean(vals["before"]), mean(vals["after"])
        rows.append(f"| {kind} | {key} | {b:.1f} | {a:.1f} | {a / b:.3f} |")
levels = {}
for side in ("before", "after"):
    for p in sorted(glob.glob(f"{out}/serve-{side}-c*.json")):
        r = load(p); c = int(p.rsplit("-c", 1)[1].split(".")[0])
        levels.setdefault(c, {})[side] = r
for c in sorted(levels):
    b, a = levels[c].get("before"), levels[c].get("after")
    if b and a:
        rows.append(f"| serve C={c} | output_throughput | {b['output_throughput']:.1f} | {a['output_throughput']:.1f} | "
                    f"{a['output_throughput'] / b['output_throughput']:.3f} |")
        rows.append(f"| serve C={c} | median_ttft_ms | {b['median_ttft_ms']:.0f} | {a['median_ttft_ms']:.0f} | "
                    f"{b['median_ttft_ms'] / a['median_ttft_ms']:.3f} (before/after) |")
text = "| bench | metric | before | after | after/before |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
open(f"{out}/summary.md", "w").write(text)
print(text)
PYEOF
