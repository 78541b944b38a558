// Package graphexec describes workloads as graphs of kernels over tensors,
// records their lifetimes in a dry run, runs them eagerly on an arena,
// captures them once into a CUDA graph and replays that graph.
//
// A Graph is tensors (shape, dtype, role: input, weight, state, output,
// intermediate) and ops (a PTX entry, its tensor, workspace and scalar
// arguments, a launch shape), built with a Builder from the program's own
// PTX. DryRun walks it with a lifetime.Recorder: an intermediate is born at
// its first writer and dies after its last user, a workspace lives for its
// op, everything else lives throughout; Plan plans the trace one region per
// role tag. An Executor builds the arena from the plan, runs steps eagerly
// or as replays of one captured graph, writes per-step inputs into their
// arena tensors before each step (so the graph never changes for them), and
// Rebind decides whether a captured graph is reused, updated in place or
// re-planned and re-captured when the workload changes; it never falls back
// to eager execution on its own.
//
// Beyond one graph: tensors a workload marks SetUnplanned and workspaces
// with SpillWorkspace come from arena's spillover allocator, also during
// capture (capture-time reuse, side streams joined by events; built-in
// spill-demo shows it). A Family runs several members (batch sizes) on one
// arena, shared tensors at one address, one member at a time; a Chain runs
// stages planned on one timeline and refuses, through the plan's guard, a
// replay order that would overwrite memory a later stage still needs.
//
// The built-in workloads gpt2-decode and mlp (Build, AddShapeFlags) use the
// fp32 kernels of package kernels. It is not a file format and not a
// planner: cmd/plan and cmd/run turn plans into files and back.
package graphexec
