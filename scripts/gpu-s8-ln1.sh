#!/usr/bin/env bash
# A record of a session-8 measurement (bench/results/h100-s8-probes.txt): the
# LINEAR_LN_T1/LINEAR_LN_R1 defines it edits are not in kernels/kernels.cu
# (the variant was not landed).
# Session 8 (issue 15): linear_ln at one batch row with R rows a warp and T
# float4s a lane a tile (LINEAR_LN_R1, LINEAR_LN_T1 in kernels.cu: with R =
# 2 and T = 6 a warp loads both its rows of a 768-wide layer whole before
# it waits). Each variant is kernels.cu with those two defines edited,
# built to PTX here (its SHA-256 printed); the fastest at batch 1 is then
# run through scripts/gpu-floor.sh (CHECK=1, BEFORE=.dev/run-before: cmd/run
# of 8a74a96). Carry .dev/run and .dev/run-before.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT/src
best=; bestt=99999
one() { timeout 150 "$@" --json 2>>$OUT/log-ln1.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f}')"; }
for v in t8r1 t6r2 t6r1 t4r2; do
  T=${v:1:1}; R=${v:3:1}
  d=$OUT/src/$v; mkdir -p $d
  sed -e "s/^#define LINEAR_LN_T1 8$/#define LINEAR_LN_T1 $T/" -e "s/^#define LINEAR_LN_R1 1$/#define LINEAR_LN_R1 $R/" kernels/kernels.cu > $d/kernels.cu
  nvcc -ptx -arch=compute_90 -O3 -o $d/kernels_90.ptx $d/kernels.cu && nvcc -ptx -arch=compute_80 -O3 -o $d/kernels.ptx $d/kernels.cu || exit 1
  nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o $d/k.cubin $d/kernels.cu > $d/ptxas.txt 2>&1
  echo "== $v sha $(sha256sum $d/kernels.cu | cut -c1-64) linear_ln: $(grep -A4 "Compiling entry function 'linear_ln'" $d/ptxas.txt | grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ') pin: $(cuobjdump -sass -fun linear_ln $d/k.cubin | grep -oE 'LDG[.A-Z]*128|ACQBULK' | head -1)"; rm -f $d/k.cubin
done
for rep in 1 2; do
  echo "b1 before: $(one .dev/run-before --workload gpt2-decode --steps 128 --batch 1)"
  for v in t8r1 t6r2 t6r1 t4r2; do
    t=$(one .dev/run --ptx $OUT/src/$v/kernels_90.ptx --workload gpt2-decode --steps 128 --batch 1)
    echo "b1 $v: $t"
    [ $rep = 2 ] && python3 -c "import sys; sys.exit(0 if float('$t') < float('$bestt') else 1)" && { best=$v; bestt=$t; }
  done
done
echo "best: $best ($bestt)"
cp $OUT/src/$best/kernels.cu $OUT/src/$best/kernels.ptx $OUT/src/$best/kernels_90.ptx $OUT/
PTX=$OUT/src/$best/kernels_90.ptx CHECK=1 BEFORE=.dev/run-before bash scripts/gpu-floor.sh > $OUT/floor-stdout.txt 2>&1
tail -13 $OUT/floor-stdout.txt
