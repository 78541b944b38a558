#!/usr/bin/env bash
# Checks cmd/libarenaplan/arenaplan.h, the library's public header, against
# the library built by scripts/build-torch-bridge.sh: its prototypes agree
# with those cgo wrote for the Go exports (one C file includes both), and
# every arenaplan_* symbol the library exports (but its own arenaplan_go_*)
# is declared.
set -euo pipefail
cd "$(dirname "$0")/.."
printf '#include "libarenaplan.h"\n#include "arenaplan.h"\n' |
	gcc -fsyntax-only -Wall -Werror -I.dev/torch -Icmd/libarenaplan -x c -
missing=0
for s in $(nm -D --defined-only .dev/torch/libarenaplan.so | awk '{print $3}' | grep '^arenaplan_' | grep -v '^arenaplan_go_'); do
	if ! grep -Eq "[ *]$s(\(|;)" cmd/libarenaplan/arenaplan.h; then
		echo "arenaplan.h does not declare $s" >&2
		missing=1
	fi
done
exit $missing
