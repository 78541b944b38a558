#!/usr/bin/env bash
# A record of a session-7 measurement: -DR_PLAIN/-DR_LN are no longer in
# kernels/kernels.cu (linear_ln's R = 2 landed; bench/results/h100-s7-rows.txt).
# Session 7: linear_rows blocking over R output rows per warp at 3+ batch
# rows (each activation vector read once for R weight rows), -DR_PLAIN=R for
# linear, -DR_LN=R for linear_ln; against the committed kernels. Carry .dev/run.
set -u
mkdir -p $OUT
declare -A F=([r11]="" [r21]="-DR_PLAIN=2" [r12]="-DR_LN=2" [r22]="-DR_PLAIN=2 -DR_LN=2")
for v in r11 r21 r12 r22; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
  echo "== $v: $(nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu 2>&1 | grep -A2 -E "entry function '(linear|linear_ln)'" | grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
done
one() { timeout 120 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'replay {r[\"replay_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]} check {r.get(\"check_max_abs_diff\")} ok {r.get(\"check_ok\")}')"; }
SMALL="--workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001"
for v in r22; do
  echo "check $v b8: $(one .dev/run --ptx $OUT/$v.ptx --workload gpt2-decode --batch 8 --steps 3 --check)"
  echo "check $v odd-width b3: $(one .dev/run --ptx $OUT/$v.ptx $SMALL --batch 3 --steps 3 --check)"
  echo "check $v odd-width b11: $(one .dev/run --ptx $OUT/$v.ptx $SMALL --batch 11 --steps 3 --check)"
done
for rep in 1 2; do for b in 8 4; do
  echo "b$b committed: $(one .dev/run --workload gpt2-decode --batch $b --steps 128)"
  for v in r11 r21 r12 r22; do echo "b$b $v:       $(one .dev/run --ptx $OUT/$v.ptx --workload gpt2-decode --batch $b --steps 128)"; done
done; done
echo "b1 committed: $(one .dev/run --workload gpt2-decode --batch 1 --steps 128)"
echo "b1 r22:       $(one .dev/run --ptx $OUT/r22.ptx --workload gpt2-decode --batch 1 --steps 128)"
