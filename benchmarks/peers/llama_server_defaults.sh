# Sourced by compare.sh and big_model.sh: llama-server at its best. Its repacked weight layouts stay on; on
# an AMX Xeon its AMX kernels segfault at the first decode (Q4_1 and Q4_K_M files, 2026-12-03 and -05), so
# there it is built without them (NO_AMX=1, build_llama_server.sh), which keeps the AVX-512 repacked layouts;
# an AMX build (NO_AMX=0) needs --no-repack, which also drops those layouts. LLAMA_SERVER_ARGS overrides.
# TOKENMILL_NATIVE_ISA=avx2: every server measured as on an AVX2-only CPU (llama-server's avx2 build, which has no
# AMX kernels; tokenmill's kernels and ggml built for AVX2; torch's ATen and oneDNN held to AVX2 too).
if [[ "${TOKENMILL_NATIVE_ISA:-native}" == avx2 ]]; then
    export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
elif grep -qw amx_tile /proc/cpuinfo; then
    export NO_AMX="${NO_AMX-1}"
    [[ "$NO_AMX" == 1 ]] || LLAMA_SERVER_ARGS="${LLAMA_SERVER_ARGS---no-repack}"
fi
LLAMA_SERVER_ARGS="${LLAMA_SERVER_ARGS-}"
