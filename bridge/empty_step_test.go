package bridge

import (
	"path/filepath"
	"testing"
)

// A step that allocates nothing (a compiled optimizer step that writes
// its parameters in place and reads its gradients where another graph
// made them) records, plans and serves: its arena holds nothing, and the
// device maps nothing for it.
func TestStepWithoutAllocations(t *testing.T) {
	b := newTestBridge(t)
	const stream = 0x55
	s, err := b.NewStep(0, "in place")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Record(stream); err != nil {
		t.Fatal(err)
	}
	if err := s.End(false); err != nil {
		t.Fatalf("End of a recording without allocations: %v", err)
	}
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Serve(stream, true); err != nil {
			t.Fatal(err)
		}
		if err := s.End(false); err != nil {
			t.Fatal(err)
		}
	}
	r := s.Report()
	if r.Arena != 0 || r.LowerBound != 0 || r.Divergences != 0 {
		t.Fatalf("report %+v: want an empty arena at its bound, no divergence", r)
	}
	if st, _ := b.Stats(0); st.ArenaBytes != 0 || st.ArenaMapped != 0 {
		t.Fatalf("stats count %d arena bytes, %d mapped: want none", st.ArenaBytes, st.ArenaMapped)
	}
	// Its plan round-trips through a file.
	path := filepath.Join(t.TempDir(), "empty.plan")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := b.NewStep(0, "loaded")
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Load(path); err != nil {
		t.Fatal(err)
	}
	if err := s2.Serve(stream, true); err != nil {
		t.Fatal(err)
	}
	if err := s2.End(false); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
}

// A family whose members allocate nothing, or one of them: planned and
// served as any other.
func TestFamilyMemberWithoutAllocations(t *testing.T) {
	for _, withOther := range []bool{false, true} {
		b := newTestBridge(t)
		f, err := b.NewFamily(0, "opt")
		if err != nil {
			t.Fatal(err)
		}
		empty, err := f.NewMember("empty")
		if err != nil {
			t.Fatal(err)
		}
		if err := empty.Record(0x77); err != nil {
			t.Fatal(err)
		}
		if err := empty.End(false); err != nil {
			t.Fatal(err)
		}
		var p *program
		var other *Step
		if withOther {
			p = &program{t: t, b: b, stream: 0x77, layers: 4}
			if other, err = f.NewMember("other"); err != nil {
				t.Fatal(err)
			}
			recordRun(t, other, p)
		}
		if err := f.Plan(0); err != nil {
			t.Fatalf("family (with another member: %v): %v", withOther, err)
		}
		for range 2 {
			if err := empty.Serve(0x77, true); err != nil {
				t.Fatal(err)
			}
			if err := empty.End(false); err != nil {
				t.Fatal(err)
			}
			if other != nil {
				if err := other.Serve(p.stream, true); err != nil {
					t.Fatal(err)
				}
				out := p.run()
				if err := other.End(false); err != nil {
					t.Fatal(err)
				}
				p.free(out)
			}
		}
		noDivergence(t, f)
		if rs := f.ar.Regions(); len(rs) == 0 || !b.devices[0].heap.owns(rs[0].VA) {
			t.Fatalf("the family's arena (another member: %v) is not in the graph heap: it maps a granule of its own", withOther)
		}
		r := f.Report()
		if withOther != (r.Arena > 0) || r.Ratio < 1 {
			t.Fatalf("family arena %d bytes, %.2f of its bound (another member: %v)", r.Arena, r.Ratio, withOther)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
