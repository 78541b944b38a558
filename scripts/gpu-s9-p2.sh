#!/usr/bin/env bash
# Session 9 probe 2 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s9-p2.sh' with .dev carried
# (.dev/run, .dev/run-before; .dev/kernels_90.ptx, the PTX of probe 1); a record: its output is in
# bench/results/h100-s9-probes.txt.
set -u
P=(--ptx .dev/kernels_90.ptx)
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]} pdl={r.get(\"pdl_launches_per_step\")}/{r.get(\"launches_per_step\")}')
except Exception as e: print('FAILED', e)"; }
one() { timeout 100 "$@" --json 2>>$OUT/err.txt | js; }
for rep in 1 2; do
echo "mlp unstaged $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --unstaged) | g264 $(one .dev/run "${P[@]}" --workload mlp --steps 1000) | g132 $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --staged-grid 132) | g64 $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --staged-grid 64) | g32 $(one .dev/run "${P[@]}" --workload mlp --steps 1000 --staged-grid 32)"
W=(--workload gpt2-decode --width 512 --heads 8 --steps 128)
for b in 1 8; do
echo "w512 b$b unstaged $(one .dev/run "${P[@]}" "${W[@]}" --batch $b --unstaged) | g264 $(one .dev/run "${P[@]}" "${W[@]}" --batch $b) | g132 $(one .dev/run "${P[@]}" "${W[@]}" --batch $b --staged-grid 132) | g100 $(one .dev/run "${P[@]}" "${W[@]}" --batch $b --staged-grid 100)"
done
done
nvcc -cubin -arch=sm_90 -O3 -o /tmp/k.cubin kernels/kernels.cu && cuobjdump -sass -fun linear_st /tmp/k.cubin > $OUT/linear_st.sass
wc -l $OUT/linear_st.sass; grep -c "LDL\|STL" $OUT/linear_st.sass
