#!/usr/bin/env bash
# A record: attention_cl and --no-attention-cluster, and linear_few's two rows at
# a time, are no longer in the tree (measured slower here; h100-s10-probes.txt).
# Session 10 probe 1 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s10-p1.sh'
# with .dev carried (.dev/run: this tree; .dev/run-before: bab3c80, session 9's end).
# Builds kernels.cu with nvcc (13.0 there) into $OUT, checks linear_few and
# attention_cl (--check, replay = eager), then times gpt2-decode replays,
# alternating: the new kernels, each taken back (--no-linear-few,
# --no-attention-cluster, both), linear_few variants (-DLINEAR_FEW_T/LB),
# and run-before.
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/nvcc.txt
P=$OUT/kernels_90.ptx
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -o $P kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DLINEAR_FEW_T=12 -DLINEAR_FEW_LB=3 -o /tmp/t12.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 &&
nvcc -ptx -arch=compute_90 -O3 -DLINEAR_FEW_T=6 -o /tmp/t6.ptx kernels/kernels.cu >> $OUT/nvcc.txt 2>&1 || { cat $OUT/nvcc.txt; exit 1; }
sha256sum kernels/kernels.cu >> $OUT/nvcc.txt
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/k.cubin kernels/kernels.cu 2>&1 | grep -E "entry|registers|spill" | paste - - - | sed 's/ptxas info *://g' >> $OUT/nvcc.txt
for fn in linear linear_ln attention_part linear_st linear_few attention_cl; do
  echo "pin $fn: $(cuobjdump -sass -fun "$fn" /tmp/k.cubin | grep -oE 'LDGSTS[.A-Z]*128|LDG[.A-Z]*128|ACQBULK' | head -2 | tr '\n' ' ')"
done >> $OUT/nvcc.txt
echo "attention_cl barrier: $(cuobjdump -sass -fun attention_cl /tmp/k.cubin | grep -oE 'MEMBAR[.A-Z]*|UCGABAR_[A-Z]*|CCTL[.A-Z]*' | tr '\n' ' ')" >> $OUT/nvcc.txt
cat $OUT/nvcc.txt
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); c=r.get('check_max_abs_diff'); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL') + ('' if c is None else f' check {c:.3g} ok={r.get(\"check_ok\")}'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 90 "$@" --json 2>>$OUT/err.txt | js; }
R=".dev/run --ptx $P"
G="--workload gpt2-decode"
echo "== checks"
for b in 1 2 5 8; do echo "check b$b: $(one $R $G --batch $b --steps 3 --check)"; done
echo "check small b3: $(one $R $G --layers 2 --width 256 --heads 4 --kv-len 300 --vocab 1000 --batch 3 --steps 3 --check)"
echo "check hd128 b1: $(one $R $G --layers 2 --width 512 --heads 4 --kv-len 2048 --vocab 1000 --batch 1 --steps 3 --check)"
echo "check compute_80 b1: $(one .dev/run --ptx $OUT/kernels.ptx $G --batch 1 --steps 3 --check)"
echo "check mlp: $(one $R --workload mlp --steps 3 --check)"
echo "== timing (replay us/step, 128 steps)"
for rep in 1 2; do
  echo "b1 new $(one $R $G --batch 1 --steps 128) | no-few $(one $R $G --batch 1 --steps 128 --no-linear-few) | no-cluster $(one $R $G --batch 1 --steps 128 --no-attention-cluster) | neither $(one $R $G --batch 1 --steps 128 --no-linear-few --no-attention-cluster) | before $(one .dev/run-before $G --batch 1 --steps 128)"
  echo "b1 few T12/LB3 $(one .dev/run --ptx /tmp/t12.ptx $G --batch 1 --steps 128) | few T6 $(one .dev/run --ptx /tmp/t6.ptx $G --batch 1 --steps 128)"
  echo "b2 new $(one $R $G --batch 2 --steps 128) | neither $(one $R $G --batch 2 --steps 128 --no-linear-few --no-attention-cluster) | b4 new $(one $R $G --batch 4 --steps 128) | b4 no-cluster $(one $R $G --batch 4 --steps 128 --no-attention-cluster)"
  echo "b8 new $(one $R $G --batch 8 --steps 128) | before $(one .dev/run-before $G --batch 8 --steps 128) | mlp new $(one $R --workload mlp --steps 1000) | mlp no-few $(one $R --workload mlp --steps 1000 --no-linear-few)"
done
