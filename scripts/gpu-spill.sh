#!/bin/bash
# spill-demo and the spillover conformance cases on a GPU machine. Build here
# (no Go is needed there), then run it there with .dev/spill carried:
#
#   mkdir -p .dev/spill && cp kernels/spill.cu .dev/spill/ && cp scripts/gpu-spill.sh .dev/spill/gpu.sh
#   CGO_ENABLED=0 go test -c -o .dev/spill/spill.test ./spill
#   CGO_ENABLED=0 go build -o .dev/spill/run ./cmd/run
#   # on the GPU machine, from the repository root, with OUT a writable folder:
#   bash .dev/spill/gpu.sh
cd .dev/spill || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc --version | tail -2
nvcc -ptx -arch=compute_80 -o $OUT/spill.ptx spill.cu && echo NVCC_OK
echo "== spill cases on the driver"
./spill.test -test.run 'GPUSpill' -test.v > $OUT/spill.log 2>&1; echo "spill.test rc=$?"
grep -E "^(\s*--- |ok|FAIL|PASS)|SPILL|no CUDA" $OUT/spill.log | head -40
echo "== run spill-demo"
for a in "--iters 100" "--iters 100 --no-capture-reuse" "--iters 1000" "--iters 1000 --no-capture-reuse" \
         "--iters 100 --join-every 4" "--iters 100 --join-every 4 --no-capture-reuse" \
         "--iters 100 --width 524288" "--iters 100 --width 524288 --no-capture-reuse"; do
  echo "ARGS $a"; ./run --workload spill-demo $a --steps 50 --json --check; echo "rc=$?"
done | tee $OUT/run.jsonl
echo "== nvcc PTX"
ARENAPLAN_TUNE=spill_ptx=$OUT/spill.ptx ./run --workload spill-demo --iters 100 --steps 20 --json --check; echo "rc=$?"
echo "== memcheck"
compute-sanitizer --tool memcheck --print-limit 20 ./run --workload spill-demo --iters 50 --steps 3 --warmup 1 2>&1 | tail -25
compute-sanitizer --tool memcheck --print-limit 20 ./run --workload spill-demo --iters 50 --steps 3 --warmup 1 --no-capture-reuse 2>&1 | tail -4
