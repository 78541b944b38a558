#!/usr/bin/env bash
# A record of a session-7 measurement: the macros and prefetch arguments it
# builds with are no longer in kernels/kernels.cu (they were removed once
# measured; bench/results/h100-s7-*.txt has the figures).
# Session 7, second pin probe (see gpu-s7-pin.sh): e (no prefetch code;
# linear_rows waits under `if (b0 == 0)`), f (e, and attention_part's wait
# behind a branch too), a and d for reference, against .dev/run-before.
set -u
mkdir -p $OUT
declare -A F=([a]="" [d]="-DNO_PF_CODE -DPIN=2" [e]="-DNO_PF_CODE -DPIN=3" [f]="-DNO_PF_CODE -DPIN=3 -DAPIN=1")
for v in a d e f; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -o /tmp/$v.cubin kernels/kernels.cu
  for fn in linear linear_ln attention_part; do
    echo "== $v $fn: $(cuobjdump -sass -fun $fn /tmp/$v.cubin | grep -oE '(LDG[.A-Z0-9]*|ACQBULK|PREEXIT|BRA)' | uniq -c | head -12 | tr '\n' ' ')" >> $OUT/sass.txt
  done
done
one() { timeout 120 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'replay {r[\"replay_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]} check {r.get(\"check_max_abs_diff\")}')"; }
for v in e f; do for b in 1 8; do echo "check $v b$b: $(one .dev/run --ptx $OUT/$v.ptx --no-prefetch --workload gpt2-decode --batch $b --steps 3 --check)"; done; done
for rep in 1 2; do for b in 1 8; do
  echo "b$b before: $(one .dev/run-before --workload gpt2-decode --batch $b --steps 128)"
  for v in a d e f; do echo "b$b $v:      $(one .dev/run --ptx $OUT/$v.ptx --no-prefetch --workload gpt2-decode --batch $b --steps 128)"; done
done; done
