#!/usr/bin/env bash
# A record: the coherent loads it measured were not landed (slower); see bench/results/h100-s11-probes.txt.
# Session 11 probe 3 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s11-p3.sh'
# with .dev carried (.dev/run: this tree's cmd/run). The linears read their
# activations after griddepcontrol.wait coherently (ld.cg), and their
# weights' first tile and bias before it, where they had used __ldg. Times
# the committed PTX ('old', kernels/kernels_90.ptx) against this tree's
# ('new', built here by nvcc 13.0) alternating, three times, at batch 1, 2
# and 8 and mlp, then runs gpu-floor.sh COMPILE=1 CHECK=1 (the new PTX).
# The rule, fixed before the run: land 'new' if its median is at most the
# old one's + 1.0 us in every case.
set -u
mkdir -p $OUT/new
N=$OUT/new/kernels_90.ptx
nvcc -ptx -arch=compute_90 -O3 -o $N kernels/kernels.cu || exit 1
. scripts/probe-lib.sh
G="--workload gpt2-decode --steps 128"
for rep in 1 2 3; do
  echo "b1 old $(one .dev/run --ptx kernels/kernels_90.ptx $G --batch 1) | new $(one .dev/run --ptx $N $G --batch 1) | b2 old $(one .dev/run --ptx kernels/kernels_90.ptx $G --batch 2) | new $(one .dev/run --ptx $N $G --batch 2) | b8 old $(one .dev/run --ptx kernels/kernels_90.ptx $G --batch 8) | new $(one .dev/run --ptx $N $G --batch 8) | mlp old $(one .dev/run --ptx kernels/kernels_90.ptx --workload mlp --steps 1000) | new $(one .dev/run --ptx $N --workload mlp --steps 1000)"
done | tee $OUT/probe.txt
COMPILE=1 CHECK=1 REPS=2 OUT=$OUT/floor timeout 400 bash scripts/gpu-floor.sh > $OUT/floor-stdout.txt 2>&1
cmp $OUT/floor/kernels_90.ptx $N && echo "floor PTX = probe PTX"
grep -E "pdl pin|check-|sanitizer " $OUT/floor-stdout.txt | grep -v "^== "
tail -4 $OUT/floor-stdout.txt
