#!/usr/bin/env bash
# Session 10 (issue 15): compute-sanitizer racecheck and synccheck, and
# --check, at batch 1, where linear_few and linear_ln's tiles of 6 run
# (gpu-floor.sh's final run of this session checked them at batch 2, which
# runs neither). On the H100 as 'OUT=$OUT bash scripts/gpu-s10-san.sh' with
# .dev/run carried (this tree; the embedded kernels, nvcc 13.0's).
set -u
mkdir -p $OUT
few=(--workload gpt2-decode --layers 2 --width 1024 --heads 16 --kv-len 512 --vocab 1001 --batch 1)
.dev/run "${few[@]}" --steps 10 --check --json > $OUT/check.json 2>&1; echo "check: rc=$? $(python3 -c "import json; r=json.load(open('$OUT/check.json')); print('equal', r['outputs_equal'], 'diff', r['check_max_abs_diff'], 'ok', r['check_ok'])")"
for tool in racecheck synccheck memcheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 .dev/run "${few[@]}" --steps 2 --warmup 1 > $OUT/san-$tool.txt 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-$tool.txt | tr '\n' ' ')"
done
