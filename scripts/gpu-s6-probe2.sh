#!/usr/bin/env bash
# Session 6 probe 2: linear_ln's launch bound (blocks resident per
# multiprocessor) against its grid. Carry .dev/run.
set -u
mkdir -p $OUT
# PTX built with nvcc -ptx -arch=compute_90 -O3 -DLINEAR_LN_LB=N into
# .dev/ptx/kN.ptx (k3 is the committed kernels_90.ptx); carry .dev/ptx.
for b in 1 8; do
  for lb in 2 3 4; do
    for g in $((132*lb)) $((264*lb)) 330 462; do
      [ $g = 792 ] && continue # two waves at bound 3, not run (bound 4 with two waves, 1056, was as slow as no cap)
      [ $lb != 3 ] && [ $g = 330 -o $g = 462 ] && continue
      r=$(.dev/run --ptx .dev/ptx/k$lb.ptx --workload gpt2-decode --batch $b --steps 128 --warmup 3 --linear-ln-grid $g --json 2>>$OUT/log.txt)
      echo "$r" >> $OUT/grid2.jsonl
      echo "$r" | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'b$b LB $lb ln-grid $g replay {r[\"replay_us_per_step\"]:.1f} eager {r[\"eager_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]}')" | tee -a $OUT/grid2.txt
    done
  done
done
