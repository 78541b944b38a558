//go:build arenaplan_fault

package main

import "strings"

// Built with -tags arenaplan_fault (tests only): ARENAPLAN_FAULT_PANIC
// names the exports that panic when called ("all": every one), so that a
// test can check that every export turns a panic into an error.
func init() {
	fault = func(export string) {
		v := cgetenv("ARENAPLAN_FAULT_PANIC")
		if v == "all" || (v != "" && strings.Contains(","+v+",", ","+export+",")) {
			panic("fault injected in " + export)
		}
	}
}
