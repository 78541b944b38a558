package main

/*
#include <stdint.h>
*/
import "C"

import (
	"fmt"
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
	const export = "arenaplan_family_plan_member_around"
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
				return f.PlanMemberAround(s, budget, held)
			}
		}
		return fmt.Errorf("%s: step %d is not a member of family %d", export, int(sid), int(id))
	})
}
