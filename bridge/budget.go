package bridge

import (
	"fmt"
	"math"
	"time"

	"github.com/arenaplan/arenaplan/planner"
)

// MaxBudget bounds a planning budget: planning a step takes milliseconds
// to seconds, and a longer budget is a unit mistake.
const MaxBudget = time.Hour

// BudgetSeconds turns a planning budget in seconds (the unit of the C ABI
// and of Python) into a Duration for Step.Plan, Step.Replan and
// Family.Plan: 0 means planner.DefaultBudget; NaN, an infinity, a
// negative number or more than MaxBudget is an error.
func BudgetSeconds(s float64) (time.Duration, error) {
	switch {
	case math.IsNaN(s), math.IsInf(s, 0):
		return 0, fmt.Errorf("bridge: planning budget %v s: want a finite number of seconds", s)
	case s < 0:
		return 0, fmt.Errorf("bridge: planning budget %v s is negative (0: the default, %v)", s, planner.DefaultBudget)
	case s > MaxBudget.Seconds():
		return 0, fmt.Errorf("bridge: planning budget %v s is more than the most allowed, %v", s, MaxBudget)
	}
	return time.Duration(s * float64(time.Second)), nil
}

// checkBudget refuses a budget that Plan cannot mean.
func checkBudget(op string, d time.Duration) error {
	if d < 0 || d > MaxBudget {
		return fmt.Errorf("bridge: %s: planning budget %v: want 0 (the default, %v) up to %v", op, d, planner.DefaultBudget, MaxBudget)
	}
	return nil
}
