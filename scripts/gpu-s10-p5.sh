#!/usr/bin/env bash
# A record: -DTILE6=0 is no longer in kernels.cu (v0 now builds v1's kernels;
# the figures: h100-s10-probes.txt).
# Session 10 probe 5 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s10-p5.sh'
# with .dev carried (.dev/run: this tree). gpt2-decode replays at batch 1,
# alternating: tiles of 6 in neither linear (-DTILE6=0), in linear_ln at one
# batch row always (-DLINEAR_LN_T1=6 -DFEW_TILE6=0, probe 3's variant), with
# 64-thread attention_part blocks (--attention-block 64: 32 splits of 32
# positions) and 64-thread linear_few blocks (--few-block 64).
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/nvcc.txt
nvcc -ptx -arch=compute_90 -O3 -DTILE6=0 -o /tmp/v0.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DLINEAR_LN_T1=6 -DFEW_TILE6=0 -o /tmp/v1.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
sha256sum kernels/kernels.cu >> $OUT/nvcc.txt
cat $OUT/nvcc.txt
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); c=r.get('check_max_abs_diff'); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL') + ('' if c is None else f' check {c:.3g} ok={r.get(\"check_ok\")}'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 90 "$@" --json 2>>$OUT/err.txt | js; }
G="--workload gpt2-decode"
V0=".dev/run --ptx /tmp/v0.ptx"; V1=".dev/run --ptx /tmp/v1.ptx"
echo "check v1 att64 few64 b1: $(one $V1 $G --batch 1 --steps 3 --check --attention-block 64 --few-block 64)"
b1() { one "$@" $G --batch 1 --steps 128; }
for rep in 1 2; do
  echo "b1 v0 $(b1 $V0) | v1 $(b1 $V1) | v0 att64 $(b1 $V0 --attention-block 64) | v1 att64 $(b1 $V1 --attention-block 64) | v1 few64 $(b1 $V1 --few-block 64) | v1 att64 few64 $(b1 $V1 --attention-block 64 --few-block 64)"
done
