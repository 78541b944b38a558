package arena_test

import (
	"context"
	"fmt"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// A planned step made real with NewLayout on the simulated device: the
// plan is checked, the arena mapped at the lower bound (3 MiB of weights
// beside two 2 MiB activations that are never live together), every
// buffer has its address; a later run of the step with a smaller buffer
// fits the plan and keeps those addresses, one that grew does not.
func ExampleNewLayout() {
	dev, err := cuda.OpenSim(cuda.SizedSimConfig(nil))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	const MiB = 1 << 20
	step := func(a1 int64) *lifetime.Trace {
		return &lifetime.Trace{Name: "step", Buffers: []lifetime.Buffer{
			{ID: 0, Name: "w", Tag: "weight", Size: 3 * MiB, Start: 0, End: 3},
			{ID: 1, Name: "a0", Size: 2 * MiB, Start: 0, End: 2},
			{ID: 2, Name: "a1", Size: a1, Start: 2, End: 3},
		}}
	}
	tr := step(2 * MiB)
	p, err := planner.Run(context.Background(), planner.Auto, tr, planner.Options{Workers: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	l, err := arena.NewLayout(dev, tr, p, "weight")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	fmt.Println("a0 and a1 (never live together) share an address:", l.Addrs()[1] == l.Addrs()[2])
	fmt.Println("arena of", l.Arena().Size()/MiB, "MiB, the lower bound")
	if later, err := l.Fit(step(1 * MiB)); err == nil {
		fmt.Println("a smaller a1 fits, a1 at the same address:", later.Addrs()[2] == l.Addrs()[2])
	}
	if _, err := l.Fit(step(3 * MiB)); err != nil {
		fmt.Println("a larger a1 does not fit")
	}
	// Output:
	// a0 and a1 (never live together) share an address: true
	// arena of 5 MiB, the lower bound
	// a smaller a1 fits, a1 at the same address: true
	// a larger a1 does not fit
}
