#!/usr/bin/env bash
# GPU runs of run --pause: the arena of gpt2-decode paused and resumed
# twice halfway through a replayed sequence (weights and KV cache backed up
# in page-locked host memory), outputs checked against eager. Builds no Go:
# first, on a machine with Go,
#
#   CGO_ENABLED=0 go build -o .dev/pause/run ./cmd/run
#
# and copy .dev/pause to the GPU machine beside the checkout; there run scripts/gpu-pause.sh.
# Logs and JSON go to $OUT (default /tmp/gpu-pause); a table last.
set -u
OUT=${OUT:-/tmp/gpu-pause}
mkdir -p "$OUT"
RUN=${RUN:-.dev/pause/run}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
i=0
for shape in "" "--batch 8 --kv-len 4096" "--batch 32 --kv-len 8192"; do
	i=$((i + 1))
	echo "== run --workload gpt2-decode $shape --steps 20 --pause" | tee -a "$OUT/log.txt"
	# shellcheck disable=SC2086
	"$RUN" --workload gpt2-decode $shape --steps 20 --pause --json >"$OUT/pause$i.json" 2>>"$OUT/log.txt" || echo "FAILED ($?)" | tee -a "$OUT/log.txt"
done
echo "== compute-sanitizer memcheck, small shape" | tee -a "$OUT/log.txt"
compute-sanitizer --tool memcheck --error-exitcode 9 "$RUN" --workload gpt2-decode --layers 2 --width 64 --heads 4 --kv-len 64 --vocab 101 --steps 4 --pause >"$OUT/sanitizer.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$OUT/log.txt"
tail -2 "$OUT/sanitizer.txt" | tee -a "$OUT/log.txt"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys, glob
print(f"{'shape':>24} {'mapped MiB':>10} {'returned MiB':>12} {'host MiB':>9} {'pause ms':>9} {'resume ms':>9} {'again ms':>9} {'again ms':>9} equal")
for p in sorted(glob.glob(sys.argv[1] + "/pause*.json")):
    try:
        r = json.load(open(p))
    except Exception as e:
        print(p, "missing", e)
        continue
    s, q = r["shape"], r["pause"]
    name = f"b{s.get('batch')} kv{s.get('kv_len')}"
    print(f"{name:>24} {r['mapped_bytes']/2**20:10.0f} {q['returned_bytes']/2**20:12.0f} {q['host_bytes']/2**20:9.0f} {q['pause_ms']:9.2f} {q['resume_ms']:9.2f} {q['pause_again_ms']:9.2f} {q['resume_again_ms']:9.2f} {q['outputs_equal'] and r['outputs_equal']}")
PY
