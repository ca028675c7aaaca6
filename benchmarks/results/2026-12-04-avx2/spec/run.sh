#!/usr/bin/env bash
# Issue 15 on the AVX2-only kind (2026-12-04 late evening, Zen 3, fp32): n-gram on the grounded workload at
# C=1, twice. Run from the repository root: bash benchmarks/results/2026-12-04-avx2/spec/run.sh
set -u
D=benchmarks/results/2026-12-04-avx2/spec
lscpu > $D/lscpu.txt
spec() { name=$1; shift; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
         timeout 1200 .venv/bin/tokenmill bench spec "$@" --result-json "$D/$name.json" > /dev/null 2>> $D/stderr.log; }
G="--workload grounded --concurrency 1 --repeats 4 --output-len 128"
spec grounded-1 $G --speculative-config '{"method": "ngram"}'
spec grounded-2 $G --speculative-config '{"method": "ngram"}'
echo "== end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
