#!/usr/bin/env bash
# gpu-floor.sh: the executor's replayed step against the fastest PyTorch
# twin and against the memory floor, in one run on one GPU, for
# gpt2-decode batch 1 and 8 and mlp (BENCHMARKS.md's executor table). The
# device machine has CUDA, nvcc, compute-sanitizer and PyTorch but no Go:
# build the run command first,
#
#   CGO_ENABLED=0 go build -o .dev/run ./cmd/run
#
# copy .dev to the GPU machine beside the checkout, and run from the repository root there:
#
#   scripts/gpu-floor.sh
#
# Per case: cmd/run (REPS runs, replay µs/step, replay = eager bit for
# bit); bench/torch_decode.py --attention auto --floor (every attention
# PyTorch offers for the shape, timed; the fastest one's replay; the floor:
# a device-to-device copy of the bytes our step must move, see that
# script). gpt2-decode runs STEPS timed steps (default 128: positions 896 to
# 1023, the cache never wraps), mlp MLP_STEPS (1000).
#
# Environment: OUT (logs, default /tmp/gpu-floor); RUN (default .dev/run);
# REPS (runs of each case, default 2); PTX=FILE runs cmd/run on that PTX
# (ARENAPLAN_TUNE=ptx=FILE); COMPILE=1 first builds kernels/kernels.cu to
# $OUT/kernels.ptx (compute_80) and $OUT/kernels_90.ptx (compute_90, used:
# the files to commit) with the ptxas report; CHECK=1 adds the --check runs
# against the Go references and compute-sanitizer; PROFILE=1 prints the
# per-kernel device time of one eager step. ARENAPLAN_TUNE's launch shapes
# (see cmd/run) pass through to every run.
set -u
OUT=${OUT:-/tmp/gpu-floor}
mkdir -p "$OUT"
LOG=$OUT/log.txt
RES=$OUT/results.jsonl
: >"$RES"
RUN=${RUN:-.dev/run}
STEPS=${STEPS:-128}
MLP_STEPS=${MLP_STEPS:-1000}
REPS=${REPS:-2}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$LOG"
if [ -n "${COMPILE:-}" ]; then
	nvcc --version | tail -2 | tee -a "$LOG"
	if nvcc -ptx -arch=compute_80 -O3 -o "$OUT/kernels.ptx" kernels/kernels.cu >>"$LOG" 2>&1 &&
		nvcc -ptx -arch=compute_90 -O3 -o "$OUT/kernels_90.ptx" kernels/kernels.cu >>"$LOG" 2>&1; then
		nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/kernels.cubin kernels/kernels.cu >"$OUT/ptxas.txt" 2>&1
		grep -E "Compiling entry|registers|spill|stack" "$OUT/ptxas.txt" >>"$LOG"
		# PDL_WAIT_IF's purpose (kernels.cu): a 16-byte load of the
		# prologue issued before the first griddepcontrol.wait (ACQBULK).
		for fn in linear linear_ln attention_part linear_st linear_few linear_ln1; do
			first=$(cuobjdump -sass -fun "$fn" /tmp/kernels.cubin | grep -oE 'LDGSTS[.A-Z]*128|LDG[.A-Z]*128|ACQBULK' | head -1)
			case $first in
			LDG*) echo "pdl pin $fn: ok (a 16-byte load before the wait: $first)" ;;
			*) echo "pdl pin $fn: FAILED (the wait before every 16-byte load)" ;;
			esac
		done | tee -a "$LOG"
		PTX=$OUT/kernels_90.ptx
	else
		echo "COMPILE FAILED" | tee -a "$LOG"
		tail -30 "$LOG"
		exit 1
	fi
fi
[ -n "${PTX:-}" ] && export ARENAPLAN_TUNE="ptx=$PTX${ARENAPLAN_TUNE:+,$ARENAPLAN_TUNE}"
echo "ARENAPLAN_TUNE=${ARENAPLAN_TUNE:-}" | tee -a "$LOG"

# ours NAME BIN ARGS...: one cmd/run, its JSON line tagged NAME.
ours() {
	local name=$1 bin=$2
	shift 2
	echo "== $name: $bin $*" >>"$LOG"
	local out
	out=$("$bin" --json "$@" 2>>"$LOG") || echo "FAILED ($name)" | tee -a "$LOG"
	echo "$out" >>"$LOG"
	[ -n "$out" ] && echo "{\"case\":\"$name\",\"tool\":\"ours\",\"r\":$out}" >>"$RES"
}
twin() {
	local name=$1
	shift
	echo "== torch $name: $*" >>"$LOG"
	local out
	out=$(python3 bench/torch_decode.py --json --floor "$@" 2>>"$LOG") || echo "FAILED (torch $name)" | tee -a "$LOG"
	echo "$out" >>"$LOG"
	[ -n "$out" ] && echo "{\"case\":\"$name\",\"tool\":\"torch\",\"r\":$out}" >>"$RES"
}
san() {
	local tool=$1
	shift
	timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 "$RUN" "$@" >"$OUT/san-$tool.txt" 2>&1
	local rc=$?
	echo "== sanitizer $tool rc=$rc $*: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.txt" | tr '\n' ' ')" | tee -a "$LOG"
	echo "{\"case\":\"sanitizer-$tool\",\"tool\":\"sanitizer\",\"r\":{\"rc\":$rc,\"args\":\"$*\"}}" >>"$RES"
}

small=(--workload gpt2-decode --layers 2 --width 256 --heads 4 --kv-len 256 --vocab 1000)
# At batch 1: linear_few, and linear_ln's tiles of 6 (width 1024: two a row).
few=(--workload gpt2-decode --layers 2 --width 1024 --heads 16 --kv-len 512 --vocab 1001)
# At batch 1: linear_ln1 with rows of 4 float4s a lane, a quarter of the lanes idle.
ln1=(--workload gpt2-decode --layers 2 --width 384 --heads 6 --kv-len 512 --vocab 1001)
if [ -n "${CHECK:-}" ]; then
	ours check-gpt2-b1 "$RUN" --workload gpt2-decode --batch 1 --steps 5 --check
	ours check-few-b1 "$RUN" "${few[@]}" --batch 1 --steps 10 --check
	ours check-ln1-b1 "$RUN" "${ln1[@]}" --batch 1 --steps 10 --check
	ours check-gpt2-b8 "$RUN" --workload gpt2-decode --batch 8 --steps 3 --check
	ours check-small-b3 "$RUN" "${small[@]}" --batch 3 --steps 10 --check
	ours check-small-b11 "$RUN" "${small[@]}" --batch 11 --steps 4 --check
	# An odd number of logits rows: linear_ln's last pair of rows a warp
	# (from 3 batch rows on) has one row.
	ours check-odd-rows-b11 "$RUN" --workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001 --batch 11 --steps 4 --check
	ours check-mlp "$RUN" --workload mlp --steps 50 --check
fi
for rep in $(seq "$REPS"); do
	ours gpt2-b1 "$RUN" --workload gpt2-decode --batch 1 --steps "$STEPS"
	ours gpt2-b8 "$RUN" --workload gpt2-decode --batch 8 --steps "$STEPS"
	ours mlp "$RUN" --workload mlp --steps "$MLP_STEPS"
done
twin gpt2-b1 --workload gpt2-decode --batch 1 --steps "$STEPS"
twin gpt2-b8 --workload gpt2-decode --batch 8 --steps "$STEPS"
twin mlp --workload mlp --steps "$MLP_STEPS"
if [ -n "${PROFILE:-}" ]; then
	for b in 1 8; do
		ARENAPLAN_TUNE="${ARENAPLAN_TUNE:+$ARENAPLAN_TUNE,}profile=1" "$RUN" --workload gpt2-decode --batch $b --steps 1 2>&1 | grep profile | sed "s/^/b$b /" | tee -a "$LOG"
	done
fi
if [ -n "${CHECK:-}" ]; then
	san memcheck --workload gpt2-decode --batch 1 --steps 2 --warmup 1
	san memcheck "${small[@]}" --batch 11 --steps 2 --warmup 1
	san racecheck "${small[@]}" --batch 3 --steps 2 --warmup 1
	san synccheck "${small[@]}" --batch 3 --steps 2 --warmup 1
	san racecheck "${few[@]}" --batch 1 --steps 2 --warmup 1
	san synccheck "${few[@]}" --batch 1 --steps 2 --warmup 1
	san racecheck "${ln1[@]}" --batch 1 --steps 2 --warmup 1
	san synccheck "${ln1[@]}" --batch 1 --steps 2 --warmup 1
fi

python3 - "$RES" <<'PY' | tee -a "$LOG"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    if r["tool"] == "sanitizer":
        print(f"sanitizer {r['case'][10:]:10s} rc={r['r']['rc']} {r['r']['args']}")
for r in rows:
    if r["case"].startswith("check-"):
        x = r["r"]
        print(f"{r['case']:16s} replay=eager {x.get('outputs_equal')}  max abs diff vs Go reference {x.get('check_max_abs_diff', 0):.3g} (tolerance {x.get('check_tolerance', 0):.3g}) ok={x.get('check_ok')}")
print()
print(f"{'case':8s} {'ours replay us':>16s} {'x floor':>8s} {'torch replay us':>16s} {'x floor':>8s} {'torch/ours':>10s} {'floor us':>9s} {'copy TB/s':>9s} {'MB/step':>8s}  torch attention (trials, replay us)")
for case in ["gpt2-b1", "gpt2-b8", "mlp"]:
    ours = [r["r"] for r in rows if r["case"] == case and r["tool"] == "ours"]
    tw = [r["r"] for r in rows if r["case"] == case and r["tool"] == "torch"]
    if not ours or not tw:
        print(f"{case:8s} missing")
        continue
    t = tw[0]
    fl = t["floor_us"]
    reps = [o["replay_us_per_step"] for o in ours]
    eq = all(o.get("outputs_equal") for o in ours)
    o = statistics.median(reps)
    trials = ", ".join(f"{k} {v if not isinstance(v, str) else 'n/a'}" for k, v in t.get("attention_trials", {}).items())
    print(f"{case:8s} {o:10.1f} ({len(reps)}x) {o/fl:8.2f} {t['replay_us_per_step']:16.1f} {t['replay_us_per_step']/fl:8.2f} {t['replay_us_per_step']/o:10.2f} {fl:9.1f} {t['copy_rate_tbs']:9.3f} {t['floor_bytes']/1e6:8.1f}  {t['attention']} ({trials})  ours runs {reps} equal={eq}")
PY
