package arena_test

import (
	"context"
	"fmt"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Weights and activations planned by tag into one arena on the simulated
// device: every buffer at its fixed address, the activations' memory given
// back to the device while paused (their contents dropped), the weights
// backed up to host memory and restored at the same addresses.
func ExampleNew() {
	dev, err := cuda.OpenSim(cuda.SizedSimConfig(nil))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	const MiB = 1 << 20
	tr := &lifetime.Trace{Name: "step", Buffers: []lifetime.Buffer{
		{ID: 0, Name: "w", Tag: "weight", Size: 3 * MiB, Start: 0, End: 3},
		{ID: 1, Name: "a0", Tag: "intermediate", Size: 2 * MiB, Start: 0, End: 2},
		{ID: 2, Name: "a1", Tag: "intermediate", Size: 2 * MiB, Start: 1, End: 3},
	}}
	p, _, err := planner.RunByTag(context.Background(), planner.Auto, tr, planner.Options{Workers: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	a, err := arena.New(dev, tr, p, arena.WithPolicy("weight", arena.Backup))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	w, _ := a.Ptr(0)
	_ = dev.CopyHtoD(w, []byte("weights"))
	for _, r := range a.Regions() {
		fmt.Printf("region %v: plan [%d, %d), %v\n", r.Tags, r.Lo, r.Hi, r.Policy)
	}
	if err := a.Pause("weight", "intermediate"); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("paused, mapped bytes:", a.Mapped())
	if err := a.Resume("weight", "intermediate"); err != nil {
		fmt.Println(err)
		return
	}
	again, _ := a.Ptr(0)
	got := make([]byte, 7)
	_ = dev.CopyDtoH(got, again)
	fmt.Printf("resumed: same address %v, weights %q\n", again == w, got)
	// Output:
	// region [weight]: plan [0, 3145728), backup
	// region [intermediate]: plan [3145728, 7340032), drop
	// paused, mapped bytes: 0
	// resumed: same address true, weights "weights"
}
