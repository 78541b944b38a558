#!/usr/bin/env bash
# A record of a session-8 measurement (bench/results/h100-s8-probes.txt): its
# S8_* macros, LINEAR_LN_R/T8, LINEAR_T8 and the --combine-kernel and
# --linear-block flags are gone; LINEAR_SK_R/T and --linear-rows,
# --attention-blocks remain.
# Session 8 probe 4 (issue 15): attention split into chunks of one round
# (16 splits at batch 1), linear_ln's grid sized by its rows a warp; the
# plain linear's block size (--linear-block) and tile at 8 batch rows
# (-DLINEAR_T8=8); combine loads batched or not (-DS8_COMBINE_OLD). Carry
# .dev/run and .dev/run-before.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
declare -A F=([def]="" [combold]="-DS8_COMBINE_OLD" [t8]="-DLINEAR_T8=8" [t8combold]="-DLINEAR_T8=8 -DS8_COMBINE_OLD")
for v in "${!F[@]}"; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { echo "nvcc $v failed"; cat $OUT/nvcc.txt; exit 1; }
done
for v in def t8; do
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu > /tmp/ptxas-$v.txt 2>&1
  echo "== $v: $(grep -A4 -E "Compiling entry function '(linear|linear_ln|attention_part|attention_combine)'" /tmp/ptxas-$v.txt | grep -oE "function '[a-z_]+'|Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
done
for fn in linear linear_ln attention_part; do
  echo "pdl pin $fn: $(cuobjdump -sass -fun "$fn" /tmp/def.cubin | grep -oE 'LDG[.A-Z]*128|ACQBULK' | head -1)"
done
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]} check={r.get(\"check_max_abs_diff\")} ok={r.get(\"check_ok\")}')"; }
G="--workload gpt2-decode --steps 128"
SMALL="--workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001"
D="--ptx $OUT/def.ptx"
T8="--ptx $OUT/t8.ptx"
echo "check def b1: $(one .dev/run $D --workload gpt2-decode --batch 1 --steps 3 --check)"
echo "check def b8: $(one .dev/run $D --workload gpt2-decode --batch 8 --steps 3 --check)"
echo "check def odd b3: $(one .dev/run $D $SMALL --batch 3 --steps 4 --check)"
echo "check t8 lb32 odd b11: $(one .dev/run $T8 --linear-block 32 $SMALL --batch 11 --steps 4 --check)"
echo "check t8 lb64 b8: $(one .dev/run $T8 --linear-block 64 --workload gpt2-decode --batch 8 --steps 3 --check)"
for rep in 1 2; do
  echo "b1 before: $(one .dev/run-before $G --batch 1)"
  echo "b1 def: $(one .dev/run $D $G --batch 1)"
  echo "b1 combold: $(one .dev/run --ptx $OUT/combold.ptx $G --batch 1)"
  echo "b1 def lb64: $(one .dev/run $D --linear-block 64 $G --batch 1)"
  echo "b1 def lb32: $(one .dev/run $D --linear-block 32 $G --batch 1)"
  echo "b8 before: $(one .dev/run-before $G --batch 8)"
  echo "b8 def: $(one .dev/run $D $G --batch 8)"
  echo "b8 combold: $(one .dev/run --ptx $OUT/combold.ptx $G --batch 8)"
  echo "b8 def lb64: $(one .dev/run $D --linear-block 64 $G --batch 8)"
  echo "b8 def lb32: $(one .dev/run $D --linear-block 32 $G --batch 8)"
  echo "b8 t8: $(one .dev/run $T8 $G --batch 8)"
  echo "b8 t8 lb64: $(one .dev/run $T8 --linear-block 64 $G --batch 8)"
  echo "b8 t8 lb32: $(one .dev/run $T8 --linear-block 32 $G --batch 8)"
  echo "b8 t8combold lb32: $(one .dev/run --ptx $OUT/t8combold.ptx --linear-block 32 $G --batch 8)"
done
echo "mlp before: $(one .dev/run-before --workload mlp --steps 1000)"
echo "mlp def: $(one .dev/run $D --workload mlp --steps 1000)"
echo "mlp def lb32: $(one .dev/run $D --linear-block 32 --workload mlp --steps 1000)"
