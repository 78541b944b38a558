#!/usr/bin/env bash
# gpu-check.sh: run the Go test binaries built on the build machine on a GPU
# machine that has no Go, then run them again under compute-sanitizer, and
# print a short table last.
#
# Build first, on a machine with Go, from the repository root:
#   mkdir -p .dev
#   for p in cuda arena spill graphexec bridge; do
#     [ -d "$p" ] && CGO_ENABLED=0 go test -c -o ".dev/$p.test" "./$p"
#   done
# then, on the GPU machine, from the repository root:
#   scripts/gpu-check.sh            # logs under $OUT (or .dev/gpu-check)
#
# Every .dev/*.test runs (NAME.test runs in folder NAME, where its testdata
# is; "a_b.test" runs in "a/b"). cuda.test, arena.test and spill.test are
# expected (bridge.test too: the graph heap on the driver); a missing one
# is skipped with a note. For cuda.test the conformance lines of the
# simulation and of the driver are compared (they must be equal).
# memcheck runs with --report-api-errors no: the conformance suite makes
# failing driver calls on purpose (capture rules), and those are results,
# not memory errors.
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-$root/.dev/gpu-check}
mkdir -p "$out"
: "${GPU_CHECK_TIMEOUT:=300}"
rows=()
row() { rows+=("$(printf '%-26s %-10s %s' "$1" "$2" "$3")"); }

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/machine.txt"
have_sanitizer=1
command -v compute-sanitizer >/dev/null 2>&1 || have_sanitizer=0
if command -v ptxas >/dev/null 2>&1 && [ -f cuda/cudatest/kernels.ptx ]; then
	if ptxas -arch=sm_90 -o /dev/null cuda/cudatest/kernels.ptx >"$out/ptxas.log" 2>&1; then
		row "ptxas kernels.ptx sm_90" PASS "hand-written PTX assembles"
	else
		row "ptxas kernels.ptx sm_90" FAIL "see ptxas.log"
	fi
fi

for want in cuda arena spill; do
	[ -x ".dev/$want.test" ] || row "$want.test" SKIP "not built (.dev/$want.test missing)"
done

shopt -s nullglob
for bin in .dev/*.test; do
	name=$(basename "$bin" .test)
	dir=${name//_//}
	[ -d "$dir" ] || dir=.
	abs="$root/$bin"
	log="$out/$name.log"
	echo "== $name: tests (in $dir)"
	(cd "$dir" && timeout "$GPU_CHECK_TIMEOUT" "$abs" -test.v -test.count=1) >"$log" 2>&1
	rc=$?
	pass=$(grep -c '^--- PASS' "$log")
	fail=$(grep -c '^--- FAIL' "$log")
	skip=$(grep -c '^--- SKIP' "$log")
	grep -E '^(--- (FAIL|SKIP)|FAIL|ok|PASS)' "$log" | tail -n 20
	if [ $rc -eq 0 ]; then st=PASS; else st="FAIL($rc)"; fi
	row "$name tests" "$st" "$pass passed, $fail failed, $skip skipped"

	if grep -q 'CONFORMANCE driver ' "$log"; then
		sed -n 's/.*CONFORMANCE sim //p' "$log" >"$out/$name.sim.txt"
		sed -n 's/.*CONFORMANCE driver //p' "$log" >"$out/$name.driver.txt"
		n=$(wc -l <"$out/$name.sim.txt")
		if [ "$n" -gt 0 ] && diff -u "$out/$name.sim.txt" "$out/$name.driver.txt" >"$out/$name.diff"; then
			row "$name sim vs driver" AGREE "$n of $n conformance lines equal"
		else
			row "$name sim vs driver" DIFFER "see $name.diff"
			cat "$out/$name.diff"
		fi
	elif grep -q 'CONFORMANCE sim ' "$log"; then
		row "$name sim vs driver" SKIP "driver half did not run"
	fi

	if [ $have_sanitizer -eq 1 ]; then
		echo "== $name: compute-sanitizer --tool memcheck"
		slog="$out/$name.memcheck.log"
		(cd "$dir" && timeout "$GPU_CHECK_TIMEOUT" compute-sanitizer --tool memcheck --leak-check full --report-api-errors no \
			"$abs" -test.v -test.count=1) >"$slog" 2>&1
		src=$?
		summary=$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$slog" | tail -n 1)
		drv=$(grep -c 'CONFORMANCE driver ' "$slog")
		grep -E '^(=========|--- FAIL)' "$slog" | tail -n 5
		extra=""
		[ "$drv" -gt 0 ] && extra=" ($drv driver conformance cases under memcheck)"
		if grep -q 'terminated before first instrumented API call' "$slog"; then
			row "$name memcheck" N/A "the binary makes no CUDA call (simulated device only)"
		elif [ $src -eq 0 ] && [ "$summary" = "ERROR SUMMARY: 0 errors" ]; then
			row "$name memcheck" PASS "$summary$extra"
		else
			row "$name memcheck" "FAIL($src)" "${summary:-no summary}"
		fi
	else
		row "$name memcheck" SKIP "compute-sanitizer not found"
	fi
done

echo
echo "== gpu-check summary (logs in $out)"
printf '%-26s %-10s %s\n' CHECK RESULT DETAIL
printf '%s\n' "${rows[@]}" | tee "$out/summary.txt"
