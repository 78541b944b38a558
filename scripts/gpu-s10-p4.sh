#!/usr/bin/env bash
# A record: the TILE6/FEW_TILE6 macros (six_fits) are no longer in kernels.cu
# (measured slower here; h100-s10-probes.txt).
# Session 10 probe 4 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s10-p4.sh'
# with .dev carried (.dev/run: this tree). Builds kernels.cu with nvcc (13.0
# there) into $OUT, checks the tiles of 6 (--check at widths 768 and 384),
# then times gpt2-decode replays at batch 1 alternating: tiles of 6 in
# linear_ln and linear_few (default), in linear_ln only (-DFEW_TILE6=0), in
# neither (-DTILE6=0); attention splits (--attention-blocks) and linear_ln's
# grid with the default kernels.
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/nvcc.txt
P=$OUT/kernels_90.ptx
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -o $P kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DFEW_TILE6=0 -o /tmp/few0.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DTILE6=0 -o /tmp/t0.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
sha256sum kernels/kernels.cu >> $OUT/nvcc.txt
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/k.cubin kernels/kernels.cu 2>&1 | grep -A4 -E "entry function '(linear_few|linear_ln)'" | grep -E "entry|Used|spill" | paste - - - | sed "s/ptxas info *://g" >> $OUT/nvcc.txt
for fn in linear_few linear_ln; do echo "pin $fn: $(cuobjdump -sass -fun $fn /tmp/k.cubin | grep -oE 'LDG[.A-Z]*128|ACQBULK' | head -2 | tr '\n' ' ')"; done >> $OUT/nvcc.txt
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
echo "check width 384 b1: $(one $R $G --layers 2 --width 384 --heads 6 --kv-len 1024 --vocab 1001 --batch 1 --steps 5 --check)"
echo "check width 1024 b1: $(one $R $G --layers 2 --width 1024 --heads 16 --kv-len 512 --vocab 999 --batch 1 --steps 5 --check)"
echo "== timing (replay us/step, 128 steps)"
b1() { one "$@" $G --batch 1 --steps 128; }
for rep in 1 2; do
  echo "b1 tile6 both $(b1 $R) | ln only $(b1 .dev/run --ptx /tmp/few0.ptx) | neither $(b1 .dev/run --ptx /tmp/t0.ptx) | attn-blocks 96 $(b1 $R --attention-blocks 96) | 144 $(b1 $R --attention-blocks 144)"
  echo "b1 ln-grid 528 $(b1 $R --linear-ln-grid 528) | 396 $(b1 $R --linear-ln-grid 396) | 594 $(b1 $R --linear-ln-grid 594)"
done
echo "b2 $(one $R $G --batch 2 --steps 128) | b8 $(one $R $G --batch 8 --steps 128) | mlp $(one $R --workload mlp --steps 1000)"
