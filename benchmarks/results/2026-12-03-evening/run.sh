#!/usr/bin/env bash
# Issue 15's "random prompts, speculation enabled >= 0.97x of disabled" at C=16 and C=64: more passes of
# the same command (stop 29 had two at C=16: 0.93x and 1.03x, with no drafts proposed in either).
# Run from the repository root: bash benchmarks/results/2026-12-03-evening/run.sh
set -u
D=benchmarks/results/2026-12-03-evening
lscpu > $D/lscpu.txt
spec() { name=$1; shift; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
         timeout 1500 .venv/bin/python -m tokenmill.cli bench spec "$@" --result-json $D/$name.json > /dev/null; }
for i in 1 2 3; do
    spec random-c16-$i --workload random --concurrency 16 --repeats 4 --output-len 64
done
for i in 1 2; do
    spec random-c64-$i --workload random --concurrency 64 --repeats 2 --output-len 64
done
# then, the spread above being that of two identical engines (no drafts at C=16 / 64), longer passes
for i in 1 2; do
    spec random-c16-r8-$i --workload random --concurrency 16 --repeats 8 --output-len 64
    spec random-c64-r4-$i --workload random --concurrency 64 --repeats 4 --output-len 64
done
# serving at the stop's final code, two rounds: for d in compare compare-2; do PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=benchmarks/results/2026-12-03-evening/$d benchmarks/compare.sh; done
