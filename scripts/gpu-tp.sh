#!/usr/bin/env bash
# Tensor parallel on every GPU of the machine: bench/torch_tp.py under
# torchrun at world size 1 and at the GPU count, for two models (the
# Llama-3.2-1B-shaped decode step, and an MLP-heavy step whose all-reduces
# have three sizes), with PyTorch's own allocator and with arenaplan's;
# then every rank loads its own plan in a fresh process and refuses
# another rank's and another world size's. Every process's exit code and
# wall time are recorded (scripts/tp-rank.sh). Builds no Go: first, on a
# machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/libarenaplan.so
#
# copy .dev/torch to the GPU machine beside the checkout and run scripts/gpu-tp.sh. Logs and
# JSON (one line per rank per run) go to $OUT (default /tmp/gpu-tp); a
# table per rank last. WORLDS overrides the world sizes, MODELS the models
# (llama prefill mlp), TP_ARGS adds bench flags (say --layers 4), PAUSE the
# pause/resume cycles (default 3). Each rank gets its own share of the
# CPUs (--pin; PIN=0: not). DIAG=1 adds where eager time goes
# (--eager-diag); DIAG=2 also eager-only runs of ours with the C fast path
# shut (ARENAPLAN_FASTPATH=0) and with plain spill segments
# (ARENAPLAN_SPILL_PLAIN=1). EAGER=1 runs eager steps only, with their
# diagnosis: PyTorch's allocator, ours, and ours with the C fast path shut,
# at each world size (no graphs, no plan files). REPEAT=1 runs both allocators' eager steps
# once more at the largest world size (eager-only), after everything else.
set -u
OUT=${OUT:-/tmp/gpu-tp}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
# Never NVLink multicast: it can take a shared host's GPUs down.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# NCCL's graph user-buffer registration is cached by address and goes stale
# after a same-address resume: off for both allocators (same NCCL path).
export NCCL_GRAPH_REGISTER=${NCCL_GRAPH_REGISTER:-0}
N=$(nvidia-smi --list-gpus | wc -l)
WORLDS=${WORLDS:-$( (echo 1; echo "$N") | sort -nu | tr '\n' ' ')}
MODELS=${MODELS:-llama mlp}
PAUSE=${PAUSE:-3}
DIAG=${DIAG:-0}
PIN=${PIN:-1}
REPEAT=${REPEAT:-0}
PLANS=${PLANS:-/tmp/gpu-tp-plans}
rm -rf "$PLANS"; mkdir -p "$PLANS"
RES=$OUT/results.jsonl
export TP_EXITS=$OUT/exits.jsonl
# A rank stuck longer than this prints every thread's stack and fails.
export TP_DEADLINE=${TP_DEADLINE:-240}
: >"$RES"; : >"$TP_EXITS"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m >>"$OUT/gpu.txt" 2>&1
echo "GPUs: $N; world sizes: $WORLDS; models: $MODELS" | tee -a "$OUT/log.txt"
diag=()
[ "$DIAG" != 0 ] && diag=(--eager-diag)
[ "$PIN" = 1 ] && TP_ARGS="--pin ${TP_ARGS:-}"

tp() { # tp TAG MODEL WORLD ARGS...
	local tag=$1 model=$2 w=$3 t0 rc
	shift 3
	echo "== $tag, $model, world size $w" | tee -a "$OUT/log.txt"
	t0=$(date +%s)
	TP_TAG="$model/$tag" timeout "${TP_TIMEOUT:-300}" torchrun --standalone --nproc_per_node="$w" --no-python bash \
		scripts/tp-rank.sh bench/torch_tp.py --model "$model" --tag "$tag" --json-out "$RES" "$@" ${TP_ARGS:-} \
		>>"$OUT/log.txt" 2>&1
	rc=$?
	echo "   exit $rc after $(($(date +%s) - t0)) s" | tee -a "$OUT/log.txt"
	[ $rc -eq 0 ] || echo "FAILED $tag, $model, world size $w (exit $rc)" | tee -a "$OUT/log.txt"
}

if [ "${EAGER:-0}" = 1 ]; then
	for model in $MODELS; do
		for w in $WORLDS; do
			tp torch "$model" "$w" --mode torch --eager-only --eager-diag
			tp ours "$model" "$w" --mode ours --eager-only --eager-diag
			ARENAPLAN_FASTPATH=0 tp ours-nofast "$model" "$w" --mode ours --eager-only --eager-diag
		done
	done
	MODELS=""
fi
for model in $MODELS; do
	done_worlds=""
	for w in $WORLDS; do
		pl="$PLANS/$model-w{world}-r{rank}.plan"
		tp torch "$model" "$w" --mode torch "${diag[@]}"
		tp ours "$model" "$w" --mode ours --plan-out "$pl" --pause "$PAUSE" "${diag[@]}"
		if [ "$DIAG" = 2 ]; then
			ARENAPLAN_FASTPATH=0 tp ours-nofast "$model" "$w" --mode ours --eager-only --eager-diag
			ARENAPLAN_SPILL_PLAIN=1 tp ours-plain "$model" "$w" --mode ours --eager-only --eager-diag
		fi
		foreign=()
		[ "$w" -gt 1 ] && foreign+=(--foreign-plan "$PLANS/$model-w{world}-r{next}.plan")
		for d in $done_worlds; do foreign+=(--foreign-plan "$PLANS/$model-w$d-r0.plan"); done
		if [ "$N" -eq 1 ]; then
			# One GPU: no other rank exists, so make a plan file that says
			# "rank 1 of 2" (arenaplan told so; the process group is world 1).
			tp label "$model" "$w" --mode ours --label 1/2 --plan-out "$PLANS/$model-label-r1of2.plan" \
				--foreign-plan "$pl" --iters 5 --blocks 2
			foreign+=(--foreign-plan "$PLANS/$model-label-r1of2.plan")
		fi
		tp ours-plan "$model" "$w" --mode ours --plan "$pl" "${foreign[@]}"
		done_worlds="$done_worlds $w"
	done
done
if [ "$REPEAT" = 1 ]; then
	w=$(echo $WORLDS | tr ' ' '\n' | sort -n | tail -1)
	for model in $MODELS; do
		tp torch-again "$model" "$w" --mode torch --eager-only
		tp ours-again "$model" "$w" --mode ours --eager-only
	done
fi
grep -E "Error|error|Traceback|FAILED|failed:" "$OUT/log.txt" | grep -v "^==" | sort | uniq -c | sort -rn | head -20

python3 scripts/tp-table.py "$RES" "$TP_EXITS" | tee "$OUT/summary.txt"
exit 0
