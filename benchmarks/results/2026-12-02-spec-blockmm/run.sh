#!/usr/bin/env bash
# n-gram speculation on the default GGUF after the block kernel and the thread chooser (2026-12-02), one
# process per measurement (off and on alternate inside it). Run from the repository root:
#   bash benchmarks/results/2026-12-02-spec-blockmm/run.sh
set -u
D=benchmarks/results/2026-12-02-spec-blockmm
TM=.venv/bin/tokenmill
{ lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "avx2|avx512f|amx_bf16" /proc/cpuinfo | sort | uniq -c; } > $D/lscpu.txt
run() { name=$1; shift; echo "== $name $(date +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
        timeout 1200 $TM bench spec "$@" --result-json $D/$name.json > /dev/null 2>> $D/stderr.txt
        echo "   done $(date +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt; }
run ngram-c1-grounded --workload grounded --concurrency 1 --repeats 4 --output-len 128
run ngram-c1-random --workload random --concurrency 1 --repeats 4 --output-len 64
run ngram-c16-random --workload random --concurrency 16 --repeats 4 --output-len 64
run ngram-always-c16-random --workload random --concurrency 16 --repeats 4 --output-len 64 \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "max_batch_size": 64, "min_acceptance_rate": 0.0}'
run ngram-c16-grounded --workload grounded --concurrency 16 --repeats 2 --output-len 128
run ngram-always-c16-grounded --workload grounded --concurrency 16 --repeats 2 --output-len 128 \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "max_batch_size": 64, "min_acceptance_rate": 0.0}'
