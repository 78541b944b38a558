#!/usr/bin/env bash
# Out of memory on a GPU, with PyTorch's allocator and with arenaplan's:
# bench/torch_oom.py's cases (past the device's capacity, after frees,
# accelerate's find_executable_batch_size, variable sizes near the limit),
# each in a fresh process; then the C fast path's alloc+free cost, against
# an earlier library when BEFORE names one (alternating, same run). Builds
# no Go: first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/{libarenaplan.so,abi_check}
#
# carry .dev/torch (and the BEFORE library's folder) to the GPU machine and
# run scripts/gpu-oom.sh. Logs and JSON go to $OUT (default /tmp/gpu-oom);
# the tables last.
set -u
OUT=${OUT:-/tmp/gpu-oom}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 bench/torch_oom.py --json-out "$OUT/oom.jsonl" ${OOM_ARGS:-} >"$OUT/oom.txt" 2>&1
echo "== alloc+free from C" >"$OUT/abi.txt"
for i in 1 2 3; do
	for lib in ${BEFORE:-} "$ARENAPLAN_LIB"; do
		echo "-- $lib" >>"$OUT/abi.txt"
		.dev/torch/abi_check "$lib" bench >>"$OUT/abi.txt" 2>&1
	done
done
sed -n '/^| case/,$p' "$OUT/oom.txt"
echo
grep -E '^--|legacy stream: |reports 0 captures' "$OUT/abi.txt"
