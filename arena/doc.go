// Package arena is the imported arena API: one device region sized from a
// verified plan, every planned buffer at its fixed offset, pause/resume of
// physical memory at the same addresses, and the spillover caching
// allocator for what the plan does not cover.
//
// It is not a planner: it takes plans as they are and never moves a buffer.
package arena
