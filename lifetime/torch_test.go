package lifetime

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// wantBuf is the part of a buffer the importer tests compare.
type wantBuf struct {
	Name       string
	Size       int64
	Start, End int64
	Stream     int64
}

func bufsOf(t *Trace) []wantBuf {
	out := make([]wantBuf, len(t.Buffers))
	for i, b := range t.Buffers {
		out[i] = wantBuf{b.Name, b.Size, b.Start, b.End, b.Stream}
	}
	return out
}

// TestReadTorchSnapshotFixture checks every rule of the importer on the
// fixture written by testdata/gen_torch_fixture.py, worked out by hand.
func TestReadTorchSnapshotFixture(t *testing.T) {
	f, err := os.Open("testdata/torch_small.pickle")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ts, err := ReadTorchSnapshot(f, "small.pickle")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 {
		t.Fatalf("%d traces, want 2 (device 1 has no events)", len(ts))
	}
	d0, d2 := ts[0], ts[1]
	if d0.Name != "small.pickle[cuda:0]" || d2.Name != "small.pickle[cuda:2]" {
		t.Errorf("names %q, %q", d0.Name, d2.Name)
	}
	// Time counts alloc and free_requested: A 0, B 1, free A 2, C 3,
	// free B 4, D 5, free P 6, E 7, free C 8, free D 9; 10 counted events.
	want := []wantBuf{
		{"0x1000@alloc#0", 1000, 0, 2, 0}, // completion right after request: End 2
		{"0x2000@alloc#1", 2000, 1, 6, 7}, // completed after D's alloc at 5: End 6
		{"0x3000@alloc#5", 3000, 3, 8, 0},
		{"0x4000@alloc#7", 500, 5, 9, 0},   // no completion: dies at its request
		{"0x5000@alloc#12", 100, 7, 11, 0}, // never freed: End = 10 + 1
	}
	if got := bufsOf(d0); !reflect.DeepEqual(got, want) {
		t.Errorf("device 0 buffers\n got %+v\nwant %+v", got, want)
	}
	for _, b := range d0.Buffers {
		if b.HasFixed || b.HasHint || b.Align != 0 {
			t.Errorf("%s: Fixed %d Hint %d Align %d, want none", b.Name, b.Fixed, b.Hint, b.Align)
		}
	}
	if lb, at := d0.LowerBound(1); lb != 5500 || at != 5 {
		t.Errorf("LowerBound(1) = %d at %d, want 5500 at 5", lb, at)
	}
	// Reserved after: 4 MiB + 2 MiB on device 0; during the trace +2 MiB and
	// -1 MiB, so 5 MiB before, 7 MiB at the peak. Live at start: the untouched
	// active block W (8192) and the pre-trace block P freed in the trace
	// (4096); E's block is the trace's own.
	wantStats := TorchStats{Device: 0, ReservedPeak: 7 << 20, LiveAtStart: 12288, HasSegments: true, Kept: []int64{8192}}
	if !reflect.DeepEqual(*d0.Torch, wantStats) {
		t.Errorf("device 0 stats %+v, want %+v", *d0.Torch, wantStats)
	}
	if r := d0.Torch.Reserved(); r != 7<<20-12288 {
		t.Errorf("Reserved() = %d", r)
	}
	if got := bufsOf(d2); !reflect.DeepEqual(got, []wantBuf{{"0x7000@alloc#0", 64, 0, 2, 0}}) {
		t.Errorf("device 2 buffers %+v", got)
	}
	if s := *d2.Torch; !reflect.DeepEqual(s, TorchStats{Device: 2, ReservedPeak: 1 << 20, LiveAtStart: 0, HasSegments: true}) {
		t.Errorf("device 2 stats %+v", s)
	}
}

func TestReadTorchSnapshotNoSegments(t *testing.T) {
	data, err := os.ReadFile("testdata/torch_nosegments.pickle")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := ReadTorchSnapshot(bytes.NewReader(data), "n")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].Name != "n" || len(ts[0].Buffers) != 5 {
		t.Fatalf("got %d traces", len(ts))
	}
	if s := ts[0].Torch; s.HasSegments || s.ReservedPeak != 0 || s.Reserved() != 0 {
		t.Errorf("stats %+v, want no segment data", *s)
	}
}

func torchEv(action string, addr, size int64) []kv {
	return []kv{{"action", action}, {"addr", addr}, {"size", size}, {"stream", int64(0)}}
}

func TestReadTorchSnapshotErrors(t *testing.T) {
	ev := torchEv("alloc", 16, 8)
	for _, c := range []struct {
		name string
		in   []byte
		want string
	}{
		{"not pickle", []byte("id,lower\n"), "torch: not a pickled memory snapshot"},
		{"empty", nil, "torch: empty input"},
		{"protocol 1", []byte{0x80, 1, 0x7d}, "torch: not a pickled memory snapshot"},
		{"global", []byte("\x80\x02cos\nsystem\n."), "torch: pickle: offset 2: opcode GLOBAL (0x63) would import or call Python code; refused"},
		{"list", pk([]any{}), "torch: snapshot is a list, not a dict"},
		{"no traces", pk([]kv{{"segments", []any{}}}), "torch: snapshot has no device_traces"},
		{"traces not list", pk([]kv{{"device_traces", "x"}}), "device_traces is a str, not a list"},
		{"device not list", pk([]kv{{"device_traces", []any{int64(3)}}}), "device_traces[0] is a int, not a list"},
		{"event not dict", pk([]kv{{"device_traces", []any{[]any{"x"}}}}), "device_traces[0][0] is a str, not a dict"},
		{"no events", pk([]kv{{"device_traces", []any{[]any{}, []any{}}}}), "snapshot has no trace events"},
		{"no action", pk([]kv{{"device_traces", []any{[]any{[]kv{{"addr", int64(1)}}}}}}), "device_traces[0][0]: event has no action"},
		{"addr str", pk([]kv{{"device_traces", []any{[]any{[]kv{{"action", "alloc"}, {"addr", "0x10"}, {"size", int64(8)}}}}}}), `device_traces[0][0]: field "addr" is a str, not an int`},
		{"no size", pk([]kv{{"device_traces", []any{[]any{[]kv{{"action", "alloc"}, {"addr", int64(16)}}}}}}), `device_traces[0][0]: no "size" field`},
		{"negative size", pk([]kv{{"device_traces", []any{[]any{torchEv("alloc", 16, -8)}}}}), "alloc event: size -8 is out of range"},
		{"segments not list", pk([]kv{{"device_traces", []any{[]any{ev}}}, {"segments", int64(1)}}), "segments is a int, not a list"},
		{"segment no size", pk([]kv{{"device_traces", []any{[]any{ev}}}, {"segments", []any{[]kv{{"device", int64(0)}}}}}), `segments[0]: no "total_size" field`},
		{"block not dict", pk([]kv{{"device_traces", []any{[]any{ev}}}, {"segments", []any{[]kv{{"total_size", int64(1)}, {"blocks", []any{nil}}}}}}), "segments[0].blocks[0] is a None, not a dict"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadTorchSnapshot(bytes.NewReader(c.in), "x")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "torch: ") {
				t.Errorf("err = %v, want the prefix torch: ", err)
			}
		})
	}
}

// TestReadTorchSnapshotEdgeCases covers lost events: an alloc at a live
// address, a completion without a request, a zero-size alloc, and segment
// events that contradict the final state.
func TestReadTorchSnapshotEdgeCases(t *testing.T) {
	evs := []any{
		torchEv("alloc", 16, 8),            // t0
		torchEv("alloc", 16, 4),            // t1: the free of the first was lost
		torchEv("alloc", 32, 0),            // t2: zero bytes, no buffer
		torchEv("free_completed", 16, 4),   // no request: ends at lastAlloc+1 = 3
		torchEv("segment_alloc", 0, 1<<30), // no segment holds it at the end
		[]kv{{"action", "snapshot"}},       // ignored, needs no fields
	}
	in := pk([]kv{{"device_traces", []any{evs}}, {"segments", []any{}}})
	ts, err := ReadTorchSnapshot(bytes.NewReader(in), "e")
	if err != nil {
		t.Fatal(err)
	}
	want := []wantBuf{{"0x10@alloc#0", 8, 0, 1, 0}, {"0x10@alloc#1", 4, 1, 3, 0}}
	if got := bufsOf(ts[0]); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if ts[0].Torch.HasSegments {
		t.Errorf("contradictory segment events: HasSegments should be false, stats %+v", *ts[0].Torch)
	}
}

// TestReadTorchSnapshotMemoAmplification: one memoized event dict
// referenced more times than the file has room for distinct events is
// refused, cheaply; referenced fewer times (with a big dict that pays for
// them) it is converted once (TestHostileSnapshots, wide dict).
func TestReadTorchSnapshotMemoAmplification(t *testing.T) {
	var b bytes.Buffer
	b.Write([]byte{0x80, 4, '}', '(', 'X', 13, 0, 0, 0})
	b.WriteString("device_traces")
	b.Write([]byte{']', '(', ']', '('})
	b.Write(pk(torchEv("free_requested", 16, 8))[2:]) // the event dict, then '.'
	b.Truncate(b.Len() - 1)
	b.WriteByte(0x94) // memoize as 0
	for range 10000 {
		b.Write([]byte{'h', 0})
	}
	b.Write([]byte{'e', 'e', 'u', '.'})
	size := b.Len()
	var err error
	if n := allocated(func() { _, err = ReadTorchSnapshot(&b, "m") }); n > 64*uint64(size) {
		t.Errorf("%d-byte pickle allocated %d bytes", size, n)
	}
	if err == nil || !strings.Contains(err.Error(), "device_traces[0]: more list items than a snapshot of") {
		t.Fatalf("err = %v, want a refusal of device_traces[0]", err)
	}
}

// TestTorchData checks every snapshot in ../shared/data/torch: its lower
// bound at alignment 1 equals peak_live_trace in anchor-summary.json and the
// derived CSV's, and its lifetimes equal the CSV's row by row.
func TestTorchData(t *testing.T) {
	dir := filepath.Join(sharedData(t), "torch")
	var anchors struct {
		Workloads map[string]struct {
			Tensors          int   `json:"tensors"`
			PeakLiveTrace    int64 `json:"peak_live_trace"`
			MaxReservedDelta int64 `json:"max_reserved_delta"`
		} `json:"workloads"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "anchor-summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &anchors); err != nil {
		t.Fatal(err)
	}
	pickles, _ := filepath.Glob(filepath.Join(dir, "*.pickle"))
	if len(pickles) == 0 {
		t.Fatalf("no pickles in %s", dir)
	}
	for _, p := range pickles {
		w := strings.TrimSuffix(filepath.Base(p), ".pickle")
		t.Run(w, func(t *testing.T) {
			start := time.Now()
			ts, err := Load(p, "")
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if elapsed > time.Second {
				t.Errorf("loading took %v, want well under a second", elapsed)
			}
			if len(ts) != 1 {
				t.Fatalf("%d traces, want 1", len(ts))
			}
			tr := ts[0]
			a, ok := anchors.Workloads[w]
			if !ok {
				t.Fatalf("no anchor for %s", w)
			}
			lb, _ := tr.LowerBound(1)
			if lb != a.PeakLiveTrace {
				t.Errorf("LowerBound(1) = %d, anchor peak_live_trace %d", lb, a.PeakLiveTrace)
			}
			if len(tr.Buffers) != a.Tensors {
				t.Errorf("%d buffers, anchor says %d tensors", len(tr.Buffers), a.Tensors)
			}
			cs, err := Load(filepath.Join(dir, w+".csv"), "")
			if err != nil {
				t.Fatal(err)
			}
			clb, _ := cs[0].LowerBound(1)
			if clb != lb {
				t.Errorf("CSV LowerBound(1) = %d, pickle %d", clb, lb)
			}
			if len(cs[0].Buffers) != len(tr.Buffers) {
				t.Fatalf("CSV has %d buffers, pickle %d", len(cs[0].Buffers), len(tr.Buffers))
			}
			for i, b := range tr.Buffers {
				c := cs[0].Buffers[i]
				if b.Start != c.Start || b.End != c.End || b.Size != c.Size {
					t.Errorf("buffer %d (%s): [%d,%d) %d bytes; CSV row [%d,%d) %d bytes", i, b.Name, b.Start, b.End, b.Size, c.Start, c.End, c.Size)
					break
				}
			}
			s := tr.Torch
			if !s.HasSegments {
				t.Fatalf("no segment data")
			}
			// What the allocator held for the trace's own buffers can never be
			// less than the live peak of those buffers.
			if s.Reserved() < lb {
				t.Errorf("torch reserved %d < lower bound %d", s.Reserved(), lb)
			}
			t.Logf("load %v, %d buffers, LB %d, reserved peak %d, live at start %d, torch_reserved %d (%.2fx LB), anchor max_reserved_delta %d",
				elapsed.Round(time.Microsecond), len(tr.Buffers), lb, s.ReservedPeak, s.LiveAtStart, s.Reserved(),
				float64(s.Reserved())/float64(lb), a.MaxReservedDelta)
		})
	}
}

func BenchmarkReadTorchSnapshot(b *testing.B) {
	dir := filepath.Join(sharedData(b), "torch")
	p := filepath.Join(dir, "gpt2_train_b4_s512.pickle")
	data, err := os.ReadFile(p)
	if err != nil {
		b.Skip(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := ReadTorchSnapshot(bytes.NewReader(data), "g"); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzReadTorchSnapshot(f *testing.F) {
	for _, p := range []string{"testdata/torch_small.pickle", "testdata/torch_nosegments.pickle"} {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add(pk([]kv{{"device_traces", []any{[]any{torchEv("alloc", 16, 8), torchEv("free_requested", 16, 8)}}}}))
	// Small hostile inputs (hostile_test.go): lists and dicts repeated
	// through memo references.
	f.Add(memoBombPickle(64, 64))
	f.Add(segmentBombPickle(64, 64))
	f.Add(wideDictPickle(64, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, err := ReadTorchSnapshot(bytes.NewReader(data), "f")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "torch: ") {
				t.Fatalf("error without prefix: %v", err)
			}
			return
		}
		for _, tr := range ts {
			if err := tr.Validate(); err != nil {
				t.Fatalf("accepted an invalid trace: %v", err)
			}
			if tr.Torch == nil {
				t.Fatal("no TorchStats")
			}
		}
	})
}
