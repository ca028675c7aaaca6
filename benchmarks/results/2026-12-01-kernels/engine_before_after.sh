#!/usr/bin/env bash
# Engine-level before/after of the native kernels, paired: `tokenmill bench latency` (one request, 200 prompt
# tokens -> 128, greedy) and `tokenmill bench throughput` (64 x 200 -> 64, offline), before and after
# interleaved per round, at 1 and 2 threads (latency) and 2 threads (throughput).
#   BEFORE=/path/to/checkout/of/a4c7fc2 AFTER=/path/to/native-kernels OUT=dir ROUNDS=5 ./engine_before_after.sh
set -u
PY=${PYTHON:-/work/main/.venv/bin/python}
BEFORE=${BEFORE:?set BEFORE to the old checkout}
AFTER=${AFTER:?set AFTER to the new checkout}
OUT=${OUT:-.}
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT"
lscpu | grep -E "Model name|^CPU\(s\)" > "$OUT/lscpu.txt"
for f in avx2 avx512f amx_bf16; do grep -qw "$f" /proc/cpuinfo && echo "flag $f: yes" || echo "flag $f: no"; done >> "$OUT/lscpu.txt"
uptime > "$OUT/load.txt"
run() {  # run SIDE THREADS NAME bench args...
  local side=$1 threads=$2 name=$3; shift 3
  local tree; tree=$([[ $side == before ]] && echo "$BEFORE" || echo "$AFTER")
  (cd "$tree" && PYTHONPATH="$tree" OMP_NUM_THREADS=$threads "$PY" -m tokenmill.cli bench "$@" --num-threads "$threads" \
     --result-json "$OUT/$name.json" > /dev/null 2> "$OUT/$name.log")
}
for round in $(seq 1 "$ROUNDS"); do
  for threads in 1 2; do
    for side in before after; do
      run $side $threads "latency-$side-t$threads-$round" latency --input-len 200 --output-len 128
    done
  done
done
for round in 1 2; do
  for side in before after; do
    run $side 2 "throughput-$side-t2-$round" throughput --num-prompts 64 --input-len 200 --output-len 64
  done
done
uptime >> "$OUT/load.txt"
"$PY" - "$OUT" <<'PYEOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = []
def vals(kind, side, t, key):
    return [json.load(open(p))[kind][key] for p in sorted(glob.glob(f"{out}/{kind}-{side}-t{t}-*.json"))]
lines = ["| bench | threads | metric | before (median, runs) | after (median, runs) | after/before (medians) |",
         "|---|---|---|---|---|---|"]
for kind, t, key in (("latency", 1, "decode_tok_per_s"), ("latency", 2, "decode_tok_per_s"),
                     ("latency", 1, "prefill_tok_per_s"), ("latency", 2, "prefill_tok_per_s"),
                     ("throughput", 2, "output_tok_per_s")):
    b, a = vals(kind, "before", t, key), vals(kind, "after", t, key)
    if not b or not a:
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    fmt = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
    lines.append(f"| {kind} | {t} | {key} | {mb:.1f} ({fmt(b)}) | {ma:.1f} ({fmt(a)}) | {ma / mb:.3f} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
