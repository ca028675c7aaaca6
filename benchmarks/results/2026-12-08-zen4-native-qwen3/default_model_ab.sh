#!/usr/bin/env bash
# The default model, old (e60e20c, this stop's start: `git worktree add /tmp/oldwt e60e20c`) against new, alternating
# processes, with the scripts of benchmarks/results/2026-12-07-zen4-check/ (one_stream.py: 128 tokens, best of 5;
# cohort.py: 64 x 200 -> 64 offline, best of 3). From the repository root.
set -euo pipefail
S=$PWD/benchmarks/results/2026-12-07-zen4-check
for i in 1 2; do
  (cd /tmp/oldwt && PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$S/one_stream.py" old 2>&1 | grep "best of")
  .venv/bin/python "$S/one_stream.py" new 2>&1 | grep "best of"
done
for i in 1 2; do
  (cd /tmp/oldwt && PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$S/cohort.py" old 2>&1 | grep "best of")
  .venv/bin/python "$S/cohort.py" new 2>&1 | grep "best of"
done
