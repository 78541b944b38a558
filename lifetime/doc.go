// Package lifetime is the trace model of arenaplan: the buffers a workload
// allocates, each with a size, an alignment and a half-open lifetime
// [Start, End) in logical time, plus the importers that read such traces
// (MiniMalloc CSV, PyTorch memory snapshot pickles, our JSON) and the
// Recorder a dry run calls.
//
// It is not a planner and knows nothing about devices: it only says which
// buffers exist, when they live, and the lower bound any arena must reach
// (the peak of live bytes).
//
// Two buffers conflict only if a.Start < b.End && b.Start < a.End, so a
// buffer that ends at t and one that starts at t may share addresses.
package lifetime
