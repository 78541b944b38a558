package tracegen

import (
	"testing"
)

func TestGenerateIsValidAndRepeatable(t *testing.T) {
	for _, n := range []int{1, 10, 1000, 20000} {
		a, err := Generate(Options{Buffers: n, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		if len(a.Buffers) != n {
			t.Fatalf("%d buffers, want %d", len(a.Buffers), n)
		}
		if err := a.Validate(); err != nil {
			t.Fatal(err)
		}
		b, _ := Generate(Options{Buffers: n, Seed: 7})
		if a.Fingerprint() != b.Fingerprint() {
			t.Fatalf("%d buffers: two traces from the same seed differ", n)
		}
	}
	if _, err := Generate(Options{}); err == nil {
		t.Fatal("no error for zero buffers")
	}
}

// TestShape checks the traces look like the real ones: most buffers short
// lived, some long, and a bounded live set.
func TestShape(t *testing.T) {
	tr, _ := Generate(Options{Buffers: 50000, Seed: 1})
	short := 0
	for _, b := range tr.Buffers {
		if b.End-b.Start <= 3 {
			short++
		}
	}
	if f := float64(short) / float64(len(tr.Buffers)); f < 0.5 || f > 0.95 {
		t.Errorf("%.2f of buffers live at most 3 ticks; want most but not all", f)
	}
	peak, _ := tr.LowerBound(1)
	if total := tr.TotalBytes(1); peak*20 > total {
		t.Errorf("peak %d is more than 1/20 of all bytes %d: lifetimes too long", peak, total)
	}
}

func TestWindow(t *testing.T) {
	tr, err := Window(WindowOptions{Buffers: 100, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Validate(); err != nil {
		t.Fatal(err)
	}
	for i, b := range tr.Buffers {
		if b.End-b.Start != 4 || b.Start != int64(i) || b.Size < 1<<10 || b.Size > 1<<20 || b.Size%256 != 0 {
			t.Fatalf("buffer %d: %+v", i, b)
		}
	}
	again, _ := Window(WindowOptions{Buffers: 100, Seed: 3})
	other, _ := Window(WindowOptions{Buffers: 100, Seed: 4})
	if tr.Fingerprint() != again.Fingerprint() || tr.Fingerprint() == other.Fingerprint() {
		t.Fatal("the seed does not decide the trace")
	}
	for _, bad := range []WindowOptions{{}, {Buffers: 5, MinSize: 10, MaxSize: 5}} {
		if _, err := Window(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestTorchDecode(t *testing.T) {
	for _, att := range []string{"", "math16", "efficient"} {
		a, err := TorchDecode(TorchDecodeOptions{Model: Model{Batch: 4}, Attention: att})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("%q: %v", att, err)
		}
		if n := len(a.Buffers); n < 300 || n > 400 {
			t.Errorf("%q: %d buffers, want about 48 a layer", att, n)
		}
		b, _ := TorchDecode(TorchDecodeOptions{Model: Model{Batch: 4}, Attention: att})
		for i := range a.Buffers {
			x, y := a.Buffers[i], b.Buffers[i]
			if x.Size != y.Size || x.Start != y.Start || x.End != y.End || x.Name != y.Name {
				t.Fatalf("%q: buffer %d differs between two draws", att, i)
			}
		}
	}
	for _, bad := range []TorchDecodeOptions{{Model: Model{Heads: 12, KVHeads: 5}}, {Attention: "flash"}} {
		if _, err := TorchDecode(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
