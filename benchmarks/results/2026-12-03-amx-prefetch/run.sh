#!/usr/bin/env bash
# Issue 10 on an AMX Xeon (2026-12-03 afternoon): the AMX block kernel with software prefetch of its 16
# weight-row streams (this commit) against the kernel before (OLD, a checkout of d29a6a6; the library is
# built from each checkout's own source), offline, alternating old/new: `tokenmill bench throughput`,
# 200 random tokens in, 64 out, at C=16 and C=64 (all prompts at once); then the grounded speculation
# pass (C=1) on the new kernel.
# Run from the repository root: OLD=/path/to/old/checkout bash benchmarks/results/2026-12-03-amx-prefetch/run.sh
set -u
D=benchmarks/results/2026-12-03-amx-prefetch
PY=$PWD/.venv/bin/python
lscpu > $D/lscpu.txt
run() { name=$1; src=$2; shift 2; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
        (cd "$src" && PYTHONPATH="$src" timeout 1200 "$PY" -m tokenmill.cli bench "$@" \
            --result-json "$OLDPWD/$D/$name.json" > /dev/null 2>&1); }
for i in 1 2; do
    for c in 16 64; do
        run old-c$c-$i "$OLD" throughput --input-len 200 --output-len 64 --num-prompts $c --max-num-seqs $c
        run new-c$c-$i "$PWD" throughput --input-len 200 --output-len 64 --num-prompts $c --max-num-seqs $c
    done
done
run new-spec-grounded "$PWD" spec --workload grounded --concurrency 1 --repeats 4 --output-len 128 \
    --speculative-config '{"method": "ngram"}'
# Then (abba-c16.txt): the C=16 pass six more times per kernel, alternating new/old, old/new, ..., since
# the first passes above showed whichever ran second in a pair as the slower one:
#   for i in 1..6: (order by i) cd <checkout> && PYTHONPATH=<checkout> .venv/bin/python -m tokenmill.cli bench
#       throughput --input-len 200 --output-len 64 --num-prompts 16 --max-num-seqs 16
# Kernel alone (kernel-ab.txt): /tmp/ab_amx.py's loop, kept as benchmarks/experiments/amx_ab.py:
#   .venv/bin/python benchmarks/experiments/amx_ab.py OLD_LIB.so NEW_LIB.so   (T=threads, L=layers)
# Serving, at the final code of the stop (compare/, compare-2/, compare-3/: three rounds back to back):
#   for d in compare compare-2 compare-3; do
#       PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=benchmarks/results/2026-12-03-amx-prefetch/$d benchmarks/compare.sh
#   done
