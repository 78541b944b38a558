#!/usr/bin/env bash
# Session 8 probe 7 (issue 15): attention_combine with its first CU
# partials loaded once for both passes (-DCU=16 or 8), and the plain
# linear's tile at one batch row (-DLINEAR_T1=8, 12, 16 float4s a lane: a
# 3072-wide row in 3, 2 or 2 tiles); against .dev/run-before (68f0224).
# Carry .dev/run and .dev/run-before.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT
declare -A F=([def]="" [cu8]="-DCU=8" [t12]="-DLINEAR_T1=12" [t16]="-DLINEAR_T1=16")
for v in def cu8 t12 t16; do
  nvcc -ptx -arch=compute_90 -O3 ${F[$v]} -o $OUT/$v.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { echo "nvcc $v failed"; cat $OUT/nvcc.txt; exit 1; }
  nvcc -cubin -arch=sm_90 -O3 ${F[$v]} -Xptxas -v -o /tmp/$v.cubin kernels/kernels.cu > /tmp/ptxas-$v.txt 2>&1
  echo "== $v: $(grep -A4 -E "Compiling entry function '(linear|attention_combine)'" /tmp/ptxas-$v.txt | grep -oE "function '[a-z_]+'|Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
done
one() { timeout 150 "$@" --json 2>>$OUT/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]} check={r.get(\"check_max_abs_diff\")} ok={r.get(\"check_ok\")}')"; }
G="--workload gpt2-decode --steps 128"
SMALL="--workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001"
echo "check def b1: $(one .dev/run --ptx $OUT/def.ptx --workload gpt2-decode --batch 1 --steps 3 --check)"
echo "check def b8: $(one .dev/run --ptx $OUT/def.ptx --workload gpt2-decode --batch 8 --steps 3 --check)"
echo "check def kv8192 b1 (64 splits): $(one .dev/run --ptx $OUT/def.ptx --workload gpt2-decode --layers 2 --kv-len 8192 --batch 1 --steps 3 --check)"
echo "check t16 b1: $(one .dev/run --ptx $OUT/t16.ptx --workload gpt2-decode --batch 1 --steps 3 --check)"
echo "check t12 odd b1: $(one .dev/run --ptx $OUT/t12.ptx $SMALL --batch 1 --steps 3 --check)"
for rep in 1 2; do
  echo "b1 before: $(one .dev/run-before $G --batch 1)"
  for v in def cu8 t12 t16; do echo "b1 $v: $(one .dev/run --ptx $OUT/$v.ptx $G --batch 1)"; done
  echo "b8 before: $(one .dev/run-before $G --batch 8)"
  for v in def cu8; do echo "b8 $v: $(one .dev/run --ptx $OUT/$v.ptx $G --batch 8)"; done
done
echo "mlp before: $(one .dev/run-before --workload mlp --steps 1000)"
for v in def t16; do echo "mlp $v: $(one .dev/run --ptx $OUT/$v.ptx --workload mlp --steps 1000)"; done
