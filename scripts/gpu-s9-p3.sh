#!/usr/bin/env bash
# Session 9 probe 3 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s9-p3.sh' with .dev carried
# (.dev/run, .dev/run-before; no PTX: it builds its own); a record: its output is in
# bench/results/h100-s9-probes.txt.
set -u
mkdir -p $OUT/v
nvcc -ptx -arch=compute_90 -O3 -o $OUT/kernels_90.ptx kernels/kernels.cu || exit 1
nvcc -ptx -arch=compute_80 -O3 -o $OUT/kernels.ptx kernels/kernels.cu || exit 1
nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -o /tmp/k.cubin kernels/kernels.cu > $OUT/v/ptxas.txt 2>&1
grep -A4 -E "Compiling entry function '(linear_st|linear|linear_ln)'" $OUT/v/ptxas.txt | grep -E "entry|registers|stack"
cuobjdump -sass -fun linear_st /tmp/k.cubin > $OUT/v/linear_st.sass; echo "linear_st LDL/STL: $(grep -c 'LDL\|STL' $OUT/v/linear_st.sass)"
P=(--ptx $OUT/kernels_90.ptx)
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]}' + (f' check={r[\"check_max_abs_diff\"]:.3g} ok={r[\"check_ok\"]}' if 'check_ok' in r else ''))
except Exception as e: print('FAILED', e)"; }
one() { timeout 100 "$@" --json 2>>$OUT/err.txt | js; }
echo "check b8 $(one .dev/run "${P[@]}" --workload gpt2-decode --batch 8 --steps 3 --check) | b3 small $(one .dev/run "${P[@]}" --workload gpt2-decode --layers 2 --width 256 --heads 4 --kv-len 256 --vocab 1000 --batch 3 --steps 4 --check)"
for rep in 1 2; do
echo "mlp before $(one .dev/run-before --workload mlp --steps 1000) unstaged $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --unstaged) | g264 $(one .dev/run "${P[@]}" --workload mlp --steps 1000) | g132 $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --staged-grid 132) | g32 $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --staged-grid 32)"
for b in 1 8; do
G=(--workload gpt2-decode --steps 128 --batch $b)
echo "b$b before $(one .dev/run-before "${G[@]}") unstaged $(one .dev/run "${P[@]}" "${G[@]}" --unstaged) | g264 $(one .dev/run "${P[@]}" "${G[@]}") | g132 $(one .dev/run "${P[@]}" "${G[@]}" --staged-grid 132)"
W=(--workload gpt2-decode --width 512 --heads 8 --steps 128 --batch $b)
echo "w512 b$b unstaged $(one .dev/run "${P[@]}" "${W[@]}" --unstaged) | g264 $(one .dev/run "${P[@]}" "${W[@]}") | g132 $(one .dev/run "${P[@]}" "${W[@]}" --staged-grid 132)"
done
done
