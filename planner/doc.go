// Package planner assigns every buffer of a lifetime.Trace a fixed offset
// inside one arena, as close as it can to the lower bound (the peak of live
// bytes), and proves the result correct with Check.
//
// Every algorithm has the shape Func: a trace and Options in, a *Plan or an
// error out. Run is the entry point callers use: it validates the trace,
// runs the named algorithm and refuses any plan that Check rejects, so a
// plan that leaves this package has been verified.
//
// Algorithms (constants for their names):
//   - BestFit ("bestfit"): llama.cpp-style in-order best fit (a baseline).
//   - BySize ("bysize"): TFLite/XLA greedy by size (a baseline).
//   - Auto ("auto"): the best plan the package can find within the budget.
//
// Auto stops before its budget (Options.Budget, a ceiling) when more
// search cannot pay, and says why in Plan.Stop: the arena reached the
// lower bound (StopBound); the search proved no smaller arena exists, or
// the arena met the window bound (StopProof); or the stop rule ended it
// (StopRule): a leaf's exact search within 1/256 of the bound that has
// searched 4 nodes per buffer, plus 1024, since its last better plan, or
// nothing left to try; within 1/256 the rolling search gets 4 nodes a
// buffer instead of 256. The rule counts nodes, not time, so with one
// worker it stops at the same point on every machine;
// Options.FullBudget turns it off. A first plan at most Options.Goal
// ends it too (StopGoal): in a family (PlanFamily), a member under the
// largest member's peak, as the family's arena cannot be smaller.
//
// Plan.Bound is the strongest lower bound auto proved, at least the
// peak of live bytes: where the greedy passes stay above the peak, the
// window bound (bound.go, LowerBoundProven) packs the buffers around the
// hottest times exactly, cut to those times, and every search aims at
// it instead of the peak.
//
// Options validate: a bad alignment, budget or worker count is an error
// wrapping ErrOptions, never quietly replaced.
//
// Beyond one trace: RunGrouped plans groups of buffers into separate
// address regions, and RunByTag, the one way to plan a tagged trace for an
// arena (plan -o, graphexec and the PyTorch bridge all use it), groups them
// by tag, so that an arena never merges tags of different pause policies.
//
// Several traces replayed in turn from one arena are windows of one joint
// timeline (Join): window after window, with the buffers that cross
// windows merged into one buffer at one offset, live over the whole
// timeline, or handed on to a later window's free; a plan of the joint
// trace, projected back (Joint.Offsets), places every window. A
// GroupPlan is such windows, its members, in one arena: each member's
// plan, the buffers that cross members and the order they replay in. Two
// make one. PlanFamily plans members replayed one at a time in any order,
// each shared key one buffer over the whole timeline, window by window
// above the stacked shared buffers; PlanChain plans stages whose outputs
// feed later stages without copies with one search of the joint trace
// (Joint.Group), and the plan's ChainGuard refuses a replay order that
// would overwrite memory a later stage still needs. CheckFamily and
// CheckChain verify those plans as Check verifies one.
//
// It knows nothing about files or devices.
package planner
