package planner

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
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
type Member struct {
	Name  string
	Trace *lifetime.Trace
	Keys  []string
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

// MemberPlan is one member's place in a family plan.
type MemberPlan struct {
	Name string
	// Plan holds an offset for every buffer of the member's trace inside
	// the family arena; it passes Check on the member's trace. Its Arena
	// is the highest end of the member's own buffers (at most the family
	// arena) and its LowerBound the member's peak of live bytes, shared
	// buffers included.
	Plan *Plan
	// Alone is the arena the same algorithm gives the member planned by
	// itself: what the member would cost in an arena of its own.
	Alone int64
}

// FamilyPlan lays out a family of members in one arena: the shared
// buffers at the bottom, [0, Shared.Hi), each at one offset used by every
// member, and each member's private buffers above them, planned member by
// member so that different members' private buffers overlap freely.
// Members must therefore replay one at a time, never concurrently.
type FamilyPlan struct {
	Algo  string
	Align int64
	// Arena is the family arena: the highest end of any buffer of any
	// member, or of the shared region.
	Arena int64
	// LowerBound is the largest member lower bound: no arena that holds
	// every member can be smaller.
	LowerBound int64
	// SharedRegion is [0, top of the shared buffers); Shared lists them by
	// offset.
	SharedRegion Region
	Shared       []SharedBuffer
	Members      []MemberPlan
	// SeparateArenas is the sum of the members' Alone arenas: what one
	// arena per member would cost.
	SeparateArenas int64
	Elapsed        time.Duration
}

// Ratio is Arena / LowerBound (1 when the lower bound is 0).
func (fp *FamilyPlan) Ratio() float64 {
	if fp.LowerBound == 0 {
		return 1
	}
	return float64(fp.Arena) / float64(fp.LowerBound)
}

// SharedKey looks up a shared key.
func (fp *FamilyPlan) SharedKey(key string) (SharedBuffer, bool) {
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

// sharedLayout collects the shared keys of members, checks that every use
// of a key agrees on size and alignment, and packs them from offset 0
// (largest alignment first, then by first appearance, to waste little
// padding). It returns the keys by offset and the top of the region.
func sharedLayout(members []Member, align int64) ([]SharedBuffer, int64, error) {
	type use struct {
		member string
		buf    int
		size   int64
		align  int64 // the buffer's own
	}
	first := map[string]use{}
	var order []string
	names := map[string]bool{}
	for mi, m := range members {
		if m.Name == "" {
			return nil, 0, fmt.Errorf("%w: member %d has no name", ErrFamily, mi)
		}
		if names[m.Name] {
			return nil, 0, fmt.Errorf("%w: member name %q appears twice", ErrFamily, m.Name)
		}
		names[m.Name] = true
		if m.Trace == nil {
			return nil, 0, fmt.Errorf("%w: member %q has no trace", ErrFamily, m.Name)
		}
		if m.Keys != nil && len(m.Keys) != len(m.Trace.Buffers) {
			return nil, 0, fmt.Errorf("%w: member %q has %d keys for %d buffers", ErrFamily, m.Name, len(m.Keys), len(m.Trace.Buffers))
		}
		if err := m.Trace.Validate(); err != nil {
			return nil, 0, fmt.Errorf("%w: member %q: %w", ErrFamily, m.Name, err)
		}
		mine := map[string]int{}
		for i, k := range m.Keys {
			if k == "" {
				continue
			}
			b := &m.Trace.Buffers[i]
			if j, ok := mine[k]; ok {
				return nil, 0, fmt.Errorf("%w: member %q: buffers %d (%s) and %d (%s) both have shared key %q",
					ErrFamily, m.Name, j, m.Trace.Buffers[j].Name, i, b.Name, k)
			}
			mine[k] = i
			u := use{m.Name, i, b.Size, max(b.Align, 1)}
			f, ok := first[k]
			if !ok {
				first[k] = u
				order = append(order, k)
				continue
			}
			if f.size != u.size || f.align != u.align {
				return nil, 0, fmt.Errorf("%w: shared key %q is %d bytes aligned to %d in member %q (buffer %d) but %d bytes aligned to %d in member %q (buffer %d)",
					ErrFamily, k, f.size, f.align, f.member, f.buf, u.size, u.align, u.member, u.buf)
			}
		}
	}
	shared := make([]SharedBuffer, len(order))
	for i, k := range order {
		u := first[k]
		b := lifetime.Buffer{Size: u.size, Align: u.align}
		size, a := Need(&b, align)
		shared[i] = SharedBuffer{Key: k, Size: size, Align: a}
	}
	sort.SliceStable(shared, func(i, j int) bool { return shared[i].Align > shared[j].Align })
	var top int64
	for i := range shared {
		shared[i].Offset = lifetime.RoundUp(top, shared[i].Align)
		top = shared[i].Offset + shared[i].Size
		if top > lifetime.MaxSize {
			return nil, 0, fmt.Errorf("%w: shared buffers need more than %d bytes", ErrFamily, lifetime.MaxSize)
		}
	}
	return shared, top, nil
}

// PlanFamily plans members into one arena with the named algorithm (see
// FamilyPlan for the layout). Each member's private buffers are planned
// with Run on a sub-trace of that member; each member is also planned
// alone, for SeparateArenas. Fixed offsets are not supported in members.
// The result passes CheckFamily.
//
// Stacking the shared buffers below the private ones is optimal when the
// shared buffers live through each member's whole step (weights, caches):
// a member's lower bound is then the shared bytes it uses plus its private
// peak, and the family arena is the shared region plus the largest
// private arena.
func PlanFamily(ctx context.Context, algo string, members []Member, opt Options) (*FamilyPlan, error) {
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
	shared, top, err := sharedLayout(members, opt.Align)
	if err != nil {
		return nil, fmt.Errorf("planner: family: %w", err)
	}
	at := make(map[string]int64, len(shared))
	for _, s := range shared {
		at[s.Key] = s.Offset
	}
	// Private offsets move up by base, which must keep every private
	// buffer's alignment: a multiple of all of them.
	baseAlign := opt.Align
	for _, m := range members {
		for i := range m.Trace.Buffers {
			b := &m.Trace.Buffers[i]
			if b.HasFixed {
				return nil, fmt.Errorf("planner: family: %w: member %q: buffer %d (%s) has a fixed offset, which family plans do not support",
					ErrFamily, m.Name, i, b.Name)
			}
			if !isShared(m, i) {
				_, a := Need(b, opt.Align)
				baseAlign = lcm(baseAlign, a)
				if baseAlign > lifetime.MaxSize {
					return nil, fmt.Errorf("planner: family: %w: the private buffers' alignments have no common multiple below %d", ErrFamily, lifetime.MaxSize)
				}
			}
		}
	}
	base := lifetime.RoundUp(top, baseAlign)
	fp := &FamilyPlan{
		Align:        opt.Align,
		SharedRegion: Region{Group: "shared", Lo: 0, Hi: top},
		Shared:       shared,
		Arena:        top,
	}
	// Members are independent problems: plan them side by side.
	mps := make([]MemberPlan, len(members))
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	par := max(1, min(runtime.NumCPU(), len(members)))
	sem := make(chan struct{}, par)
	// Members side by side share the workers: more goroutines than
	// cores only slice the cores between the searches.
	mopt := opt
	mopt.Workers = max(1, opt.Workers/par)
	for i, m := range members {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			mps[i], errs[i] = planMember(ctx, algo, m, at, base, mopt)
		}()
	}
	wg.Wait()
	for i, m := range members {
		if errs[i] != nil {
			return nil, fmt.Errorf("planner: family: member %q: %w", m.Name, errs[i])
		}
		mp := mps[i]
		fp.Algo = mp.Plan.Algo
		fp.Arena = max(fp.Arena, mp.Plan.Arena)
		fp.LowerBound = max(fp.LowerBound, mp.Plan.LowerBound)
		fp.SeparateArenas += mp.Alone
		fp.Members = append(fp.Members, mp)
	}
	if len(members) > 1 {
		fp.Algo = algo
	}
	fp.Elapsed = time.Since(start)
	if err := CheckFamily(members, fp); err != nil {
		return nil, fmt.Errorf("planner: family: produced an invalid plan: %w", err)
	}
	return fp, nil
}

func isShared(m Member, i int) bool { return m.Keys != nil && m.Keys[i] != "" }

// planMember places m's shared buffers at their family offsets and plans
// its private buffers, shifted up by base; it also plans m alone.
func planMember(ctx context.Context, algo string, m Member, at map[string]int64, base int64, opt Options) (MemberPlan, error) {
	t := m.Trace
	sub := &lifetime.Trace{Name: t.Name + "/private"}
	var private []int
	for i := range t.Buffers {
		if !isShared(m, i) {
			b := t.Buffers[i]
			b.ID = lifetime.ID(len(private))
			sub.Buffers = append(sub.Buffers, b)
			private = append(private, i)
		}
	}
	p := &Plan{Algo: algo, Align: opt.Align, Offsets: make([]int64, len(t.Buffers))}
	if len(private) > 0 {
		sp, err := Run(ctx, algo, sub, opt)
		if err != nil {
			return MemberPlan{}, fmt.Errorf("private buffers: %w", err)
		}
		for j, i := range private {
			p.Offsets[i] = base + sp.Offsets[j]
		}
		p.Algo, p.Elapsed, p.ToBest, p.Stop = sp.Algo, sp.Elapsed, sp.ToBest, sp.Stop
	}
	for i, k := range m.Keys {
		if k != "" {
			p.Offsets[i] = at[k]
		}
	}
	p.Arena = ArenaSize(t, p.Offsets, opt.Align)
	p.LowerBound, _ = t.LowerBound(opt.Align)
	p.Optimal = p.Arena == p.LowerBound
	if err := Check(t, p); err != nil {
		return MemberPlan{}, err
	}
	alone := int64(0)
	switch {
	case len(private) == len(t.Buffers) && base == 0:
		alone = p.Arena // planned alone already: nothing shared, nothing below
	case len(t.Buffers) > 0:
		ap, err := Run(ctx, algo, t, opt)
		if err != nil {
			return MemberPlan{}, fmt.Errorf("planned alone: %w", err)
		}
		alone = ap.Arena
	}
	return MemberPlan{Name: m.Name, Plan: p, Alone: alone}, nil
}

// CheckFamily verifies a family plan against its members, independently
// of how it was made: every member's plan passes Check on its trace with
// the family's alignment and fits in the family arena; every shared key of
// every member sits at its one family offset, with the size and alignment
// recorded for it; shared buffers are disjoint from each other and from
// every other buffer of every member, at all times; and the arena, lower
// bound and separate-arena sum are the ones the members imply (the Alone
// arenas themselves are only checked to be at least each member's bound).
func CheckFamily(members []Member, fp *FamilyPlan) error {
	if fp == nil {
		return fmt.Errorf("check family: no plan")
	}
	if len(fp.Members) != len(members) {
		return fmt.Errorf("check family: plan has %d members, the family %d", len(fp.Members), len(members))
	}
	if fp.Align < 1 || fp.Align > lifetime.MaxSize {
		return fmt.Errorf("check family: alignment %d is out of range", fp.Align)
	}
	if fp.Arena < 0 || fp.Arena > lifetime.MaxSize {
		return fmt.Errorf("check family: arena size %d is out of range", fp.Arena)
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
	used := make(map[string]bool, len(fp.Shared))
	arena, lb, sep := top, int64(0), int64(0)
	names := map[string]bool{}
	for mi, m := range members {
		mp := &fp.Members[mi]
		if m.Name != mp.Name {
			return fmt.Errorf("check family: member %d is %q in the family, %q in the plan", mi, m.Name, mp.Name)
		}
		if names[m.Name] {
			return fmt.Errorf("check family: member name %q appears twice", m.Name)
		}
		names[m.Name] = true
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

func checkMember(m Member, mp *MemberPlan, fp *FamilyPlan, byKey map[string]SharedBuffer, used map[string]bool) error {
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
	if p.Arena > fp.Arena {
		return fmt.Errorf("needs %d bytes, beyond the family arena of %d", p.Arena, fp.Arena)
	}
	if mp.Alone < p.LowerBound {
		return fmt.Errorf("own arena %d is below its lower bound %d", mp.Alone, p.LowerBound)
	}
	if m.Keys != nil && len(m.Keys) != len(t.Buffers) {
		return fmt.Errorf("%d keys for %d buffers", len(m.Keys), len(t.Buffers))
	}
	// Shared ranges in offset order, for the disjointness search below.
	shared := make([]SharedBuffer, 0, len(byKey))
	shared = append(shared, fp.Shared...)
	mine := map[string]bool{}
	for i := range t.Buffers {
		b := &t.Buffers[i]
		size, a := Need(b, p.Align)
		off := p.Offsets[i]
		if k := keyOf(m, i); k != "" {
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
			continue
		}
		// A private buffer may not touch any shared range, at any time:
		// shared contents outlive every member's replay.
		j := sort.Search(len(shared), func(j int) bool { return shared[j].Offset+shared[j].Size > off })
		if j < len(shared) && shared[j].Offset < off+size {
			return fmt.Errorf("buffer %d (%s) %s overlaps shared key %q %s",
				i, b.Name, byteRange(off, size), shared[j].Key, byteRange(shared[j].Offset, shared[j].Size))
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
