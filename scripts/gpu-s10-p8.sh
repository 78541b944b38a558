#!/usr/bin/env bash
# A record: its binaries were built with the constants qkvLNGrid and fcLNGrid
# (now fcLNGrid1 = 528 alone); the figures: h100-s10-probes.txt.
# Session 10 probe 8 and a final run (issue 15), on the H100 as
# 'OUT=$OUT bash scripts/gpu-s10-p8.sh' with .dev carried: .dev/run-qQ-fF
# are cmd/run of this tree with qkvLNGrid Q and fcLNGrid F (the QKV
# projection's and the MLP's first linear_ln grids; 0: linearLNMaxGrid,
# 462), .dev/run-before bab3c80's. Times gpt2-decode replays at batch 1
# alternating them, picks the fastest (q0-f0 unless another is faster by
# 1.5 µs or more), and runs scripts/gpu-floor.sh CHECK=1 with it (the
# embedded kernels: nvcc 13.0's committed PTX).
set -u
mkdir -p $OUT
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL'))
except Exception as e: print('FAILED', e)"; }
b1() { timeout 60 "$@" --workload gpt2-decode --batch 1 --steps 128 --json 2>>$OUT/err.txt | js; }
V="q0-f0 q396-f0 q0-f396 q528-f0 q0-f528"
for rep in 1 2; do
  line="b1"; for v in $V; do line="$line $v $(b1 .dev/run-$v) |"; done; echo "$line" | tee -a $OUT/probe.txt
done
best=$(python3 - $OUT/probe.txt <<'PY'
import re,sys,statistics
t={}
for l in open(sys.argv[1]):
    for k,v in re.findall(r'(q\d+-f\d+) ([\d.]+)',l): t.setdefault(k,[]).append(float(v))
med={k:statistics.median(v) for k,v in t.items()}
b=min(med,key=med.get)
print(b if 'q0-f0' not in med or med[b] <= med['q0-f0']-1.5 else 'q0-f0')
PY
)
echo "chosen: $best" | tee -a $OUT/probe.txt
(RUN=.dev/run-$best CHECK=1 BEFORE=.dev/run-before OUT=/tmp/gf timeout 300 bash scripts/gpu-floor.sh > /tmp/gf-stdout.txt 2>&1)
cp /tmp/gf/log.txt /tmp/gf/results.jsonl /tmp/gf-stdout.txt $OUT/
tail -4 /tmp/gf-stdout.txt
