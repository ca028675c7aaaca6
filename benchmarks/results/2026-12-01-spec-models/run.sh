#!/usr/bin/env bash
# Speculative decoding's methods side by side, one process per measurement (off and on alternate inside it).
# Run from the repository root: bash benchmarks/results/2026-12-01-spec-models/run.sh
set -u
D=benchmarks/results/2026-12-01-spec-models
TM=.venv/bin/tokenmill
M=$(.venv/bin/python -c "from tokenmill.loader.model_source import default_model_path as d; print(d())")
{ lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "avx2|avx512f|amx_bf16" /proc/cpuinfo | sort | uniq -c; } > $D/lscpu.txt
run() { name=$1; shift; echo "== $name $(date +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
        timeout 1200 $TM bench spec "$@" --result-json $D/$name.json > /dev/null 2>> $D/stderr.txt
        echo "   done $(date +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt; }
run ngram-c1-grounded --workload grounded --concurrency 1 --repeats 4 --output-len 128
run ngram-fp32-c1-grounded --workload grounded --concurrency 1 --repeats 4 --output-len 128 \
    --quantization dequantize --dtype float32
run draft-q4-for-fp32-c1-grounded --workload grounded --concurrency 1 --repeats 4 --output-len 128 \
    --quantization dequantize --dtype float32 \
    --speculative-config "{\"method\": \"draft_model\", \"model\": \"$M\", \"quantization\": \"auto\"}"
run layer-skip-8-c1-grounded --workload grounded --concurrency 1 --repeats 2 --output-len 128 \
    --speculative-config '{"method": "layer_skip", "num_draft_layers": 8}'
run layer-skip-8-always-c1-grounded --workload grounded --concurrency 1 --repeats 2 --output-len 128 \
    --speculative-config '{"method": "layer_skip", "num_draft_layers": 8, "min_acceptance_rate": 0.0}'
run ngram-c1-random --workload random --concurrency 1 --repeats 4 --output-len 64
run ngram-c16-random --workload random --concurrency 16 --repeats 4 --output-len 64
run draft-q4-for-fp32-c16-random --workload random --concurrency 16 --repeats 4 --output-len 64 \
    --quantization dequantize --dtype float32 \
    --speculative-config "{\"method\": \"draft_model\", \"model\": \"$M\", \"quantization\": \"auto\"}"
run layer-skip-8-c16-random --workload random --concurrency 16 --repeats 4 --output-len 64 \
    --speculative-config '{"method": "layer_skip", "num_draft_layers": 8}'
