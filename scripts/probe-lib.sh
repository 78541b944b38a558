# probe-lib.sh: what the session probes (scripts/gpu-s11-p*.sh) share; sourced.
# js reads one cmd/run --json object: replay µs a step, NOT-EQUAL when the
# replay differed from the eager run, and the --check result when there is one.
# one CMD ARGS... runs cmd/run with --json (90 s at most, stderr to
# $OUT/err.txt) and prints js's line.
js() { python3 -c "import json,sys
try:
  r=json.load(sys.stdin); c=r.get('check_max_abs_diff'); print(f'{r[\"replay_us_per_step\"]:.1f}' + ('' if r['outputs_equal'] else ' NOT-EQUAL') + ('' if c is None else f' check {c:.3g} ok={r.get(\"check_ok\")}'))
except Exception as e: print('FAILED', e)"; }
one() { timeout 90 "$@" --json 2>>"$OUT/err.txt" | js; }
