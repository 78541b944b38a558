#!/usr/bin/env bash
# A record of a session-8 measurement (bench/results/h100-s8-probes.txt): its
# S8_* macros, LINEAR_LN_R/T8, LINEAR_T8 and the --combine-kernel and
# --linear-block flags are gone; LINEAR_SK_R/T and --linear-rows,
# --attention-blocks remain.
# Session 8 probe 5 (issue 15): the plain linear from 3 batch rows on as
# linear_rows_sk (a block per R rows, its warps splitting the inputs),
# -DLINEAR_SK_R/-DLINEAR_SK_T variants (with --linear-rows R), against
# .dev/run-before. Carry .dev/run and .dev/run-before.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
declare -A F=([r4t2]="" [r2t4]="-DLINEAR_SK_R=2 -DLINEAR_SK_T=4" [r2t2]="-DLINEAR_SK_R=2 -DLINEAR_SK_T=2" [r4t4]="-DLINEAR_SK_R=4 -DLINEAR_SK_T=4" [r8t1]="-DLINEAR_SK_R=8 -DLINEAR_SK_T=1")
declare -A RW=([r4t2]=4 [r2t4]=2 [r2t2]=2 [r4t4]=4 [r8t1]=8)
for v in "${!F[@]}"; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { echo "nvcc $v failed"; cat $OUT/nvcc.txt; exit 1; }
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu > /tmp/ptxas-$v.txt 2>&1
  echo "== $v: $(grep -A4 -E "Compiling entry function '(linear)'" /tmp/ptxas-$v.txt | grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
done
echo "pdl pin linear: $(cuobjdump -sass -fun linear /tmp/r4t2.cubin | grep -oE 'LDG[.A-Z]*128|ACQBULK' | head -1)"
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]} check={r.get(\"check_max_abs_diff\")} ok={r.get(\"check_ok\")}')"; }
G="--workload gpt2-decode --steps 128"
SMALL="--workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001"
D="--ptx $OUT/r4t2.ptx"
echo "check r4t2 b8: $(one .dev/run $D --workload gpt2-decode --batch 8 --steps 3 --check)"
echo "check r4t2 b4: $(one .dev/run $D --workload gpt2-decode --batch 4 --steps 3 --check)"
echo "check r4t2 odd b3: $(one .dev/run $D $SMALL --batch 3 --steps 4 --check)"
echo "check r4t2 odd b11: $(one .dev/run $D $SMALL --batch 11 --steps 4 --check)"
echo "check r4t2 mlp b5: $(one .dev/run $D --workload mlp --batch 5 --steps 5 --check)"
echo "check r2t4 odd b11: $(one .dev/run --ptx $OUT/r2t4.ptx --linear-rows 2 $SMALL --batch 11 --steps 4 --check)"
for rep in 1 2; do
  echo "b8 before: $(one .dev/run-before $G --batch 8)"
  for v in r4t2 r2t4 r2t2 r4t4 r8t1; do
    echo "b8 $v: $(one .dev/run --ptx $OUT/$v.ptx --linear-rows ${RW[$v]} $G --batch 8)"
  done
  echo "b4 before: $(one .dev/run-before $G --batch 4)"
  echo "b4 r4t2: $(one .dev/run $D $G --batch 4)"
  echo "b1 before: $(one .dev/run-before $G --batch 1)"
  echo "b1 r4t2: $(one .dev/run $D $G --batch 1)"
done
