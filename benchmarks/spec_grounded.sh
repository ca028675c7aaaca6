#!/usr/bin/env bash
# Issue 15's measurement: n-gram speculation on the grounded workload (code edit, summarise with quotes) at
# C=1, 128 output tokens, 4 repeats, run twice; with RANDOM_C16=1 also random prompts at C=16 (where no draft
# should run). Writes lscpu.txt, load.txt (the load before each run), stderr.log and one JSON a run into DIR.
#   bash benchmarks/spec_grounded.sh benchmarks/results/<date>/spec
set -u
D=${1:?usage: benchmarks/spec_grounded.sh DIR}
mkdir -p "$D"
lscpu > "$D/lscpu.txt"
spec() { name=$1; shift; echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$D/load.txt"
         timeout 1200 .venv/bin/tokenmill bench spec "$@" --result-json "$D/$name.json" > /dev/null 2>> "$D/stderr.log"; }
G="--workload grounded --concurrency 1 --repeats 4 --output-len 128"
spec grounded-1 $G --speculative-config '{"method": "ngram"}'
spec grounded-2 $G --speculative-config '{"method": "ngram"}'
if [ "${RANDOM_C16:-0}" = 1 ]; then
    spec random-c16 --workload random --concurrency 16 --repeats 4 --output-len 64
fi
echo "== end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$D/load.txt"
