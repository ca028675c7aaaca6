#!/usr/bin/env bash
# issue 10 on the AVX2 code, measured on an AVX-512/AMX host (2026-12-06): every server built for x86-64-v3
# (TOKENMILL_NATIVE_ISA=avx2: tokenmill's kernels and ggml; llama-server from build_llama_server.sh with the
# same variable; torch's ATen and oneDNN held to AVX2 by peers/llama_server_defaults.sh), tokenmill at fp32 as
# on an AVX2-only CPU. From the repository root: bash benchmarks/results/2026-12-06-avx2proxy/run.sh MODE
# vLLM (serve mode) runs its matmuls through oneDNN, held to AVX2; its own C++ kernels keep the ISA its wheel
# was built for. big-model-before/ is `big` at 0879723 (before f16c74a); big-model/ at f16c74a.
set -euo pipefail
R=benchmarks/results/2026-12-06-avx2proxy
if [[ "${1:-}" == native-big ]]; then  # the same file on this host's own code (AMX, bf16), beside llama-server NO_AMX
    LOAD_C=0 RESULTS_DIR=benchmarks/results/2026-12-06-amx3/big-model exec benchmarks/big_model.sh
fi
if [[ "${1:-}" == f16-ab ]]; then  # f16c74a's A/B: /tmp/kq_old, /tmp/kq_new hold the four sources before / after
    for isa in avx2 native; do for pair in "kq_old kq_new" "kq_new kq_old"; do set -- $pair
        TOKENMILL_NATIVE_ISA=$isa ROWS=1,2,4,8 .venv/bin/python benchmarks/experiments/kquant_ab.py /tmp/$1 /tmp/$2
    done; done; exit
fi
if [[ "${1:-}" == q6k-ab ]]; then  # the Q6_K byte unpack: /tmp/kq_new = f16c74a's sources, /tmp/kq_new2 the next commit's
    for pair in "kq_new kq_new2" "kq_new2 kq_new"; do set -- $pair
        TOKENMILL_NATIVE_ISA=avx2 TYPES=14 ROWS=1,2,4,8 .venv/bin/python benchmarks/experiments/kquant_ab.py /tmp/$1 /tmp/$2
    done; exit
fi
if [[ "${1:-}" == q6k512-ab ]]; then  # the same for the AVX-512 loop: /tmp/kq_new2 = b89fad8's sources, /tmp/kq_new3 the next
    for pair in "kq_new2 kq_new3" "kq_new3 kq_new2"; do set -- $pair
        TYPES=14 ROWS=1,2,4,8 .venv/bin/python benchmarks/experiments/kquant_ab.py /tmp/$1 /tmp/$2
    done; exit
fi
export TOKENMILL_NATIVE_ISA=avx2
case "${1:?mode: big | c1 | serve | native-big | f16-ab}" in
    big) TOKENMILL_ARGS="--dtype float32" LOAD_C=0 RESULTS_DIR=$R/big-model${2:+-$2} benchmarks/big_model.sh ;;
    c1) TOKENMILL_ARGS="--dtype float32" PEERS="llama-server" LEVELS=1 RESULTS_DIR=$R/c1${2:+-$2} benchmarks/compare.sh ;;
    kernels) .venv/bin/python benchmarks/experiments/kquant_vs_ggml.py 2 ;;  # kquant_vs_ggml_avx2.txt
    serve) TOKENMILL_ARGS="--dtype float32" PEERS="vllm" LEVELS=16,64 RESULTS_DIR=$R/serve${2:+-$2} benchmarks/compare.sh ;;
esac
