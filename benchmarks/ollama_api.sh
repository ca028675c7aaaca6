#!/usr/bin/env bash
# One `tokenmill serve`, measured through Ollama's /api/chat and OpenAI's /v1/chat/completions in the
# same run: at each concurrency level, REPEATS rounds of one pass per endpoint, the order alternating
# round to round, each round's two passes on the same random prompts (greedy); then the ratios
# Ollama / OpenAI of the medians and of the best passes (on a shared machine the best pass is the least
# disturbed one; every pass's figures and load are in the summary). Each pass also records the server
# process's CPU time per output token: what the API layer costs, which other processes on the machine
# barely change (they take the cores away, they do not add work to this process).
#
#   benchmarks/ollama_api.sh                    # levels 1,16; results in benchmarks/results/<date>-ollama-api/
#
# Ollama's API has no ignore_eos, so both endpoints stop at EOS (the OpenAI requests send ignore_eos false)
# and generate the same greedy tokens; the prefix cache is off, so the second pass over a prompt prefills
# it again rather than reading the first pass's blocks.
# Knobs (environment): LEVELS (1,16), REPEATS (3), INPUT_LEN / OUTPUT_LEN (200 / 64), PROMPTS_PER_C /
# MIN_PROMPTS (2 / 8), PORT (8322), TOKENMILL_ARGS (extra `serve` flags), RESULTS_DIR, PYTHON (the venv's
# python), WAIT_QUIET (before each pass, wait up to this many seconds for the 1-minute load to fall below
# 1.5; default 0). Each result JSON records the load at the start and end of its pass.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
LEVELS="${LEVELS:-1,16}"
REPEATS="${REPEATS:-3}"
RESULTS_DIR="${RESULTS_DIR:-benchmarks/results/$(date +%F)-ollama-api}"
PORT="${PORT:-8322}"
mkdir -p "$RESULTS_DIR"

# shellcheck disable=SC2086
setsid "$PYTHON" -m tokenmill.cli serve --port "$PORT" --no-prefix-caching ${TOKENMILL_ARGS:-} \
    >"$RESULTS_DIR/server.log" 2>&1 &
SERVER=$!
trap 'kill -- -$SERVER 2>/dev/null || true' EXIT

wait_quiet() {
    local deadline=$((SECONDS + ${WAIT_QUIET:-0}))
    while ((SECONDS < deadline)) && awk '{exit !($1 >= 1.5)}' /proc/loadavg; do sleep 5; done
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }  # user + system, every thread

bench() {  # endpoint, concurrency, round
    wait_quiet
    local extra=() before
    before=$(cpu_ticks)
    [[ $1 == chat ]] && extra=(--extra-body '{"ignore_eos": false}')
    "$PYTHON" -m tokenmill.cli bench serve --base-url "http://127.0.0.1:$PORT" --endpoint "$1" --max-concurrency "$2" \
        --random-input-len "${INPUT_LEN:-200}" --random-output-len "${OUTPUT_LEN:-64}" --seed "$3" \
        --prompts-per-concurrency "${PROMPTS_PER_C:-2}" --min-prompts "${MIN_PROMPTS:-8}" --num-warmups 2 \
        --wait-for-server 900 --label "$1-r$3" --result-dir "$RESULTS_DIR" "${extra[@]}"
    echo "$1 $2 $3 $(($(cpu_ticks) - before)) $(getconf CLK_TCK)" >>"$RESULTS_DIR/server_cpu.txt"
}

{ uptime; lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "avx2|avx512f|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '
  echo; } >"$RESULTS_DIR/machine.txt"
for c in ${LEVELS//,/ }; do
    for ((r = 1; r <= REPEATS; r++)); do
        if ((r % 2)); then order=(chat ollama-chat); else order=(ollama-chat chat); fi
        for ep in "${order[@]}"; do bench "$ep" "$c" "$r"; done
    done
done
uptime >>"$RESULTS_DIR/machine.txt"

"$PYTHON" - "$RESULTS_DIR" <<'EOF' | tee "$RESULTS_DIR/summary.md"
import json, pathlib, statistics, sys
d = pathlib.Path(sys.argv[1])
runs: dict[tuple[str, int], list[dict]] = {}
for f in sorted(d.glob("*.json"), key=lambda f: f.stat().st_mtime):
    r = json.loads(f.read_text())
    runs.setdefault((r["endpoint"], r["max_concurrency"]), []).append(r)
print("| C | endpoint | out tok/s, each round | TTFT p50 ms, each round | output tokens | load at start |")
print("|---|---|---|---|---|---|")
for (ep, c), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    cells = [" / ".join(f"{r[k]:{fmt}}" for r in rs) for k, fmt in
             (("output_throughput", ".1f"), ("median_ttft_ms", ".0f"), ("total_output_tokens", "d"))]
    loads = " / ".join(str(r["machine"]["loadavg_at_start"][0]) for r in rs)
    print(f"| {c} | {ep} | {' | '.join(cells)} | {loads} |")
print()
# server CPU ms per output token, per pass (the ticks include the pass's warm-up requests: 2 of each pass's
# requests, the same share on both endpoints)
cpu: dict[tuple[str, int], list[float]] = {}
for line in (d / "server_cpu.txt").read_text().split("\n"):
    if line.strip():
        ep, c, rnd, ticks, hz = line.split()
        rec = next(r for r in runs[(ep, int(c))] if r["label"] == f"{ep}-r{rnd}")
        cpu.setdefault((ep, int(c)), []).append(1000 * int(ticks) / int(hz) / rec["total_output_tokens"])
for (ep, c), ms in sorted(cpu.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"C={c} {ep}: server CPU ms per output token {' / '.join(f'{m:.1f}' for m in ms)}")
print()
for c in sorted({c for _, c in runs}):
    o, a = runs.get(("ollama-chat", c), []), runs.get(("chat", c), [])
    if not (o and a):
        continue
    tput = [r["output_throughput"] for r in o], [r["output_throughput"] for r in a]
    ttft = [r["median_ttft_ms"] for r in o], [r["median_ttft_ms"] for r in a]
    print(f"C={c}: Ollama / OpenAI output tok/s {statistics.median(tput[0]) / statistics.median(tput[1]):.3f}x "
          f"(medians), {max(tput[0]) / max(tput[1]):.3f}x (best); TTFT p50 "
          f"{statistics.median(ttft[0]) / statistics.median(ttft[1]):.3f}x (medians), "
          f"{min(ttft[0]) / min(ttft[1]):.3f}x (best)", end="")
    if ("ollama-chat", c) in cpu and ("chat", c) in cpu:
        ratio = statistics.median(cpu[("ollama-chat", c)]) / statistics.median(cpu[("chat", c)])
        print(f"; server CPU per output token {ratio:.3f}x (medians)", end="")
    print()
EOF
