#!/usr/bin/env bash
# Tensor parallel on every GPU of the machine (issue 17): bench/torch_tp.py
# (a Llama-3.2-1B-shaped decode step, all-reduces inside the graph) under
# torchrun at world size 1 and at the GPU count, with PyTorch's own
# allocator and with arenaplan's; then every rank loads its own plan in a
# fresh process and refuses another rank's and another world size's. Builds
# no Go: first, on a machine with Go and gcc,
#
#   scripts/build-torch-bridge.sh          # writes .dev/torch/libarenaplan.so
#
# carry .dev/torch to the GPU machine and run scripts/gpu-tp.sh. Logs and
# JSON (one line per rank per run) go to $OUT (default /tmp/gpu-tp); a
# table per rank last. WORLDS overrides the world sizes, TP_ARGS adds
# bench flags (say --layers 4), PAUSE the pause/resume cycles (default 3).
set -u
OUT=${OUT:-/tmp/gpu-tp}
mkdir -p "$OUT"
export ARENAPLAN_LIB=${ARENAPLAN_LIB:-$PWD/.dev/torch/libarenaplan.so}
export PYTHONUNBUFFERED=1
# Never NVLink multicast: it can take a shared host's GPUs down.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# NCCL's graph user-buffer registration is cached by address and goes stale
# after a same-address resume: off for both allocators (same NCCL path).
export NCCL_GRAPH_REGISTER=${NCCL_GRAPH_REGISTER:-0}
N=$(nvidia-smi --list-gpus | wc -l)
WORLDS=${WORLDS:-$( (echo 1; echo "$N") | sort -nu | tr '\n' ' ')}
PAUSE=${PAUSE:-3}
PLANS=${PLANS:-/tmp/gpu-tp-plans}
rm -rf "$PLANS"; mkdir -p "$PLANS"
RES=$OUT/results.jsonl
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m >>"$OUT/gpu.txt" 2>&1
echo "GPUs: $N; world sizes: $WORLDS" | tee -a "$OUT/log.txt"

tp() { # tp TAG WORLD ARGS...
	local tag=$1 w=$2
	shift 2
	echo "== $tag, world size $w" | tee -a "$OUT/log.txt"
	timeout "${TP_TIMEOUT:-400}" torchrun --standalone --nproc_per_node="$w" bench/torch_tp.py --tag "$tag" \
		--json-out "$RES" "$@" ${TP_ARGS:-} >>"$OUT/log.txt" 2>&1 ||
		echo "FAILED $tag, world size $w ($?)" | tee -a "$OUT/log.txt"
}

done_worlds=""
for w in $WORLDS; do
	tp torch "$w" --mode torch
	tp ours "$w" --mode ours --plan-out "$PLANS/w{world}-r{rank}.plan" --pause "$PAUSE"
	foreign=()
	[ "$w" -gt 1 ] && foreign+=(--foreign-plan "$PLANS/w{world}-r{next}.plan")
	for d in $done_worlds; do foreign+=(--foreign-plan "$PLANS/w$d-r0.plan"); done
	if [ "$N" -eq 1 ]; then
		# One GPU: no other rank exists, so make a plan file that says
		# "rank 1 of 2" (arenaplan told so; the process group is world 1).
		tp label "$w" --mode ours --label 1/2 --plan-out "$PLANS/label-r1of2.plan" \
			--foreign-plan "$PLANS/w{world}-r{rank}.plan" --iters 5 --blocks 2
		foreign+=(--foreign-plan "$PLANS/label-r1of2.plan")
	fi
	tp ours-plan "$w" --mode ours --plan "$PLANS/w{world}-r{rank}.plan" "${foreign[@]}"
	done_worlds="$done_worlds $w"
done
grep -E "Error|error|Traceback|FAILED" "$OUT/log.txt" | grep -v "^==" | sort | uniq -c | sort -rn | head -20

[ -f "$RES" ] && python3 - "$RES" <<'PY' | tee "$OUT/summary.txt"
import json, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        rows.setdefault((r["world"], r["rank"]), {})[r["tag"]] = r
M = 2**20
yn = lambda v: "-" if v is None else ("y" if v is True else ("n" if v is False else "n/a"))
print(f"{'ws':>2} {'rk':>2} {'LB MiB':>7} {'arena/LB':>8} {'torch MiB':>9} {'ours MiB':>8} {'o/t':>6} "
      f"{'capture ms t/o':>14} {'replay us t/o':>15} {'o/t':>6} {'eager us':>8} {'equal t/o/p':>11} {'ranks':>5} "
      f"{'repeat t/o':>10} {'div o/p':>7} {'nccl t/o':>8} {'refused':>7} {'pause':>12} {'on gpu':>6}")
for (w, rk), d in sorted(rows.items()):
    t, o, pl = d.get("torch", {}), d.get("ours", {}), d.get("ours-plan", {})
    lb = o.get("lower_bound", 0)
    tp, op = t.get("graph_bytes"), o.get("graph_bytes")
    tr, orr = t.get("replay_us"), o.get("replay_us")
    ps = o.get("pause", {})
    refused = [x.get("foreign_refused") for x in (pl, d.get("label", {})) if "foreign_refused" in x]
    print(f"{w:2} {rk:2} {lb/M:7.1f} {o.get('ratio', float('nan')):8.4f} {tp/M if tp is not None else float('nan'):9.1f} "
          f"{op/M if op is not None else float('nan'):8.1f} {op/tp if tp and op is not None else float('nan'):6.3f} "
          f"{t.get('capture_ms', 0):6.0f}/{o.get('capture_ms', 0):<7.0f} {tr or 0:7.1f}/{orr or 0:<7.1f} "
          f"{orr/tr if tr and orr else float('nan'):6.3f} {t.get('eager_us', 0):8.0f} "
          f"{yn(t.get('replay_equal')) + '/' + yn(o.get('replay_equal')) + '/' + yn(pl.get('replay_equal')):>11} "
          f"{yn(all(x.get('same_logits_on_all_ranks', False) for x in (t, o))):>5} "
          f"{yn(t.get('eager_repeatable') and t.get('replay_repeatable')) + '/' + yn(o.get('eager_repeatable') and o.get('replay_repeatable')):>10} "
          f"{str(o.get('divergences', '-')) + '/' + str(pl.get('divergences', '-')):>7} "
          f"{yn(t.get('allreduce_in_graph')) + '/' + yn(o.get('allreduce_in_graph')):>8} "
          f"{yn(all(refused) if refused else None):>7} "
          f"{(str(ps.get('cycles', '-')) + 'x ' + yn(ps.get('all_equal')) + ' ' + format(ps.get('returned_bytes_min', 0)/M, '.0f') + 'M') if ps else '-':>12} "
          f"{yn(all(x.get(k) for x in (t, o) for k in ('graph_memory_on_this_gpu', 'weights_on_this_gpu'))):>6}")
for (w, rk), d in sorted(rows.items()):
    t, o = d.get("torch", {}), d.get("ours", {})
    gn = t.get("graph_nodes")
    print(f"ws {w} rank {rk}: PyTorch's graph nodes {gn['types'] if gn else t.get('graph_nodes_error', '-')}, "
          f"NCCL kernels in it {gn['nccl_kernels'] if gn else '-'}; profiled replay NCCL kernels torch "
          f"{t.get('profiled_replay', {}).get('nccl_kernels', '-')} ours {o.get('profiled_replay', {}).get('nccl_kernels', '-')}; "
          f"kernels/replay t/o {t.get('profiled_replay', {}).get('kernels_per_replay', '-')}/{o.get('profiled_replay', {}).get('kernels_per_replay', '-')}; "
          f"ours replay after pause {o.get('replay_us_after_pause', '-')} us; NCCL_GRAPH_REGISTER={o.get('nccl_graph_register', '-')}")
    for tag in ("ours-plan", "label"):
        for f, v in d.get(tag, {}).get("foreign_plans", {}).items():
            print(f"   {tag}: {f}: {v[:160]}")
PY
exit 0
