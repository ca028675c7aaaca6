#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the sources vendored in the PyPI sdist of llama-cpp-python.
#
#   benchmarks/peers/build_llama_server.sh            # prints the binary's path on its last line
#
# The binary is cached in $TOKENMILL_CACHE/llama-server/ (default ~/.cache/tokenmill); a second call
# only prints the path. ~15-25 minutes on 2 cores, so it runs under `nice`. Knobs (env):
#   LLAMA_CPP_PYTHON_VERSION  sdist version (default 0.3.36)
#   JOBS                      parallel compile jobs (default: number of cores)
#   PYTHON                    interpreter whose pip downloads the sdist (default: python3)
#   NO_AMX=1                  build without ggml's AMX kernels (GCC's -mno-amx-*), into llama-server-noamx/:
#                             on an AMX Xeon this build runs with its repacked layouts (Q4_0 / Q4_K / IQ4_NL
#                             interleaved tiles on AVX-512) instead of --no-repack, so it is the stronger peer there
#   TOKENMILL_NATIVE_ISA=avx2 build for an AVX2-only CPU (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX), into
#                             llama-server-avx2/: with tokenmill's kernels built the same way (the same variable,
#                             tokenmill/native/compile.py) the two AVX2 code paths meet on an AVX-512 host
# Known issue: with GGML_NATIVE on an AMX-capable Xeon (this repo's 2-core test VM), the AMX kernel
# segfaults in ggml_backend_amx_mul_mat on a Q4_1 model's first decode; start the server with
# --no-repack (it disables the AMX/repacked weight buffers; Q4_1 then runs on the AVX-512 kernels), or
# build with NO_AMX=1 (a Q4_K_M file's first decode segfaults the same way, 2026-12-05).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
NO_AMX="${NO_AMX:-0}"
ISA="${TOKENMILL_NATIVE_ISA:-native}"
SUFFIX=""
ISA_FLAGS=(-DGGML_NATIVE=ON)
EXTRA_FLAGS=()
if [[ "$ISA" == avx2 ]]; then
    SUFFIX=-avx2
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
elif [[ "$ISA" != native ]]; then
    echo "build_llama_server: TOKENMILL_NATIVE_ISA is 'native' or 'avx2', not '$ISA'" >&2; exit 2
elif [[ "$NO_AMX" == 1 ]]; then
    SUFFIX=-noamx
    EXTRA_FLAGS=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                 -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
CACHE="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/llama-server$SUFFIX"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
BIN="$CACHE/bin/llama-server"

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi

for tool in cmake g++; do
    command -v "$tool" >/dev/null || { echo "build_llama_server: '$tool' is required" >&2; exit 1; }
done

mkdir -p "$CACHE/src"
SDIST=$(ls "$CACHE"/src/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)
if [[ -z "$SDIST" ]]; then
    echo "build_llama_server: downloading the llama-cpp-python $VERSION sdist from PyPI" >&2
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$CACHE/src"
    SDIST="$CACHE/src/llama_cpp_python-$VERSION.tar.gz"
fi

SRC="$CACHE/src/llama_cpp_python-$VERSION"
[[ -d "$SRC" ]] || tar -xzf "$SDIST" -C "$CACHE/src"
LLAMA="$SRC/vendor/llama.cpp"
[[ -f "$LLAMA/CMakeLists.txt" ]] || { echo "build_llama_server: no vendor/llama.cpp in $SDIST" >&2; exit 1; }

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
echo "build_llama_server: configuring $LLAMA" >&2
nice -n 10 cmake -S "$LLAMA" -B "$CACHE/build" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
    "${EXTRA_FLAGS[@]}" >&2
echo "build_llama_server: building llama-server with $JOBS jobs (nice 10)" >&2
nice -n 10 cmake --build "$CACHE/build" --target llama-server -j "$JOBS" >&2

mkdir -p "$CACHE/bin"
cp "$CACHE/build/bin/llama-server" "$BIN"
"$BIN" --version >&2
echo "$BIN"
