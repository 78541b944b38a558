#!/usr/bin/env bash
# GPU runs of the executor (cmd/run) and its PyTorch twin (bench/), for the
# device machine, which has CUDA, nvcc, compute-sanitizer and PyTorch but no
# Go. It builds no Go: build the run command first on a machine with Go,
#
#   CGO_ENABLED=0 go build -o .dev/run ./cmd/run
#   go run ./cmd/plan --workload gpt2-decode -o .dev/gpt2.plan   (optional)
#
# and copy .dev to the GPU machine beside the checkout. Then, on it:
#
#   scripts/gpu-run.sh smoke          short runs with --check
#   scripts/gpu-run.sh full           every case of BENCHMARKS.md, sanitizer, PyTorch
#   scripts/gpu-run.sh compile MODE   first nvcc the kernels to PTX ($OUT/kernels.ptx,
#                                     to be committed) and run MODE on that PTX
#
# Logs and JSON lines go to $OUT (default /tmp/gpu-run); a short table is
# printed last. With PTX=FILE the runs use that PTX instead of the embedded
# one (ARENAPLAN_TUNE=ptx=FILE; compile sets it to the PTX it has just
# compiled).
set -u
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
MODE=${1:-full}
COMPILE=
if [ "$MODE" = compile ]; then COMPILE=1; MODE=${2:-smoke}; fi
RUN=${RUN:-.dev/run}
RES="$OUT/results.jsonl"
: >"$RES"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if [ -n "$COMPILE" ]; then
	nvcc --version | tail -2
	nvcc -ptx -arch=compute_80 -O3 -o "$OUT/kernels.ptx" kernels/kernels.cu || exit 1
	nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/kernels.cubin kernels/kernels.cu 2>"$OUT/ptxas.txt"
	cat "$OUT/ptxas.txt"
	PTX=${PTX:-$OUT/kernels.ptx}
fi
if [ -n "${PTX:-}" ]; then export ARENAPLAN_TUNE="ptx=$PTX${ARENAPLAN_TUNE:+,$ARENAPLAN_TUNE}"; fi

# ours NAME ARGS...: one run of cmd/run, its JSON line tagged with NAME.
ours() {
	local name=$1
	shift
	echo "== run $name: $*" | tee -a "$OUT/log.txt"
	if out=$("$RUN" --json "$@" 2>>"$OUT/log.txt"); then :; else echo "FAILED ($?)" | tee -a "$OUT/log.txt"; fi
	echo "$out" | tee -a "$OUT/log.txt"
	[ -n "$out" ] && echo "{\"case\":\"$name\",\"tool\":\"arenaplan\",\"r\":$out}" >>"$RES"
}

# torchrun NAME ARGS...: one run of the PyTorch twin.
torchrun() {
	local name=$1
	shift
	echo "== torch $name: $*" | tee -a "$OUT/log.txt"
	out=$(python3 bench/torch_decode.py --json "$@" 2>>"$OUT/log.txt") || echo "FAILED" | tee -a "$OUT/log.txt"
	echo "$out" | tee -a "$OUT/log.txt"
	[ -n "$out" ] && echo "{\"case\":\"$name\",\"tool\":\"torch\",\"r\":$out}" >>"$RES"
}

# sanitize TOOL ARGS...: compute-sanitizer over a short run.
sanitize() {
	local tool=$1
	shift
	echo "== compute-sanitizer --tool $tool: $*" | tee -a "$OUT/log.txt"
	compute-sanitizer --tool "$tool" --error-exitcode 9 "$RUN" "$@" >"$OUT/sanitizer-$tool.txt" 2>&1
	local rc=$?
	tail -3 "$OUT/sanitizer-$tool.txt" | tee -a "$OUT/log.txt"
	echo "{\"case\":\"sanitizer-$tool\",\"tool\":\"compute-sanitizer\",\"r\":{\"rc\":$rc,\"args\":\"$*\"}}" >>"$RES"
}

small=(--workload gpt2-decode --layers 2 --width 256 --heads 4 --kv-len 256 --vocab 1000)
if [ "$MODE" = smoke ]; then
	ours mlp-check --workload mlp --steps 20 --check
	ours gpt2-small-check "${small[@]}" --batch 3 --steps 20 --check
	ours gpt2-b1 --workload gpt2-decode --batch 1 --steps 50 --check
	ours gpt2-b8 --workload gpt2-decode --batch 8 --steps 50
	ours mlp --workload mlp --steps 200
	sanitize memcheck "${small[@]}" --batch 2 --steps 2 --warmup 1
	torchrun gpt2-b1 --workload gpt2-decode --batch 1 --steps 50
	torchrun mlp --workload mlp --steps 200
else
	ours gpt2-b1 --workload gpt2-decode --batch 1 --steps 200
	ours gpt2-b8 --workload gpt2-decode --batch 8 --steps 200
	ours mlp --workload mlp --steps 1000
	ours gpt2-b1-check --workload gpt2-decode --batch 1 --steps 20 --check
	ours gpt2-b8-check --workload gpt2-decode --batch 8 --steps 10 --check
	ours mlp-check --workload mlp --steps 100 --check
	if [ -f .dev/gpt2.plan ] && [ -z "${PTX:-}" ]; then ours gpt2-b1-planfile --plan .dev/gpt2.plan --steps 200; fi
	ours gpt2-l48 --workload gpt2-decode --layers 48 --steps 50
	echo "== per-kernel device time, one eager step (event pairs: each adds a few us)" | tee -a "$OUT/log.txt"
	for b in 1 8; do
		ARENAPLAN_TUNE="${ARENAPLAN_TUNE:+$ARENAPLAN_TUNE,}profile=1" "$RUN" --workload gpt2-decode --batch $b --steps 1 2>&1 | grep profile | tee -a "$OUT/log.txt"
	done
	torchrun gpt2-b1 --workload gpt2-decode --batch 1 --steps 200
	torchrun gpt2-b8 --workload gpt2-decode --batch 8 --steps 200
	torchrun mlp --workload mlp --steps 1000
	sanitize memcheck --workload gpt2-decode --batch 1 --steps 2 --warmup 1
	sanitize memcheck --workload gpt2-decode --batch 8 --steps 2 --warmup 1
	sanitize memcheck --workload mlp --steps 2 --warmup 1
	sanitize racecheck "${small[@]}" --batch 2 --steps 2 --warmup 1
	sanitize synccheck "${small[@]}" --batch 2 --steps 2 --warmup 1
fi

python3 - "$RES" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print(f"{'case':22s} {'tool':8s} {'eager us':>10s} {'replay us':>10s} {'x':>6s} {'capture ms':>10s} {'equal':>6s} {'check diff':>10s} {'interm/pool B':>14s} {'arena B':>12s}")
for row in rows:
    r, t = row["r"], row["tool"]
    if t == "compute-sanitizer":
        print(f"{row['case']:22s} {'sanitzr':8s} rc={r['rc']} {r['args']}")
        continue
    e, p = r.get("eager_us_per_step", 0), r.get("replay_us_per_step", 0)
    pool = r.get("intermediate_bytes", r.get("private_pool_bytes", 0))
    eq = r.get("outputs_equal", "-")
    diff = r.get("check_max_abs_diff", "-")
    diff = f"{diff:.2e}" if isinstance(diff, float) else diff
    print(f"{row['case']:22s} {t:8s} {e:10.1f} {p:10.1f} {e/p if p else 0:6.2f} {r.get('capture_ms', 0):10.3f} {str(eq):>6s} {diff:>10s} {pool:14d} {r.get('arena_bytes', 0):12d}")
EOF
