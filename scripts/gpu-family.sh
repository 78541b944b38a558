#!/usr/bin/env bash
# GPU runs of families of graphs: plan --batch-sizes, run --plan
# FAMILY (mixed sequence checked against eager, per-member replay), a
# small family on the simulated device and under compute-sanitizer, and
# the PyTorch twin with one shared graph pool (bench/torch_family.py).
# Like scripts/gpu-run.sh it builds no Go: first, on a machine with Go,
#
#   CGO_ENABLED=0 go build -o .dev/run ./cmd/run
#   CGO_ENABLED=0 go build -o .dev/plan ./cmd/plan
#
# and copy .dev to the GPU machine beside the checkout; there run scripts/gpu-family.sh.
# Logs and JSON go to $OUT (default /tmp/gpu-family). TORCH=0 skips the
# PyTorch twin.
set -u
OUT=${OUT:-/tmp/gpu-family}
mkdir -p "$OUT"
RUN=${RUN:-.dev/run}
PLAN=${PLAN:-.dev/plan}
SIZES=${SIZES:-1,2,4,8,16,32,64}
STEPS=${STEPS:-100}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== plan --workload gpt2-decode --batch-sizes $SIZES" | tee -a "$OUT/log.txt"
"$PLAN" --workload gpt2-decode --batch-sizes "$SIZES" -o "$OUT/fam.plan" | tee -a "$OUT/log.txt"

echo "== run --plan fam.plan --steps $STEPS (round robin, GPU)" | tee -a "$OUT/log.txt"
"$RUN" --plan "$OUT/fam.plan" --steps "$STEPS" --json >"$OUT/family.json" 2>>"$OUT/log.txt" || echo "FAILED ($?)" | tee -a "$OUT/log.txt"
echo "== run --plan fam.plan --steps $STEPS --no-pdl (GPU, for comparison)" | tee -a "$OUT/log.txt"
"$RUN" --plan "$OUT/fam.plan" --steps "$STEPS" --no-pdl --json >"$OUT/family_nopdl.json" 2>>"$OUT/log.txt" || echo "FAILED ($?)" | tee -a "$OUT/log.txt"
echo "== run --plan fam.plan --sequence ... (GPU)" | tee -a "$OUT/log.txt"
"$RUN" --plan "$OUT/fam.plan" --steps 50 --sequence 8,1,64,2,32,4,16,64,1,8,2,16,4,32,64,32,16,8,4,2,1 2>&1 | tee -a "$OUT/log.txt"

small=(--workload gpt2-decode --layers 2 --width 64 --heads 4 --kv-len 64 --vocab 101)
"$PLAN" "${small[@]}" --batch-sizes "$SIZES" -o "$OUT/small.plan" >/dev/null
echo "== small family, simulated device" | tee -a "$OUT/log.txt"
"$RUN" --device sim --plan "$OUT/small.plan" --steps 10 --sequence 8,1,64,2,32,4,16,64,1,8 2>&1 | grep -E "outputs|family" | tee -a "$OUT/log.txt"
echo "== small family, GPU" | tee -a "$OUT/log.txt"
"$RUN" --plan "$OUT/small.plan" --steps 10 --sequence 8,1,64,2,32,4,16,64,1,8 2>&1 | grep -E "outputs|family" | tee -a "$OUT/log.txt"
echo "== compute-sanitizer memcheck, small family" | tee -a "$OUT/log.txt"
compute-sanitizer --tool memcheck --error-exitcode 9 "$RUN" --plan "$OUT/small.plan" --steps 2 --warmup 1 >"$OUT/sanitizer.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$OUT/log.txt"
tail -2 "$OUT/sanitizer.txt" | tee -a "$OUT/log.txt"

if [ "${TORCH:-1}" = 1 ]; then
	echo "== torch, one shared pool" | tee -a "$OUT/log.txt"
	python3 bench/torch_family.py --batch-sizes "$SIZES" --steps "$STEPS" --json >"$OUT/torch_family.json" 2>>"$OUT/log.txt" || echo "torch FAILED" | tee -a "$OUT/log.txt"
fi

python3 - "$OUT/family.json" "$OUT/torch_family.json" "$OUT/family_nopdl.json" <<'PY' | tee "$OUT/summary.txt"
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        print("missing", p, e)
        return {}
f, t, n = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
plain = {m["batch"]: m["replay_us_per_step"] for m in n.get("members", [])}
if f:
    print(f"family arena {f['arena_bytes']}  largest LB {f['lower_bound']}  ratio {f['arena_bytes']/f['lower_bound']:.4f}")
    print(f"shared {f['shared_bytes']} (weights {f['weight_bytes']}, kv {f['kv_bytes']}), inputs {f['input_bytes']}, outputs {f['output_bytes']}, intermediates {f['intermediate_bytes']}")
    print(f"separate arenas {f['separate_arenas_bytes']}  standalone {f['separate_standalone_arenas_bytes']}  mapped {f['mapped_bytes']}")
    print(f"mixed sequence {f['sequence_steps']} steps equal eager: {f['mixed_outputs_equal']}; eager {f['eager_us_per_step']:.1f} us/step, replay {f['replay_us_per_step']:.1f} us/step")
    print(f"launch: PDL {f.get('pdl')} ({f.get('pdl_launches_per_step')} of {f.get('launches_per_step')} kernels); --no-pdl run equal eager: {n.get('mixed_outputs_equal')}")
    for m in f["members"]:
        p = plain.get(m["batch"])
        extra = f"  (--no-pdl {p:.1f} us)" if p else ""
        print(f"  batch {m['batch']:3d}  LB {m['lower_bound']}  private {m['private_bytes']}  replay {m['replay_us_per_step']:.1f} us{extra}")
if t:
    print(f"torch shared pool reserved {t['shared_pool_reserved_bytes']}  live after capture {t['shared_pool_live_after_capture_bytes']}  static outputs {t['static_outputs_bytes']}  beyond outputs {t['shared_pool_beyond_outputs_bytes']}")
    print(f"torch separate pools reserved {t['separate_pools_reserved_bytes']}; mixed replay equal eager {t['mixed_replay_equal_eager']} (max diff {t['mixed_replay_max_abs_diff']})")
    for m in t["members"]:
        print(f"  torch batch {m['batch']:3d}  replay {m['replay_us_per_step']:.1f} us")
PY
