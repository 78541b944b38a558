#!/usr/bin/env bash
# A record: attention_part's L2 prefetch (11fe517) is no longer in the tree
# (measured neutral at batch 1, slower at 8; h100-s10-probes.txt).
# Session 10 probe 7 and the final run (issue 15), on the H100 as
# 'OUT=$OUT bash scripts/gpu-s10-p7.sh' with .dev carried: .dev/run-pf1,
# -pf2, -pf3 are cmd/run of this tree with attentionPrefetch 0, 1, 2 (what
# attention_part asks L2 for: nothing; the output projection's weights;
# those and the MLP's first linear's), .dev/run-before bab3c80's. Builds
# kernels.cu with nvcc (13.0 there), checks the prefetching kernels, times
# gpt2-decode replays alternating the three, picks the one fastest at batch
# 1 (unless it is slower at batch 8 than no prefetch by more than 0.5%),
# and runs scripts/gpu-floor.sh COMPILE=1 CHECK=1 with it.
set -u
mkdir -p $OUT
nvcc --version | tail -1 > $OUT/probe.txt
nvcc -ptx -arch=compute_90 -O3 -o /tmp/d.ptx kernels/kernels.cu >> $OUT/probe.txt 2>&1 || { cat $OUT/probe.txt; exit 1; }
nvcc -cubin -arch=sm_90 -O3 -o /tmp/k.cubin kernels/kernels.cu && echo "attention_part SASS: $(cuobjdump -sass -fun attention_part /tmp/k.cubin | grep -oE 'UBLKPF[.A-Z0-9]*|CCTL[.A-Z0-9]*|UTMAPF[.A-Z0-9]*' | sort | uniq -c | tr '\n' ' ')" >> $OUT/probe.txt
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); c=r.get('check_max_abs_diff'); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL') + ('' if c is None else f' check {c:.3g} ok={r.get(\"check_ok\")}'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 90 "$@" --json 2>>$OUT/err.txt | js; }
G="--workload gpt2-decode"
echo "check pf3 b1: $(one .dev/run-pf3 --ptx /tmp/d.ptx $G --batch 1 --steps 3 --check)" | tee -a $OUT/probe.txt
echo "check pf3 b8: $(one .dev/run-pf3 --ptx /tmp/d.ptx $G --batch 8 --steps 3 --check)" | tee -a $OUT/probe.txt
for rep in 1 2; do
  for b in 1 8; do
    echo "b$b pf1 $(one .dev/run-pf1 --ptx /tmp/d.ptx $G --batch $b --steps 128) | pf2 $(one .dev/run-pf2 --ptx /tmp/d.ptx $G --batch $b --steps 128) | pf3 $(one .dev/run-pf3 --ptx /tmp/d.ptx $G --batch $b --steps 128)" | tee -a $OUT/probe.txt
  done
done
best=$(python3 - $OUT/probe.txt <<'PY'
import re,sys,statistics
t={}
for l in open(sys.argv[1]):
    m=re.match(r'b(\d) (.*)',l)
    if not m: continue
    for k,v in re.findall(r'(pf\d) ([\d.]+)',m.group(2)): t.setdefault((m.group(1),k),[]).append(float(v))
med={k:statistics.median(v) for k,v in t.items()}
c=[p for p in ('pf1','pf2','pf3') if ('1',p) in med and ('8',p) in med and med[('8',p)] <= 1.005*med[('8','pf1')]]
print(min(c,key=lambda p: med[('1',p)]) if c else 'pf1')
PY
)
echo "chosen: $best" | tee -a $OUT/probe.txt
(RUN=.dev/run-$best COMPILE=1 CHECK=1 BEFORE=.dev/run-before OUT=/tmp/gf timeout 420 bash scripts/gpu-floor.sh > /tmp/gf-stdout.txt 2>&1)
cp /tmp/gf/log.txt /tmp/gf/results.jsonl /tmp/gf/kernels.ptx /tmp/gf/kernels_90.ptx /tmp/gf-stdout.txt $OUT/
tail -5 /tmp/gf-stdout.txt
