#!/usr/bin/env bash
# The native decode step (models/native_decode.py, native/decode_step.cpp), 2026-12-02, measured against the
# layer-by-layer path (TOKENMILL_NATIVE_DECODE=0) in alternating processes, then n-gram speculation on the
# default GGUF with it. Serving comparisons against llama-server and vLLM are compare.sh runs (README.md
# beside this file has their commands). Run from the repository root:
#   bash benchmarks/results/2026-12-02-native-step/run.sh
set -u
D=benchmarks/results/2026-12-02-native-step
TM=.venv/bin/tokenmill
{ lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_bf16" /proc/cpuinfo | sort | uniq -c; } > $D/lscpu.txt
note() { echo "== $1 $(date +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt; }
# engine, one stream, decode tok/s: layer by layer (0) and native (1), alternating
for i in 1 2 3; do
    for n in 0 1; do
        note "latency native=$n #$i"
        TOKENMILL_NATIVE_DECODE=$n timeout 600 $TM bench latency --output-len 128 \
            --result-json $D/latency-native$n-$i.json > /dev/null 2>> $D/stderr.txt
    done
done
spec() { name=$1; shift; note "$name"
         timeout 1200 $TM bench spec "$@" --result-json $D/$name.json > /dev/null 2>> $D/stderr.txt; }
spec ngram-c1-grounded --workload grounded --concurrency 1 --repeats 4 --output-len 128
spec ngram-c1-random --workload random --concurrency 1 --repeats 4 --output-len 64
spec ngram-c16-random --workload random --concurrency 16 --repeats 4 --output-len 64
note "done"
# after the 16-bit block kernel (the same day): the grounded line again, as ngram-c1-grounded-16bit, and
#   PEERS="llama-server" LEVELS=1 RESULTS_DIR=$D/compare-c1-16bit benchmarks/compare.sh
