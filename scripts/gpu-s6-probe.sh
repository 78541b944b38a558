#!/usr/bin/env bash
# Session 6 probe (issue 15 launch shapes; the Python wheel installed as a
# user would). Carry .dev/run, .dev/wheel.
set -u
mkdir -p $OUT
# 1. the wheel, installed into a target folder, no ARENAPLAN_LIB
( unset ARENAPLAN_LIB; python3 -m pip install --no-deps --no-index --target /tmp/site .dev/wheel/*.whl 2>&1 | tail -1
  cd /tmp && PYTHONPATH=/tmp/site python3 - <<'PY'
import arenaplan._lib as L, arenaplan.torch as ap
print("lib", L.default_path())
ap.install()
import torch
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda().half()
x = torch.randn(64, 1024, device="cuda", dtype=torch.half)
s = torch.cuda.Stream()
step = ap.graph(lambda: m(x), stream=s)
out = step.replay(); torch.cuda.synchronize()
ref = m(x); torch.cuda.synchronize()
r = step.report()
print("wheel ok", torch.equal(out, ref), {k: r.get(k) for k in ("arena", "lower_bound", "divergences", "captures")})
PY
) > $OUT/wheel.txt 2>&1
tail -3 $OUT/wheel.txt | cut -c1-400
# 2. linear launch grids: replay µs per step, gpt2-decode b1 and b8
for b in 1 8; do
  for lg in 0 396 264 132; do
    for pg in 0 264 132; do
      r=$(.dev/run --workload gpt2-decode --batch $b --steps 128 --warmup 3 --linear-ln-grid $lg --linear-grid $pg --json 2>>$OUT/log.txt)
      echo "$r" >> $OUT/grid.jsonl
      echo "$r" | python3 -c "import json,sys; r=json.load(sys.stdin); print(f'b$b ln-grid $lg grid $pg replay {r[\"replay_us_per_step\"]:.1f} eager {r[\"eager_us_per_step\"]:.1f} equal {r[\"outputs_equal\"]}')" | tee -a $OUT/grid.txt
    done
  done
done
