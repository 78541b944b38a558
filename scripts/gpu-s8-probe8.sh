#!/usr/bin/env bash
# Session 8 probe 8 (issue 15): linear_ln's grid cap (--linear-ln-grid,
# default 528 = 4 blocks a multiprocessor) with the session-8 kernels, at
# batch 1 (QKV 2304 rows and MLP-in 3072 rows over 4 warps a block) and 8.
# Carry .dev/run.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]}')"; }
G="--workload gpt2-decode --steps 128"
for rep in 1 2; do
  for g in 528 576 640 768 1024; do echo "b1 grid $g: $(one .dev/run --linear-ln-grid $g $G --batch 1)"; done
  for g in 528 768; do echo "b8 grid $g: $(one .dev/run --linear-ln-grid $g $G --batch 8)"; done
done
