package plans

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"

	"github.com/arenaplan/arenaplan/lifetime"
)

// jsonHead is everything of a File except its buffers, in the order a
// reader wants to see it.
type jsonHead struct {
	Format      string              `json:"format"`
	Version     int                 `json:"version"`
	Trace       string              `json:"trace"`
	Fingerprint string              `json:"fingerprint"`
	Buffers     int                 `json:"buffer_count"`
	Algo        string              `json:"algo"`
	Align       int64               `json:"align"`
	Arena       int64               `json:"arena"`
	LowerBound  int64               `json:"lower_bound"`
	Ratio       float64             `json:"ratio"`
	Optimal     bool                `json:"optimal"`
	ElapsedMS   float64             `json:"elapsed_ms,omitempty"` // files written before timings left the payload
	ToBestMS    float64             `json:"to_best_ms,omitempty"`
	Torch       *lifetime.JSONTorch `json:"torch,omitempty"`
	Workload    *jsonWorkload       `json:"workload,omitempty"`
}

type jsonWorkload struct {
	Name        string    `json:"name"`
	Shape       []jsonDim `json:"shape"`
	Fingerprint string    `json:"fingerprint"`
}

type jsonDim struct {
	Name  string `json:"name"`
	Value int64  `json:"value"`
}

// jsonBuffer is a buffer as the JSON trace format of package lifetime
// writes it (one schema for both), with its id and its offset in the plan.
type jsonBuffer struct {
	ID     int   `json:"id"`
	Offset int64 `json:"offset"`
	lifetime.JSONBuffer
}

// WriteJSON writes f as one human-readable JSON object: the header fields
// first, then "buffers" with one buffer (and its offset) per line, so the
// export of a large plan stays readable with grep and diff. It is an
// export only; the package does not read JSON back. Names that are not
// valid UTF-8 are written with U+FFFD in place of the bad bytes.
func WriteJSON(w io.Writer, f *File) error {
	if f == nil || f.Trace == nil || f.Plan == nil {
		return fmt.Errorf("plans: json: %w: missing trace or plan", ErrInvalid)
	}
	t, p := f.Trace, f.Plan
	fp := t.Fingerprint()
	h := jsonHead{
		Format:      "arenaplan plan",
		Version:     Version,
		Trace:       t.Name,
		Fingerprint: hex.EncodeToString(fp[:]),
		Buffers:     len(t.Buffers),
		Algo:        p.Algo,
		Align:       p.Align,
		Arena:       p.Arena,
		LowerBound:  p.LowerBound,
		Ratio:       p.Ratio(),
		Optimal:     p.Optimal,
		ElapsedMS:   float64(p.Elapsed.Microseconds()) / 1000,
		ToBestMS:    float64(p.ToBest.Microseconds()) / 1000,
	}
	if ts := t.Torch; ts != nil {
		h.Torch = &lifetime.JSONTorch{Device: ts.Device, ReservedPeak: ts.ReservedPeak, LiveAtStart: ts.LiveAtStart, HasSegments: ts.HasSegments}
	}
	if wl := f.Workload; wl != nil {
		jw := &jsonWorkload{Name: wl.Name, Shape: []jsonDim{}, Fingerprint: hex.EncodeToString(wl.Fingerprint[:])}
		for _, d := range wl.Shape {
			jw.Shape = append(jw.Shape, jsonDim(d))
		}
		h.Workload = jw
	}
	head, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return fmt.Errorf("plans: json: %w", err)
	}
	// Reopen the head object to append the buffers array to it.
	head = bytes.TrimSuffix(head, []byte("\n}"))
	bw := bufio.NewWriter(w)
	bw.Write(head)
	bw.WriteString(",\n  \"buffers\": [")
	for i := range t.Buffers {
		line, err := json.Marshal(jsonBufferOf(t, p.Offsets, i))
		if err != nil {
			return fmt.Errorf("plans: json: buffer %d: %w", i, err)
		}
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.WriteString("\n    ")
		bw.Write(line)
	}
	if len(t.Buffers) > 0 {
		bw.WriteString("\n  ")
	}
	bw.WriteString("]\n}\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("plans: json: %w", err)
	}
	return nil
}

func jsonBufferOf(t *lifetime.Trace, offsets []int64, i int) jsonBuffer {
	jb := jsonBuffer{ID: i, Offset: lifetime.NoOffset, JSONBuffer: lifetime.NewJSONBuffer(t, i)}
	if i < len(offsets) {
		jb.Offset = offsets[i]
	}
	return jb
}
