package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// handOff is a recorded member's output, by the address its recording
// run gave it.
type handOff struct {
	member int
	buf    lifetime.ID
}

// chainFree says that member to freed handOff from at tick at of its run.
type chainFree struct {
	from handOff
	to   int
	at   int64
}

// NewChain makes an empty chain on device ordinal: a family whose members
// run in turn, in the order they were added, and hand memory on: a buffer
// that one member's run leaves live and a later member's run frees is one
// buffer, live from its producer's allocation to that free, at one address
// (a training step's forward and backward: the activations the forward
// saves are read in place by the backward, which frees them as it goes).
// The members are planned on one timeline, the first member's window, then
// the second's, ..., into one arena whose size is the chain's peak of live
// bytes where the search reaches it, so the backward's buffers reuse the
// forward's dead ones. Outputs no later member frees stay live to the end
// of the chain: a member's outputs are valid until that member runs again.
//
// Record its members in order (Record and End each, on one stream), then
// Plan; serve and capture them in the same order. A chain's plan is
// checked (planner.Check) on the joint trace. Chains are not written to
// plan files, and a member that diverges keeps its plan.
func (b *Bridge) NewChain(ordinal int, name string) (*Family, error) {
	f, err := b.NewFamily(ordinal, name)
	if err != nil {
		return nil, err
	}
	f.d.mu.Lock()
	f.chained = true
	f.handed = map[cuda.DevicePtr]handOff{}
	f.d.mu.Unlock()
	return f, nil
}

// Chained says whether the family is a chain.
func (f *Family) Chained() bool { return f.chained }

// memberIndex is s's index in the family; d.mu is held.
func (f *Family) memberIndex(s *Step) int {
	for i, m := range f.members {
		if m == s {
			return i
		}
	}
	return -1
}

// recordedOutputs notes, at the end of member s's recording run, the
// buffers it left live, so that a later member's free of one links them; d.mu is
// held.
func (f *Family) recordedOutputs(s *Step, run *runLog) {
	k := f.memberIndex(s)
	for p, i := range run.ids {
		f.handed[p] = handOff{member: k, buf: lifetime.ID(i)}
	}
}

// handedFree reports whether p is an earlier member's output freed by the
// recording run of member s, and notes it; d.mu is held.
func (f *Family) handedFree(s *Step, p cuda.DevicePtr) bool {
	h, ok := f.handed[p]
	if !ok {
		return false
	}
	k := f.memberIndex(s)
	if k <= h.member {
		return false
	}
	delete(f.handed, p)
	f.frees = append(f.frees, chainFree{from: h, to: k, at: s.run.now})
	s.run.now++
	return true
}

// jointTrace lays the members' traces on one timeline (planner.Join):
// each member's window after the previous one's; a buffer a later member
// freed lives to that free, and an output no member freed to the end of
// the chain. Joint buffers are named member/name.
func jointTrace(name string, traces []*lifetime.Trace, frees []chainFree) (*planner.Joint, error) {
	windows := make([]planner.Window, len(traces))
	for k, t := range traces {
		windows[k] = planner.Window{Name: fmt.Sprint(k), Trace: t}
	}
	until := make(map[planner.BufferRef]planner.WindowTime, len(frees))
	for _, fr := range frees {
		until[planner.BufferRef{Stage: fr.from.member, Buffer: fr.from.buf}] = planner.WindowTime{Window: fr.to, Time: fr.at}
	}
	j, err := planner.Join(name, windows, planner.Crossings{Until: until, OutputsToEnd: true})
	if err != nil {
		return nil, fmt.Errorf("chain %s: %w", name, err)
	}
	for k, sp := range j.Spans {
		for i, id := range sp.Joint {
			j.Trace.Buffers[id].Name = fmt.Sprintf("%d/%s", k, traces[k].Buffers[i].Name)
		}
	}
	return j, nil
}

// planChain plans the members' recorded runs as one chain.
func (f *Family) planChain(budget time.Duration) error {
	members, err := f.recorded()
	if err != nil {
		return err
	}
	traces := make([]*lifetime.Trace, len(members))
	for i := range members {
		traces[i] = members[i].Trace
	}
	f.d.mu.Lock()
	frees := append([]chainFree(nil), f.frees...)
	f.d.mu.Unlock()
	j, err := jointTrace(f.name, traces, frees)
	if err != nil {
		return f.errorf("%v", err)
	}
	t0 := time.Now()
	p, _, err := planner.RunByTag(context.Background(), planner.Auto, j.Trace, planner.Options{Budget: budget})
	if err != nil {
		return fmt.Errorf("bridge: chain %d (%s): planning: %w", f.id, f.name, err)
	}
	// The group plan reports the chain (its arena, its peak of live
	// bytes, each member's plan); the arena is the joint plan's, and
	// arena.NewGroupLayout checks the joint plan and each member's.
	windows := make([]planner.Window, len(members))
	for k := range members {
		windows[k] = planner.Window{Name: members[k].Name, Trace: traces[k]}
	}
	gp := j.Group(p, windows)
	gp.Elapsed = time.Since(t0)
	return f.install(gp, "", func(dev cuda.Device) (*arena.GroupLayout, error) { return arena.NewGroupLayout(dev, traces, gp) })
}
