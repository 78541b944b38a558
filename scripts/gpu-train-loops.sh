#!/usr/bin/env bash
# Training loops as people write them (bench/torch_train_loops.py) on a GPU,
# three ways: the reference (arenaplan's backend, capture off) first, alone,
# so that inductor's autotuned kernel configurations land in the cache the
# other two read (configurations picked by timing would otherwise differ
# between processes, and the sums with them); then arenaplan's graphs and
# reduce-overhead. Builds no Go: first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/libarenaplan.so
#
# copy .dev/torch to the GPU machine beside the checkout, then run this.
# LOOPS= (comma-separated, default all), STEPS= (default 30), PAR=1 runs
# ours and reduce-overhead side by side (faster; their step times then
# mean nothing), PER=1 runs each loop in a process of its own (memory
# figures per loop), TIMEOUT= seconds a process (default 400). Logs, JSON
# lines and states go to $OUT (default /tmp/gpu-train-loops); the table last.
set -u
OUT=${OUT:-/tmp/gpu-train-loops}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/arenaplan-inductor-cache}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
ALL=${LOOPS:-resnet-bn,mlp-dropout,whole-step,accum,gpt2-bf16,gpt2-fp16-scaler,bert-clip,train-eval,zero-keep}
STEPS=${STEPS:-30}
# mode LOOPS: one process (or one a loop with PER=1)
mode() {
	local m=$1 l
	if [ "${PER:-0}" = 1 ]; then
		for l in ${2//,/ }; do
			timeout "${TIMEOUT:-400}" python3 bench/torch_train_loops.py --mode "$m" --loops "$l" --steps "$STEPS" \
				--out "$OUT" >>"$OUT/$m.jsonl" 2>>"$OUT/$m.log" || echo "FAILED $m $l ($?)" | tee -a "$OUT/$m.log"
		done
	else
		timeout "${TIMEOUT:-400}" python3 bench/torch_train_loops.py --mode "$m" --loops "$2" --steps "$STEPS" \
			--out "$OUT" >>"$OUT/$m.jsonl" 2>>"$OUT/$m.log" || echo "FAILED $m ($?)" | tee -a "$OUT/$m.log"
	fi
	echo "== $m done $(date +%T)"
}
echo "== ref $(date +%T)"
mode ref "$ALL"
if [ "${PAR:-0}" = 1 ]; then
	mode ours "$ALL" &
	mode ro "$ALL" &
	wait
else
	mode ours "$ALL"
	mode ro "$ALL"
fi
python3 bench/torch_train_loops.py --summary "$OUT" | tee "$OUT/summary.txt"
exit 0
