#!/usr/bin/env bash
# A record: linear_ln_few and --no-linear-ln-few are no longer in the tree
# (measured neutral here; h100-s10-probes.txt).
# Session 10 probe 2 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s10-p2.sh'
# with .dev carried (.dev/run: this tree). Builds kernels.cu with nvcc (13.0
# there) into $OUT, checks linear_few and linear_ln_few (--check, replay =
# eager), then times gpt2-decode replays alternating: linear_ln_few on and
# off, linear_ln's grid, linear_ln_few's launch bound (-DLINEAR_LN_FEW_LB=4),
# linear_few's grid.
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/nvcc.txt
P=$OUT/kernels_90.ptx
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -o $P kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DLINEAR_LN_FEW_LB=4 -o /tmp/lb4.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
sha256sum kernels/kernels.cu >> $OUT/nvcc.txt
for d in "" -DLINEAR_LN_FEW_LB=4; do
  nvcc -cubin -arch=sm_90 -O3 -Xptxas -v $d -o /tmp/k.cubin kernels/kernels.cu 2>&1 | grep -A2 -E "entry function '(linear_few|linear_ln_few|linear_ln)'" | grep -E "entry|Used|spill" | paste - - - | sed "s/ptxas info *://g; s/^/$d /"
done >> $OUT/nvcc.txt
nvcc -cubin -arch=sm_90 -O3 -o /tmp/k.cubin kernels/kernels.cu
for fn in linear_few linear_ln_few; do
  echo "pin $fn: $(cuobjdump -sass -fun "$fn" /tmp/k.cubin | grep -oE 'LDGSTS[.A-Z]*128|LDG[.A-Z]*128|ACQBULK' | head -2 | tr '\n' ' ')"
done >> $OUT/nvcc.txt
cat $OUT/nvcc.txt
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); c=r.get('check_max_abs_diff'); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL') + ('' if c is None else f' check {c:.3g} ok={r.get(\"check_ok\")}'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 90 "$@" --json 2>>$OUT/err.txt | js; }
R=".dev/run --ptx $P"
G="--workload gpt2-decode"
echo "== checks"
for b in 1 2; do echo "check b$b: $(one $R $G --batch $b --steps 3 --check)"; done
echo "check small b2: $(one $R $G --layers 2 --width 256 --heads 4 --kv-len 1024 --vocab 1001 --batch 2 --steps 5 --check)"
echo "check compute_80 b1: $(one .dev/run --ptx $OUT/kernels.ptx $G --batch 1 --steps 3 --check)"
echo "== timing (replay us/step, 128 steps)"
b1() { one "$@" $G --batch 1 --steps 128; }
for rep in 1 2; do
  echo "b1 new $(b1 $R) | no-ln-few $(b1 $R --no-linear-ln-few) | no-few $(b1 $R --no-linear-few) | ln-few LB4 $(b1 .dev/run --ptx /tmp/lb4.ptx)"
  echo "b1 ln-grid 528 $(b1 $R --linear-ln-grid 528) | 594 $(b1 $R --linear-ln-grid 594) | 396 $(b1 $R --linear-ln-grid 396) | linear-grid 96 $(b1 $R --linear-grid 96)"
  echo "b2 new $(one $R $G --batch 2 --steps 128) | no-few $(one $R $G --batch 2 --steps 128 --no-linear-few) | b8 new $(one $R $G --batch 8 --steps 128) | mlp new $(one $R --workload mlp --steps 1000)"
done
