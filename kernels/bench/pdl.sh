#!/usr/bin/env bash
# One device run for programmatic dependent launch (PDL): the cuda.h layout
# probe for cuLaunchKernelEx, the compute_90 PTX of kernels.cu ($OUT/
# kernels_90.ptx, the file to commit as kernels/kernels_90.ptx; the
# compute_80 PTX is rebuilt and compared with the committed one), the cuda
# conformance suite on the driver, then cmd/run (built beforehand where Go
# is: CGO_ENABLED=0 go build -o .dev/run ./cmd/run; CGO_ENABLED=0 go test -c
# -o .dev/cuda.test ./cuda; carried as .dev) on mlp and gpt2-decode b1/b8:
# plain compute_80 ("before"), compute_90 with PDL, compute_90 --no-pdl;
# Go-reference checks and compute-sanitizer with PDL on.
#
#   kernels/bench/pdl.sh            everything
#   PTX90=kernels/kernels_90.ptx    use this compute_90 PTX instead of building it
set -u
set -o pipefail
OUT=${OUT:-/tmp/pdl}
mkdir -p "$OUT"
LOG=$OUT/log.txt
RES=$OUT/results.jsonl
: >"$RES"
BIN=${BIN:-.dev}
RUN=${RUN:-$BIN/run}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$LOG"
nvcc --version | tail -2 | tee -a "$LOG"
gcc -I/usr/local/cuda/include -o /tmp/probe kernels/bench/launchex_probe.c -ldl 2>&1 | tee -a "$LOG"
/tmp/probe 2>&1 | tee -a "$LOG"
grep -n "typedef struct CUlaunchAttribute_st" -A4 /usr/local/cuda/include/cuda.h | tee -a "$LOG"
nvcc -ptx -arch=compute_80 -O3 -o /tmp/kernels_80.ptx kernels/kernels.cu 2>&1 | tee -a "$LOG"
cmp /tmp/kernels_80.ptx kernels/kernels.ptx && echo "compute_80 PTX: identical to kernels/kernels.ptx" | tee -a "$LOG"
NEW=${PTX90:-$OUT/kernels_90.ptx}
if [ -z "${PTX90:-}" ]; then
	nvcc -ptx -arch=compute_90 -O3 -o "$NEW" kernels/kernels.cu 2>&1 | tee -a "$LOG" || exit 1
fi
grep -c griddepcontrol "$NEW" | sed 's/^/griddepcontrol instructions in compute_90 PTX: /' | tee -a "$LOG"
if [ -x "$BIN/cuda.test" ]; then
	"$BIN/cuda.test" -test.v -test.run 'Conformance' 2>&1 | grep -E "launch_ex|AGREE|disagree|FAIL|^ok|PASS" | tee -a "$LOG"
fi

ours() {
	local name=$1 ptx=$2
	shift 2
	local pa=()
	[ "$ptx" != - ] && pa=(--ptx "$ptx")
	echo "== run $name: $*" >>"$LOG"
	local out
	out=$("$RUN" "${pa[@]}" --json "$@" 2>>"$LOG") || echo "FAILED ($name)" | tee -a "$LOG"
	echo "$out" >>"$LOG"
	[ -n "$out" ] && echo "{\"case\":\"$name\",\"r\":$out}" >>"$RES"
}
for rep in 1 2; do
	ours mlp-plain80-$rep - --workload mlp --steps 1000
	ours mlp-pdl-$rep "$NEW" --workload mlp --steps 1000
	ours mlp-nopdl90-$rep "$NEW" --workload mlp --steps 1000 --no-pdl
done
for b in 1 8; do
	ours gpt2-b$b-plain80 - --workload gpt2-decode --batch $b --steps 200
	ours gpt2-b$b-pdl "$NEW" --workload gpt2-decode --batch $b --steps 200
	ours gpt2-b$b-nopdl90 "$NEW" --workload gpt2-decode --batch $b --steps 200 --no-pdl
done
ours mlp-pdl-check "$NEW" --workload mlp --steps 50 --check
ours gpt2-b1-pdl-check "$NEW" --workload gpt2-decode --batch 1 --steps 5 --check
ours gpt2-b8-pdl-check "$NEW" --workload gpt2-decode --batch 8 --steps 3 --check
small=(--workload gpt2-decode --layers 2 --width 256 --heads 4 --kv-len 256 --vocab 1000)
ours gpt2-small-b3-pdl-check "$NEW" "${small[@]}" --batch 3 --steps 10 --check
ours gpt2-small-b11-pdl-check "$NEW" "${small[@]}" --batch 11 --steps 4 --check
"$RUN" --ptx "$NEW" --workload mlp --steps 2 2>&1 | grep -E "^launch" | tee -a "$LOG"
san() {
	local tool=$1
	shift
	timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 "$RUN" --ptx "$NEW" "$@" >"$OUT/san.txt" 2>&1
	echo "== sanitizer $tool rc=$? $*: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^launch|outputs' "$OUT/san.txt" | tr '\n' ' ')" | tee -a "$LOG"
}
san memcheck --workload mlp --steps 2 --warmup 1
san memcheck "${small[@]}" --batch 11 --steps 2 --warmup 1
san racecheck "${small[@]}" --batch 2 --steps 2 --warmup 1
san synccheck "${small[@]}" --batch 2 --steps 2 --warmup 1
san racecheck --workload mlp --layers 8 --steps 2 --warmup 1
san synccheck --workload mlp --layers 8 --steps 2 --warmup 1

python3 - "$RES" <<'PY' | tee -a "$LOG"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'case':26s} {'launch':>8s} {'eager us':>10s} {'replay us':>10s} {'x':>6s} {'equal':>6s} {'check diff':>10s} {'ok':>4s}")
for row in rows:
    r = row["r"]
    e, p = r.get("eager_us_per_step", 0), r.get("replay_us_per_step", 0)
    d = r.get("check_max_abs_diff", "-")
    d = f"{d:.2e}" if isinstance(d, float) else d
    mode = f"{'pdl' if r.get('pdl') else 'plain'}{r.get('ptx_target')}"
    print(f"{row['case']:26s} {mode:>8s} {e:10.1f} {p:10.1f} {e/p if p else 0:6.2f} {str(r.get('outputs_equal','-')):>6s} {d:>10s} {str(r.get('check_ok','-')):>4s}")
PY
