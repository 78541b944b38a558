#!/usr/bin/env python3
"""The table scripts/gpu-tp.sh prints last: one row per model, world size
and rank, from bench/torch_tp.py's JSON lines (argv[1]) and
scripts/tp-rank.sh's exit lines (argv[2])."""
import json
import sys

M = 2**20


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip().startswith("{")]
    except FileNotFoundError:
        return []


rows, exits = {}, {}
for r in lines(sys.argv[1]):
    rows.setdefault((r.get("model", "llama"), r["world"], r["rank"]), {})[r["tag"]] = r
for e in lines(sys.argv[2]):
    model, _, tag = e["tag"].partition("/")
    exits.setdefault((model, e["world"], e["rank"]), {})[tag] = e
keys = sorted(set(rows) | set(exits))

yn = lambda v: "-" if v is None else ("y" if v is True else ("n" if v is False else "n/a"))  # noqa: E731
f1 = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
ratio = lambda a, b: f"{a / b:.3f}" if a and b else "-"  # noqa: E731

print(f"{'model':5} {'ws':>2} {'rk':>2} {'arena/LB':>8} {'graph MiB t/o':>13} {'o/t':>5} {'replay us t/o':>15} {'o/t':>5} "
      f"{'eager us t/o':>13} {'o/t':>5} {'eq t/o/p':>8} {'AR t/o':>6} {'reload cap/div':>14} {'refused':>7} "
      f"{'pause':>9} {'exit codes':>16} {'wall s':>16}")
for k in keys:
    model, w, rk = k
    d = rows.get(k, {})
    t, o, pl = d.get("torch", {}), d.get("ours", {}), d.get("ours-plan", {})
    tg, og = t.get("graph_bytes"), o.get("graph_bytes")
    tr, orr = t.get("replay_us"), o.get("replay_us")
    te, oe = t.get("eager_us"), o.get("eager_us")
    refused = [x.get("foreign_refused") for x in (pl, d.get("label", {})) if "foreign_refused" in x]
    ps = o.get("pause")
    ex = exits.get(k, {})
    order = [x for x in ("torch", "ours", "ours-nofast", "ours-plain", "label", "ours-plan", "torch-again", "ours-again")
             if x in ex]
    codes = "/".join(str(ex[x]["rc"]) for x in order) or "-"
    walls = "/".join(f"{ex[x]['wall_s']:.0f}" for x in order) or "-"
    reload = f"{pl.get('captures', '-')}/{pl.get('divergences', '-')}" if pl else "-"
    print(f"{model:5} {w:2} {rk:2} {f1(o.get('ratio'), '.4f'):>8} "
          f"{f1(tg and tg / M, '.1f') + '/' + f1(og and og / M, '.1f'):>13} {ratio(og, tg):>5} "
          f"{f1(tr, '.1f') + '/' + f1(orr, '.1f'):>15} {ratio(orr, tr):>5} "
          f"{f1(te, '.0f') + '/' + f1(oe, '.0f'):>13} {ratio(oe, te):>5} "
          f"{yn(t.get('replay_equal')) + '/' + yn(o.get('replay_equal')) + '/' + yn(pl.get('replay_equal')):>8} "
          f"{yn(t.get('allreduce_in_graph')) + '/' + yn(o.get('allreduce_in_graph')):>6} {reload:>14} "
          f"{yn(all(refused) if refused else None):>7} "
          f"{(str(ps['cycles']) + 'x ' + yn(ps['all_equal'])) if ps else '-':>9} {codes:>16} {walls:>16}")
print("eager: fastest block; exit codes and wall s per process, in job order: "
      "torch/ours[/ours-nofast/ours-plain][/label]/ours-plan[/torch-again/ours-again]")
for k in keys:
    d = rows.get(k, {})
    e = {tag: (d[tag].get("eager_us"), d[tag].get("eager_med_us"), d[tag].get("eager_p90_us")) for tag in
         ("torch", "ours", "ours-nofast", "ours-plain", "ours-plan", "torch-again", "ours-again") if tag in d}
    if e:
        print(f"{k[0]} ws {k[1]} rank {k[2]} eager us fastest/median/p90: " +
              "; ".join(f"{t} {f1(a, '.0f')}/{f1(b, '.0f')}/{f1(c, '.0f')}" for t, (a, b, c) in e.items()))
for k in keys:
    d = rows.get(k, {})
    for tag in ("torch", "ours", "ours-nofast", "ours-plain"):
        g = d.get(tag, {}).get("eager_diag")
        if not g:
            continue
        ps = g.get("per_step", {})
        print(f"{k[0]} ws {k[1]} rank {k[2]} {tag}: eager {d[tag].get('eager_us', 0):.0f} us (host {g['host_us']:.0f}, "
              f"no all-reduce {g['no_allreduce_us']:.0f}, GPU kernels {g['gpu_kernel_us']:.0f}); alloc+free "
              f"{g['alloc_free_us']:.2f} us; per step {ps}; after {g.get('after', {})}")
        print("    top self CPU us/step: " + "; ".join(f"{n} {c}x {t}" for n, (c, t) in list(g["top_self_cpu_us"].items())[:8]))
        print("    CUDA API us/step: " + "; ".join(f"{n} {c}x {t}" for n, (c, t) in list(g["cuda_api_us"].items())[:6]))
for k in keys:
    for tag in ("ours-plan", "label"):
        for f, v in rows.get(k, {}).get(tag, {}).get("foreign_plans", {}).items():
            print(f"{k[0]} ws {k[1]} rank {k[2]} {tag}: {f}: {v[:150]}")

# Eager steps against PyTorch's allocator, per call: median, p90 and fastest
# (ours with the C fast path on, and off where it ran), and arenaplan's
# counters per step where --eager-diag ran.
print(f"\n{'model':7} {'ws':>2} {'rk':>2} {'torch med/p90/min us':>22} {'ours med/p90/min':>20} {'ours/torch med p90':>18} "
      f"{'fast path off med/p90':>22} {'off/torch':>9}  per step: calls into Go, grows, unmaps, syncs")
for k in keys:
    d = rows.get(k, {})
    t, o, n = d.get("torch", {}), d.get("ours", {}), d.get("ours-nofast", {})
    if not t.get("eager_med_us") or not o.get("eager_med_us"):
        continue
    trip = lambda r: f"{r['eager_med_us']:.0f}/{r.get('eager_p90_us', 0):.0f}/{r['eager_us']:.0f}"  # noqa: E731
    off = f"{n['eager_med_us']:.0f}/{n.get('eager_p90_us', 0):.0f}" if n.get("eager_med_us") else "-"
    offr = ratio(n.get("eager_med_us"), t["eager_med_us"]) if n else "-"
    ps = o.get("eager_diag", {}).get("per_step", {})
    cnt = (f"{round(ps.get('FastPath/GoAllocs', 0) + ps.get('FastPath/FreeCalls', 0), 1)}, {ps.get('Spill/Grows', '-')}, "
           f"{ps.get('Spill/Unmaps', '-')}, {ps.get('Spill/Syncs', '-')}") if ps else "-"
    print(f"{k[0]:7} {k[1]:2} {k[2]:2} {trip(t):>22} {trip(o):>20} "
          f"{ratio(o['eager_med_us'], t['eager_med_us']) + ' ' + ratio(o.get('eager_p90_us'), t.get('eager_p90_us')):>18} "
          f"{off:>22} {offr:>9}  {cnt}")
