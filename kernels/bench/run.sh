#!/usr/bin/env bash
# One device run for kernel work (the device machine has nvcc and no Go):
# compile kernels.cu to PTX ($OUT/kernels.ptx and $OUT/kernels_90.ptx, the
# files to commit as kernels/kernels.ptx and kernels/kernels_90.ptx, with the
# kernels/ptx.sum that scripts/gpu-ptx.sh writes), the ptxas resource report, the microbenchmark
# (kernels/bench/bench.cu), the executor's runs (cmd/run, built beforehand
# on a machine with Go: CGO_ENABLED=0 go build -o .dev/run ./cmd/run, and
# carried as .dev/run) on the embedded PTX (before) and on the new PTX
# (after), Go-reference checks, per-kernel profile and compute-sanitizer.
#
#   kernels/bench/run.sh            everything
#   QUICK=1 kernels/bench/run.sh    no baseline runs, no sanitizer
set -u
set -o pipefail
OUT=${OUT:-/tmp/kbench}
mkdir -p "$OUT"
LOG=$OUT/log.txt
RES=$OUT/results.jsonl
: >"$RES"
RUN=${RUN:-.dev/run}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$LOG"
nvcc --version | tail -2 | tee -a "$LOG"
nvcc -ptx -arch=compute_80 -O3 -o "$OUT/kernels.ptx" kernels/kernels.cu 2>&1 | tee -a "$LOG" || exit 1
# The compute_90 build with programmatic dependent launch (commit it as
# kernels/kernels_90.ptx; kernels/bench/pdl.sh measures it).
nvcc -ptx -arch=compute_90 -O3 -o "$OUT/kernels_90.ptx" kernels/kernels.cu 2>&1 | tee -a "$LOG" || exit 1
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/kernels.cubin kernels/kernels.cu >"$OUT/ptxas.txt" 2>&1
grep -E "Function properties|registers|spill|Compiling entry" "$OUT/ptxas.txt" | grep -v "^$" | tee -a "$LOG"
# VARIANTS="name:-DFLAG=1,-DFLAG2=1 ...": the kernels compiled with those
# flags too (in the background), their batch-8 GEMVs benchmarked and a
# batch-8 gpt2-decode run on each ($OUT/variants.tgz holds their PTX).
VARIANTS=${VARIANTS-}
mkdir -p /tmp/variants
for v in $VARIANTS; do
	name=${v%%:*} flags=${v#*:}
	flags=${flags//,/ }
	(nvcc -ptx -arch=compute_80 -O3 $flags -o /tmp/variants/kernels-$name.ptx kernels/kernels.cu &&
		nvcc -O3 -arch=sm_90 $flags -o /tmp/variants/bench-$name kernels/bench/bench.cu) >/tmp/variants/$name.log 2>&1 &
done
nvcc -O3 -arch=sm_90 -o /tmp/bench kernels/bench/bench.cu 2>&1 | tee -a "$LOG" || exit 1
/tmp/bench 2>&1 | tee "$OUT/bench.txt" | tee -a "$LOG"
wait
for v in $VARIANTS; do
	name=${v%%:*}
	cat /tmp/variants/$name.log | tee -a "$LOG"
	echo "== variant $name" | tee -a "$LOG"
	/tmp/variants/bench-$name g8 2>&1 | grep gemv | tee -a "$OUT/bench.txt" | tee -a "$LOG"
done
[ -n "$VARIANTS" ] && (cd /tmp/variants && tar czf "$OUT/variants.tgz" *.ptx)

# ours NAME PTXFILE ARGS...: one run of cmd/run (PTXFILE "-": embedded PTX).
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
NEW=$OUT/kernels.ptx
if [ -z "${QUICK:-}" ]; then
	ours before-mlp - --workload mlp --steps 1000
	ours before-gpt2-b1 - --workload gpt2-decode --batch 1 --steps 200
	ours before-gpt2-b8 - --workload gpt2-decode --batch 8 --steps 200
fi
for v in $VARIANTS; do
	name=${v%%:*}
	ours "gpt2-b8-$name" /tmp/variants/kernels-$name.ptx --workload gpt2-decode --batch 8 --steps 200
done
ours mlp "$NEW" --workload mlp --steps 1000
ours mlp-again "$NEW" --workload mlp --steps 1000
ours gpt2-b1 "$NEW" --workload gpt2-decode --batch 1 --steps 200
ours gpt2-b8 "$NEW" --workload gpt2-decode --batch 8 --steps 200
ours mlp-check "$NEW" --workload mlp --steps 50 --check
ours gpt2-b1-check "$NEW" --workload gpt2-decode --batch 1 --steps 5 --check
ours gpt2-b8-check "$NEW" --workload gpt2-decode --batch 8 --steps 3 --check
small=(--workload gpt2-decode --layers 2 --width 256 --heads 4 --kv-len 256 --vocab 1000)
ours gpt2-small-b3-check "$NEW" "${small[@]}" --batch 3 --steps 10 --check
ours gpt2-small-b11-check "$NEW" "${small[@]}" --batch 11 --steps 4 --check
for b in 1 8; do
	echo "== profile b$b (event pair per kernel)" | tee -a "$LOG"
	"$RUN" --ptx "$NEW" --workload gpt2-decode --batch $b --steps 1 --profile 2>&1 | grep profile | tee -a "$LOG"
done
if [ -z "${QUICK:-}" ]; then
	san() {
		local tool=$1
		shift
		compute-sanitizer --tool "$tool" --error-exitcode 9 "$RUN" --ptx "$NEW" "$@" >"$OUT/san.txt" 2>&1
		echo "== sanitizer $tool rc=$? $*: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san.txt")" | tee -a "$LOG"
	}
	san memcheck --workload mlp --steps 2 --warmup 1
	san memcheck --workload gpt2-decode --batch 1 --steps 2 --warmup 1
	san memcheck "${small[@]}" --batch 11 --steps 2 --warmup 1
	san racecheck "${small[@]}" --batch 2 --steps 2 --warmup 1
	san synccheck "${small[@]}" --batch 2 --steps 2 --warmup 1
fi

python3 - "$RES" <<'EOF' | tee -a "$LOG"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'case':22s} {'eager us':>10s} {'replay us':>10s} {'x':>6s} {'equal':>6s} {'check diff':>10s} {'max ref':>8s} {'ok':>4s}")
for row in rows:
    r = row["r"]
    e, p = r.get("eager_us_per_step", 0), r.get("replay_us_per_step", 0)
    d = r.get("check_max_abs_diff", "-")
    d = f"{d:.2e}" if isinstance(d, float) else d
    m = r.get("check_max_abs_ref", "-")
    m = f"{m:.3g}" if isinstance(m, float) else m
    print(f"{row['case']:22s} {e:10.1f} {p:10.1f} {e/p if p else 0:6.2f} {str(r.get('outputs_equal','-')):>6s} {d:>10s} {m:>8s} {str(r.get('check_ok','-')):>4s}")
EOF
