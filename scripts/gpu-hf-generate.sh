#!/usr/bin/env bash
# Hugging Face generate with a static cache (bench/torch_hf_generate.py) on
# a GPU, unmodified, three ways, a process each: reduce-overhead on
# PyTorch's allocator, arenaplan installed (the same program: its
# reduce-overhead compile lands on arenaplan's backend), and eager. Builds
# no Go: first, where Go is,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/libarenaplan.so
#
# copy .dev/torch to the GPU machine beside the checkout, then run this.
# MODELS= (default: gpt2 llama), NEW= new tokens a call (default: 64 256),
# MODES= (default: ro ours eager; plain: generate's compile without graphs on
# PyTorch's allocator, the tokens' reference),
# REPS= timed calls after the first three (default 5; each call makes a new
# static cache, so more than five reach past max_shapes members),
# TIMEOUT= seconds a process (default 240), PROFILE=1 (each first call's
# cProfile by cumulative time and the timed calls' by own time, in
# $OUT/profile-*.txt; the profiler slows the timed calls), ROUNDS= times
# the whole sequence runs, the modes in turn (default 1; the table takes
# the median of a mode's processes), PIN= CPUs every process runs on
# (taskset -c, e.g. 2-5: processes of one mode then vary less). Logs and
# JSON lines go to $OUT (default /tmp/gpu-hf-generate); the table last.
set -u
OUT=${OUT:-/tmp/gpu-hf-generate}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/arenaplan-inductor-cache}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
pin=()
if [ -n "${PIN:-}" ]; then pin=(taskset -c "$PIN"); fi
for round in $(seq "${ROUNDS:-1}"); do
	for m in ${MODELS:-gpt2 llama}; do
		for n in ${NEW:-64 256}; do
			for mode in ${MODES:-ro ours eager}; do
				echo "== $mode $m $n round $round $(date +%T)"
				timeout "${TIMEOUT:-240}" "${pin[@]}" python3 bench/torch_hf_generate.py --mode $mode --model $m --new $n \
					--reps "${REPS:-5}" ${PROFILE:+--profile} --out "$OUT" >>"$OUT/results.jsonl" 2>>"$OUT/log.txt" ||
					echo "FAILED $mode $m $n ($?)" | tee -a "$OUT/log.txt"
			done
		done
	done
done
python3 bench/torch_hf_generate.py --summary "$OUT/results.jsonl" --out "$OUT" | tee "$OUT/summary.txt"
exit 0
