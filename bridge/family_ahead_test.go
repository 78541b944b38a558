package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestFamilyPlansMembersAhead: members planned ahead, each right after
// its recording, are what Plan takes (it plans none of them again), and
// the family's arena is the one planned without them; every member then
// serves without a divergence. A plan made ahead with another budget is
// not taken. PlanAhead refuses a member without a finished recording, one
// planned ahead already, and any member once the family is planned.
func TestFamilyPlansMembersAhead(t *testing.T) {
	scales := []uint64{8, 4, 2, 1}
	b0 := newTestBridge(t)
	f0, _ := recordFamily(t, b0, scales)
	if err := f0.Plan(0); err != nil {
		t.Fatal(err)
	}
	want := f0.Report().Arena

	for _, budget := range []time.Duration{0, 50 * time.Millisecond} {
		b := newTestBridge(t)
		f, err := b.NewFamily(0, "decode")
		if err != nil {
			t.Fatal(err)
		}
		var ps []*program
		for _, k := range scales {
			p := &program{t: t, b: b, stream: 0x77, layers: 6, scale: k}
			s, err := f.NewMember(fmt.Sprint("bs", k))
			if err != nil {
				t.Fatal(err)
			}
			if err := f.PlanAhead(s, budget); err == nil {
				t.Fatalf("PlanAhead of member %s before its recording: no error", s.name)
			}
			recordRun(t, s, p)
			if err := f.PlanAhead(s, budget); err != nil {
				t.Fatal(err)
			}
			if err := f.PlanAhead(s, budget); err == nil {
				t.Fatalf("PlanAhead of member %s twice: no error", s.name)
			}
			ps = append(ps, p)
		}
		f.d.mu.Lock()
		var ahead []*aheadPlan
		for _, s := range f.members {
			ahead = append(ahead, f.ahead[s])
		}
		f.d.mu.Unlock()
		for _, a := range ahead {
			<-a.done
		}
		if err := f.Plan(0); err != nil {
			t.Fatal(err)
		}
		if got := f.Report().Arena; got != want {
			t.Errorf("budget %v: arena %d, want %d as planned without plans made ahead", budget, got, want)
		}
		for i, mp := range f.plan.Members {
			a := ahead[i].plan
			if a == nil {
				t.Fatalf("budget %v: member %s: no plan made ahead", budget, mp.Name)
			}
			if taken := mp.Plan.Elapsed == a.Elapsed; taken != (budget == 0) {
				t.Errorf("budget %v: member %s: plan made ahead taken: %v, want %v (Plan's budget is 0)", budget, mp.Name, taken, budget == 0)
			}
		}
		if err := f.PlanAhead(f.Members()[0], 0); err == nil {
			t.Fatal("PlanAhead after Plan: no error")
		}
		for range 2 {
			for i, s := range f.Members() {
				_, out := serveRun(t, s, ps[i])
				ps[i].free(out)
			}
		}
		noDivergence(t, f)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFamilyCloseStopsPlansAhead: Close stops the plans still made
// ahead and waits for them: a plan that runs until it is stopped (a
// stand-in for a long search) has ended when Close returns; a Close that
// did not stop it would not return.
func TestFamilyCloseStopsPlansAhead(t *testing.T) {
	b := newTestBridge(t)
	f, _ := recordFamily(t, b, []uint64{8, 4})
	s := f.Members()[0]
	ctx, cancel := context.WithCancel(context.Background())
	a := &aheadPlan{trace: s.trace, cancel: cancel, done: make(chan struct{})}
	ended := false
	go func() {
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond) // stopping takes a while
		ended = true
		close(a.done)
	}()
	f.d.mu.Lock()
	f.ahead = map[*Step]*aheadPlan{s: a}
	f.d.mu.Unlock()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	default:
		t.Fatal("a plan made ahead still running after Close")
	}
	if !ended {
		t.Fatal("Close returned before the plan made ahead ended")
	}
}
