#!/usr/bin/env bash
# A record of a session-8 measurement (bench/results/h100-s8-probes.txt): its
# LINEAR_SK1 and LINEAR_LN_SK variants are not in kernels/kernels.cu (both
# were slower).
# Session 8 probe 6 (issue 15): linear_rows_sk (a block's warps split its
# rows' inputs) also for one batch row of the plain linear (-DLINEAR_SK1)
# and for linear_ln from 3 batch rows on, its staged rows read from shared
# memory (-DLINEAR_LN_SK); against .dev/run-before (cmd/run of 68f0224).
# Carry .dev/run and .dev/run-before.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
declare -A F=([def]="" [sk1off]="-DLINEAR_SK1=0" [lnskoff]="-DLINEAR_LN_SK=0")
for v in def sk1off lnskoff; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { echo "nvcc $v failed"; cat $OUT/nvcc.txt; exit 1; }
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu > /tmp/ptxas-$v.txt 2>&1
  echo "== $v: $(grep -A4 -E "Compiling entry function '(linear|linear_ln)'" /tmp/ptxas-$v.txt | grep -oE "function '[a-z_]+'|Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
done
for fn in linear linear_ln; do echo "pdl pin $fn: $(cuobjdump -sass -fun "$fn" /tmp/def.cubin | grep -oE 'LDG[.A-Z]*128|ACQBULK' | head -1)"; done
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]} check={r.get(\"check_max_abs_diff\")} ok={r.get(\"check_ok\")}')"; }
G="--workload gpt2-decode --steps 128"
SMALL="--workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001"
D="--ptx $OUT/def.ptx"
echo "check def b1: $(one .dev/run $D --workload gpt2-decode --batch 1 --steps 3 --check)"
echo "check def b8: $(one .dev/run $D --workload gpt2-decode --batch 8 --steps 3 --check)"
echo "check def b4: $(one .dev/run $D --workload gpt2-decode --batch 4 --steps 3 --check)"
echo "check def odd b3: $(one .dev/run $D $SMALL --batch 3 --steps 4 --check)"
echo "check def odd b11: $(one .dev/run $D $SMALL --batch 11 --steps 4 --check)"
echo "check def odd b1: $(one .dev/run $D $SMALL --batch 1 --steps 4 --check)"
echo "check def mlp b1: $(one .dev/run $D --workload mlp --steps 5 --check)"
echo "check def mlp b5 w1028: $(one .dev/run $D --workload mlp --layers 4 --width 1028 --batch 5 --steps 5 --check)"
echo "check def mlp b1 w1028: $(one .dev/run $D --workload mlp --layers 4 --width 1028 --batch 1 --steps 5 --check)"
for rep in 1 2; do for b in 1 8 4; do
  echo "b$b before: $(one .dev/run-before $G --batch $b)"
  for v in def sk1off lnskoff; do echo "b$b $v: $(one .dev/run --ptx $OUT/$v.ptx $G --batch $b)"; done
done; done
echo "mlp before: $(one .dev/run-before --workload mlp --steps 1000)"
echo "mlp def: $(one .dev/run $D --workload mlp --steps 1000)"
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 .dev/run $D $SMALL --batch 3 --steps 2 --warmup 1 > $OUT/san-race.txt 2>&1; echo "racecheck b3 rc=$? $(grep 'SUMMARY' $OUT/san-race.txt)"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 .dev/run $D $SMALL --batch 11 --steps 2 --warmup 1 > $OUT/san-mem.txt 2>&1; echo "memcheck b11 rc=$? $(grep 'ERROR SUMMARY' $OUT/san-mem.txt)"
