#!/usr/bin/env bash
# Session 8, last run (issue 15): attention_combine with its first 8 or 16
# partials loaded once for both passes (8 where that covers every split),
# against the fixed choices (-DCOMBINE_U=8, 16), then scripts/gpu-floor.sh
# COMPILE=1 CHECK=1 BEFORE=.dev/run-before (cmd/run of 68f0224). Carry
# .dev/run and .dev/run-before.
set -u
OUT=${OUT:-/tmp/s8}
mkdir -p $OUT/v
for v in 8 16; do
  nvcc -ptx -arch=compute_90 -O3 -DCOMBINE_U=$v -o $OUT/v/u$v.ptx kernels/kernels.cu || exit 1
done
nvcc -ptx -arch=compute_90 -O3 -o $OUT/v/def.ptx kernels/kernels.cu || exit 1
one() { timeout 150 "$@" --json 2>>$OUT/v/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]}')"; }
G="--workload gpt2-decode --steps 128"
echo "check def kv8192 b1 (44 splits): $(timeout 150 .dev/run --ptx $OUT/v/def.ptx --workload gpt2-decode --layers 2 --kv-len 8192 --batch 1 --steps 3 --check --json 2>>$OUT/v/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(r['outputs_equal'], r['check_max_abs_diff'], r['check_ok'])")"
echo "check def kv8192 b2 (22 splits): $(timeout 150 .dev/run --ptx $OUT/v/def.ptx --workload gpt2-decode --layers 2 --kv-len 8192 --batch 2 --steps 3 --check --json 2>>$OUT/v/log.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print(r['outputs_equal'], r['check_max_abs_diff'], r['check_ok'])")"
for rep in 1 2; do for b in 1 8; do
  echo "b$b before: $(one .dev/run-before $G --batch $b) | def: $(one .dev/run --ptx $OUT/v/def.ptx $G --batch $b) | u8: $(one .dev/run --ptx $OUT/v/u8.ptx $G --batch $b) | u16: $(one .dev/run --ptx $OUT/v/u16.ptx $G --batch $b)"
done; done
COMPILE=1 CHECK=1 BEFORE=.dev/run-before bash scripts/gpu-floor.sh > $OUT/floor-stdout.txt 2>&1
tail -14 $OUT/floor-stdout.txt
