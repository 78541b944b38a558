#!/usr/bin/env bash
# A record of a session-7 measurement: the macros and prefetch arguments it
# builds with are no longer in kernels/kernels.cu (they were removed once
# measured; bench/results/h100-s7-*.txt has the figures).
# Session 7: where ptxas puts a linear's first weight loads relative to
# griddepcontrol.wait (ACQBULK in SASS), and what it costs. Variants of
# kernels/kernels.cu: a (as is: the L2 prefetch loop, null at run time,
# between loads and wait), b (-DNO_PF_CODE: no loop, as before), c (b with
# __syncwarp between), d (b with a branch on the first weight between).
# Times each against .dev/run-before. Carry .dev.
set -u
mkdir -p $OUT
declare -A F=([a]="" [b]="-DNO_PF_CODE" [c]="-DNO_PF_CODE -DPIN=1" [d]="-DNO_PF_CODE -DPIN=2")
for v in a b c d; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -o /tmp/$v.cubin kernels/kernels.cu
  for fn in linear linear_ln; do
    echo "== $v $fn" >> $OUT/sass.txt
    cuobjdump -sass -fun $fn /tmp/$v.cubin | grep -oE '(LDG[.A-Z0-9]*|ACQBULK|PREEXIT|LDS[.A-Z0-9]*|BRA|FFMA|CCTL[.A-Z0-9]*)' | uniq -c | head -40 | tr '\n' ' ' >> $OUT/sass.txt
    echo >> $OUT/sass.txt
  done
done
one() { timeout 120 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'replay {r[\"replay_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]} check {r.get(\"check_max_abs_diff\")}')"; }
for v in c d; do for b in 1 8; do echo "check $v b$b: $(one .dev/run --ptx $OUT/$v.ptx --no-prefetch --workload gpt2-decode --batch $b --steps 3 --check)"; done; done
for rep in 1 2; do for b in 1 8; do
  echo "b$b before: $(one .dev/run-before --workload gpt2-decode --batch $b --steps 128)"
  for v in a b c d; do echo "b$b $v:      $(one .dev/run --ptx $OUT/$v.ptx --no-prefetch --workload gpt2-decode --batch $b --steps 128)"; done
done; done
