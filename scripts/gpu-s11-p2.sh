#!/usr/bin/env bash
# A record: linear_few_sk (and the --no-few-sk knob) it measured were reverted; see bench/results/h100-s11-probes.txt.
# Session 11 probe 2 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s11-p2.sh'
# with .dev carried (.dev/run: this tree). Builds kernels.cu with nvcc (13.0
# there) into $OUT, reads linear_few_sk's registers and SASS, checks it
# against the Go references, then times gpt2-decode replays at batch 1
# alternating: linear_few_sk for the MLP's second linear ('sk', LB6: 80
# registers, 768 blocks in one wave), linear_few there as before
# (--no-few-sk), linear_few_sk bounded for 4 blocks (-DFEW_SK_LB=4), and
# session 10's kernels and launches in this binary ('s10').
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/nvcc.txt
P=$OUT/kernels_90.ptx
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -o $P kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DFEW_SK_LB=4 -o /tmp/lb4.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
sha256sum kernels/kernels.cu >> $OUT/nvcc.txt
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/k.cubin kernels/kernels.cu 2>&1 | grep -A4 -E "entry function '(linear_ln1|linear_few_sk|linear_few)'" | grep -E "entry|Used|spill" | paste - - - | sed "s/ptxas info *://g" >> $OUT/nvcc.txt
for f in linear_few_sk linear_ln1; do
  echo "sass $f: $(cuobjdump -sass -fun $f /tmp/k.cubin | grep -oE 'LDG[.A-Z0-9]*|ACQBULK|SHFL|BAR.SYNC' | uniq -c | head -8 | tr -s ' \n' ' ')" >> $OUT/nvcc.txt
done
cat $OUT/nvcc.txt
. scripts/probe-lib.sh
R=".dev/run --ptx $P"
G="--workload gpt2-decode"
echo "== checks"
echo "check b1: $(one $R $G --batch 1 --steps 3 --check)"
echo "check w384 b1 (sk, half the lanes idle): $(one $R $G --layers 2 --width 384 --heads 6 --kv-len 512 --vocab 1001 --batch 1 --steps 5 --check)"
echo "check w1024 b1 (sk, two tiles a warp): $(one $R $G --layers 2 --width 1024 --heads 16 --kv-len 512 --vocab 1001 --batch 1 --steps 5 --check)"
echo "check compute_80 b1: $(one .dev/run --ptx $OUT/kernels.ptx $G --batch 1 --steps 3 --check)"
echo "check lb4 b1: $(one .dev/run --ptx /tmp/lb4.ptx $G --batch 1 --steps 3 --check)"
echo "== timing (replay us/step, 128 steps)"
b1() { one "$@" $G --batch 1 --steps 128; }
for rep in 1 2 3; do
  echo "b1 sk $(b1 $R) | few $(b1 $R --no-few-sk) | sk lb4 $(b1 .dev/run --ptx /tmp/lb4.ptx) | s10 $(b1 $R --no-few-sk --no-linear-ln1 --fc-grid 528)"
done
echo "b8 $(one $R $G --batch 8 --steps 128) | mlp $(one $R --workload mlp --steps 1000)"
