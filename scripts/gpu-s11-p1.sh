#!/usr/bin/env bash
# Session 11 probe 1 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s11-p1.sh'
# with .dev carried (.dev/run: this tree). Builds kernels.cu with nvcc (13.0
# there) into $OUT, reads linear_ln1's registers and SASS (its weight loads
# before the wait, its input loads after), checks it against the Go
# references, then times gpt2-decode replays at batch 1 alternating:
# linear_ln1 for every layer-norm linear at batch 1 ('ln1'), linear_ln as
# before ('ln', --no-linear-ln1), linear_ln1 but not for the logits, and
# the QKV and MLP-in grids.
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/nvcc.txt
P=$OUT/kernels_90.ptx
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -o $P kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
sha256sum kernels/kernels.cu >> $OUT/nvcc.txt
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/k.cubin kernels/kernels.cu 2>&1 | grep -A4 -E "entry function '(linear_ln1|linear_ln|linear_few)'" | grep -E "entry|Used|spill" | paste - - - | sed "s/ptxas info *://g" >> $OUT/nvcc.txt
for f in linear_ln1 linear_ln linear_few attention_part; do
  echo "sass $f: $(cuobjdump -sass -fun $f /tmp/k.cubin | grep -oE 'LDG[.A-Z0-9]*|ACQBULK|SHFL' | uniq -c | head -8 | tr -s ' \n' ' ')" >> $OUT/nvcc.txt
done
cat $OUT/nvcc.txt
. scripts/probe-lib.sh
R=".dev/run --ptx $P"
G="--workload gpt2-decode"
echo "== checks"
echo "check b1: $(one $R $G --batch 1 --steps 3 --check)"
echo "check w256 b1 (X=2): $(one $R $G --layers 2 --width 256 --heads 4 --kv-len 512 --vocab 1001 --batch 1 --steps 5 --check)"
echo "check w384 b1 (X=4 with idle lanes): $(one $R $G --layers 2 --width 384 --heads 6 --kv-len 512 --vocab 1001 --batch 1 --steps 5 --check)"
echo "check w1024 b1 (linear_ln): $(one $R $G --layers 2 --width 1024 --heads 16 --kv-len 512 --vocab 1001 --batch 1 --steps 5 --check)"
echo "check compute_80 b1: $(one .dev/run --ptx $OUT/kernels.ptx $G --batch 1 --steps 3 --check)"
echo "check b2: $(one $R $G --batch 2 --steps 3 --check)"
echo "== timing (replay us/step, 128 steps)"
b1() { one "$@" $G --batch 1 --steps 128; }
for rep in 1 2; do
  echo "b1 ln1 $(b1 $R) | ln $(b1 $R --no-linear-ln1) | ln1 not logits $(b1 $R --ln1-only qkv,fc+) | ln1 logits only $(b1 $R --ln1-only logits)"
  echo "b1 ln1 qkv-grid 528 $(b1 $R --qkv-grid 528) | 396 $(b1 $R --qkv-grid 396) | fc-grid 462 $(b1 $R --fc-grid 462) | both 528 $(b1 $R --qkv-grid 528 --fc-grid 528)"
done
echo "b8 $(one $R $G --batch 8 --steps 128) | mlp $(one $R --workload mlp --steps 1000)"
