#!/usr/bin/env bash
# A record of a session-8 measurement (bench/results/h100-s8-probes.txt): its
# S8_* macros, LINEAR_LN_R/T8, LINEAR_T8 and the --combine-kernel and
# --linear-block flags are gone; LINEAR_SK_R/T and --linear-rows,
# --attention-blocks remain.
# Session 8 probe 2 (issue 15): where gpt2-decode's replayed step goes.
# Variants of kernels.cu by -D (S8_* macros, development): the staging
# before/after, gamma prefetch, combine loads batched or not, and kernels
# that return right after their wait (S8_SKIP_*: outputs meaningless, the
# time of the step without that work) or never wait (S8_NOWAIT). Carry
# .dev/run and .dev/run-before; logs under $OUT.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
declare -A F=([def]="" [lnold]="-DS8_LN_OLD" [nogpre]="-DS8_NO_GPRE" [combold]="-DS8_COMBINE_OLD"
  [skipall]="-DS8_SKIP_LIN -DS8_SKIP_LN -DS8_SKIP_ATT" [skiplin]="-DS8_SKIP_LIN" [skipln]="-DS8_SKIP_LN"
  [skipatt]="-DS8_SKIP_ATT" [nowait]="-DS8_NOWAIT" [nowaitskip]="-DS8_NOWAIT -DS8_SKIP_LIN -DS8_SKIP_LN -DS8_SKIP_ATT")
for v in "${!F[@]}"; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { echo "nvcc $v failed"; cat $OUT/nvcc.txt; exit 1; }
done
for v in def lnold nogpre; do
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu > $OUT/ptxas-$v.txt 2>&1
  echo "== $v: $(grep -A2 -E "entry function '(linear|linear_ln|attention_part|attention_combine)'" $OUT/ptxas-$v.txt | grep -oE "function '[a-z_]+'|Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
  cuobjdump -sass -fun linear_ln /tmp/$v.cubin > $OUT/sass-linear_ln-$v.txt
  echo "   linear_ln sass: $(grep -nE 'ACQBULK|BAR.SYNC|LDG' $OUT/sass-linear_ln-$v.txt | head -40 | sed -E 's/^([0-9]+):.*(ACQBULK|BAR.SYNC[.A-Z]*|LDG[.A-Z0-9]*).*/\1:\2/' | tr '\n' ' ')"
done
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]} check={r.get(\"check_max_abs_diff\")}')"; }
G="--workload gpt2-decode --steps 128"
echo "check def b8 combine-kernel: $(one .dev/run --ptx $OUT/def.ptx --combine-kernel --workload gpt2-decode --batch 8 --steps 3 --check)"
echo "check def b1 fused: $(one .dev/run --ptx $OUT/def.ptx --workload gpt2-decode --batch 1 --steps 3 --check)"
for rep in 1 2; do for b in 1 8; do
  echo "b$b before: $(one .dev/run-before $G --batch $b)"
  for v in def lnold nogpre combold; do
    echo "b$b $v fused: $(one .dev/run --ptx $OUT/$v.ptx $G --batch $b) | sep: $(one .dev/run --ptx $OUT/$v.ptx --combine-kernel $G --batch $b)"
  done
done; done
for b in 1 8; do for v in skipall skiplin skipln skipatt nowait nowaitskip; do
  echo "b$b $v fused: $(one .dev/run --ptx $OUT/$v.ptx $G --batch $b) | sep: $(one .dev/run --ptx $OUT/$v.ptx --combine-kernel $G --batch $b)"
done; done
