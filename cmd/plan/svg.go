package main

import (
	"bufio"
	"fmt"
	"html"
	"io"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// writeSVG draws the layout: time on x, offset on y (0 at the bottom), one
// rectangle per buffer with a <title> tooltip, and a dashed line at the
// lower bound.
func writeSVG(w io.Writer, t *lifetime.Trace, p *planner.Plan) error {
	const W, H, margin = 1200.0, 800.0, 40.0
	bw := bufio.NewWriter(w)
	t0, t1 := t.Span()
	span := float64(max(t1-t0, 1))
	height := float64(max(p.Arena, 1))
	x := func(v int64) float64 { return margin + (float64(v-t0)/span)*(W-2*margin) }
	y := func(off int64) float64 { return H - margin - (float64(off)/height)*(H-2*margin) }
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(bw, "<title>%s: arena %d bytes, lower bound %d (%.4fx), %s</title>\n",
		html.EscapeString(t.Name), p.Arena, p.LowerBound, p.Ratio(), html.EscapeString(p.Algo))
	fmt.Fprintf(bw, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#888"/>`+"\n", margin, margin, W-2*margin, H-2*margin)
	for i := range t.Buffers {
		b := &t.Buffers[i]
		size := lifetime.RoundUp(b.Size, p.Align)
		off := p.Offsets[i]
		hue := (i * 47) % 360
		fmt.Fprintf(bw, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="hsl(%d,60%%,65%%)" stroke="#333" stroke-width="0.2"><title>%s: %d bytes at offset %d, time [%d, %d)</title></rect>`+"\n",
			x(b.Start), y(off+size), max(x(b.End)-x(b.Start), 0.5), max(y(off)-y(off+size), 0.5),
			hue, html.EscapeString(b.Name), b.Size, off, b.Start, b.End)
	}
	lb := y(p.LowerBound)
	fmt.Fprintf(bw, `<line x1="%g" y1="%.2f" x2="%g" y2="%.2f" stroke="red" stroke-dasharray="6,4"><title>lower bound %d bytes</title></line>`+"\n", margin, lb, W-margin, lb, p.LowerBound)
	fmt.Fprintf(bw, `<text x="%g" y="%g">%s — arena %d B, lower bound %d B (%.4fx), %s</text>`+"\n",
		margin, margin-12, html.EscapeString(t.Name), p.Arena, p.LowerBound, p.Ratio(), html.EscapeString(p.Algo))
	fmt.Fprintf(bw, `<text x="%g" y="%g">time →</text><text x="4" y="%g">offset ↑</text>`+"\n", W/2, H-12, margin-20)
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}
