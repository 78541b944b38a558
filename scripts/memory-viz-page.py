#!/usr/bin/env python3
"""Writes PyTorch's memory_viz pages of a snapshot pickle into a folder that
needs no network: MemoryViz.js (and its sibling modules) copied beside the
pages, and every d3 URL it imports mapped, by an import map, to a shim over
Debian's d3 5 (node-d3). Used by memory-viz-png.sh; stdlib only.

    memory-viz-page.py SNAPSHOT.pickle OUTDIR MemoryViz.js d3.js [--select-largest]

writes OUTDIR/trace.html ("Active Memory Timeline", what _memory_viz
trace_plot shows) and OUTDIR/segments.html ("Allocator State History",
segment_plot). --select-largest points at the largest allocation once the
view is drawn, as a mouse would, so that the view shows its size and the
stack that allocated it."""
import base64
import json
import pickle
import re
import shutil
import sys
from pathlib import Path

VIEWS = {"trace": "Active Memory Timeline", "segments": "Allocator State History"}


def fail(msg):
    sys.exit(f"memory-viz-page: {msg}")


def read_snapshot(path):
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        fail(f"{path}: {e}")
    if isinstance(data, list):  # segments only, as _memory_viz accepts
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data or "device_traces" not in data:
        fail(f"{path}: not a torch.cuda.memory._snapshot() pickle (no segments/device_traces)")
    # The viewer's unpickler reads protocols 2 to 4 only.
    return pickle.dumps(data, protocol=4)


def d3_imports(viz_js):
    """The d3 URLs MemoryViz.js imports and the d3 major version it wants."""
    urls = re.findall(r'(?:from|import)\s*["\'](https?://[^"\']+)["\']', viz_js.read_text())
    want = None
    for url in urls:
        m = re.search(r"/d3(-[a-z]+)?@(\d+)", url)
        if not m:
            fail(f"{viz_js} imports {url}, which has no local copy")
        if m.group(1) is None:
            want = int(m.group(2))
    if want is None:
        fail(f"{viz_js} imports no d3@N; is it PyTorch's torch/utils/viz/MemoryViz.js?")
    return urls, want


def shim(d3_js, want):
    """An ES module over the d3 UMD build (window.d3) that MemoryViz.js can
    import as d3, d3-axis, d3-scale, d3-zoom and d3-brush."""
    text = d3_js.read_text()
    m = re.search(r"d3js\.org v(\d+)\.", text[:300])
    have = int(m.group(1)) if m else 0
    if have != 5:
        fail(f"{d3_js} is not d3 5 (Debian's node-d3 in bookworm); found {have or 'no version'}")
    names = sorted(set(re.findall(r"^exports\.(\w+) = ", text, re.M)) - {"event"})
    lines = [
        "const d3 = globalThis.d3;  // not window: d3 exports a name \"window\"",
        # d3 5 sets d3.event around each listener; keep it a live export.
        "export let event = null;",
        "Object.defineProperty(d3, 'event', {get: () => event, set: v => { event = v; }});",
    ]
    if want >= 6:
        # d3 6+ calls listener(event, datum); d3 5 calls listener(datum, i, nodes)
        # and sets d3.event. Adapt MemoryViz's listeners: un-namespaced types on
        # selections (d3's own are namespaced, "wheel.zoom") and behaviours' events.
        lines += [
            "const wrap = f => typeof f === 'function' ? function (d) { return f.call(this, event, d); } : f;",
            "const sel_on = d3.selection.prototype.on;",
            "d3.selection.prototype.on = function (type, f, capture) {",
            "  if (arguments.length < 2) return sel_on.call(this, type);",
            "  return sel_on.call(this, type, type.includes('.') ? f : wrap(f), capture);",
            "};",
            "for (const k of ['zoom', 'brush', 'brushX', 'brushY', 'drag']) {",
            "  const make = d3[k];",
            "  d3[k] = (...a) => { const b = make(...a), on = b.on;",
            "    b.on = function (type, f) { return arguments.length < 2 ? on.call(b, type) : on.call(b, type, wrap(f)); };",
            "    return b; };",
            "}",
        ]
    lines.append(f"export const {{{', '.join(names)}}} = d3;")
    lines.append("export default d3;")
    return "\n".join(lines) + "\n"


PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<title>$TITLE</title>
<script type="importmap">$IMPORTMAP</script>
<script>
// Errors end up in the page, where the screenshot and the check see them.
function memory_viz_error(msg) {
  const p = document.createElement('pre');
  p.id = 'memory-viz-error';
  p.style = 'color: red; position: fixed; top: 0; background: white';
  p.textContent = 'memory-viz error: ' + msg;
  document.documentElement.appendChild(p);
}
// Capturing: a script that fails to load fires a non-bubbling error on its element.
window.addEventListener('error', e => memory_viz_error(e.message || `cannot load ${e.target.src || 'a module script'}`), true);
window.addEventListener('unhandledrejection', e => memory_viz_error(String(e.reason)));
</script>
<script src="d3.js"></script>
</head>
<body>
<script type="module">
import {add_local_files} from "./viz/MemoryViz.js";
const local_files = $SNAPSHOT;
add_local_files(local_files, $VIEW);
$SELECT
</script>
</body>
</html>
"""


# Points at the largest allocation drawn: the timeline's polygons carry
# {elem, size}, the segment view's blocks {requested_size, frames}.
SELECT = """
function select_largest(tries) {
  const shapes = [...document.querySelectorAll('polygon, rect')].filter(e => {
    const d = e.__data__;
    return d && (typeof d.elem === 'number' || d.frames !== undefined && d.requested_size !== undefined);
  });
  if (shapes.length === 0) {
    if (tries > 0) setTimeout(() => select_largest(tries - 1), 200);
    return;
  }
  const size = e => e.__data__.requested_size !== undefined ? e.__data__.requested_size : e.__data__.size;
  shapes.sort((a, b) => size(b) - size(a));
  shapes[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
}
setTimeout(() => select_largest(50), 200);
"""


def main():
    args = [a for a in sys.argv[1:] if a != "--select-largest"]
    if len(args) != 4:
        fail("usage: memory-viz-page.py SNAPSHOT.pickle OUTDIR MemoryViz.js d3.js [--select-largest]")
    select = SELECT if "--select-largest" in sys.argv[1:] else ""
    snapshot, out, viz_js, d3_js = args[0], Path(args[1]), Path(args[2]), Path(args[3])
    buf = read_snapshot(snapshot)
    buf += b"\x00" * (3 - len(buf) % 3)  # as _memory_viz._format_viz: its decoder wants no '=' padding
    urls, want = d3_imports(viz_js)

    out.mkdir(parents=True, exist_ok=True)
    (out / "viz").mkdir(exist_ok=True)
    for js in viz_js.parent.glob("*.js"):  # newer MemoryViz.js imports siblings (./process_alloc_data.js)
        shutil.copyfile(js, out / "viz" / js.name)
    shutil.copyfile(viz_js, out / "viz" / "MemoryViz.js")
    shutil.copyfile(d3_js, out / "d3.js")
    (out / "d3-shim.js").write_text(shim(d3_js, want))

    importmap = json.dumps({"imports": {u: "./d3-shim.js" for u in urls}}, indent=1)
    files = json.dumps([{"name": Path(snapshot).name, "base64": base64.b64encode(buf).decode()}])
    for name, view in VIEWS.items():
        page = (PAGE.replace("$TITLE", f"{view}: {Path(snapshot).name}")
                .replace("$IMPORTMAP", importmap)
                .replace("$VIEW", json.dumps(view))
                .replace("$SELECT", select)
                .replace("$SNAPSHOT", files))
        (out / f"{name}.html").write_text(page)


if __name__ == "__main__":
    main()
