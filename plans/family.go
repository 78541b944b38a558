package plans

import (
	"fmt"
	"slices"
	"time"

	"github.com/arenaplan/arenaplan/planner"
)

// Family is what a family plan file holds: several members (one workload
// at several shapes, say) planned into one arena by planner.PlanFamily.
// Workloads is nil, or holds one entry per member (nil where unknown).
type Family struct {
	Members   []planner.Member
	Plan      *planner.GroupPlan
	Workloads []*Workload
}

// Workload returns member i's workload, or nil.
func (f *Family) Workload(i int) *Workload {
	if i < len(f.Workloads) {
		return f.Workloads[i]
	}
	return nil
}

// Payload of a family (format version 2): a family section, then one
// member section per member, then the end byte.
const (
	kindFamily = 16
	kindMember = 17
)

// Smallest encodings: a shared buffer is a key, offset, size and
// alignment; a member at least its name, alone arena and a meta section.
const (
	minSharedBytes = 4
	minMemberBytes = 36
)

// EncodeFamily verifies f exactly as DecodeFamily will (every member's
// plan as Encode verifies a single one, then planner.CheckFamily) and
// returns its file bytes, format version 2. Keys that share nothing are
// written as nil.
func EncodeFamily(f *Family) ([]byte, error) {
	data, err := encodeFamily(f)
	if err != nil {
		return nil, fmt.Errorf("plans: encode: %w", err)
	}
	return data, nil
}

// familyWithoutTimes is f with every planning time cleared, as
// withoutTimes does for one plan.
func familyWithoutTimes(f *Family) *Family {
	g, fp := *f, *f.Plan
	fp.Elapsed = 0
	fp.Members = slices.Clone(fp.Members)
	for i := range fp.Members {
		if p := fp.Members[i].Plan; p != nil {
			q := *p
			q.Elapsed, q.ToBest = 0, 0
			fp.Members[i].Plan = &q
		}
	}
	g.Plan = &fp
	return &g
}

func encodeFamily(f *Family) ([]byte, error) {
	if err := verifyFamily(f); err != nil {
		return nil, err
	}
	return sealBounded(encodeFamilyPayload(familyWithoutTimes(f)), FamilyVersion)
}

// DecodeFamily parses and verifies a family plan file. A version 1 file
// (one plan) reads as a family of one member that shares nothing, named
// after its trace, so an executor can read either kind.
func DecodeFamily(data []byte) (*Family, error) {
	f, err := decodeFamilySafe(data)
	if err != nil {
		return nil, fmt.Errorf("plans: %w", err)
	}
	return f, nil
}

// SaveFamily encodes f and writes it to path atomically, as Save does.
func SaveFamily(path string, f *Family) error {
	return save(path, f, encodeFamily)
}

// LoadFamily reads and decodes the plan file at path, of either version
// (see DecodeFamily); every error names the file.
func LoadFamily(path string) (*Family, error) {
	return load(path, decodeFamilySafe)
}

func decodeFamilySafe(data []byte) (f *Family, err error) {
	defer corruptOnPanic(&err)
	return decodeFamily(data)
}

func decodeFamily(data []byte) (*Family, error) {
	f, fam, err := decodeAny(data)
	if err != nil {
		return nil, err
	}
	if f != nil {
		return familyOfOne(f), nil
	}
	return fam, nil
}

// familyOfOne is a single plan as a family of one member.
func familyOfOne(f *File) *Family {
	name := f.Trace.Name
	if name == "" {
		name = "plan"
	}
	p := f.Plan
	fam := &Family{
		Members: []planner.Member{{Name: name, Trace: f.Trace}},
		Plan: &planner.GroupPlan{
			Algo: p.Algo, Align: p.Align, Arena: p.Arena, LowerBound: p.LowerBound,
			SharedRegion:   planner.Region{Group: "shared"},
			Members:        []planner.MemberPlan{{Name: name, Plan: p, Alone: p.Arena}},
			SeparateArenas: p.Arena, Elapsed: p.Elapsed,
		},
	}
	if f.Workload != nil {
		fam.Workloads = []*Workload{f.Workload}
	}
	return fam
}

// decodeFamilyVerified decodes a version 2 payload and verifies it.
func decodeFamilyVerified(raw []byte, budget *itemBudget) (*Family, error) {
	f, fps, err := parseFamily(raw, budget)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err := verifyFamily(f); err != nil {
		return nil, err
	}
	for i, m := range f.Members {
		if got := m.Trace.Fingerprint(); got != fps[i] {
			return nil, fmt.Errorf("%w: member %q: trace fingerprint %x does not match the stored %x", ErrInvalid, m.Name, got, fps[i])
		}
	}
	return f, nil
}

// verifyFamily is what both EncodeFamily and DecodeFamily require.
func verifyFamily(f *Family) error {
	switch {
	case f == nil:
		return fmt.Errorf("%w: no family", ErrInvalid)
	case f.Plan == nil:
		return fmt.Errorf("%w: no family plan", ErrInvalid)
	case len(f.Members) == 0:
		return fmt.Errorf("%w: a family needs at least one member", ErrInvalid)
	case len(f.Plan.Members) != len(f.Members):
		return fmt.Errorf("%w: %d member plans for %d members", ErrInvalid, len(f.Plan.Members), len(f.Members))
	case f.Workloads != nil && len(f.Workloads) != len(f.Members):
		return fmt.Errorf("%w: %d workloads for %d members", ErrInvalid, len(f.Workloads), len(f.Members))
	case f.Plan.Elapsed < 0:
		return fmt.Errorf("%w: negative planning time %v", ErrInvalid, f.Plan.Elapsed)
	}
	for i, m := range f.Members {
		one := &File{Trace: m.Trace, Plan: f.Plan.Members[i].Plan, Workload: f.Workload(i)}
		if err := verify(one); err != nil {
			return fmt.Errorf("member %d (%q): %w", i, m.Name, err)
		}
	}
	if err := planner.CheckFamily(f.Members, f.Plan); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// shares reports whether keys names any shared buffer.
func shares(keys []string) bool {
	for _, k := range keys {
		if k != "" {
			return true
		}
	}
	return false
}

func encodeFamilyPayload(f *Family) []byte {
	fp := f.Plan
	w := writer{}
	w.section(kindFamily, 64+32*len(fp.Shared), func(s *writer) {
		s.str(fp.Algo)
		s.uvarint(uint64(fp.Align))
		s.uvarint(uint64(fp.Arena))
		s.uvarint(uint64(fp.LowerBound))
		s.uvarint(uint64(fp.SeparateArenas))
		s.uvarint(uint64(fp.Elapsed))
		s.uvarint(uint64(len(fp.Shared)))
		for _, sb := range fp.Shared {
			s.str(sb.Key)
			s.uvarint(uint64(sb.Offset))
			s.uvarint(uint64(sb.Size))
			s.uvarint(uint64(sb.Align))
		}
		s.uvarint(uint64(len(f.Members)))
	})
	for i, m := range f.Members {
		mp := &fp.Members[i]
		w.section(kindMember, 64+48*len(m.Trace.Buffers), func(s *writer) {
			s.str(m.Name)
			s.uvarint(uint64(mp.Alone))
			var keys []string
			if shares(m.Keys) {
				keys = m.Keys
			}
			s.bytes(encodeSections(&File{Trace: m.Trace, Plan: mp.Plan, Workload: f.Workload(i)}, keys))
		})
	}
	w.b = append(w.b, kindEnd)
	return w.b
}

// parseFamily parses a version 2 payload into a Family and each member's
// stored trace fingerprint. It checks structure only.
func parseFamily(raw []byte, budget *itemBudget) (*Family, [][32]byte, error) {
	r := &reader{b: raw, budget: budget}
	section := func(want byte) *reader {
		if k := r.byte(); r.err == nil && k != want {
			r.fail("section kind %d, want %d", k, want)
		}
		n := r.uvarint()
		start := r.off
		body := r.take(n)
		if r.err != nil {
			return nil
		}
		return &reader{b: body, base: start, budget: budget}
	}
	s := section(kindFamily)
	if r.err != nil {
		return nil, nil, r.err
	}
	fp := &planner.GroupPlan{SharedRegion: planner.Region{Group: "shared"}}
	fp.Algo = s.str()
	fp.Align = s.int64()
	fp.Arena = s.int64()
	fp.LowerBound = s.int64()
	fp.SeparateArenas = s.int64()
	fp.Elapsed = time.Duration(s.int64())
	ns := s.count("shared buffers", minSharedBytes)
	s.spend(ns, "shared buffers")
	if s.err == nil && ns > 0 {
		fp.Shared = make([]planner.SharedBuffer, ns)
		for i := range fp.Shared {
			sb := &fp.Shared[i]
			sb.Key = s.str()
			sb.Offset = s.int64()
			sb.Size = s.int64()
			sb.Align = s.int64()
		}
		last := fp.Shared[ns-1]
		fp.SharedRegion.Hi = last.Offset + last.Size
	}
	// Members follow this section: bound their count by the bytes after it.
	nm := s.uvarint()
	if s.err == nil && s.left() != 0 {
		s.fail("%d unread bytes at the end of the family section", s.left())
	}
	if s.err != nil {
		return nil, nil, fmt.Errorf("section family: %w", s.err)
	}
	if nm == 0 || nm > uint64(r.left()/minMemberBytes) {
		r.fail("%d members cannot fit in the %d bytes left", nm, r.left())
		return nil, nil, r.err
	}
	if r.spend(int(nm), "members"); r.err != nil {
		return nil, nil, r.err
	}
	f := &Family{Plan: fp, Members: make([]planner.Member, nm)}
	fp.Members = make([]planner.MemberPlan, nm)
	fps := make([][32]byte, nm)
	hasWorkload := false
	workloads := make([]*Workload, nm)
	for i := range f.Members {
		s := section(kindMember)
		if r.err != nil {
			return nil, nil, fmt.Errorf("member %d: %w", i, r.err)
		}
		name := s.str()
		alone := s.int64()
		if s.err != nil {
			return nil, nil, fmt.Errorf("member %d: %w", i, s.err)
		}
		one, keys, fprint, err := parseSections(s.b[s.off:], s.base+s.off, true, budget)
		if err != nil {
			return nil, nil, fmt.Errorf("member %d (%q): %w", i, name, err)
		}
		f.Members[i] = planner.Member{Name: name, Trace: one.Trace, Keys: keys}
		fp.Members[i] = planner.MemberPlan{Name: name, Plan: one.Plan, Alone: alone}
		fps[i] = fprint
		workloads[i] = one.Workload
		hasWorkload = hasWorkload || one.Workload != nil
	}
	if r.byte(); r.err == nil && r.b[r.off-1] != kindEnd {
		r.fail("section kind %d where the end marker belongs", r.b[r.off-1])
	}
	if r.err == nil && r.left() != 0 {
		r.fail("%d bytes after the end marker", r.left())
	}
	if r.err != nil {
		return nil, nil, r.err
	}
	if hasWorkload {
		f.Workloads = workloads
	}
	return f, fps, nil
}
