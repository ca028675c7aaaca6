#!/usr/bin/env bash
# Issues 10 and 15 on an AMX Xeon (2026-12-03), after the dense copy and the native attention on AMX:
# the serving comparison twice (tokenmill at --dtype auto = bf16 here, llama-server, vLLM's CPU build at
# bf16, its own choice here; the machine's speed wandered by up to 2x this morning), and the
# speculative-decoding runs, at the code of this stop.
# Run from the repository root: bash benchmarks/results/2026-12-03-amx/run.sh [compare|spec]
set -u
D=benchmarks/results/2026-12-03-amx
TM=.venv/bin/tokenmill
lscpu > $D/lscpu.txt
what=${1:-all}
if [ "$what" = all ] || [ "$what" = compare ]; then
    for r in 1 2; do
        PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/compare-$r benchmarks/compare.sh
    done
fi
spec() { name=$1; shift; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
         timeout 1200 $TM bench spec "$@" --result-json $D/$name.json > /dev/null; }
if [ "$what" = all ] || [ "$what" = spec ]; then
    G="--workload grounded --concurrency 1 --repeats 4 --output-len 128"
    for i in 1 2; do spec ngram-c1-grounded-$i $G --speculative-config '{"method": "ngram"}'; done
    spec ngram-random-c1 --workload random --concurrency 1 --repeats 4 --output-len 64
    spec ngram-random-c16 --workload random --concurrency 16 --repeats 4 --output-len 64
    spec ngram-random-c64 --workload random --concurrency 64 --repeats 2 --output-len 64
    spec layer-skip-8-c1-grounded --workload grounded --concurrency 1 --repeats 2 --output-len 128 \
        --speculative-config '{"method": "layer_skip", "num_draft_layers": 8}'
    .venv/bin/python benchmarks/spec_ceiling.py --json $D/spec-ceiling.json > $D/spec-ceiling.txt
    spec ngram-fp32-c1-grounded --workload grounded --concurrency 1 --repeats 2 --output-len 128 --dtype float32
fi
