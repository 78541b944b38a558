#!/usr/bin/env bash
# A record of a session-7 measurement: the macros and prefetch arguments it
# builds with are no longer in kernels/kernels.cu (they were removed once
# measured; bench/results/h100-s7-*.txt has the figures).
# Session 7: each warp of linear/linear_ln asks L2 for its first OWN_PF
# weight rows whole before the wait (kernels.cu -DOWN_PF=K), against the
# committed kernels (OWN_PF=0, PDL_WAIT_IF). Carry .dev/run.
set -u
mkdir -p $OUT
for k in 0 1 2 4; do
  nvcc -ptx -arch=compute_90 -O3 -DOWN_PF=$k -o $OUT/pf$k.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
done
one() { timeout 120 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'replay {r[\"replay_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]} check {r.get(\"check_max_abs_diff\")}')"; }
for k in 1 2; do for b in 1 8; do echo "check pf$k b$b: $(one .dev/run --ptx $OUT/pf$k.ptx --workload gpt2-decode --batch $b --steps 3 --check)"; done; done
for rep in 1 2; do for b in 1 8; do
  echo "b$b committed: $(one .dev/run --workload gpt2-decode --batch $b --steps 128)"
  for k in 0 1 2 4; do echo "b$b pf$k:       $(one .dev/run --ptx $OUT/pf$k.ptx --workload gpt2-decode --batch $b --steps 128)"; done
done; done
