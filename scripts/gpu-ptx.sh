#!/bin/bash
# Rebuild the committed PTX from the CUDA sources on a GPU machine (it has
# nvcc; Go is not needed), and the record that ties them together:
#
#   OUT=/some/dir scripts/gpu-ptx.sh      (from the repository root)
#   cp $OUT/kernels.ptx $OUT/kernels_90.ptx $OUT/spill.ptx $OUT/ptx.sum kernels/
#
# then commit the four files together: kernels/ptxsum_test.go fails when a
# source's SHA-256 differs from ptx.sum's, that is when kernels.cu or
# spill.cu changed without their PTX.
set -euo pipefail
OUT=${OUT:-/tmp/ptx}
mkdir -p "$OUT"
cd kernels
nvcc --version | tail -2
nvcc -ptx -arch=compute_80 -O3 -o "$OUT/kernels.ptx" kernels.cu
nvcc -ptx -arch=compute_90 -O3 -o "$OUT/kernels_90.ptx" kernels.cu
nvcc -ptx -arch=compute_80 -o "$OUT/spill.ptx" spill.cu
{
	sed -n '/^#/p' ptx.sum
	echo "$(sha256sum kernels.cu | cut -d' ' -f1)  kernels.cu  kernels.ptx kernels_90.ptx"
	echo "$(sha256sum spill.cu | cut -d' ' -f1)  spill.cu  spill.ptx"
} >"$OUT/ptx.sum"
for f in kernels.ptx kernels_90.ptx spill.ptx; do
	if cmp -s "$OUT/$f" "$f"; then echo "$f: unchanged"; else echo "$f: CHANGED (commit $OUT/$f)"; fi
done
cat "$OUT/ptx.sum"
