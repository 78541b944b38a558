#!/usr/bin/env bash
# One rank of a torchrun job (torchrun --no-python scripts/tp-rank.sh
# SCRIPT ARGS...): runs python3 SCRIPT ARGS and appends the process's exit
# code and wall time, as one JSON line, to $TP_EXITS (with $TP_TAG and
# torchrun's RANK and WORLD_SIZE), then exits with that code.
t0=$(date +%s.%N)
python3 "$@"
rc=$?
t1=$(date +%s.%N)
if [ -n "${TP_EXITS:-}" ]; then
	printf '{"tag":"%s","rank":%d,"world":%d,"rc":%d,"wall_s":%.2f}\n' "${TP_TAG:-}" "${RANK:-0}" \
		"${WORLD_SIZE:-1}" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" >>"$TP_EXITS"
fi
exit $rc
