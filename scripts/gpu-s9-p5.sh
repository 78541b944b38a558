#!/usr/bin/env bash
# Session 9 probe 5 (issue 15), run on the H100 as 'OUT=$OUT bash scripts/gpu-s9-p5.sh' with .dev carried
# (.dev/run, .dev/run-before; .dev/k90.ptx, probe 4's PTX); a record: its output is in
# bench/results/h100-s9-probes.txt. Its --staged-min-bytes 4000000 and --staged-min-in 1024
# are gone: --staged-only qkv,fc and --staged-only fc_proj stage the same linears.
set -u
P=(--ptx .dev/k90.ptx)
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f} eq={r[\"outputs_equal\"]}')
except Exception as e: print('FAILED', e)"; }
one() { timeout 100 "$@" --json 2>>$OUT/err.txt | js; }
G=(--workload gpt2-decode --steps 128)
for rep in 1 2; do
echo "b8 default $(one .dev/run "${P[@]}" "${G[@]}" --batch 8) | noproj $(one .dev/run "${P[@]}" "${G[@]}" --batch 8 --staged-min-bytes 4000000) | g132noproj $(one .dev/run "${P[@]}" "${G[@]}" --batch 8 --staged-min-bytes 4000000 --staged-grid 200)"
echo "b1 default $(one .dev/run "${P[@]}" "${G[@]}" --batch 1) | all $(one .dev/run "${P[@]}" "${G[@]}" --batch 1 --staged-from-batch 1) | fcproj-only $(one .dev/run "${P[@]}" "${G[@]}" --batch 1 --staged-from-batch 1 --staged-min-in 1024) | noproj $(one .dev/run "${P[@]}" "${G[@]}" --batch 1 --staged-from-batch 1 --staged-min-bytes 4000000)"
done
echo "b4 default $(one .dev/run "${P[@]}" "${G[@]}" --batch 4) unstaged $(one .dev/run "${P[@]}" "${G[@]}" --batch 4 --unstaged) | b2 all $(one .dev/run "${P[@]}" "${G[@]}" --batch 2 --staged-from-batch 1) unstaged $(one .dev/run "${P[@]}" "${G[@]}" --batch 2)"
