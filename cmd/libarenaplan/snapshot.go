package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"

	"github.com/arenaplan/arenaplan/bridge"
)

// arenaplan_snapshot sets *out to device's memory as JSON
// (bridge.Snapshot: segments with their blocks, and the history while it
// is recorded); free it with arenaplan_free_string. The blocks the C fast
// path keeps are given back first, so they show as free.
//
//export arenaplan_snapshot
func arenaplan_snapshot(device C.int, out **C.char) *C.char {
	return control("arenaplan_snapshot", func(b *bridge.Bridge) error {
		return setJSON("arenaplan_snapshot", out, func() (any, error) { return b.Snapshot(int(device)) })
	})
}

// arenaplan_record_history turns the allocation history on (enabled != 0,
// keeping the newest max_entries events per device; 0: the default) or
// off (dropping it). While it is on, the C fast path stays shut: every
// allocation and free reaches Go.
//
//export arenaplan_record_history
func arenaplan_record_history(enabled C.int, maxEntries C.int) *C.char {
	return control("arenaplan_record_history", func(b *bridge.Bridge) error {
		if maxEntries < 0 {
			return fmt.Errorf("arenaplan_record_history: max_entries %d is negative", int(maxEntries))
		}
		return b.RecordHistory(enabled != 0, int(maxEntries))
	})
}
