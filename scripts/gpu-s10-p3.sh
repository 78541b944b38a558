#!/usr/bin/env bash
# Session 10 probe 3 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s10-p3.sh'
# with .dev carried (.dev/run: this tree). Builds kernels.cu with nvcc (13.0
# there) into $OUT, checks linear_few (one row at a time now), then times
# gpt2-decode replays at batch 1 alternating: linear_few's launch bound
# (-DLINEAR_FEW_LB), linear_ln's tile at one batch row (-DLINEAR_LN_T1), and,
# to see where the step goes, the logits taken out (--vocab 1000) and half
# the layers.
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/nvcc.txt
P=$OUT/kernels_90.ptx
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -o $P kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
for d in -DLINEAR_FEW_LB=5 -DLINEAR_FEW_LB=6 -DLINEAR_LN_T1=6 -DLINEAR_LN_T1=4; do
  nvcc -ptx -arch=compute_90 -O3 $d -o /tmp/v$d.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
done
sha256sum kernels/kernels.cu >> $OUT/nvcc.txt
for d in "" -DLINEAR_FEW_LB=5 -DLINEAR_FEW_LB=6 -DLINEAR_LN_T1=6; do
  nvcc -cubin -arch=sm_90 -O3 -Xptxas -v $d -o /tmp/k.cubin kernels/kernels.cu 2>&1 | grep -A4 -E "entry function '(linear_few|linear_ln)'" | grep -E "entry|Used|spill" | paste - - - | sed "s/ptxas info *://g; s/^/$d /"
done >> $OUT/nvcc.txt
nvcc -cubin -arch=sm_90 -O3 -o /tmp/k.cubin kernels/kernels.cu
echo "pin linear_few: $(cuobjdump -sass -fun linear_few /tmp/k.cubin | grep -oE 'LDG[.A-Z]*128|ACQBULK' | head -2 | tr '\n' ' ')" >> $OUT/nvcc.txt
cat $OUT/nvcc.txt
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); c=r.get('check_max_abs_diff'); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL') + ('' if c is None else f' check {c:.3g} ok={r.get(\"check_ok\")}'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 90 "$@" --json 2>>$OUT/err.txt | js; }
R=".dev/run --ptx $P"
G="--workload gpt2-decode"
echo "== checks"
echo "check b1: $(one $R $G --batch 1 --steps 3 --check)"
echo "check small b1: $(one $R $G --layers 2 --width 256 --heads 4 --kv-len 1024 --vocab 1001 --batch 1 --steps 5 --check)"
echo "check LN_T1=6 b1: $(one .dev/run --ptx /tmp/v-DLINEAR_LN_T1=6.ptx $G --batch 1 --steps 3 --check)"
echo "== timing (replay us/step, 128 steps)"
b1() { one "$@" $G --batch 1 --steps 128; }
for rep in 1 2; do
  echo "b1 new $(b1 $R) | no-few $(b1 $R --no-linear-few) | few LB5 $(b1 .dev/run --ptx /tmp/v-DLINEAR_FEW_LB=5.ptx) | few LB6 $(b1 .dev/run --ptx /tmp/v-DLINEAR_FEW_LB=6.ptx)"
  echo "b1 ln T1=6 $(b1 .dev/run --ptx /tmp/v-DLINEAR_LN_T1=6.ptx) | ln T1=4 $(b1 .dev/run --ptx /tmp/v-DLINEAR_LN_T1=4.ptx) | vocab 1000 $(b1 $R --vocab 1000) | 6 layers $(b1 $R --layers 6) | 6 layers vocab 1000 $(b1 $R --layers 6 --vocab 1000)"
done
echo "b2 new $(one $R $G --batch 2 --steps 128) | b8 new $(one $R $G --batch 8 --steps 128) | mlp new $(one $R --workload mlp --steps 1000) | mlp no-few $(one $R --workload mlp --steps 1000 --no-linear-few)"
