#!/usr/bin/env bash
# Training loops as people write them (bench/torch_train_loops.py) on a GPU,
# three ways, each loop in a process of its own. First the reference
# (arenaplan's backend, capture off), its loops in three groups side by side
# (loops of one group share kernels and run in turn), so that inductor's
# autotuned kernel configurations land in the cache the other two read
# (configurations picked by timing would otherwise differ between
# processes, and the sums with them); then, one process at a time, each
# loop with arenaplan's graphs and with reduce-overhead, so that their step
# times compare. Builds no Go: first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/libarenaplan.so
#
# copy .dev/torch to the GPU machine beside the checkout, then run this.
# LOOPS= (space-separated, default all), STEPS= (default 30), REPEAT=
# processes a loop and mode (default 1; the table takes the median of their
# step times: two processes of one mode differ by up to 30% on a host-bound
# step), TIMEOUT=
# seconds a process (default 150), DEADLINE= seconds after which no process
# starts (default 540), so that the table comes. Logs, JSON lines and states
# go to $OUT (default /tmp/gpu-train-loops); the table last.
set -u
OUT=${OUT:-/tmp/gpu-train-loops}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/arenaplan-inductor-cache}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
LOOPS=${LOOPS:-mlp-dropout whole-step accum train-eval zero-keep resnet-bn bert-clip gpt2-bf16 gpt2-fp16-scaler}
STEPS=${STEPS:-30}
GPUS=${GPUS:-1}
read -r -a DEVICES <<<"$(echo "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((GPUS - 1)))}" | tr , ' ')"
if [ "${#DEVICES[@]}" -lt "$GPUS" ]; then echo "GPUS=$GPUS but ${#DEVICES[@]} GPUs visible" >&2; exit 2; fi
CPUS=$(nproc)
# on G CMD...: CMD on the G-th GPU (of GPUS) and its share of the CPUs
on() {
	local g=$1
	shift
	if [ "$GPUS" -le 1 ]; then "$@"; return; fi
	local per=$((CPUS / GPUS))
	if [ "$per" -lt 1 ]; then CUDA_VISIBLE_DEVICES=${DEVICES[$g]} "$@"; return; fi
	CUDA_VISIBLE_DEVICES=${DEVICES[$g]} taskset -c "$((g * per))-$((g * per + per - 1))" "$@"
}
# one MODE LOOP [G]: a process (on the G-th GPU), unless the deadline passed
one() {
	if [ "$SECONDS" -ge "${DEADLINE:-540}" ]; then echo "SKIPPED $1 $2 (deadline)" | tee -a "$OUT/$1.log"; return; fi
	on "${3:-0}" timeout "${TIMEOUT:-150}" python3 bench/torch_train_loops.py --mode "$1" --loops "$2" --steps "$STEPS" \
		--out "$OUT" >>"$OUT/$1-$2.jsonl" 2>>"$OUT/$1.log" || echo "FAILED $1 $2 ($?)" | tee -a "$OUT/$1.log"
}
# group G LOOP...: the reference's loops that share kernels, in turn, on the G-th GPU
group() {
	local g=$1 l
	shift
	for l in "$@"; do
		case " $LOOPS " in *" $l "*) one ref "$l" "$g" ;; esac
	done
}
if [ "${REF:-1}" != 0 ]; then
	echo "== ref $(date +%T)"
	group 0 mlp-dropout whole-step accum train-eval zero-keep &
	group $((1 % GPUS)) resnet-bn bert-clip &
	group $((2 % GPUS)) gpt2-bf16 gpt2-fp16-scaler &
	wait
fi
# timed G: the G-th GPU's loops, each with arenaplan's graphs and with
# reduce-overhead in turn, REPEAT rounds
timed() {
	local g=$1 k l i
	for k in $(seq "${REPEAT:-1}"); do
		i=0
		for l in $LOOPS; do
			if [ $((i % GPUS)) -eq "$g" ]; then
				echo "== $l $(date +%T) ($k)"
				one ours "$l" "$g"
				one ro "$l" "$g"
			fi
			i=$((i + 1))
		done
	done
}
for g in $(seq 0 $((GPUS - 1))); do
	timed "$g" &
done
wait
cat "$OUT"/*-*.jsonl >"$OUT/all.jsonl.txt" 2>/dev/null
python3 bench/torch_train_loops.py --summary "$OUT" | tee "$OUT/summary.txt"
exit 0
