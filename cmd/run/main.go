// Command run loads a plan, builds the arena, captures the workload once
// into a CUDA graph, replays it and reports. Not implemented yet.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "run: not implemented yet")
	os.Exit(1)
}
