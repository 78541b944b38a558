package plans

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// decodeMember is a small decode step at one batch: weights and a cache
// (shared) through the whole step, activations that grow with the batch.
// Member 0 also carries gaps, own alignments, streams, prior offsets and
// PyTorch statistics, so that every section of a member is exercised.
func decodeMember(batch int64, extras bool) *lifetime.Trace {
	t := &lifetime.Trace{Name: fmt.Sprintf("decode b%d", batch)}
	add := func(name, tag string, size, start, end int64) *lifetime.Buffer {
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: name, Tag: tag,
			Size: size, Start: start, End: end})
		return &t.Buffers[len(t.Buffers)-1]
	}
	add("wte", "weight", 100000, 0, 12)
	add("kv", "kv", 64*4096, 0, 12)
	for l := range 3 {
		add(fmt.Sprintf("l%d.w", l), "weight", 30000, 0, 12)
		a := add(fmt.Sprintf("l%d.act", l), "intermediate", batch*3000, int64(1+3*l), int64(4+3*l))
		add(fmt.Sprintf("l%d.up", l), "intermediate", batch*12000, int64(2+3*l), int64(3+3*l))
		if extras && l == 1 {
			a.Align = 4096
			a.Stream = 2
			a.Gaps = []lifetime.Gap{{Start: a.Start + 1, End: a.Start + 2, HasWindow: true, Lo: 0, Hi: 100}}
		}
	}
	add("logits", "output", batch*5000, 10, 12)
	if extras {
		t.Prior = make([]int64, len(t.Buffers))
		for i := range t.Prior {
			t.Prior[i] = lifetime.NoOffset
		}
		t.Prior[3] = 4096
		t.Torch = &lifetime.TorchStats{Device: 0, ReservedPeak: 9 << 20, LiveAtStart: 1 << 20, HasSegments: true}
	}
	return t
}

func familyFile(t testing.TB, batches ...int64) *Family {
	t.Helper()
	var ms []planner.Member
	var ws []*Workload
	for i, b := range batches {
		tr := decodeMember(b, i == 0)
		ms = append(ms, planner.Member{Name: fmt.Sprintf("batch=%d", b), Trace: tr, Keys: planner.SharedByTag(tr, "weight", "kv")})
		ws = append(ws, &Workload{Name: "gpt2-decode", Shape: []Dim{{Name: "batch", Value: b}, {Name: "seq", Value: 1024}}})
	}
	ws[len(ws)-1] = nil // one member without a workload
	fp, err := planner.PlanFamily(context.Background(), "bestfit", ms, planner.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Without planning times, which files do not store.
	return familyWithoutTimes(&Family{Members: ms, Plan: fp, Workloads: ws})
}

func TestFamilyRoundTrip(t *testing.T) {
	f := familyFile(t, 1, 2, 4, 8, 16, 32, 64)
	data, err := EncodeFamily(f)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeFamily(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, f) {
		t.Fatalf("round trip changed the family:\n%+v\n%+v", back.Plan, f.Plan)
	}
	path := filepath.Join(t.TempDir(), "family.plan")
	if err := SaveFamily(path, f); err != nil {
		t.Fatal(err)
	}
	back, err = LoadFamily(path)
	if err != nil || !reflect.DeepEqual(back, f) {
		t.Fatalf("LoadFamily: %v", err)
	}
	// A family is not a single plan: Decode and Load say where to look.
	if _, err := Load(path); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "LoadFamily") || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load of a family file: %v", err)
	}
	// Encoding is canonical: the same family, the same bytes.
	again, err := EncodeFamily(back)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("re-encoding differs (%v)", err)
	}
	t.Logf("7 members, %d buffers each: %d bytes", len(f.Members[0].Trace.Buffers), len(data))
}

// TestFamilyReadsVersion1 reads a single-plan file as a family of one.
func TestFamilyReadsVersion1(t *testing.T) {
	one := smallFile(t)
	path := filepath.Join(t.TempDir(), "one.plan")
	if err := Save(path, one); err != nil {
		t.Fatal(err)
	}
	f, err := LoadFamily(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Members) != 1 || !reflect.DeepEqual(f.Members[0].Trace, one.Trace) {
		t.Fatalf("members %+v", f.Members)
	}
	if f.Plan.Arena != one.Plan.Arena || f.Plan.SeparateArenas != one.Plan.Arena || f.Plan.LowerBound != one.Plan.LowerBound {
		t.Fatalf("family of one: %+v", f.Plan)
	}
	if !reflect.DeepEqual(f.Workload(0), one.Workload) {
		t.Fatalf("workload %+v", f.Workload(0))
	}
	if err := planner.CheckFamily(f.Members, f.Plan); err != nil {
		t.Fatal(err)
	}
	// And it can be written as a version 2 file.
	if _, err := EncodeFamily(f); err != nil {
		t.Fatal(err)
	}
}

func mustFailFamily(t *testing.T, data []byte, what string) error {
	t.Helper()
	f, err := DecodeFamily(data)
	if err == nil {
		t.Fatalf("%s: DecodeFamily accepted it (%d members)", what, len(f.Members))
	}
	if !isSentinel(err) {
		t.Fatalf("%s: error wraps no sentinel: %v", what, err)
	}
	return err
}

func TestFamilyCorruptFile(t *testing.T) {
	data, err := EncodeFamily(familyFile(t, 1, 4, 16))
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(data) {
		mustFailFamily(t, data[:n], "truncated")
	}
	mustFailFamily(t, append(bytes.Clone(data), 0), "trailing byte")
	for i := range data {
		c := bytes.Clone(data)
		c[i] ^= 1 << (i % 8)
		mustFailFamily(t, c, "bit flip")
	}
	// A family header on a single plan's payload.
	one, err := Encode(smallFile(t))
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(one[8:], FamilyVersion)
	err = mustFailFamily(t, resum(one), "single payload as family")
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("single payload as family: %v", err)
	}
}

// TestFamilyCraftedPayloads edits the family behind a valid checksum, as
// an attacker could: each must be refused with the right sentinel.
func TestFamilyCraftedPayloads(t *testing.T) {
	base := familyFile(t, 1, 8, 64)
	seal2 := func(raw []byte) []byte {
		data, err := seal(raw, FamilyVersion)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	edit := func(fn func(f *Family)) []byte {
		f := familyFile(t, 1, 8, 64)
		fn(f)
		return seal2(encodeFamilyPayload(f))
	}
	wte := func(f *Family) int { // index of shared key "wte"
		for i, s := range f.Plan.Shared {
			if s.Key == "wte" {
				return i
			}
		}
		t.Fatal("no wte")
		return 0
	}
	cases := []struct {
		name  string
		data  []byte
		want  error
		wants string
	}{
		{"shared offset in one member", edit(func(f *Family) {
			// l0.w and l1.w have the same size: swapping them keeps the
			// member's own plan valid.
			p := f.Plan.Members[1].Plan
			p.Offsets[2], p.Offsets[5] = p.Offsets[5], p.Offsets[2]
		}), ErrInvalid, `shared key "l0.w" is at`},
		{"shared table offset", edit(func(f *Family) { f.Plan.Shared[wte(f)].Offset += 256 }), ErrInvalid, "shared key"},
		{"member arena", edit(func(f *Family) { f.Plan.Members[2].Plan.Arena++ }), ErrInvalid, "member 2"},
		{"family arena", edit(func(f *Family) { f.Plan.Arena += 256 }), ErrInvalid, "arena"},
		{"separate arenas", edit(func(f *Family) { f.Plan.SeparateArenas-- }), ErrInvalid, "separate arenas"},
		{"key renamed in one member", edit(func(f *Family) { f.Members[0].Keys[0] = "wtf" }), ErrInvalid, `"wtf"`},
		{"stored fingerprint", func() []byte {
			raw := encodeFamilyPayload(base)
			fp := base.Members[1].Trace.Fingerprint()
			i := bytes.Index(raw, fp[:])
			raw[i] ^= 1
			return seal2(raw)
		}(), ErrInvalid, `member "batch=8": trace fingerprint`},
		{"member count", func() []byte {
			raw := encodeFamilyPayload(base)
			// The member count is the family section's last byte.
			n := int(raw[1]) // one-byte section length for this small family
			raw[2+n-1] = 0x7f
			return seal2(raw)
		}(), ErrCorrupt, "members cannot fit"},
		{"no end marker", seal2(encodeFamilyPayload(base)[:len(encodeFamilyPayload(base))-1]), ErrCorrupt, "truncated"},
		{"keys section in a single plan", func() []byte {
			raw := encodeSections(smallFile(t), []string{"a", "", "", "", "", ""})
			data, err := seal(raw, Version)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}(), ErrCorrupt, "unknown section kind 6"},
		{"keys that share nothing", func() []byte {
			f := familyFile(t, 1, 8, 64)
			raw := encodeFamilyPayload(f)
			// Rebuild member 2 with an all-empty keys section.
			f.Members[2].Keys = make([]string, len(f.Members[2].Trace.Buffers))
			w := writer{}
			w.section(kindMember, 0, func(s *writer) {
				s.str(f.Members[2].Name)
				s.uvarint(uint64(f.Plan.Members[2].Alone))
				s.bytes(encodeSections(&File{Trace: f.Members[2].Trace, Plan: f.Plan.Members[2].Plan}, f.Members[2].Keys))
			})
			f.Members = f.Members[:2]
			f.Plan.Members = f.Plan.Members[:2]
			f.Workloads = f.Workloads[:2]
			head := encodeFamilyPayload(f)
			_ = raw
			// The family section still says 3 members.
			head = head[:len(head)-1]
			head = append(head, w.b...)
			head = append(head, kindEnd)
			n := int(head[1])
			head[2+n-1] = 3
			return seal2(head)
		}(), ErrCorrupt, "shares no buffer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := mustFailFamily(t, c.data, c.name)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.wants) {
				t.Fatalf("got %v, want %v containing %q", err, c.want, c.wants)
			}
			t.Log(err)
		})
	}
}

func TestFamilyEncodeRefuses(t *testing.T) {
	f := familyFile(t, 1, 2)
	f.Plan.Members[0].Plan.Offsets[0] += 256
	if _, err := EncodeFamily(f); !errors.Is(err, ErrInvalid) {
		t.Fatalf("EncodeFamily of a broken family: %v", err)
	}
	f = familyFile(t, 1, 2)
	f.Workloads = f.Workloads[:1]
	if _, err := EncodeFamily(f); !errors.Is(err, ErrInvalid) {
		t.Fatalf("EncodeFamily with too few workloads: %v", err)
	}
	if _, err := EncodeFamily(&Family{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("EncodeFamily of nothing: %v", err)
	}
	if err := SaveFamily(filepath.Join(t.TempDir(), "x"), &Family{}); err == nil {
		t.Fatal("SaveFamily of nothing")
	}
	if _, err := LoadFamily(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("LoadFamily of a missing file")
	}
}

// Family fuzz seeds live beside FuzzDecode's, under FuzzDecodeFamily.
func familyFuzzSeeds(t testing.TB) map[string][]byte {
	seeds := map[string][]byte{}
	f := familyFile(t, 1, 4)
	data, err := EncodeFamily(f)
	if err != nil {
		t.Fatal(err)
	}
	seeds["family-file"] = data
	seeds["family-payload"] = encodeFamilyPayload(f)
	one, err := Encode(smallFile(t))
	if err != nil {
		t.Fatal(err)
	}
	seeds["single-file"] = one
	return seeds
}

func TestWriteFamilyFuzzSeeds(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite testdata/fuzz/FuzzDecodeFamily")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeFamily")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range familyFuzzSeeds(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzDecodeFamily feeds each input as a whole file and as a family
// payload: no panic, every error wraps a sentinel, and what is accepted
// passes CheckFamily, re-encodes canonically and round-trips.
func FuzzDecodeFamily(f *testing.F) {
	for _, data := range familyFuzzSeeds(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, err := decodeFamily(data); err != nil {
			if !isSentinel(err) {
				t.Fatalf("file: error wraps no sentinel: %v", err)
			}
		} else {
			checkFamilyAccepted(t, got)
		}
		got, err := decodeFamilyVerified(data, nil)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("payload: error wraps no sentinel: %v", err)
			}
			return
		}
		checkFamilyAccepted(t, got)
		if again := encodeFamilyPayload(got); !bytes.Equal(again, data) {
			t.Fatalf("payload accepted but not canonical:\n in %x\nout %x", data, again)
		}
	})
}

func checkFamilyAccepted(t *testing.T, f *Family) {
	t.Helper()
	if err := planner.CheckFamily(f.Members, f.Plan); err != nil {
		t.Fatalf("accepted a family that CheckFamily rejects: %v", err)
	}
	data, err := EncodeFamily(f)
	if err != nil {
		t.Fatalf("accepted a family that EncodeFamily refuses: %v", err)
	}
	back, err := DecodeFamily(data)
	if err != nil {
		t.Fatalf("re-encoded family does not decode: %v", err)
	}
	// Files store no planning times (older ones may, as the seeds do).
	if !reflect.DeepEqual(back, familyWithoutTimes(f)) {
		t.Fatalf("round trip changed the family")
	}
}
