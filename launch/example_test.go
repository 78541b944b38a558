package launch_test

import (
	"fmt"

	"github.com/arenaplan/arenaplan/launch"
)

// What a PTX module says about its launch: its target, and the entries
// that wait for their predecessor (griddepcontrol.wait) and so may be
// launched with programmatic dependent launch.
func ExamplePDLEntries() {
	ptx := []byte(`.version 8.0
.target sm_90
.address_size 64
.visible .entry first(
)
{
	ret;
}
.visible .entry second(
)
{
	griddepcontrol.wait;
	ret;
}
`)
	fmt.Println("target", launch.Target(ptx), "PDL entries", launch.PDLEntries(ptx))
	fmt.Println(launch.U32(7), launch.F32(0.5), launch.D1(128).Count())
	// Output:
	// target 90 PDL entries map[second:true]
	// u32(7) f32(0.5) 128
}
