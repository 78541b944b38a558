#!/usr/bin/env bash
# A record of a session-7 measurement: the macros and prefetch arguments it
# builds with are no longer in kernels/kernels.cu (they were removed once
# measured; bench/results/h100-s7-*.txt has the figures).
# Session 7: each kernel prefetches the next kernel's weights into L2
# (l2_prefetch), at its start (kernels_90.ptx) or at its end (-DPF_END=1,
# pfend.ptx), against --no-prefetch (same PTX, null prefetch pointers) and
# against .dev/run-before (main before this change, its embedded PTX),
# alternating, on gpt2-decode b1/b8; --check at b1 and b8. Builds the PTX
# (compute_80 and compute_90) into $OUT. Carry .dev.
set -u
mkdir -p $OUT
R=.dev/run
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu > $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -o $OUT/kernels_90.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DPF_END=1 -o $OUT/pfend.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/k.cubin kernels/kernels.cu 2>&1 | grep -E "entry|registers" > $OUT/ptxas.txt
sha256sum kernels/kernels.cu > $OUT/cu.sha
one() { timeout 120 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'replay {r[\"replay_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]} check {r.get(\"check_max_abs_diff\")} ok {r.get(\"check_ok\")}')"; }
S="--ptx $OUT/kernels_90.ptx"; E="--ptx $OUT/pfend.ptx"
for b in 1 8; do
  echo "check b$b start: $(one $R $S --workload gpt2-decode --batch $b --steps 3 --check)"
  echo "check b$b end:   $(one $R $E --workload gpt2-decode --batch $b --steps 3 --check)"
done
for rep in 1 2 3; do
  for b in 1 8; do
    echo "b$b before:       $(one .dev/run-before --workload gpt2-decode --batch $b --steps 128)"
    echo "b$b no-prefetch:  $(one $R $S --workload gpt2-decode --batch $b --steps 128 --no-prefetch)"
    echo "b$b pf start:     $(one $R $S --workload gpt2-decode --batch $b --steps 128)"
    echo "b$b pf end:       $(one $R $E --workload gpt2-decode --batch $b --steps 128)"
  done
done
