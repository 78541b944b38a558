package main

/*
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/arenaplan/arenaplan/bridge"
	"github.com/arenaplan/arenaplan/cuda"
)

// maxHeld bounds the held ranges one call passes: a member is planned
// around the outputs the program holds, a handful.
const maxHeld = 1 << 16

// arenaplan_family_plan_member_around is arenaplan_family_plan_member for
// a member that replays while the program holds memory in the family's
// arena (bridge.Family.PlanMemberAround): its plan leaves the n device
// address ranges [ranges[2k], ranges[2k+1]) alone, and the arena grows in
// place where it needs more room. On an error the member is closed and
// leaves the family.
//
//export arenaplan_family_plan_member_around
func arenaplan_family_plan_member_around(id, sid C.int, budgetSeconds C.double, ranges *C.uint64_t, n C.int) *C.char {
	return aroundMember("arenaplan_family_plan_member_around", id, sid, budgetSeconds, ranges, n, (*bridge.Family).PlanMemberAround)
}

// arenaplan_family_replan_member_around plans member sid, planned already,
// again around the n device address ranges [ranges[2k], ranges[2k+1])
// and those its plan left alone before, its outputs kept where they are
// (bridge.Family.ReplanMemberAround); the arena grows in place where it
// needs more room. Reset the member's graphs first: its capture pools are
// released. On an error the member keeps its plan and its captures.
//
//export arenaplan_family_replan_member_around
func arenaplan_family_replan_member_around(id, sid C.int, budgetSeconds C.double, ranges *C.uint64_t, n C.int) *C.char {
	return aroundMember("arenaplan_family_replan_member_around", id, sid, budgetSeconds, ranges, n, (*bridge.Family).ReplanMemberAround)
}

// aroundMember calls plan for member sid of family id with the budget and
// the n held ranges at ranges (none for arenaplan_family_plan_member).
func aroundMember(export string, id, sid C.int, budgetSeconds C.double, ranges *C.uint64_t, n C.int,
	plan func(*bridge.Family, *bridge.Step, time.Duration, []bridge.Range) error) *C.char {
	return family(export, id, func(f *bridge.Family) error {
		if n < 0 || n > maxHeld || (n > 0 && ranges == nil) {
			return fmt.Errorf("%s: %d ranges at %p: want 0 to %d ranges, not NULL", export, int(n), ranges, maxHeld)
		}
		budget, err := bridge.BudgetSeconds(float64(budgetSeconds))
		if err != nil {
			return err
		}
		var held []bridge.Range
		if n > 0 {
			for k, v := range unsafe.Slice((*uint64)(unsafe.Pointer(ranges)), 2*int(n)) {
				if k%2 == 0 {
					held = append(held, bridge.Range{Lo: cuda.DevicePtr(v)})
				} else {
					held[k/2].Hi = cuda.DevicePtr(v)
				}
			}
		}
		for _, s := range f.Members() {
			if s.ID() == int(sid) {
				return plan(f, s, budget, held)
			}
		}
		return fmt.Errorf("%s: step %d is not a member of family %d", export, int(sid), int(id))
	})
}
