#!/usr/bin/env bash
# Session 9, first probe (issue 15): linear_st, the linears' weight rows
# staged in shared memory before griddepcontrol.wait. Builds kernels.cu's
# PTX (the files to commit, under $OUT) and variants, checks linear_st
# against the Go references, runs compute-sanitizer on it, and times
# gpt2-decode b1/b8 and mlp: linear_st (default), --unstaged (the same
# binary and PTX, the linears as before) and .dev/run-before (cmd/run of
# the session's start, its embedded kernels), alternating. Carry .dev/run
# and .dev/run-before (CGO_ENABLED=0 go build here).
set -u
OUT=${OUT:-/tmp/s9}
mkdir -p "$OUT/v"
LOG=$OUT/probe-log.txt
: >"$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$LOG"
( cd kernels && nvcc -ptx -arch=compute_80 -O3 -o "$OUT/kernels.ptx" kernels.cu &&
	nvcc -ptx -arch=compute_90 -O3 -o "$OUT/kernels_90.ptx" kernels.cu &&
	nvcc -ptx -arch=compute_80 -o "$OUT/v/spill.ptx" spill.cu &&
	{ sed -n '/^#/p' ptx.sum
	  echo "$(sha256sum kernels.cu | cut -d' ' -f1)  kernels.cu  kernels.ptx kernels_90.ptx"
	  echo "$(sha256sum spill.cu | cut -d' ' -f1)  spill.cu  spill.ptx"; } >"$OUT/ptx.sum" &&
	cmp -s "$OUT/v/spill.ptx" spill.ptx && echo "spill.ptx unchanged" ) 2>&1 | tee -a "$LOG"
[ -s "$OUT/kernels_90.ptx" ] || { echo "COMPILE FAILED"; exit 1; }
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/k.cubin kernels/kernels.cu >"$OUT/v/ptxas.txt" 2>&1
grep -A4 -E "Compiling entry function '(linear_st|linear|linear_ln|attention_part)'" "$OUT/v/ptxas.txt" | grep -E "entry|registers|spill" | tee -a "$LOG"
for fn in linear_st linear linear_ln attention_part; do
	first=$(cuobjdump -sass -fun "$fn" /tmp/k.cubin | grep -oE 'LDGSTS|LDG[.A-Z]*128|ACQBULK' | head -1)
	echo "pdl pin $fn: first of (16-byte load, wait) is $first"
done | tee -a "$LOG"
for rg in 2; do nvcc -ptx -arch=compute_90 -O3 -DST_RG8=$rg -o "$OUT/v/rg$rg.ptx" kernels/kernels.cu; done
P=(--ptx "$OUT/kernels_90.ptx")
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]}' + (f' check={r[\"check_max_abs_diff\"]:.3g} ok={r[\"check_ok\"]}' if 'check_ok' in r else ''))
except Exception as e: print('FAILED', e)"; }
one() { timeout 150 "$@" --json 2>>"$LOG" | js; }
small=(--workload gpt2-decode --layers 2 --width 256 --heads 4 --kv-len 256 --vocab 1000)
echo "check b1:        $(one .dev/run "${P[@]}" --workload gpt2-decode --batch 1 --steps 5 --check)" | tee -a "$LOG"
echo "check b8:        $(one .dev/run "${P[@]}" --workload gpt2-decode --batch 8 --steps 3 --check)" | tee -a "$LOG"
echo "check small b3:  $(one .dev/run "${P[@]}" "${small[@]}" --batch 3 --steps 10 --check)" | tee -a "$LOG"
echo "check small b11: $(one .dev/run "${P[@]}" "${small[@]}" --batch 11 --steps 4 --check)" | tee -a "$LOG"
echo "check odd b11:   $(one .dev/run "${P[@]}" --workload gpt2-decode --layers 2 --width 260 --heads 5 --kv-len 256 --vocab 1001 --batch 11 --steps 4 --check)" | tee -a "$LOG"
echo "check mlp:       $(one .dev/run "${P[@]}" --workload mlp --steps 50 --check)" | tee -a "$LOG"
echo "check 80 b8:     $(one .dev/run --ptx "$OUT/kernels.ptx" --workload gpt2-decode --batch 8 --steps 3 --check)" | tee -a "$LOG"
san() {
	local tool=$1; shift
	timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 .dev/run "${P[@]}" "$@" >"$OUT/v/san-$tool.txt" 2>&1
	echo "sanitizer $tool rc=$? $*: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/v/san-$tool.txt" | tr '\n' ' ')" | tee -a "$LOG"
}
san memcheck "${small[@]}" --batch 11 --steps 2 --warmup 1
san racecheck "${small[@]}" --batch 3 --steps 2 --warmup 1
san synccheck "${small[@]}" --batch 11 --steps 2 --warmup 1
G=(--workload gpt2-decode --steps 128)
for rep in 1 2; do
	for b in 1 8; do
		echo "b$b before $(one .dev/run-before "${G[@]}" --batch $b) | unstaged $(one .dev/run "${P[@]}" "${G[@]}" --batch $b --unstaged) | staged $(one .dev/run "${P[@]}" "${G[@]}" --batch $b)" | tee -a "$LOG"
	done
	echo "mlp before $(one .dev/run-before --workload mlp --steps 1000) | unstaged $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --unstaged) | staged $(one .dev/run "${P[@]}" --workload mlp --steps 1000)" | tee -a "$LOG"
done
for b in 1 8; do
	echo "b$b grid132 $(one .dev/run "${P[@]}" "${G[@]}" --batch $b --staged-grid 132) | grid396 $(one .dev/run "${P[@]}" "${G[@]}" --batch $b --staged-grid 396) | rg8=2 $(one .dev/run --ptx "$OUT/v/rg2.ptx" "${G[@]}" --batch $b)" | tee -a "$LOG"
done
for b in 1 8; do
	.dev/run "${P[@]}" --workload gpt2-decode --batch $b --steps 1 --profile 2>&1 | grep profile | sed "s/^/b$b staged /" | tee -a "$LOG"
	.dev/run "${P[@]}" --workload gpt2-decode --batch $b --steps 1 --profile --unstaged 2>&1 | grep profile | sed "s/^/b$b unstaged /" | tee -a "$LOG"
done
echo "== summary"
grep -E "^(check|sanitizer|pdl|b1|b8|mlp)" "$LOG" | grep -v profile
