package arena

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/cuda/devtest"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30
)

// env is the device a test runs on: the simulation, or the driver
// (gpu_test.go).
type env = devtest.Env

func newSimEnv(t testing.TB, total uint64) *env { return devtest.NewSim(t, total) }

// modelTrace is a small workload: weights and a KV cache that live
// throughout, activations that come and go.
func modelTrace() *lifetime.Trace {
	t := &lifetime.Trace{Name: "model"}
	add := func(name, tag string, size, start, end int64) {
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: name, Tag: tag,
			Size: size, Start: start, End: end})
	}
	add("w0", "weight", 1*MiB+100, 0, 10)
	add("w1", "weight", 700*KiB, 0, 10)
	add("a0", "act", 1536*KiB, 0, 3)
	add("a1", "act", 512*KiB, 1, 5)
	add("a2", "act", 2*MiB, 3, 8)
	add("a3", "act", 300*KiB, 5, 10)
	add("kv", "kv", 1*MiB, 0, 10)
	return t
}

func tagOf(b *lifetime.Buffer) string { return b.Tag }

// groupedPlan plans each tag on its own, regions on granule boundaries.
func groupedPlan(t testing.TB, tr *lifetime.Trace, gran int64) (*planner.Plan, []planner.Region) {
	t.Helper()
	p, regs, err := planner.RunGrouped(context.Background(), "bestfit", tr, planner.Options{Workers: 1},
		tagOf, []string{"weight", "kv", "act"}, gran)
	if err != nil {
		t.Fatal(err)
	}
	return p, regs
}

// fixedPlan is a plan with the given offsets.
func fixedPlan(tr *lifetime.Trace, offsets []int64) *planner.Plan {
	p := &planner.Plan{Algo: "fixed", Align: planner.DefaultAlign, Offsets: offsets}
	p.Arena = planner.ArenaSize(tr, offsets, p.Align)
	p.LowerBound, _ = tr.LowerBound(p.Align)
	return p
}

func newArena(t testing.TB, e *env, tr *lifetime.Trace, p *planner.Plan, opts ...Option) *Arena {
	t.Helper()
	a, err := New(e.Dev, tr, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func mustPtr(t testing.TB, a *Arena, id lifetime.ID) cuda.DevicePtr {
	t.Helper()
	p, err := a.Ptr(id)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// fillRandom writes random bytes into every buffer and returns them, nil
// for buffers that share memory with another.
func fillRandom(t testing.TB, e *env, a *Arena, tr *lifetime.Trace, seed uint64) [][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([][]byte, len(tr.Buffers))
	for i := range tr.Buffers {
		b := make([]byte, tr.Buffers[i].Size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if err := e.Dev.CopyHtoD(mustPtr(t, a, lifetime.ID(i)), b); err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	// Buffers that share memory in the plan (at different times)
	// overwrite each other: only the others can be compared.
	for i := range tr.Buffers {
		oi, _ := a.Offset(lifetime.ID(i))
		for j := range tr.Buffers {
			oj, _ := a.Offset(lifetime.ID(j))
			if i != j && oi < oj+tr.Buffers[j].Size && oj < oi+tr.Buffers[i].Size {
				out[i] = nil
			}
		}
	}
	return out
}

func readBuf(t testing.TB, e *env, a *Arena, tr *lifetime.Trace, id lifetime.ID) []byte {
	t.Helper()
	b := make([]byte, tr.Buffers[id].Size)
	if err := e.Dev.CopyDtoH(b, mustPtr(t, a, id)); err != nil {
		t.Fatal(err)
	}
	return b
}

// arenaCases run on the simulation (TestArena) and on the driver when one
// is present (TestGPUArena). exact says MemGetInfo deltas must be exact.
var arenaCases = []struct {
	name string
	run  func(t *testing.T, e *env, exact bool)
}{
	{"addresses", testAddresses},
	{"unaligned-regions", testUnalignedRegions},
	{"separation", testSeparation},
	{"pause-releases-memory", testPauseReleases},
	{"backup-and-drop", testBackupAndDrop},
	{"graph-replay-across-pause", testGraphAcrossPause},
	{"misuse", testMisuse},
	{"shared-region", testSharedRegion},
	{"invalid-plan", testInvalidPlan},
	{"small-handles", testSmallHandles},
}

func TestArena(t *testing.T) {
	for _, c := range arenaCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newSimEnv(t, 1*GiB), true) })
	}
}

func testAddresses(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, pregs := groupedPlan(t, tr, int64(gran))
	free0 := e.Free(t)
	a := newArena(t, e, tr, p)
	if a.Size() != p.Arena {
		t.Errorf("Size %d, plan %d", a.Size(), p.Arena)
	}
	regs := a.Regions()
	if len(regs) != len(pregs) {
		t.Fatalf("%d regions, planner made %d: %+v", len(regs), len(pregs), regs)
	}
	var mapped uint64
	for i, r := range regs {
		if len(r.Tags) != 1 || r.Tags[0] != pregs[i].Group || r.Lo != pregs[i].Lo || r.Hi != pregs[i].Hi {
			t.Errorf("region %d = %v [%d,%d), planner %q [%d,%d)", i, r.Tags, r.Lo, r.Hi, pregs[i].Group, pregs[i].Lo, pregs[i].Hi)
		}
		if uint64(r.VA)%gran != 0 || r.Size%gran != 0 || r.Mapped != r.Size || r.Paused {
			t.Errorf("region %d: %+v not granule-aligned and mapped", i, r)
		}
		mapped += r.Mapped
	}
	if a.Mapped() != mapped || mapped < uint64(p.Arena) {
		t.Errorf("Mapped %d, regions %d, plan %d", a.Mapped(), mapped, p.Arena)
	}
	if drop := free0 - e.Free(t); exact && drop != mapped {
		t.Errorf("device free memory dropped by %d, mapped %d", drop, mapped)
	}
	for i := range tr.Buffers {
		id := lifetime.ID(i)
		ptr := mustPtr(t, a, id)
		off, err := a.Offset(id)
		if err != nil || off != p.Offsets[i] {
			t.Errorf("Offset(%d) = %d, %v; plan %d", i, off, err, p.Offsets[i])
		}
		r := regs[regionOf(regs, tr.Buffers[i].Tag)]
		if want := r.VA.Add(uint64(off - r.Lo)); ptr != want {
			t.Errorf("Ptr(%d) = %#x, want VA+(off-Lo) = %#x", i, ptr, want)
		}
	}
	// Two buffers of one region are as far apart as their offsets.
	if d := int64(mustPtr(t, a, 3) - mustPtr(t, a, 2)); d != p.Offsets[3]-p.Offsets[2] {
		t.Errorf("a1-a0 = %d, offsets differ by %d", d, p.Offsets[3]-p.Offsets[2])
	}
}

func regionOf(regs []RegionInfo, tag string) int {
	for i, r := range regs {
		for _, t := range r.Tags {
			if t == tag {
				return i
			}
		}
	}
	return -1
}

// testUnalignedRegions: a plan whose regions do not start on granule
// boundaries still gives every pointer its offset's alignment.
func testUnalignedRegions(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, 4096)
	a := newArena(t, e, tr, p)
	if len(a.Regions()) != 3 {
		t.Fatalf("regions %+v", a.Regions())
	}
	for i := range tr.Buffers {
		ptr := mustPtr(t, a, lifetime.ID(i))
		if uint64(ptr)%gran != uint64(p.Offsets[i])%gran {
			t.Errorf("Ptr(%d) = %#x is not congruent to offset %d modulo the granularity", i, ptr, p.Offsets[i])
		}
	}
	want := fillRandom(t, e, a, tr, 7)
	for i := range tr.Buffers {
		if got := readBuf(t, e, a, tr, lifetime.ID(i)); want[i] != nil && !bytes.Equal(got, want[i]) {
			t.Errorf("buffer %d does not read back", i)
		}
	}
}

// testSeparation: regions have disjoint address windows and their own
// physical memory: pausing one leaves the others readable and intact.
func testSeparation(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, int64(gran))
	a := newArena(t, e, tr, p)
	regs := a.Regions()
	for i := range regs {
		for j := i + 1; j < len(regs); j++ {
			ai, bi := uint64(regs[i].VA), uint64(regs[j].VA)
			if ai < bi+regs[j].Size && bi < ai+regs[i].Size {
				t.Errorf("regions %v and %v overlap in addresses", regs[i].Tags, regs[j].Tags)
			}
		}
	}
	want := fillRandom(t, e, a, tr, 1)
	act := mustPtr(t, a, 2)
	if err := a.Pause("act"); err != nil {
		t.Fatal(err)
	}
	for i, b := range tr.Buffers {
		if b.Tag == "act" {
			if _, err := a.Ptr(lifetime.ID(i)); !errors.Is(err, ErrPaused) {
				t.Errorf("Ptr(%d) of a paused region: %v", i, err)
			}
			continue
		}
		if got := readBuf(t, e, a, tr, lifetime.ID(i)); want[i] != nil && !bytes.Equal(got, want[i]) {
			t.Errorf("buffer %d (%s) changed while act was paused", i, b.Name)
		}
	}
	if e.Sim != nil {
		// Nothing is mapped at a paused region's addresses.
		if err := e.Dev.CopyHtoD(act, []byte{1, 2, 3, 4}); err == nil {
			t.Error("copy into a paused region succeeded")
		}
	}
	if err := a.Resume("act"); err != nil {
		t.Fatal(err)
	}
	if got := mustPtr(t, a, 2); got != act {
		t.Errorf("Ptr moved across pause: %#x -> %#x", act, got)
	}
}

func testPauseReleases(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, int64(gran))
	a := newArena(t, e, tr, p, WithPolicy("weight", Backup))
	before := make([]cuda.DevicePtr, len(tr.Buffers))
	for i := range before {
		before[i] = mustPtr(t, a, lifetime.ID(i))
	}
	mapped := a.Mapped()
	free0 := e.Free(t)
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	free1 := e.Free(t)
	if a.Mapped() != 0 {
		t.Errorf("Mapped %d after pausing everything", a.Mapped())
	}
	checkDelta(t, "pause returned", free1-free0, mapped, exact)
	for _, r := range a.Regions() {
		if !r.Paused || r.Mapped != 0 {
			t.Errorf("region %v after Pause: %+v", r.Tags, r)
		}
	}
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	checkDelta(t, "resume took", free1-e.Free(t), mapped, exact)
	for i := range before {
		if got := mustPtr(t, a, lifetime.ID(i)); got != before[i] {
			t.Errorf("Ptr(%d) moved across pause/resume: %#x -> %#x", i, before[i], got)
		}
	}
	if a.Mapped() != mapped {
		t.Errorf("Mapped %d after resume, %d before", a.Mapped(), mapped)
	}
	// Pausing one tag at a time returns that region's memory only.
	for _, r := range a.Regions() {
		f0 := e.Free(t)
		if err := a.Pause(r.Tags...); err != nil {
			t.Fatal(err)
		}
		checkDelta(t, "pause "+r.Tags[0]+" returned", e.Free(t)-f0, r.Size, exact)
	}
	if err := a.Resume("weight", "kv", "act"); err != nil {
		t.Fatal(err)
	}
}

// checkDelta compares a MemGetInfo difference with what it should be:
// exactly on the simulation, within 1% + 8 MiB on a driver (the driver
// keeps some memory of its own).
func checkDelta(t *testing.T, what string, got, want uint64, exact bool) {
	t.Helper()
	if exact {
		if got != want {
			t.Errorf("%s %d bytes, want %d", what, got, want)
		}
		return
	}
	slack := want/100 + 8*MiB
	if got+slack < want || got > want+slack {
		t.Errorf("%s %d bytes, want %d (±%d)", what, got, want, slack)
	}
}

func testBackupAndDrop(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, int64(gran))
	a := newArena(t, e, tr, p, WithPolicy("weight", Backup), WithPolicy("kv", Backup), WithPolicy("act", Drop))
	for _, r := range a.Regions() {
		want := Drop
		if r.Tags[0] != "act" {
			want = Backup
		}
		if r.Policy != want {
			t.Errorf("region %v policy %v, want %v", r.Tags, r.Policy, want)
		}
	}
	want := fillRandom(t, e, a, tr, 2)
	if want[3] == nil || want[0] == nil {
		t.Fatal("test needs a1 and w0 to share memory with no other buffer")
	}
	var backed uint64 // the bytes the Backup regions hold
	mapped := a.Mapped()
	for _, r := range a.Regions() {
		if r.Policy == Backup {
			backed += uint64(r.Hi - r.Lo)
			// The host copy exists before the first Pause, so that
			// Pause only copies.
			if r.Host != uint64(r.Hi-r.Lo) || e.Sim != nil && !r.Pinned {
				t.Errorf("region %v: %d host bytes (pinned %v) before the first Pause, want %d pinned", r.Tags, r.Host, r.Pinned, r.Hi-r.Lo)
			}
		}
	}
	if e.Sim != nil && e.Sim.PinnedBytes() != backed {
		t.Errorf("%d pinned bytes before the first Pause, want %d", e.Sim.PinnedBytes(), backed)
	}
	if got := a.Mapped(); got != mapped {
		t.Errorf("the host copies changed the device memory mapped: %d bytes, then %d", mapped, got)
	}
	if e.Sim != nil {
		// Pinned memory is host memory: device memory is the arena's.
		if free, total, err := e.Dev.MemGetInfo(); err != nil || total-free != a.Reserved() {
			t.Errorf("device memory in use %d (err %v), want the arena's %d", total-free, err, a.Reserved())
		}
	}
	for round := 0; round < 2; round++ {
		if err := a.Pause(); err != nil {
			t.Fatal(err)
		}
		// The backups are page-locked memory, pinned with the arena
		// and kept from one Pause to the next.
		if e.Sim != nil && e.Sim.PinnedBytes() != backed {
			t.Errorf("round %d: %d pinned bytes while paused, want %d", round, e.Sim.PinnedBytes(), backed)
		}
		if err := a.Resume(); err != nil {
			t.Fatal(err)
		}
		if e.Sim != nil && e.Sim.PinnedBytes() != backed {
			t.Errorf("round %d: %d pinned bytes kept after Resume, want %d", round, e.Sim.PinnedBytes(), backed)
		}
		var host uint64
		for _, r := range a.Regions() {
			if r.Policy == Backup && (!r.Pinned && e.Sim != nil || r.Host != uint64(r.Hi-r.Lo)) {
				t.Errorf("round %d: region %v keeps %d host bytes (pinned %v), want %d pinned", round, r.Tags, r.Host, r.Pinned, r.Hi-r.Lo)
			}
			host += r.Host
		}
		if host != backed {
			t.Errorf("round %d: regions report %d host bytes, want %d", round, host, backed)
		}
		for i, b := range tr.Buffers {
			got := readBuf(t, e, a, tr, lifetime.ID(i))
			switch {
			case want[i] == nil:
			case b.Tag != "act" && !bytes.Equal(got, want[i]):
				t.Errorf("round %d: Backup buffer %d (%s) not restored bit for bit", round, i, b.Name)
			case b.Tag == "act" && bytes.Equal(got, want[i]):
				t.Errorf("round %d: Drop buffer %d (%s) kept its contents", round, i, b.Name)
			case b.Tag == "act" && e.Sim != nil && !bytes.Equal(got, make([]byte, len(got))):
				t.Errorf("round %d: Drop buffer %d (%s) is not zero on the simulation", round, i, b.Name)
			}
		}
	}
	if err := a.ReleaseHost(); err != nil {
		t.Fatal(err)
	}
	for _, r := range a.Regions() {
		if r.Host != 0 || r.Pinned {
			t.Errorf("region %v keeps %d host bytes after ReleaseHost", r.Tags, r.Host)
		}
	}
	if e.Sim != nil && e.Sim.PinnedBytes() != 0 {
		t.Errorf("%d pinned bytes left after ReleaseHost", e.Sim.PinnedBytes())
	}
	// Closed while paused: the backups go back too.
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseHost(); err != nil {
		t.Fatal(err)
	}
	if e.Sim != nil && e.Sim.PinnedBytes() != backed {
		t.Errorf("ReleaseHost freed a paused region's backup: %d pinned bytes, want %d", e.Sim.PinnedBytes(), backed)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if e.Sim != nil && e.Sim.PinnedBytes() != 0 {
		t.Errorf("%d pinned bytes left after Close of a paused arena", e.Sim.PinnedBytes())
	}
}

// testGraphAcrossPause captures act[a2] = weight[w1] + 7 and act[a3] =
// kv + 1 over arena memory, replays, pauses, resumes, replays again.
func testGraphAcrossPause(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, int64(gran))
	a := newArena(t, e, tr, p, WithPolicy("weight", Backup), WithPolicy("kv", Backup))
	s := e.Stream(t)
	a.WatchStreams(s)
	want := fillRandom(t, e, a, tr, 3)
	n1 := uint32(tr.Buffers[1].Size / 4) // w1 -> a2 (a2 is larger)
	n2 := uint32(tr.Buffers[5].Size / 4) // kv -> a3 (a3 is smaller)
	if err := e.Dev.BeginCapture(s, cuda.CaptureModeGlobal); err != nil {
		t.Fatal(err)
	}
	if err := a.Pause("act"); !errors.Is(err, ErrCapturing) {
		t.Errorf("Pause during a capture on a watched stream: %v", err)
	}
	if err := e.LaunchAdd(s, mustPtr(t, a, 4), mustPtr(t, a, 1), 7, n1); err != nil {
		t.Fatal(err)
	}
	if err := e.LaunchAdd(s, mustPtr(t, a, 5), mustPtr(t, a, 6), 1, n2); err != nil {
		t.Fatal(err)
	}
	g, err := e.Dev.EndCapture(s)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	x, err := g.Instantiate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	check := func(when string) {
		t.Helper()
		if err := x.Launch(s); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		a2, a3 := readBuf(t, e, a, tr, 4), readBuf(t, e, a, tr, 5)
		for i := uint32(0); i < n1; i++ {
			if got, w := binary.LittleEndian.Uint32(a2[4*i:]), binary.LittleEndian.Uint32(want[1][4*i:])+7; got != w {
				t.Fatalf("%s: a2[%d] = %#x, want %#x", when, i, got, w)
			}
		}
		for i := uint32(0); i < n2; i++ {
			if got, w := binary.LittleEndian.Uint32(a3[4*i:]), binary.LittleEndian.Uint32(want[6][4*i:])+1; got != w {
				t.Fatalf("%s: a3[%d] = %#x, want %#x", when, i, got, w)
			}
		}
	}
	check("before pause")
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	check("after resume")
	if err := a.Pause("act"); err != nil {
		t.Fatal(err)
	}
	if err := a.Resume("act"); err != nil {
		t.Fatal(err)
	}
	check("after pausing act alone")
}

func testMisuse(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, int64(gran))
	a, err := New(e.Dev, tr, p, WithPolicy("weight", Backup))
	if err != nil {
		t.Fatal(err)
	}
	capturing := false
	a.SetCaptureGuard(func() bool { return capturing })
	n := lifetime.ID(len(tr.Buffers))
	steps := []struct {
		name string
		do   func() error
		want error // nil: must succeed
	}{
		{"Ptr(-1)", func() error { _, err := a.Ptr(-1); return err }, ErrUnknown},
		{"Ptr(n)", func() error { _, err := a.Ptr(n); return err }, ErrUnknown},
		{"Offset(n)", func() error { _, err := a.Offset(n); return err }, ErrUnknown},
		{"Pause(unknown)", func() error { return a.Pause("nope") }, ErrUnknown},
		{"Resume(unknown)", func() error { return a.Resume("nope") }, ErrUnknown},
		{"Resume(running)", func() error { return a.Resume("act") }, ErrNotPaused},
		{"Resume() nothing paused", func() error { return a.Resume() }, ErrNotPaused},
		{"Pause(act)", func() error { return a.Pause("act") }, nil},
		{"Ptr(paused)", func() error { _, err := a.Ptr(2); return err }, ErrPaused},
		{"Offset(paused) works", func() error { _, err := a.Offset(2); return err }, nil},
		{"Pause(act) twice", func() error { return a.Pause("act") }, ErrPaused},
		{"Pause(weight, act) one paused", func() error { return a.Pause("weight", "act") }, ErrPaused},
		{"Resume(act)", func() error { return a.Resume("act") }, nil},
		{"Resume(act) twice", func() error { return a.Resume("act") }, ErrNotPaused},
		{"Pause() all", func() error { return a.Pause() }, nil},
		{"Pause() nothing left", func() error { return a.Pause() }, ErrPaused},
		{"Resume() all", func() error { return a.Resume() }, nil},
		{"guard on", func() error { capturing = true; return nil }, nil},
		{"Pause during capture", func() error { return a.Pause("act") }, ErrCapturing},
		{"Resume during capture", func() error { return a.Resume("act") }, ErrNotPaused},
		{"Close during capture", func() error { return a.Close() }, ErrCapturing},
		{"guard off", func() error { capturing = false; return nil }, nil},
		{"Pause(weight) after guard", func() error { return a.Pause("weight") }, nil},
		{"guard on again", func() error { capturing = true; return nil }, nil},
		{"Resume(weight) during capture", func() error { return a.Resume("weight") }, ErrCapturing},
		{"guard removed", func() error { a.SetCaptureGuard(nil); return nil }, nil},
		{"Close", func() error { return a.Close() }, nil},
		{"Close twice", func() error { return a.Close() }, ErrClosed},
		{"Ptr after Close", func() error { _, err := a.Ptr(0); return err }, ErrClosed},
		{"Offset after Close", func() error { _, err := a.Offset(0); return err }, ErrClosed},
		{"Pause after Close", func() error { return a.Pause() }, ErrClosed},
		{"Resume after Close", func() error { return a.Resume() }, ErrClosed},
	}
	for _, s := range steps {
		err := s.do()
		switch {
		case s.want == nil && err != nil:
			t.Errorf("%s: %v", s.name, err)
		case s.want != nil && !errors.Is(err, s.want):
			t.Errorf("%s: got %v, want %v", s.name, err, s.want)
		case err != nil && (!strings.HasPrefix(err.Error(), "arena: ") || strings.Contains(err.Error(), "\n")):
			t.Errorf("%s: error is not one line of package arena: %q", s.name, err)
		}
	}
	if a.Mapped() != 0 {
		t.Errorf("Mapped %d after Close", a.Mapped())
	}

	// Bad options.
	for _, c := range []struct {
		name string
		opts []Option
		want string
	}{
		{"unknown tag", []Option{WithPolicy("nope", Backup)}, `WithPolicy("nope")`},
		{"bad policy", []Option{WithPolicy("act", Policy(9))}, "unknown policy"},
		{"policy twice", []Option{WithPolicy("act", Drop), WithPolicy("act", Backup)}, "set twice"},
		{"zero handle", []Option{WithHandleSize(0)}, "must be positive"},
		{"odd handle", []Option{WithHandleSize(gran + 1)}, "not a multiple"},
	} {
		a, err := New(e.Dev, tr, p, c.opts...)
		if err == nil {
			a.Close()
			t.Errorf("%s: New succeeded", c.name)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to mention %q", c.name, err, c.want)
		}
	}
	if _, err := New(nil, tr, p); err == nil {
		t.Error("New(nil device) succeeded")
	}
}

// testSharedRegion: tags whose ranges overlap share a region and pause
// together.
func testSharedRegion(t *testing.T, e *env, exact bool) {
	tr := modelTrace()
	// A joint plan interleaves act and kv: place kv between activations.
	off := []int64{0, 2 * MiB, 3 * MiB, 7680 * KiB, 5632 * KiB, 3 * MiB, 4608 * KiB}
	p := fixedPlan(tr, off)
	a := newArena(t, e, tr, p, WithPolicy("kv", Backup))
	regs := a.Regions()
	if len(regs) != 2 || strings.Join(regs[1].Tags, ",") != "act,kv" || regs[1].Policy != Backup {
		t.Fatalf("regions %+v, want weight and act+kv (backup)", regs)
	}
	err := a.Pause("kv")
	if !errors.Is(err, ErrSharedRegion) || !strings.Contains(err.Error(), `"act"`) {
		t.Errorf("Pause(kv) of a shared region: %v", err)
	}
	want := fillRandom(t, e, a, tr, 4)
	if err := a.Pause("kv", "act"); err != nil {
		t.Fatal(err)
	}
	if err := a.Resume("act"); !errors.Is(err, ErrSharedRegion) {
		t.Errorf("Resume(act) of a shared region: %v", err)
	}
	if err := a.Resume("act", "kv", "kv"); err != nil {
		t.Fatal(err)
	}
	// The whole shared region was backed up, act included.
	for i := range tr.Buffers {
		if got := readBuf(t, e, a, tr, lifetime.ID(i)); want[i] != nil && !bytes.Equal(got, want[i]) {
			t.Errorf("buffer %d not restored", i)
		}
	}
}

func testInvalidPlan(t *testing.T, e *env, exact bool) {
	tr := modelTrace()
	free0 := e.Free(t)
	// a0 and a1 live together at [1, 3) and overlap in memory.
	p := fixedPlan(tr, []int64{0, 2 * MiB, 3 * MiB, 3*MiB + 4096, 6 * MiB, 8 * MiB, 9 * MiB})
	if _, err := New(e.Dev, tr, p); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("overlapping plan: %v", err)
	}
	p = fixedPlan(tr, []int64{0, 2 * MiB, 3 * MiB, 5 * MiB, 6 * MiB, 8 * MiB, 9 * MiB})
	p.Offsets = p.Offsets[:3]
	if _, err := New(e.Dev, tr, p); err == nil {
		t.Error("short plan accepted")
	}
	p = fixedPlan(tr, []int64{0, 2 * MiB, 3 * MiB, 5 * MiB, 6 * MiB, 8 * MiB, 9 * MiB})
	p.Arena = 4 * MiB
	if _, err := New(e.Dev, tr, p); err == nil {
		t.Error("plan with buffers beyond the arena accepted")
	}
	if got := e.Free(t); exact && got != free0 {
		t.Errorf("refused plans leaked %d bytes", free0-got)
	}
}

func testSmallHandles(t *testing.T, e *env, exact bool) {
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, int64(gran))
	a := newArena(t, e, tr, p, WithHandleSize(gran), WithPolicy("act", Backup))
	want := fillRandom(t, e, a, tr, 5)
	for k := 0; k < 3; k++ {
		if err := a.Pause(); err != nil {
			t.Fatal(err)
		}
		if err := a.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range tr.Buffers {
		b := readBuf(t, e, a, tr, lifetime.ID(i))
		if tr.Buffers[i].Tag == "act" && want[i] != nil && !bytes.Equal(b, want[i]) {
			t.Errorf("backup buffer %d not restored", i)
		}
	}
}

// TestOutOfMemory: a device too small for the plan gives one clear line
// and leaks nothing.
func TestOutOfMemory(t *testing.T) {
	e := newSimEnv(t, 4*MiB)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, 2*MiB)
	_, err := New(e.Dev, tr, p)
	if err == nil {
		t.Fatal("New on a 4 MiB device succeeded")
	}
	msg := err.Error()
	t.Logf("%s", msg)
	if !errors.Is(err, ErrOutOfMemory) ||
		strings.Contains(msg, "\n") || !strings.Contains(msg, "regions") || !strings.Contains(msg, "free of 4 MiB") {
		t.Errorf("OOM error %q", msg)
	}
	if e.Free(t) != 4*MiB {
		t.Errorf("failed New leaked: %d free of 4 MiB", e.Free(t))
	}
}

// TestResumeOutOfMemory: Resume fails cleanly when the memory was taken
// meanwhile, keeps the backup, and succeeds once memory is back.
func TestResumeOutOfMemory(t *testing.T) {
	e := newSimEnv(t, 16*MiB)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, 2*MiB)
	a := newArena(t, e, tr, p, WithPolicy("weight", Backup), WithPolicy("kv", Backup), WithPolicy("act", Backup))
	want := fillRandom(t, e, a, tr, 6)
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	hog, err := e.Dev.Alloc(e.Free(t) - 2*MiB)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Resume()
	if !errors.Is(err, ErrOutOfMemory) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Resume with no memory: %v", err)
	}
	t.Logf("%v", err)
	if err := e.Dev.Free(hog); err != nil {
		t.Fatal(err)
	}
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	for i := range tr.Buffers {
		if got := readBuf(t, e, a, tr, lifetime.ID(i)); want[i] != nil && !bytes.Equal(got, want[i]) {
			t.Errorf("buffer %d not restored after a failed Resume", i)
		}
	}
}

// TestEmptyTrace: an arena of nothing is valid and maps nothing.
func TestEmptyTrace(t *testing.T) {
	e := newSimEnv(t, 16*MiB)
	tr := &lifetime.Trace{Name: "empty"}
	a, err := New(e.Dev, tr, &planner.Plan{Align: 256})
	if err != nil {
		t.Fatal(err)
	}
	if a.Size() != 0 || a.Mapped() != 0 || len(a.Regions()) != 0 {
		t.Errorf("empty arena: size %d mapped %d regions %d", a.Size(), a.Mapped(), len(a.Regions()))
	}
	if err := a.Pause(); err != nil {
		t.Errorf("Pause of an empty arena: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrent runs Ptr, Regions and Mapped against Pause and Resume
// (for the race detector).
func TestConcurrent(t *testing.T) {
	e := newSimEnv(t, 256*MiB)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, 2*MiB)
	a := newArena(t, e, tr, p, WithPolicy("weight", Backup))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := lifetime.ID(g % len(tr.Buffers))
				if _, err := a.Ptr(id); err != nil && !errors.Is(err, ErrPaused) {
					t.Error(err)
					return
				}
				_ = a.Regions()
				_ = a.Mapped()
			}
		}(g)
	}
	for k := 0; k < 50; k++ {
		tag := []string{"weight", "act", "kv"}[k%3]
		if err := a.Pause(tag); err != nil {
			t.Fatal(err)
		}
		if err := a.Resume(tag); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

// TestRunByTagKeepsPoliciesApart: weights (backed up) and activations
// (dropped) planned the one way a tagged trace is planned for an arena
// (planner.RunByTag) land in regions of their own, each with its policy;
// the weights region is never merged into one backed-up region with the
// activations, whichever planning algorithm interleaves them.
func TestRunByTagKeepsPoliciesApart(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	tr := &lifetime.Trace{Name: "w+a"}
	add := func(tag string, size, start, end int64) {
		tr.Buffers = append(tr.Buffers, lifetime.Buffer{ID: lifetime.ID(len(tr.Buffers)), Tag: tag, Size: size, Start: start, End: end})
	}
	add("weight", 3*MiB, 0, 10)
	add("weight", 1*MiB, 0, 10)
	for i := range int64(8) {
		add("intermediate", MiB+i*KiB, i, i+2)
	}
	for _, algo := range planner.Names() {
		p, regs, err := planner.RunByTag(context.Background(), algo, tr, planner.Options{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(regs) != 2 || regs[0].Group != "weight" || regs[1].Group != "intermediate" {
			t.Fatalf("%s: planner regions %+v, want weight then intermediate", algo, regs)
		}
		a := newArena(t, e, tr, p, WithPolicy("weight", Backup))
		got := a.Regions()
		if len(got) != 2 || strings.Join(got[0].Tags, ",") != "weight" || got[0].Policy != Backup ||
			strings.Join(got[1].Tags, ",") != "intermediate" || got[1].Policy != Drop {
			t.Errorf("%s: arena regions %+v, want weight (backup) and intermediate (drop) apart", algo, got)
		}
		a.Close()
	}
}
