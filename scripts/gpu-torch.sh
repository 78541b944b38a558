#!/usr/bin/env bash
# The PyTorch bridge on a GPU: every model of bench/torch_bridge.py with
# PyTorch's own allocator and with arenaplan's (one process each), the
# allocator's alloc+free cost from C, and compute-sanitizer on the GPT-2
# case. Builds no Go: first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/{libarenaplan.so,abi_check}
#
# copy .dev/torch to the GPU machine beside the checkout and run
# scripts/gpu-torch.sh [all|models|family|eager|sanitizer|diag|plain|chunk].
# Logs and JSON go to $OUT (default /tmp/gpu-torch); a table last.
# models: MODELS= (bench/torch_bridge.py's names), MODES= (torch ours
# ours-plan), DET=1 (PyTorch's deterministic kernels, to results-det.jsonl),
# SKIP_ABI=1 (no abi_check bench).
set -u
OUT=${OUT:-/tmp/gpu-torch}
WHAT=${1:-all}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "$WHAT" = all ] || [ "$WHAT" = models ]; then
	echo "== alloc+free from C" | tee -a "$OUT/log.txt"
	[ -n "${SKIP_ABI:-}" ] || .dev/torch/abi_check "$ARENAPLAN_LIB" bench 2>&1 | tee "$OUT/abi-bench.txt"
	for m in ${MODELS:-gpt2-decode-b1 gpt2-decode-b8 llama-decode bert resnet50 gpt2-train}; do
		mkdir -p /tmp/gpu-torch-plans
		for mode in ${MODES:-torch ours ours-plan}; do
			echo "== $mode $m" | tee -a "$OUT/log.txt"
			case $mode in
			torch) args=(--mode torch) ;;
			ours) args=(--mode ours --save-plan /tmp/gpu-torch-plans/$m.plan) ;;
			ours-plan) args=(--mode ours --plan /tmp/gpu-torch-plans/$m.plan) ;;
			esac
			# DET=1: PyTorch's deterministic kernels, to results-det.jsonl.
			[ -n "${DET:-}" ] && args+=(--deterministic)
			timeout 300 python3 bench/torch_bridge.py "${args[@]}" --model $m >>"$OUT/results${DET:+-det}.jsonl" 2>>"$OUT/log.txt" ||
				echo "FAILED $mode $m ($?)" | tee -a "$OUT/log.txt"
		done
	done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = family ]; then
	# FAMILY_MODES: torch, ours (saves a plan), ours-plan (one capture a
	# member from it), each with -nd for PyTorch's default (nondeterministic)
	# kernels; CYCLES sleep/wake cycles in "ours" (default 100).
	for mode in ${FAMILY_MODES:-torch ours ours-plan torch-nd ours-nd}; do
		echo "== family and sleep: $mode" | tee -a "$OUT/log.txt"
		nd=(); [ "${mode%-nd}" != "$mode" ] && nd=(--nondeterministic)
		case ${mode%-nd} in
		torch) args=(--mode torch) ;;
		ours) args=(--mode ours --save-plan /tmp/family$mode.plan --cycles ${CYCLES:-100}) ;;
		ours-plan) args=(--mode ours --plan /tmp/familyours.plan --cycles 0) ;;
		esac
		[ -n "${nd[*]}" ] && [ "${mode%-nd}" = ours ] && args+=(--cycles ${CYCLES_ND:-0})
		args+=("${nd[@]}")
		timeout 400 python3 bench/torch_family_sleep.py "${args[@]}" >>"$OUT/family.jsonl" 2>>"$OUT/log.txt" ||
			echo "FAILED family $mode ($?)" | tee -a "$OUT/log.txt"
	done
	python3 - "$OUT/family.jsonl" <<'PY' | tee "$OUT/family-summary.txt"
import json, sys
M = 2**20
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    caps = r["capture_ms"]
    per = r.get("per_size_ms", caps)
    rec = r.get("record_ms", {})
    print(f"{r['mode']:9} det {str(r['deterministic'])[0]} graphs {r['graph_bytes']/M:8.1f} MiB  device {r['device_bytes_for_graphs']/M:8.1f} MiB  "
          f"LB(largest) {r.get('lower_bound', 0)/M:8.1f} MiB  ratio {r.get('ratio', 0):.4f}  max added/size {r['max_added_bytes']/M:6.2f} MiB  "
          f"per size ms max {max(per.values()):6.1f} (captures max {max(caps.values()):.1f}, plan {r.get('plan_ms', 0):.1f} for all, recording runs max {max(rec.values()) if rec else 0:.1f})  "
          f"captures {sorted(set(r.get('captures', {}).values()))} replans {sum(r.get('replans', {}).values())}  mixed equal {r['mixed_equal']}/40 bad {r['mixed_bad_sizes']}  div {r.get('divergences', '-')}  eager repeatable {all(r['eager_repeatable'].values())}")
    print("       per size ms: " + " ".join(f"{b}:{v}" for b, v in per.items()))
    print("       curve MiB: " + " ".join(f"{b}:{v/M:.1f}" for b, v in r["curve"]))
    print("       replay us: " + " ".join(f"{b}:{v}" for b, v in r["replay_us"].items()))
    sl = r.get("sleep")
    if sl:
        print(f"       sleep: {sl['cycles']} cycles, returned >= {sl['returned_fraction_min']:.4f} of paused; backup GiB/s first {sl['backup_GiBps_first']:.1f}, later min/median {sl['backup_GiBps_min_later']:.1f}/{sl['backup_GiBps_median_later']:.1f}; "
              f"restore first {sl['restore_GiBps_first']:.1f}, later min/median {sl['restore_GiBps_min_later']:.1f}/{sl['restore_GiBps_median_later']:.1f}; wake {sl['wake_s_median']*1e3:.0f} ms; "
              f"replays equal in checked cycles {sl['checked_cycles_all_equal']}; device free after {[x/M for x in sl['device_free_after_range']]} MiB; rss {[x/M for x in sl['rss_range']]} MiB; backup {[x/M for x in sl['backup_bytes_range']]} MiB")
PY
fi
if [ "$WHAT" = plain ]; then
	for m in gpt2-decode-b1 gpt2-decode-b8 llama-decode; do
		echo "== ours $m with ARENAPLAN_SPILL_PLAIN=1" | tee -a "$OUT/log.txt"
		ARENAPLAN_SPILL_PLAIN=1 timeout 300 python3 bench/torch_bridge.py --mode ours --model $m >>"$OUT/plain.jsonl" 2>>"$OUT/log.txt" ||
			echo "FAILED plain $m ($?)" | tee -a "$OUT/log.txt"
		timeout 300 python3 bench/torch_bridge.py --mode torch --model $m >>"$OUT/plain.jsonl" 2>>"$OUT/log.txt"
	done
fi
if [ "$WHAT" = diag ]; then
	# Replay cost, taken apart: one plain torch.cuda.graph capture per
	# allocator configuration (see bench/torch_replay_diag.py).
	[ -n "${SKIP_ABI:-}" ] || .dev/torch/abi_check "$ARENAPLAN_LIB" bench 2>&1 | tee "$OUT/abi-bench.txt"
	for m in gpt2-decode-b1; do
		for cfg in ${DIAG_CFGS:-torch:keep ours:keep}; do
			set -- ${cfg/:/ }
			cfg=${cfg/:/ }
			echo "== diag $m $cfg" | tee -a "$OUT/log.txt"
			env=(); flags=()
			[ "${2:-}" = expandable ] && env=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
			[ "${2:-}" = plain ] && env=(ARENAPLAN_SPILL_PLAIN=1)
			[ "${2:-}" = planned ] && flags=(--planned)
			[ "${2:-}" = planned-first ] && flags=(--planned-first)
			[ "${2:-}" = planned-eager ] && flags=(--planned --eager-blocks 10)
			[ "${2:-}" = graphs-eager ] && flags=(--graphs --eager-blocks 10)
			[ "${2:-}" = alloc-eager ] && flags=(--graphs --eager-blocks 10 --alloc-before 1024)
			[ "${2:-}" = alloc ] && flags=(--graphs --alloc-before 1024)
			[ "${2:-}" = planned-first-eager ] && flags=(--planned-first --eager-blocks 10)
			[ "${2:-}" = newstream-eager ] && flags=(--graphs --new-stream --eager-blocks 10)
			[ -n "${DIAG_ENV:-}" ] && env+=($DIAG_ENV) && cfg="$cfg $DIAG_ENV"
			[ "${2:-}" = stages ] && flags=(--stages)
			[ "${2:-}" = graphs ] && flags=(--graphs)
			[ "${2:-}" = keep ] && flags=(--keep)
			env "${env[@]}" timeout 200 python3 bench/torch_replay_diag.py --mode $1 --model $m --tag "$cfg" "${flags[@]}" \
				>>"$OUT/diag.jsonl" 2>>"$OUT/log.txt" || echo "FAILED diag $m $cfg" | tee -a "$OUT/log.txt"
		done
	done
	python3 - "$OUT/diag.jsonl" <<'PY' | tee "$OUT/diag-summary.txt"
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    for name, m in r["runs"].items():
        print(f"{r['model']:15} {r['tag']:16} {name:28} replay {m['replay_us']:7.1f} us  busy {m['busy_us']:7.1f}  span {m['span_us']:7.1f}  gaps in/between {m['gap_inside_us']:6.1f}/{m['gap_between_replays_us']:6.1f}  ops {m['ops']:4.0f}  launch {m.get('launch_host_us', 0):6.1f} us  idle cpu {m.get('idle_cpu_pct', 0):5.1f}%  threads {m.get('threads', 0)}")
PY
fi
if [ "$WHAT" = chunk ]; then
	for m in gpt2-decode-b1 llama-decode; do
		echo "== ours $m with ARENAPLAN_SPILL_CHUNK=1 GiB" | tee -a "$OUT/log.txt"
		ARENAPLAN_SPILL_CHUNK=1073741824 timeout 300 python3 bench/torch_bridge.py --mode ours --model $m >>"$OUT/chunk.jsonl" 2>>"$OUT/log.txt" ||
			echo "FAILED chunk $m ($?)" | tee -a "$OUT/log.txt"
	done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = eager ]; then
	# Eager steps are CPU-bound (Python launching kernels) and vary between
	# processes more than between allocators: alternate the two, one
	# process each, EAGER_REPS times, every process on the same cores.
	for rep in $(seq ${EAGER_REPS:-3}); do
		for m in ${EAGER_MODELS:-gpt2-decode-b1 llama-decode gpt2-train}; do
			# ours-slow: the same with the C fast path off (ARENAPLAN_FASTPATH=0).
			for mode in ${EAGER_MODES:-torch ours ours-slow}; do
				echo "== eager $rep $mode $m" | tee -a "$OUT/log.txt"
				env=(); [ $mode = ours-slow ] && env=(ARENAPLAN_FASTPATH=0)
				env "${env[@]}" taskset -c 2-5 timeout 120 python3 bench/torch_bridge.py --mode ${mode%-slow} --model $m --eager-only \
					| sed "s/\"mode\": \"ours-eager\"/\"mode\": \"$mode-eager\"/" \
					>>"$OUT/eager.jsonl" 2>>"$OUT/log.txt" || echo "FAILED eager $mode $m" | tee -a "$OUT/log.txt"
			done
		done
	done
	python3 - "$OUT/eager.jsonl" <<'PY' | tee "$OUT/eager-summary.txt"
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        runs.setdefault(r["model"], {}).setdefault(r["mode"], []).append(r)
med = lambda rs, k: statistics.median(r["eager_call_us"][k] for r in rs)  # noqa: E731
print("eager step µs, one call at a time: median over processes of each one's median / p90 / fastest")
print(f"{'model':15} {'torch':>20} {'ours':>20} {'ours/torch':>11} {'fast path off':>20} {'off/torch':>10}  ours per step")
for m, d in runs.items():
    t, o, n = d.get("torch-eager", []), d.get("ours-eager", []), d.get("ours-slow-eager", [])
    if not t or not o or "eager_call_us" not in t[0]:
        continue
    trip = lambda rs: "/".join(f"{med(rs, k):.0f}" for k in ("median", "p90", "fastest"))  # noqa: E731
    rat = lambda rs: f"{med(rs, 'median') / med(t, 'median'):.3f} {med(rs, 'p90') / med(t, 'p90'):.3f}"  # noqa: E731
    print(f"{m:15} {trip(t):>20} {trip(o):>20} {rat(o):>11} {trip(n) if n else '-':>20} {rat(n) if n else '-':>10}  "
          f"{o[-1].get('per_step')}")
PY
fi
if [ "$WHAT" = all ] || [ "$WHAT" = sanitizer ]; then
	echo "== compute-sanitizer memcheck: ours gpt2-decode-b1" | tee -a "$OUT/log.txt"
	timeout 280 compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/torch_bridge.py --mode ours --model gpt2-decode-b1 --quick >"$OUT/sanitizer.txt" 2>&1
	echo "memcheck rc=$?" | tee -a "$OUT/log.txt"
	grep -E 'ERROR SUMMARY|LEAK SUMMARY|^\{' "$OUT/sanitizer.txt" | tail -3 | tee -a "$OUT/log.txt"
fi
R=$OUT/results${DET:+-det}.jsonl
[ -f "$R" ] && python3 - "$R" <<'PY' | tee "$OUT/summary${DET:+-det}.txt"
import json, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        rows.setdefault(r["model"], {})[r["mode"]] = r
M = 2**20
print(f"{'model':15} {'LB MB':>7} {'arena/LB':>8} {'torch pool MB':>13} {'ours MB':>8} {'ours/torch':>10} {'capture ms t/o':>15} {'replay us t/o':>15} {'eager us t/o':>15} {'equal t/o':>9} {'div':>3}  {'replay us: torch 3 captures / ours from a plan file':>20}")
for m, d in rows.items():
    t, o = d.get("torch", {}), d.get("ours", {})
    lb = o.get("lower_bound", 0)
    ratio = o.get("arena", 0) / lb if lb else float("nan")
    tp, op = t.get("graph_bytes", float("nan")), o.get("graph_bytes", float("nan"))
    print(f"{m:15} {lb/1e6:7.1f} {ratio:8.4f} {tp/1e6:13.1f} {op/1e6:8.1f} {op/tp if tp else float('nan'):10.3f} "
          f"{t.get('capture_ms', 0):7.0f}/{o.get('capture_ms', 0):<7.0f} {t.get('replay_us', 0):7.0f}/{o.get('replay_us', 0):<7.0f} "
          f"{t.get('eager_us', 0):7.0f}/{o.get('eager_us', 0):<7.0f} {str(t.get('replay_equal'))[0]}/{str(o.get('replay_equal'))[0]:7} {o.get('divergences', '-'):3}"
          f"  {t.get('replay_us_after_3_captures', 0):7.0f} / {d.get('ours-plan', {}).get('replay_us', 0):<7.0f} (div {d.get('ours-plan', {}).get('divergences', '-')})")
PY
exit 0
