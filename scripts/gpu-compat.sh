#!/usr/bin/env bash
# arenaplan as a drop-in for PyTorch's allocator, on a GPU, each against
# PyTorch's own allocator in another process: bench/torch_compat.py (memory
# statistics, snapshots and memory_viz, transformers' Trainer, Lightning's
# DeviceStatsMonitor, a vLLM-style start-up profile, torch.compile's
# CUDAGraph Trees refused); bench/torch_mempool.py (a MemPool over a
# pluggable allocator, as torch_memory_saver and vLLM make it); every
# example of python/examples;
# bench/torch_oom.py (past the device's capacity,
# after frees, accelerate's find_executable_batch_size, variable sizes near
# the limit, each case in a fresh process); then the C fast path's
# alloc+free cost, against an earlier library when BEFORE names one
# (alternating, same run). Builds no Go: first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/{libarenaplan.so,abi_check}
#
# copy .dev/torch (and the BEFORE library's folder) to the GPU machine and
# run scripts/gpu-compat.sh. Logs and JSON go to $OUT (default
# /tmp/gpu-compat), with a memory snapshot of the compatibility program
# (snapshot-{torch,ours}.pickle, for torch.cuda._memory_viz); the tables last.
set -u
OUT=${OUT:-/tmp/gpu-compat}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
SNAPSHOT_OUT=$OUT/snapshot python3 bench/torch_compat.py --json-out "$OUT/compat.jsonl" >"$OUT/compat.txt" 2>&1
for ex in python/examples/*.py; do # each in a fresh process, as a user runs it
	echo "== $ex" >>"$OUT/examples.txt"
	PYTHONPATH=python timeout 240 python3 "$ex" >>"$OUT/examples.txt" 2>&1 && echo "ok   $ex" >>"$OUT/examples-summary.txt" ||
		echo "FAIL $ex ($?)" >>"$OUT/examples-summary.txt"
done
timeout 300 python3 bench/torch_mempool.py >"$OUT/mempool.txt" 2>>"$OUT/log.txt" || echo "mempool FAILED ($?)" >>"$OUT/mempool.txt"
[ -n "${SKIP_OOM:-}" ] || python3 bench/torch_oom.py --json-out "$OUT/oom.jsonl" ${OOM_ARGS:-} >"$OUT/oom.txt" 2>&1
echo "== alloc+free from C" >"$OUT/abi.txt"
for i in $(seq "${ABI_REPS:-3}"); do
	for lib in ${BEFORE:-} "$ARENAPLAN_LIB"; do
		echo "-- $lib" >>"$OUT/abi.txt"
		.dev/torch/abi_check "$lib" bench >>"$OUT/abi.txt" 2>&1
	done
done
sed -n '/^| call/,$p' "$OUT/compat.txt"
echo
cat "$OUT/mempool.txt"
echo
cat "$OUT/examples-summary.txt"
echo
sed -n '/^| case/,$p' "$OUT/oom.txt"
echo
grep -E '^--|legacy stream: |reports 0 captures' "$OUT/abi.txt"
