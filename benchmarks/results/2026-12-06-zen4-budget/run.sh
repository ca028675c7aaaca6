#!/usr/bin/env bash
# The commands behind benchmarks/results/2026-12-06-zen4-budget/ (issues 10 and 15 on the Zen 4 kind, 2026-12-06,
# night), in the order they ran. All at ecd8592 (the hot path did not change after it this stop).
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-06-zen4-budget
lscpu > $R/lscpu.txt
# where a C=64 decode-only step goes (perf attached after the prompts are done)
mkdir -p /tmp/prof && rm -f /tmp/prof/marker
.venv/bin/python benchmarks/experiments/decode_step_perf.py 64 300 &
while [ ! -f /tmp/prof/marker ]; do sleep 1; done; sleep 2
perf record -g -o /tmp/prof/perf.data -p "$(cat /tmp/prof/marker)" -- sleep 12; wait
perf report -i /tmp/prof/perf.data --no-children --sort dso,symbol --stdio > $R/c64_decode_step_perf.txt
# decode attention variants (each a patched copy of tokenmill/native/kernels.cpp; see decode_attention_experiments.txt)
cp tokenmill/native/kernels.cpp /tmp/prof/k0.cpp
.venv/bin/python benchmarks/experiments/attention_ab.py /tmp/prof/k0.cpp /tmp/prof/k0.cpp 64 232 2
SHARED=1 .venv/bin/python benchmarks/experiments/attention_ab.py /tmp/prof/k0.cpp /tmp/prof/k0.cpp 64 232 2
for R_ in 1 2 4 7; do .venv/bin/python benchmarks/experiments/attention_ab.py /tmp/prof/k0.cpp /tmp/prof/k0.cpp 1 900 2 $R_; done
# verification rows: step costs by rows, the replay ceiling, the grounded workload
.venv/bin/python benchmarks/experiments/spec_step_rows.py summarise_quotes
.venv/bin/python benchmarks/spec_ceiling.py --row-costs 0.02,0.05,0.1,0.15,0.25
.venv/bin/tokenmill bench spec --workload grounded --concurrency 1 --repeats 4 --output-len 128 \
    --speculative-config '{"method": "ngram"}' --result-json $R/spec-grounded.json
# the packed matmul per row
mkdir -p /tmp/prof/vA && cp tokenmill/native/{block_matmul,amx_matmul,panel_matmul,kquant_matmul,vnni_matmul}.cpp /tmp/prof/vA/
.venv/bin/python benchmarks/experiments/block_matmul_builds_ab.py /tmp/prof/vA /tmp/prof/vA ffn_up,ffn_down,attn_q 1,2,4,8,16
# the step's token budget: offline cohorts, then served against vLLM bf16 at 1024 and at the default 512
.venv/bin/python benchmarks/experiments/token_budget_ab.py 64 512 1024 2048 > $R/token_budget_offline.txt
TOKENMILL_ARGS='--max-num-batched-tokens 1024' PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/budget1024 benchmarks/compare.sh
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/budget512 benchmarks/compare.sh
# at 1072210 (the stop's final code; its hot path is ecd8592's): one stream against llama-server, right after CI
PEERS="llama-server" LEVELS=1 RESULTS_DIR=$R/final-c1 benchmarks/compare.sh
