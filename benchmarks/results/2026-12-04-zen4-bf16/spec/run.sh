#!/usr/bin/env bash
# Issue 15 on a 2-core AMD Zen 4 EPYC (AVX-512 with avx512_bf16, no AMX), 2026-12-04, at the new default
# (--dtype auto = bf16 there): n-gram on the grounded workload at C=1, then random prompts at C=16 (the rule's
# other side). Run from the repository root: bash benchmarks/results/2026-12-04-zen4-bf16/spec/run.sh
set -u
D=benchmarks/results/2026-12-04-zen4-bf16/spec
lscpu > $D/lscpu.txt
spec() { name=$1; shift; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
         timeout 1200 .venv/bin/tokenmill bench spec "$@" --result-json "$D/$name.json" > /dev/null 2>> $D/stderr.log; }
G="--workload grounded --concurrency 1 --repeats 4 --output-len 128"
spec grounded-1 $G --speculative-config '{"method": "ngram"}'
spec grounded-2 $G --speculative-config '{"method": "ngram"}'
spec random-c16 --workload random --concurrency 16 --repeats 4 --output-len 64
echo "== end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
