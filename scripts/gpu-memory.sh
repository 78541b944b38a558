#!/usr/bin/env bash
# Does installing arenaplan ever raise a program's memory? Every workload of
# bench/torch_memory.py on a GPU in each mode: arenaplan installed (ours),
# reduce-overhead on PyTorch's allocator (ro), torch.compile without graphs
# (plain, compiled workloads only), one process each (the allocator is
# process-wide, and the whole process's memory is measured). Builds no Go:
# first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/libarenaplan.so
#
# copy .dev/torch to the GPU machine beside the checkout, then run this.
# WORKLOADS= (space-separated, default all), MODES= (default "ro plain ours"),
# TIMEOUT= seconds a process (default 150), DEADLINE= seconds after which no
# process starts (default 540), so that the table comes. The modes share one
# inductor cache, filled first by a process of plain compile per compiled
# workload whose row is not kept (WARM=0 skips it; WARMJOBS= how many run
# at once, default 4): a cold cache autotunes,
# which takes time and memory of its own (a buffer that clears the L2
# cache), and would count against whichever mode ran first. JSON lines go to
# $OUT/results.jsonl (default OUT=/tmp/gpu-memory; a later run's row of a
# workload and mode replaces an earlier one in the table), logs to
# $OUT/log.txt; the table last (also $OUT/summary.txt). SNAPSHOT=1 also
# dumps a memory snapshot of each process's first three steps
# ($OUT/snapshot-MODE-WORKLOAD.pickle, for memory_viz).
set -u
OUT=${OUT:-/tmp/gpu-memory}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/arenaplan-inductor-cache}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
WORKLOADS=${WORKLOADS:-gpt2-prefill convnext bert3 t5enc breaks resnet18-train llama-train graphs sleep eager}
MODES=${MODES:-ro plain ours}
# one MODE WORKLOAD [FILE]: a process, unless the deadline passed; its row to
# FILE (default results.jsonl)
one() {
	if [ "$SECONDS" -ge "${DEADLINE:-540}" ]; then echo "SKIPPED $1 $2 (deadline)" | tee -a "$OUT/log.txt"; return; fi
	echo "== $1 $2 $(date +%T)" | tee -a "$OUT/log.txt"
	local snap=()
	[ "${SNAPSHOT:-0}" = 1 ] && [ -z "${3:-}" ] && snap=(--snapshot "$OUT/snapshot-$1-$2.pickle")
	timeout "${TIMEOUT:-150}" python3 bench/torch_memory.py --mode "$1" --workload "$2" "${snap[@]}" \
		>>"$OUT/${3:-results.jsonl}" 2>>"$OUT/log.txt" || echo "FAILED $1 $2 ($?)" | tee -a "$OUT/log.txt"
}
if [ "${WARM:-1}" = 1 ]; then
	# The cache-filling processes, WARMJOBS (default 4) at a time: their
	# rows are not kept, so sharing the device costs them nothing.
	for w in $WORKLOADS; do
		while [ "$(jobs -r | wc -l)" -ge "${WARMJOBS:-4}" ]; do wait -n; done
		one plain "$w" warm.jsonl &
	done
	wait
fi
for w in $WORKLOADS; do
	for m in $MODES; do
		one "$m" "$w"
	done
done
[ -s "$OUT/results.jsonl" ] && python3 bench/torch_memory.py --summary "$OUT/results.jsonl" | tee "$OUT/summary.txt"
exit 0
