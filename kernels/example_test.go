package kernels_test

import (
	"fmt"

	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/launch"
)

// The embedded modules, what they are built for, and the Go references
// the simulated device runs for their entries.
func ExampleReference() {
	_, ok := kernels.Reference()[kernels.Linear]
	fmt.Println("kernels.ptx: target sm", launch.Target(kernels.PTX), "linear has a Go reference:", ok)
	fmt.Println("kernels_90.ptx: target sm", launch.Target(kernels.PTX90))
	// Output:
	// kernels.ptx: target sm 80 linear has a Go reference: true
	// kernels_90.ptx: target sm 90
}
