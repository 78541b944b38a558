#!/usr/bin/env bash
# Session 10 probe 6 and the final run (issue 15), on the H100 as
# 'OUT=$OUT bash scripts/gpu-s10-p6.sh' with .dev carried (.dev/run: this
# tree; .dev/run-before: bab3c80, session 9's end). First gpt2-decode
# replays at batch 1, alternating: the committed kernels (linear_ln's tile
# of 6 at one batch row), linear_ln sized for two rows a warp
# (--ln-warp-rows 2), linear_few with tiles of 12 at 3 blocks a
# multiprocessor; then scripts/gpu-floor.sh COMPILE=1 CHECK=1 BEFORE=.dev/run-before.
set -u
mkdir -p $OUT
nvcc -ptx -arch=compute_90 -O3 -o /tmp/d.ptx kernels/kernels.cu > $OUT/probe.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DLINEAR_FEW_T=12 -DLINEAR_FEW_LB=3 -o /tmp/t12.ptx kernels/kernels.cu >> $OUT/probe.txt 2>&1 || { cat $OUT/probe.txt; exit 1; }
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL'))
except Exception as e: print('FAILED', e)"; }
b1() { timeout 90 "$@" --workload gpt2-decode --batch 1 --steps 128 --json 2>>$OUT/probe.txt | js; }
for rep in 1 2; do
  echo "b1 default $(b1 .dev/run --ptx /tmp/d.ptx) | ln-warp-rows 2 $(b1 .dev/run --ptx /tmp/d.ptx --ln-warp-rows 2) | few T12 LB3 $(b1 .dev/run --ptx /tmp/t12.ptx)" | tee -a $OUT/probe.txt
done
(COMPILE=1 CHECK=1 BEFORE=.dev/run-before OUT=/tmp/gf timeout 420 bash scripts/gpu-floor.sh > /tmp/gf-stdout.txt 2>&1)
cp /tmp/gf/log.txt /tmp/gf/results.jsonl /tmp/gf/kernels.ptx /tmp/gf/kernels_90.ptx /tmp/gf-stdout.txt $OUT/
tail -16 /tmp/gf-stdout.txt
