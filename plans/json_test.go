package plans

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

func TestWriteJSONGolden(t *testing.T) {
	cases := map[string]*File{
		"small": smallFile(t),
		"empty": {Trace: &lifetime.Trace{Name: "empty"}, Plan: &planner.Plan{Algo: "none", Align: 256, Optimal: true}},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteJSON(&buf, f); err != nil {
				t.Fatal(err)
			}
			var v struct {
				Buffers []struct {
					ID     int   `json:"id"`
					Offset int64 `json:"offset"`
				} `json:"buffers"`
				Arena int64 `json:"arena"`
			}
			if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
				t.Fatalf("export is not valid JSON: %v\n%s", err, buf.Bytes())
			}
			if len(v.Buffers) != len(f.Trace.Buffers) || v.Arena != f.Plan.Arena {
				t.Fatalf("export has %d buffers and arena %d, want %d and %d", len(v.Buffers), v.Arena, len(f.Trace.Buffers), f.Plan.Arena)
			}
			for i, b := range v.Buffers {
				if b.ID != i || b.Offset != f.Plan.Offsets[i] {
					t.Fatalf("buffer %d exported as id %d at %d, want offset %d", i, b.ID, b.Offset, f.Plan.Offsets[i])
				}
			}
			golden := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("export differs from %s (run with -update if the change is intended):\n%s", golden, buf.Bytes())
			}
		})
	}
	if err := WriteJSON(&bytes.Buffer{}, &File{}); err == nil {
		t.Errorf("WriteJSON of an empty File succeeded")
	}
}
