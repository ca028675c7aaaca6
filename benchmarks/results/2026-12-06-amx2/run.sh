#!/usr/bin/env bash
# The commands behind this directory (2026-12-06, 02:44-05:30 UTC stop; AMX Xeon, lscpu.txt). OLD: the kernel
# sources of c223455 (this stop's start), NEW: this stop's (git show REV:tokenmill/native/<file> > DIR/<file>).
set -eu
mode=${1:-}
D=benchmarks/results/2026-12-06-amx2
old=/tmp/kq_old new=/tmp/kq_new
for dir_rev in "$old c223455" "$new HEAD"; do
  set -- $dir_rev; mkdir -p $1
  for f in block_matmul amx_matmul panel_matmul kquant_matmul; do git show $2:tokenmill/native/$f.cpp > $1/$f.cpp; done
done
case "$mode" in
  ab) # each pair twice, the builds' places swapped (the first-built library measured ~2% faster in an A/B of two
      # copies of one source)
      { for pair in "$old $new" "$new $old"; do echo "# A B = $pair"
          ROWS=1,1,2,4,8,16 LAYERS=4 REPEATS=9 .venv/bin/python benchmarks/experiments/kquant_ab.py $pair
          Q4K_AS=13 TYPES=13 ROWS=1,1,2,4,8,16 LAYERS=4 REPEATS=9 .venv/bin/python benchmarks/experiments/kquant_ab.py $pair
        done; } 2>&1 | tee $D/kquant_ab.txt ;;
  q6k) { echo "# A B = $old $new (Q6_K alone)"; TYPES=14 ROWS=1,1,2,4,8,16 LAYERS=4 REPEATS=9 .venv/bin/python benchmarks/experiments/kquant_ab.py $old $new
        echo "# A B = $new $old (places swapped: 'old' below = this stop's)"; TYPES=14 ROWS=1,1,2,4,8,16 LAYERS=4 REPEATS=9 .venv/bin/python benchmarks/experiments/kquant_ab.py $new $old
      } 2>&1 | tee $D/kquant_ab_q6k.txt ;;
  abba) # tp's run in ABBA order (the host slowed steadily during tp), output tok/s
      M5=$HOME/.cache/tokenmill/big/qwen2.5-7b-shape-Q5_K_M.gguf
      [[ -d /tmp/old ]] || git worktree add /tmp/old c223455
      for tree in old new new old; do root=$([[ $tree == old ]] && echo /tmp/old || pwd)
        r=$(PYTHONPATH=$root TOKENMILL_AMX_MATMUL=0 .venv/bin/python -c "import sys; from tokenmill.cli import main; sys.exit(main())" \
            bench throughput --model $M5 --dtype float32 --input-len 32 --output-len 32 --num-prompts 8 --max-num-seqs 8 \
            --max-model-len 256 2>&1 | grep output_tok_per_s); echo "$tree $r"
      done | tee $D/tp-abba.txt ;;
  big) LOAD_C=0 RESULTS_DIR=$D/big-model bash benchmarks/big_model.sh ;;
  q41) ROWS=1,1,2,3,4,8 .venv/bin/python benchmarks/experiments/block_matmul_ab.py $old/block_matmul.cpp $new/block_matmul.cpp \
         2>&1 | grep "M=" | tee $D/block_matmul_ab.txt ;;
  tp) # a 7B-class Q5_K_M file (Q5_K, Q6_K) offline at 8 sequences on the path of a CPU without AMX (fp32, the AMX
      # kernel off), so that every decode step's 8 rows are on the K-quant kernel; the tree of c223455 (a git
      # worktree at /tmp/old) and this one alternating, twice
      M5=$HOME/.cache/tokenmill/big/qwen2.5-7b-shape-Q5_K_M.gguf
      [[ -d /tmp/old ]] || git worktree add /tmp/old c223455
      for i in 1 2; do for tree in old new; do
        root=$([[ $tree == old ]] && echo /tmp/old || pwd)
        PYTHONPATH=$root TOKENMILL_AMX_MATMUL=0 .venv/bin/python -c "import sys; from tokenmill.cli import main; sys.exit(main())" \
          bench throughput --model $M5 --dtype float32 --input-len 32 --output-len ${OUT:-32} --num-prompts 8 \
          --max-num-seqs 8 --max-model-len 256 --result-json $D/tp-$tree-$i.json 2>&1 | tail -3
      done; done | tee $D/tp.txt ;;
  *) echo "usage: $0 ab|q6k|big|q41|tp|abba" >&2; exit 2 ;;
esac
