#!/usr/bin/env bash
# A record of a session-8 measurement (bench/results/h100-s8-probes.txt): its
# S8_* macros, LINEAR_LN_R/T8, LINEAR_T8 and the --combine-kernel and
# --linear-block flags are gone; LINEAR_SK_R/T and --linear-rows,
# --attention-blocks remain.
# Session 8 probe 3 (issue 15): attention's share of gpt2-decode's replayed
# step. Variants: attention_part's splits (--attention-blocks), attention
# launched without PDL (-DS8_ATT_NOPDL), linear_ln's launch bound
# (-DLINEAR_LN_LB), combine loads batched or not (-DS8_COMBINE_OLD); the
# per-kernel profile of one eager step. Carry .dev/run and .dev/run-before.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
declare -A F=([def]="" [combold]="-DS8_COMBINE_OLD" [attnopdl]="-DS8_ATT_NOPDL" [lb3]="-DLINEAR_LN_LB=3" [lb2]="-DLINEAR_LN_LB=2")
for v in "${!F[@]}"; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { echo "nvcc $v failed"; cat $OUT/nvcc.txt; exit 1; }
done
for v in def lb2; do
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu > /tmp/ptxas-$v.txt 2>&1
  echo "== $v: $(grep -A2 -E "entry function '(linear|linear_ln|attention_part|attention_combine)'" /tmp/ptxas-$v.txt | grep -oE "function '[a-z_]+'|Used [0-9]+ registers|[0-9]+ bytes smem|[0-9]+ bytes spill stores" | tr '\n' ' ')"
done
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]} check={r.get(\"check_max_abs_diff\")}')"; }
G="--workload gpt2-decode --steps 128"
D="--ptx $OUT/def.ptx"
echo "check def b1 fused ab96: $(one .dev/run $D --attention-blocks 96 --workload gpt2-decode --batch 1 --steps 3 --check)"
for rep in 1 2; do
  echo "b1 before: $(one .dev/run-before $G --batch 1)"
  for v in def combold attnopdl lb3 lb2; do
    echo "b1 $v fused: $(one .dev/run --ptx $OUT/$v.ptx $G --batch 1) | sep: $(one .dev/run --ptx $OUT/$v.ptx --combine-kernel $G --batch 1)"
  done
  for ab in 96 192 264 384; do
    echo "b1 def ab$ab fused: $(one .dev/run $D --attention-blocks $ab $G --batch 1) | sep: $(one .dev/run $D --attention-blocks $ab --combine-kernel $G --batch 1)"
  done
done
echo "b8 before: $(one .dev/run-before $G --batch 8)"
for v in def combold attnopdl lb3; do
  echo "b8 $v fused: $(one .dev/run --ptx $OUT/$v.ptx $G --batch 8) | sep: $(one .dev/run --ptx $OUT/$v.ptx --combine-kernel $G --batch 8)"
done
for ab in 264 1056 2112; do
  echo "b8 def ab$ab fused: $(one .dev/run $D --attention-blocks $ab $G --batch 8) | sep: $(one .dev/run $D --attention-blocks $ab --combine-kernel $G --batch 8)"
done
for b in 1 8; do
  .dev/run $D --combine-kernel --workload gpt2-decode --batch $b --steps 1 --profile 2>&1 | grep -i profile | sed "s/^/b$b sep /"
  .dev/run $D --workload gpt2-decode --batch $b --steps 1 --profile 2>&1 | grep -i profile | sed "s/^/b$b fused /"
done
