#!/usr/bin/env bash
# A record of a session-8 measurement (bench/results/h100-s8-probes.txt): its
# S8_* macros, LINEAR_LN_R/T8, LINEAR_T8 and the --combine-kernel and
# --linear-block flags are gone; LINEAR_SK_R/T and --linear-rows,
# --attention-blocks remain.
# Session 8 probe (issue 15): linear_ln's staging in one pass of loads
# (statistics from shared memory) and attention's combination in
# attention_part's last block, against .dev/run-before (the kernels before)
# in the same run; plus -DLINEAR_LN_R=4 -DLINEAR_LN_T8=2 (four rows a warp
# at 8 batch rows). Carry .dev/run and .dev/run-before; logs under $OUT.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
nvcc --version | tail -1
declare -A F=([def]="" [r4t2]="-DLINEAR_LN_R=4 -DLINEAR_LN_T8=2" [r4t4]="-DLINEAR_LN_R=4 -DLINEAR_LN_T8=4 -DLINEAR_LN_LB=3")
for v in def r4t2 r4t4; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
  echo "== $v: $(nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu 2>&1 | grep -A2 -E "entry function '(linear|linear_ln|attention_part)'" | grep -oE "Compiling entry function '[a-z_]+'|Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
done
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu
cp $OUT/def.ptx $OUT/kernels_90.ptx
for fn in linear linear_ln attention_part; do
  first=$(cuobjdump -sass -fun "$fn" /tmp/def.cubin | grep -oE 'LDG[.A-Z]*128|ACQBULK' | head -1)
  echo "pdl pin $fn: $first"
done
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'replay {r[\"replay_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]} check {r.get(\"check_max_abs_diff\")} ok {r.get(\"check_ok\")}')"; }
SMALL="--workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001"
D="--ptx $OUT/def.ptx"
echo "check def b1: $(one .dev/run $D --workload gpt2-decode --batch 1 --steps 3 --check)"
echo "check def b8: $(one .dev/run $D --workload gpt2-decode --batch 8 --steps 3 --check)"
echo "check def odd b3: $(one .dev/run $D $SMALL --batch 3 --steps 4 --check)"
echo "check def odd b11: $(one .dev/run $D $SMALL --batch 11 --steps 4 --check)"
echo "check def mlp: $(one .dev/run $D --workload mlp --steps 20 --check)"
echo "check combine-kernel b3: $(one .dev/run $D --combine-kernel $SMALL --batch 3 --steps 4 --check)"
echo "check r4t2 b11: $(one .dev/run --ptx $OUT/r4t2.ptx $SMALL --batch 11 --steps 4 --check)"
echo "check r4t4 b8: $(one .dev/run --ptx $OUT/r4t4.ptx --workload gpt2-decode --batch 8 --steps 3 --check)"
for rep in 1 2; do for b in 1 8; do
  echo "b$b before:         $(one .dev/run-before --workload gpt2-decode --batch $b --steps 128)"
  echo "b$b def:            $(one .dev/run $D --workload gpt2-decode --batch $b --steps 128)"
  echo "b$b combine-kernel: $(one .dev/run $D --combine-kernel --workload gpt2-decode --batch $b --steps 128)"
  if [ $b = 8 ]; then
    echo "b$b r4t2:           $(one .dev/run --ptx $OUT/r4t2.ptx --workload gpt2-decode --batch $b --steps 128)"
    echo "b$b r4t4:           $(one .dev/run --ptx $OUT/r4t4.ptx --workload gpt2-decode --batch $b --steps 128)"
  fi
done; done
echo "mlp before: $(one .dev/run-before --workload mlp --steps 1000)"
echo "mlp def:    $(one .dev/run $D --workload mlp --steps 1000)"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 .dev/run $D $SMALL --batch 11 --steps 2 --warmup 1 > $OUT/san-mem.txt 2>&1; echo "memcheck rc=$? $(grep 'ERROR SUMMARY' $OUT/san-mem.txt)"
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 .dev/run $D $SMALL --batch 2 --steps 2 --warmup 1 > $OUT/san-race.txt 2>&1; echo "racecheck rc=$? $(grep 'SUMMARY' $OUT/san-race.txt)"
