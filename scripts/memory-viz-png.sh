#!/usr/bin/env bash
# memory-viz-png.sh: PyTorch's memory_viz pictures of a snapshot pickle as
# PNG, drawn by headless Chromium, with no PyTorch and no network needed.
#
#   scripts/memory-viz-png.sh [--memory-viz PATH] [--pages DIR] [--select-largest] SNAPSHOT.pickle PREFIX
#
# writes PREFIX-trace.png (the active-memory timeline, what _memory_viz
# trace_plot shows) and PREFIX-segments.png (the allocator state at the last
# event, segment_plot), 1600x900. SNAPSHOT is what
# torch.cuda.memory._dump_snapshot wrote (a dict with "segments" and
# "device_traces").
#
# MemoryViz.js, PyTorch's viewer, comes from --memory-viz PATH, else
# $MEMORY_VIZ_JS, else the installed torch (torch/utils/viz/MemoryViz.js).
# d3 comes from Debian's node-d3 (d3 5; $D3_JS overrides the path); the
# viewer's d3 imports, from a CDN, are mapped onto it by
# scripts/memory-viz-page.py. --pages DIR keeps the HTML pages (they open
# offline in a browser); else they go to a temporary folder.
# --select-largest points at the largest allocation in each view, so that
# the picture shows its size and the stack that allocated it (recorded with
# _record_memory_history(stacks="python")).
# Needs: python3, chromium (apt-get install chromium), node-d3
# (apt-get install node-d3; libjs-d3 is d3 3, too old).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "memory-viz-png: $*" >&2; exit 1; }

viz=${MEMORY_VIZ_JS:-} pages= select=
while [ $# -gt 0 ]; do
	case $1 in
	--memory-viz) viz=${2:?--memory-viz needs a path}; shift 2 ;;
	--pages) pages=${2:?--pages needs a folder}; shift 2 ;;
	--select-largest) select=--select-largest; shift ;;
	-*) die "unknown option $1" ;;
	*) break ;;
	esac
done
[ $# -eq 2 ] || die "usage: $0 [--memory-viz PATH] [--pages DIR] [--select-largest] SNAPSHOT.pickle PREFIX"
snapshot=$1 prefix=$2
[ -f "$snapshot" ] || die "$snapshot: no such file"

command -v python3 >/dev/null || die "python3 not found"
chrome=${CHROMIUM:-}
if [ -z "$chrome" ]; then
	for c in chromium chromium-browser google-chrome; do
		if command -v "$c" >/dev/null; then chrome=$c; break; fi
	done
fi
[ -n "$chrome" ] && command -v "$chrome" >/dev/null || die "chromium not found: apt-get install chromium (or set CHROMIUM)"
d3=${D3_JS:-/usr/share/nodejs/d3/dist/d3.js}
[ -f "$d3" ] || die "$d3 not found: apt-get install node-d3 (or set D3_JS)"
if [ -z "$viz" ]; then
	viz=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "utils/viz/MemoryViz.js"))' 2>/dev/null) ||
		die "no MemoryViz.js: PyTorch is not installed here; pass --memory-viz PATH or set MEMORY_VIZ_JS (torch/utils/viz/MemoryViz.js from PyTorch)"
fi
[ -f "$viz" ] || die "$viz: no such file"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pages=${pages:-$tmp/pages}
python3 "$here/memory-viz-page.py" "$snapshot" "$pages" "$viz" "$d3" $select
pages=$(cd "$pages" && pwd)

# Virtual time runs only while the page is idle, so the budget waits until
# the viewer has drawn, however long the snapshot takes.
flags=(--headless --disable-gpu --hide-scrollbars --window-size=1600,900
	--virtual-time-budget=20000 --allow-file-access-from-files
	--user-data-dir="$tmp/profile")
[ "$(id -u)" -ne 0 ] || flags+=(--no-sandbox) # Chromium will not run as root with its sandbox
mkdir -p "$(dirname "$prefix")"
# view and what it draws: the timeline is polygons, the segment view rects.
for view in trace:polygon segments:rect; do
	name=${view%%:*} shape=${view#*:}
	url=file://$pages/$name.html
	timeout 300 "$chrome" "${flags[@]}" --dump-dom "$url" >"$tmp/$name.dom" 2>"$tmp/chromium.log" ||
		die "chromium failed on $url; its log: $(tail -5 "$tmp/chromium.log")"
	err=$(python3 -c 'import html, re, sys; m = re.search(r"id=\"memory-viz-error\"[^>]*>([^<]*)", open(sys.argv[1]).read()); print(html.unescape(m.group(1)) if m else "")' "$tmp/$name.dom")
	[ -z "$err" ] || die "$name page: $err"
	n=$({ grep -o "<$shape" "$tmp/$name.dom" || true; } | wc -l)
	[ "$n" -gt 0 ] || die "$name page drew nothing (no <$shape>); keep the page with --pages DIR and open it in a browser"
	timeout 300 "$chrome" "${flags[@]}" --screenshot="$tmp/$name.png" "$url" 2>"$tmp/chromium.log" >/dev/null ||
		die "chromium failed to take a screenshot of $url; its log: $(tail -5 "$tmp/chromium.log")"
	mv "$tmp/$name.png" "$prefix-$name.png"
	echo "$prefix-$name.png ($n ${shape}s drawn)"
done
