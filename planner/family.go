package planner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// Member is one workload of a family: several workloads (one model at
// batch 1, 2, 4, ...) replayed one at a time from one arena.
//
// Keys names the member's shared buffers: Keys[i] is the family-wide key
// of buffer i, "" for a private buffer; a nil Keys shares nothing. A
// shared buffer is state that outlives a replay and that every member using
// its key reads at the same address (weights, a KV cache): it gets one
// offset in the whole family, and no buffer of any member, shared or
// private, ever overlaps its bytes. Buffers with the same key must agree
// on size and alignment; a key names at most one buffer of a member.
//
// Ahead, where set, is a plan of Trace made before the family's
// (Options.Goal at most the largest member's peak, the family's
// alignment), while the other members were still being recorded:
// PlanFamily takes it for a member that shares nothing instead of
// planning it again, and checks it with the rest.
type Member struct {
	Name  string
	Trace *lifetime.Trace
	Keys  []string
	Ahead *Plan
}

// SharedByTag returns Keys for t that share, under their names, the
// buffers whose tag is one of tags (for example "weight", "kv").
func SharedByTag(t *lifetime.Trace, tags ...string) []string {
	return SharedBy(t, func(b *lifetime.Buffer) (string, bool) {
		for _, tag := range tags {
			if b.Tag == tag {
				return b.Name, true
			}
		}
		return "", false
	})
}

// SharedBy returns Keys for t: key(b) names buffer b's shared identity
// when its second result is true; other buffers are private.
func SharedBy(t *lifetime.Trace, key func(*lifetime.Buffer) (string, bool)) []string {
	keys := make([]string, len(t.Buffers))
	for i := range t.Buffers {
		if k, ok := key(&t.Buffers[i]); ok {
			keys[i] = k
		}
	}
	return keys
}

// SharedBuffer is where one shared key lives in a family arena.
type SharedBuffer struct {
	Key    string
	Offset int64
	Size   int64 // rounded up to the family's alignment
	Align  int64 // the offset alignment it needs (the plan's and its own)
}

// SharedKey looks up a shared key.
func (fp *GroupPlan) SharedKey(key string) (SharedBuffer, bool) {
	for _, s := range fp.Shared {
		if s.Key == key {
			return s, true
		}
	}
	return SharedBuffer{}, false
}

// ErrFamily is wrapped by every error about a family's members or keys
// (as opposed to an algorithm's failure), so callers can tell them apart.
var ErrFamily = errors.New("invalid family")

// familyJoint validates members and lays them on one timeline, each
// shared key one buffer live over all of it; keys[id] is joint buffer
// id's key ("" for a private buffer).
func familyJoint(members []Member) (*Joint, []string, error) {
	type use struct {
		member string
		buf    int
		size   int64
		align  int64 // the buffer's own
	}
	first := map[string]use{}
	group := map[string]int{}
	var same [][]BufferRef
	names := map[string]bool{}
	windows := make([]Window, len(members))
	for mi, m := range members {
		if m.Name == "" {
			return nil, nil, fmt.Errorf("%w: member %d has no name", ErrFamily, mi)
		}
		if names[m.Name] {
			return nil, nil, fmt.Errorf("%w: member name %q appears twice", ErrFamily, m.Name)
		}
		names[m.Name] = true
		if m.Trace == nil {
			return nil, nil, fmt.Errorf("%w: member %q has no trace", ErrFamily, m.Name)
		}
		if m.Keys != nil && len(m.Keys) != len(m.Trace.Buffers) {
			return nil, nil, fmt.Errorf("%w: member %q has %d keys for %d buffers", ErrFamily, m.Name, len(m.Keys), len(m.Trace.Buffers))
		}
		if err := m.Trace.Validate(); err != nil {
			return nil, nil, fmt.Errorf("%w: member %q: %w", ErrFamily, m.Name, err)
		}
		windows[mi] = Window{Name: m.Name, Trace: m.Trace}
		mine := map[string]int{}
		for i, k := range m.Keys {
			if k == "" {
				continue
			}
			b := &m.Trace.Buffers[i]
			if j, ok := mine[k]; ok {
				return nil, nil, fmt.Errorf("%w: member %q: buffers %d (%s) and %d (%s) both have shared key %q",
					ErrFamily, m.Name, j, m.Trace.Buffers[j].Name, i, b.Name, k)
			}
			mine[k] = i
			u := use{m.Name, i, b.Size, max(b.Align, 1)}
			f, ok := first[k]
			if !ok {
				first[k], group[k] = u, len(same)
				same = append(same, nil)
			} else if f.size != u.size || f.align != u.align {
				return nil, nil, fmt.Errorf("%w: shared key %q is %d bytes aligned to %d in member %q (buffer %d) but %d bytes aligned to %d in member %q (buffer %d)",
					ErrFamily, k, f.size, f.align, f.member, f.buf, u.size, u.align, u.member, u.buf)
			}
			same[group[k]] = append(same[group[k]], BufferRef{mi, lifetime.ID(i)})
		}
	}
	j, err := Join("family", windows, Crossings{Same: same, Whole: func(r BufferRef) bool { return isShared(members[r.Stage], int(r.Buffer)) }})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrFamily, err)
	}
	keys := make([]string, len(j.Trace.Buffers))
	for w, sp := range j.Spans {
		for i, id := range sp.Joint {
			keys[id] = keyOf(members[w], i)
		}
	}
	return j, keys, nil
}

// PlanFamily plans members into one arena with the named algorithm: a
// GroupPlan with the shared buffers at the bottom, [0, SharedRegion.Hi),
// each at one offset used by every member, and each member's private
// buffers above them, planned member by member so that different members'
// private buffers overlap freely. Members must therefore replay one at a
// time, never concurrently, in any order (Order is nil). The members are
// windows of one timeline on which every shared key is one buffer live
// over all of it, planned by window (Joint.planWindows): the shared
// buffers stacked from 0, each member's private buffers planned with Run
// on a sub-trace of that member and moved above them; each member is also
// planned alone, for SeparateArenas. Fixed offsets are not supported in
// members. The result passes CheckFamily.
//
// Stacking the shared buffers below the private ones is optimal when the
// shared buffers live through each member's whole step (weights, caches):
// a member's lower bound is then the shared bytes it uses plus its private
// peak, and the family arena is the shared region plus the largest
// private arena.
func PlanFamily(ctx context.Context, algo string, members []Member, opt Options) (*GroupPlan, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("planner: family: %w: no members", ErrFamily)
	}
	if _, ok := registry[algo]; !ok {
		return nil, fmt.Errorf("planner: family: unknown algorithm %q (have %v)", algo, Names())
	}
	opt, err := opt.prepared()
	if err != nil {
		return nil, fmt.Errorf("planner: family: %w", err)
	}
	start := time.Now()
	j, keys, err := familyJoint(members)
	if err != nil {
		return nil, fmt.Errorf("planner: family: %w", err)
	}
	for _, m := range members {
		for i := range m.Trace.Buffers {
			if b := &m.Trace.Buffers[i]; b.HasFixed {
				return nil, fmt.Errorf("planner: family: %w: member %q: buffer %d (%s) has a fixed offset, which family plans do not support",
					ErrFamily, m.Name, i, b.Name)
			}
		}
	}
	windows := make([]Window, len(members))
	ahead := make([]*Plan, len(members))
	for i, m := range members {
		windows[i] = Window{Name: m.Name, Trace: m.Trace}
		ahead[i] = m.Ahead
	}
	wp, err := j.planWindows(ctx, algo, windows, ahead, opt)
	if err != nil {
		return nil, fmt.Errorf("planner: family: %w", err)
	}
	fp := &GroupPlan{Align: opt.Align, Arena: wp.Top, SharedRegion: Region{Group: "shared", Lo: 0, Hi: wp.Top}}
	for _, id := range wp.Stacked {
		size, a := Need(&j.Trace.Buffers[id], opt.Align)
		fp.Shared = append(fp.Shared, SharedBuffer{Key: keys[id], Offset: wp.Offsets[id], Size: size, Align: a})
	}
	// Each member's plan is the joint plan's projection; what it would
	// cost alone needs a plan of its own, members side by side.
	mps := make([]MemberPlan, len(members))
	err = sideBySide(len(members), opt, func(w int, mopt Options) error {
		m := members[w]
		t := m.Trace
		p := &Plan{Algo: algo, Align: opt.Align, Offsets: j.Offsets(w, wp.Offsets)}
		if own := wp.Own[w]; own != nil {
			p.Algo, p.Elapsed, p.ToBest, p.Stop = own.Algo, own.Elapsed, own.ToBest, own.Stop
		}
		p.Arena = ArenaSize(t, p.Offsets, opt.Align)
		p.LowerBound, _ = t.LowerBound(opt.Align)
		if own := wp.Own[w]; own != nil && wp.Top == 0 && len(own.Offsets) == len(t.Buffers) && own.Bound > p.LowerBound {
			// The member's own plan is this one: its bound holds.
			p.Bound = min(own.Bound, p.Arena)
		}
		p.Optimal = p.Arena <= max(p.Bound, p.LowerBound)
		// Check comes with checkFamily below, every member at once.
		mps[w] = MemberPlan{Name: m.Name, Plan: p, Alone: p.Arena}
		// Planned alone already when nothing is shared or below.
		if (countShared(m) > 0 || wp.Top > 0) && len(t.Buffers) > 0 {
			ap, err := Run(ctx, algo, t, mopt)
			if err != nil {
				return fmt.Errorf("member %q: planned alone: %w", m.Name, err)
			}
			mps[w].Alone = ap.Arena
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("planner: family: %w", err)
	}
	for _, mp := range mps {
		fp.Algo = mp.Plan.Algo
		fp.Arena = max(fp.Arena, mp.Plan.Arena)
		fp.LowerBound = max(fp.LowerBound, mp.Plan.LowerBound)
		fp.SeparateArenas += mp.Alone
	}
	fp.Members = mps
	if len(members) > 1 {
		fp.Algo = algo
	}
	fp.Elapsed = time.Since(start)
	if err := checkFamily(members, fp, j); err != nil {
		return nil, fmt.Errorf("planner: family: produced an invalid plan: %w", err)
	}
	return fp, nil
}

func isShared(m Member, i int) bool { return m.Keys != nil && m.Keys[i] != "" }

func countShared(m Member) int {
	n := 0
	for i := range m.Keys {
		if isShared(m, i) {
			n++
		}
	}
	return n
}

// CheckFamily verifies a family plan against its members, independently
// of how it was made: every member's plan passes Check on its trace with
// the family's alignment and fits in the family arena; every shared key of
// every member sits at its one family offset, with the size and alignment
// recorded for it; shared buffers are disjoint from each other and from
// every other buffer of every member, at all times; and the arena, lower
// bound and separate-arena sum are the ones the members imply (the Alone
// arenas themselves are only checked to be at least each member's bound).
func CheckFamily(members []Member, fp *GroupPlan) error { return checkFamily(members, fp, nil) }

// checkFamily is CheckFamily; j is familyJoint(members) where the caller
// has made it already, or nil. The members' plans and the joint timeline
// are checked side by side, one goroutine per core; errors come in the
// order a check one after the other would find them.
func checkFamily(members []Member, fp *GroupPlan, j *Joint) error {
	if fp == nil {
		return fmt.Errorf("check family: no plan")
	}
	if len(fp.Members) != len(members) {
		return fmt.Errorf("check family: plan has %d members, the family %d", len(fp.Members), len(members))
	}
	if fp.Joint != nil || fp.Order != nil || len(fp.Values) > 0 {
		return fmt.Errorf("check family: the plan is a chain's (one joint trace, an order, values)")
	}
	if fp.Align < 1 || fp.Align > lifetime.MaxSize {
		return fmt.Errorf("check family: alignment %d is out of range", fp.Align)
	}
	if fp.Arena < 0 || fp.Arena > lifetime.MaxSize {
		return fmt.Errorf("check family: arena size %d is out of range", fp.Arena)
	}
	// The members themselves: names, keys, traces (see familyJoint).
	if j == nil {
		var err error
		if j, _, err = familyJoint(members); err != nil {
			return fmt.Errorf("check family: %w", err)
		}
	}
	// Shared buffers: sorted by offset, aligned, disjoint, inside the arena.
	byKey := make(map[string]SharedBuffer, len(fp.Shared))
	var top int64
	for i, s := range fp.Shared {
		switch {
		case s.Key == "":
			return fmt.Errorf("check family: shared buffer %d has no key", i)
		case s.Size <= 0 || s.Size > lifetime.MaxSize || s.Size%fp.Align != 0:
			return fmt.Errorf("check family: shared key %q: size %d is not a positive multiple of the alignment %d", s.Key, s.Size, fp.Align)
		case s.Align < 1 || s.Align > lifetime.MaxSize || s.Align%fp.Align != 0:
			return fmt.Errorf("check family: shared key %q: alignment %d is not a multiple of the plan's %d", s.Key, s.Align, fp.Align)
		case s.Offset < 0 || s.Offset%s.Align != 0:
			return fmt.Errorf("check family: shared key %q: offset %d is not a multiple of its alignment %d", s.Key, s.Offset, s.Align)
		case s.Offset < top:
			return fmt.Errorf("check family: shared key %q at %d overlaps or precedes the shared buffer ending at %d", s.Key, s.Offset, top)
		case s.Offset > fp.Arena-s.Size:
			return fmt.Errorf("check family: shared key %q %s ends beyond the arena of %d bytes", s.Key, byteRange(s.Offset, s.Size), fp.Arena)
		}
		if _, dup := byKey[s.Key]; dup {
			return fmt.Errorf("check family: shared key %q is listed twice", s.Key)
		}
		byKey[s.Key] = s
		top = s.Offset + s.Size
	}
	if fp.SharedRegion.Lo != 0 || fp.SharedRegion.Hi != top {
		return fmt.Errorf("check family: shared region [%d, %d), the shared buffers span [0, %d)", fp.SharedRegion.Lo, fp.SharedRegion.Hi, top)
	}
	// The costly checks, each member's plan on its trace and every
	// member on the joint timeline (below), side by side.
	planErrs := make([]error, len(members))
	var jointErr error
	eachOnCores(len(members)+1, func(k int) {
		if k == 0 {
			jointErr = checkJoint(j, fp)
			return
		}
		planErrs[k-1] = checkMemberPlan(members[k-1], &fp.Members[k-1], fp)
	})
	used := make(map[string]bool, len(fp.Shared))
	arena, lb, sep := top, int64(0), int64(0)
	for mi, m := range members {
		mp := &fp.Members[mi]
		if m.Name != mp.Name {
			return fmt.Errorf("check family: member %d is %q in the family, %q in the plan", mi, m.Name, mp.Name)
		}
		if err := planErrs[mi]; err != nil {
			return fmt.Errorf("check family: member %q: %w", m.Name, err)
		}
		if err := checkMember(m, mp, fp, byKey, used); err != nil {
			return fmt.Errorf("check family: member %q: %w", m.Name, err)
		}
		arena = max(arena, mp.Plan.Arena)
		lb = max(lb, mp.Plan.LowerBound)
		if sep += mp.Alone; sep > lifetime.MaxSize {
			return fmt.Errorf("check family: separate arenas exceed %d bytes", lifetime.MaxSize)
		}
	}
	for _, s := range fp.Shared {
		if !used[s.Key] {
			return fmt.Errorf("check family: shared key %q is used by no member", s.Key)
		}
	}
	if jointErr != nil {
		return fmt.Errorf("check family: %w", jointErr)
	}
	switch {
	case arena != fp.Arena:
		return fmt.Errorf("check family: arena is %d, the members and shared buffers need %d", fp.Arena, arena)
	case lb != fp.LowerBound:
		return fmt.Errorf("check family: lower bound is %d, the largest member bound is %d", fp.LowerBound, lb)
	case sep != fp.SeparateArenas:
		return fmt.Errorf("check family: separate arenas are %d, the members' own arenas sum to %d", fp.SeparateArenas, sep)
	}
	return nil
}

// checkJoint checks every member's plan on the family's joint timeline,
// where every shared key is one buffer live over all of it: one Check
// proves that no buffer of any member ever touches a shared one, whose
// contents outlive every replay.
func checkJoint(j *Joint, fp *GroupPlan) error {
	offs := make([][]int64, len(fp.Members))
	for mi, mp := range fp.Members {
		if mp.Plan != nil {
			offs[mi] = mp.Plan.Offsets
		}
	}
	lifted, err := j.Lift(offs)
	if err != nil {
		return err
	}
	if err := Check(j.Trace, &Plan{Align: fp.Align, Offsets: lifted, Arena: fp.Arena}); err != nil {
		return fmt.Errorf("on the joint timeline: %w", err)
	}
	return nil
}

// checkMemberPlan checks a member's plan on its own trace: what
// checkMember relies on, and what costs most.
func checkMemberPlan(m Member, mp *MemberPlan, fp *GroupPlan) error {
	t, p := m.Trace, mp.Plan
	if t == nil || p == nil {
		return fmt.Errorf("no trace or no plan")
	}
	if p.Align != fp.Align {
		return fmt.Errorf("plan alignment %d, the family's %d", p.Align, fp.Align)
	}
	if err := Check(t, p); err != nil {
		return err
	}
	if a := ArenaSize(t, p.Offsets, p.Align); a != p.Arena {
		return fmt.Errorf("arena is %d, the offsets need %d", p.Arena, a)
	}
	if lb, _ := t.LowerBound(p.Align); lb != p.LowerBound {
		return fmt.Errorf("lower bound is %d, the trace's is %d", p.LowerBound, lb)
	}
	return nil
}

// checkMember checks the rest of a member's plan against the family,
// after checkMemberPlan.
func checkMember(m Member, mp *MemberPlan, fp *GroupPlan, byKey map[string]SharedBuffer, used map[string]bool) error {
	t, p := m.Trace, mp.Plan
	if p.Arena > fp.Arena {
		return fmt.Errorf("needs %d bytes, beyond the family arena of %d", p.Arena, fp.Arena)
	}
	if mp.Alone < p.LowerBound {
		return fmt.Errorf("own arena %d is below its lower bound %d", mp.Alone, p.LowerBound)
	}
	if m.Keys != nil && len(m.Keys) != len(t.Buffers) {
		return fmt.Errorf("%d keys for %d buffers", len(m.Keys), len(t.Buffers))
	}
	mine := map[string]bool{}
	for i := range t.Buffers {
		b := &t.Buffers[i]
		if k := keyOf(m, i); k != "" {
			size, a := Need(b, p.Align)
			off := p.Offsets[i]
			s, ok := byKey[k]
			switch {
			case !ok:
				return fmt.Errorf("%s: shared key %q is not in the family's shared buffers", lifetime.Label(i, b.Name), k)
			case mine[k]:
				return fmt.Errorf("%s: shared key %q names two buffers", lifetime.Label(i, b.Name), k)
			case off != s.Offset:
				return fmt.Errorf("%s: shared key %q is at %d here but at %d in the family", lifetime.Label(i, b.Name), k, off, s.Offset)
			case size != s.Size || a != s.Align:
				return fmt.Errorf("buffer %d (%s): shared key %q needs %d bytes aligned to %d here, the family records %d aligned to %d",
					i, b.Name, k, size, a, s.Size, s.Align)
			}
			mine[k], used[k] = true, true
		}
	}
	return nil
}

func keyOf(m Member, i int) string {
	if m.Keys == nil {
		return ""
	}
	return m.Keys[i]
}

// WithMember returns a copy of fp in which member i's plan is p (a member
// replanned inside the family arena), with the family's figures made
// again from the members' plans. Check it with CheckFamily against the
// members, member i with the trace p was made for.
func (fp *GroupPlan) WithMember(i int, p *Plan) *GroupPlan {
	n := *fp
	n.Members = slices.Clone(fp.Members)
	n.Members[i] = MemberPlan{Name: fp.Members[i].Name, Plan: p, Alone: p.Arena}
	return n.totals()
}

// WithAdded returns fp with a member named name, planned alone by p,
// added last (the others keep their plans); the arena and bounds are
// recomputed as WithMember does.
func (fp *GroupPlan) WithAdded(name string, p *Plan) *GroupPlan {
	n := *fp
	n.Members = append(slices.Clone(fp.Members), MemberPlan{Name: name, Plan: p, Alone: p.Arena})
	return n.totals()
}

// totals recomputes the arena, lower bound and separate arenas from the
// members' plans.
func (fp *GroupPlan) totals() *GroupPlan {
	fp.Arena, fp.LowerBound, fp.SeparateArenas = fp.SharedRegion.Hi, 0, 0
	for _, mp := range fp.Members {
		fp.Arena = max(fp.Arena, mp.Plan.Arena)
		fp.LowerBound = max(fp.LowerBound, mp.Plan.LowerBound)
		fp.SeparateArenas += mp.Alone
	}
	return fp
}
