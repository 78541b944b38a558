#!/usr/bin/env bash
# Session 9 probe 7 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s9-p7.sh' with .dev carried
# (.dev/run, .dev/run-before; no PTX: the embedded kernels); a record: its output is in
# bench/results/h100-s9-probes.txt.
set -u
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 60 .dev/run --workload gpt2-decode --steps 128 --json "$@" 2>>$OUT/err.txt | js; }
for rep in 1 2; do
echo "b1 ln396(new default) $(one --batch 1) | ln528 $(one --batch 1 --linear-ln-grid 528) | ln462 $(one --batch 1 --linear-ln-grid 462) | ln330 $(one --batch 1 --linear-ln-grid 330)"
echo "b8 ln396(new default) $(one --batch 8) | ln528 $(one --batch 8 --linear-ln-grid 528) | ln462 $(one --batch 8 --linear-ln-grid 462)"
echo "b4 ln396 $(one --batch 4) | ln528 $(one --batch 4 --linear-ln-grid 528) | b2 ln396 $(one --batch 2) | ln528 $(one --batch 2 --linear-ln-grid 528)"
done
(CHECK=1 BEFORE=.dev/run-before OUT=/tmp/gf timeout 400 bash scripts/gpu-floor.sh > /tmp/gf-stdout.txt 2>&1)
cp /tmp/gf/log.txt /tmp/gf/results.jsonl /tmp/gf-stdout.txt $OUT/
tail -12 /tmp/gf-stdout.txt
