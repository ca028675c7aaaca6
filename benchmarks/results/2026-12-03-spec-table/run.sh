#!/usr/bin/env bash
# Issue 15 on an AMX Xeon (2026-12-03 afternoon): the rule with the window check on what drafting gave
# and the proposer's time counted in each step (this commit) against the rule before (OLD, a checkout of
# d29a6a6), alternating in one run; then k = 8, and the random workload (the rule's other side).
# The variant-table-*.json files (its old runs: variant-table-old-*.json) and load-variant-table.txt come
# from the same script run on an earlier, uncommitted version of this change (draft lengths from a per-size table of step times that tried sizes
# it had not seen; benchmarks/README.md says why it was dropped).
# Run from the repository root: OLD=/path/to/old/checkout bash benchmarks/results/2026-12-03-spec-table/run.sh
set -u
D=benchmarks/results/2026-12-03-spec-table
PY=$PWD/.venv/bin/python
lscpu > $D/lscpu.txt
spec() { name=$1; src=$2; shift 2; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
         (cd "$src" && PYTHONPATH="$src" timeout 1200 "$PY" -m tokenmill.cli bench spec "$@" \
             --result-json "$OLDPWD/$D/$name.json" > /dev/null); }
G="--workload grounded --concurrency 1 --repeats 4 --output-len 128"
for i in 1 2; do
    spec old-grounded-$i "$OLD" $G --speculative-config '{"method": "ngram"}'
    spec new-grounded-$i "$PWD" $G --speculative-config '{"method": "ngram"}'
done
spec new-grounded-k8 "$PWD" $G --speculative-config '{"method": "ngram", "num_speculative_tokens": 8}'
spec new-random-c1 "$PWD" --workload random --concurrency 1 --repeats 4 --output-len 64
spec new-random-c16 "$PWD" --workload random --concurrency 16 --repeats 4 --output-len 64
