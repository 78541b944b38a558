#!/usr/bin/env bash
# torch.compile(backend="arenaplan") against torch.compile(mode="reduce-overhead")
# on a GPU: every model of bench/torch_compile.py in both modes, one process
# each (the allocator is process-wide), reduce-overhead first. Builds no Go:
# first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/libarenaplan.so
#
# copy .dev/torch to the GPU machine beside the checkout and run scripts/gpu-compile.sh.
# MODELS= (default: tiny tiny-dyn vit bert), TRAIN= the training models of
# bench/torch_compile_train.py (default: mlp mlp-last gpt2 vit gpt2-eff), MODES= (reduce-overhead ours),
# TIMEOUT= seconds a process (default 240), DEADLINE= seconds after which no
# process starts and none runs on (default 480), so that the table comes;
# WARM=1 runs each process once first, its output dropped, so that both
# modes compile from a warm inductor cache (the modes' graph keys differ:
# without it the first mode compiles cold). Both modes share one cache, so
# that the second takes the kernels' autotuned launch configurations the
# first chose: configurations picked by timing sum in other orders, and
# the outputs would differ in the last bits. Logs and JSON go to $OUT
# (default /tmp/gpu-compile); the table last.
set -u
OUT=${OUT:-/tmp/gpu-compile}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/arenaplan-inductor-cache}
SAVE=/tmp/arenaplan-compile-outputs
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$OUT/gpu.txt"
# each SCRIPT JSONL LABEL MODEL...: every model in every mode, one process
# each, until the deadline.
each() {
	local script=$1 jsonl=$2 label=$3 m mode left t
	shift 3
	for m in "$@"; do
		for mode in ${MODES:-reduce-overhead ours}; do
			left=$((${DEADLINE:-480} - SECONDS))
			if [ $left -lt 20 ]; then echo "SKIPPED $mode $label$m (deadline)" | tee -a "$OUT/log.txt"; continue; fi
			t=${TIMEOUT:-240}; [ $t -gt $left ] && t=$left
			echo "== $mode $label$m $(date +%T) (timeout $t s)" | tee -a "$OUT/log.txt"
			if [ "${WARM:-0}" = 1 ]; then
				timeout $t python3 "$script" --mode $mode --model $m \
					--save "$SAVE-warm" >/dev/null 2>>"$OUT/log.txt" || echo "FAILED warm-up $mode $label$m ($?)" | tee -a "$OUT/log.txt"
				left=$((${DEADLINE:-480} - SECONDS))
				[ $t -gt $left ] && t=$left
				[ $t -ge 20 ] || { echo "SKIPPED $mode $label$m (deadline)" | tee -a "$OUT/log.txt"; continue; }
			fi
			timeout $t python3 "$script" --mode $mode --model $m --save $SAVE \
				>>"$OUT/$jsonl" 2>>"$OUT/log.txt" || echo "FAILED $mode $label$m ($?)" | tee -a "$OUT/log.txt"
			tail -c 600 "$OUT/$jsonl" | tail -1 | cut -c1-400
		done
	done
}
# shellcheck disable=SC2086 # the model lists split on spaces
each bench/torch_compile.py results.jsonl "" ${MODELS-tiny tiny-dyn vit bert}
# shellcheck disable=SC2086
each bench/torch_compile_train.py train.jsonl "train " ${TRAIN-mlp mlp-last gpt2 vit gpt2-eff}
[ -s "$OUT/results.jsonl" ] && python3 bench/torch_compile.py --summary "$OUT/results.jsonl" --save $SAVE | tee "$OUT/summary.txt"
[ -s "$OUT/train.jsonl" ] && python3 bench/torch_compile_train.py --summary "$OUT/train.jsonl" --save $SAVE | tee "$OUT/train-summary.txt"
exit 0
