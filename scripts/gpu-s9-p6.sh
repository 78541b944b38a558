#!/usr/bin/env bash
# Session 9 probe 6 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s9-p6.sh' with .dev carried
# (.dev/run, .dev/run-before; no PTX: the embedded kernels); a record: its output is in
# bench/results/h100-s9-probes.txt.
set -u
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 60 .dev/run --workload gpt2-decode --steps 128 --json "$@" 2>>$OUT/err.txt | js; }
S=(--staged-from-batch 1)
for rep in 1 2; do
echo "b1 default $(one --batch 1) | ln264 $(one --batch 1 --linear-ln-grid 264) | ln396 $(one --batch 1 --linear-ln-grid 396) | ln264+st:fc_proj $(one --batch 1 --linear-ln-grid 264 "${S[@]}" --staged-only fc_proj) | ln396+st:fc_proj $(one --batch 1 --linear-ln-grid 396 "${S[@]}" --staged-only fc_proj)"
echo "b1 st:qkv $(one --batch 1 "${S[@]}" --staged-only qkv) | st:qkv,fc+ $(one --batch 1 "${S[@]}" --staged-only qkv,fc+) | st:qkv,fc_proj $(one --batch 1 "${S[@]}" --staged-only qkv,fc_proj) | ln264+st:all $(one --batch 1 --linear-ln-grid 264 "${S[@]}") | st:qkv,fc+,fc_proj $(one --batch 1 "${S[@]}" --staged-only qkv,fc+,fc_proj)"
done
echo "b8 default $(one --batch 8) | ln264 $(one --batch 8 --linear-ln-grid 264) | b2 default $(one --batch 2) | b2 st:qkv $(one --batch 2 "${S[@]}" --staged-only qkv)"
