// Package graphexec is the engine: it runs a graph.Graph on a device,
// eagerly on an arena built from its plan, captures it once into a CUDA
// graph and replays that graph.
//
// An Executor builds the arena from the plan (or plans the graph's dry run
// itself, graph.Plan), loads each module in the build the device takes
// (graph.Graph.ModulePTX), runs steps eagerly or as replays of one captured
// graph, writes per-step inputs into their arena tensors before each step
// (so the graph never changes for them), and Rebind decides whether a
// captured graph is reused, updated in place or re-planned and re-captured
// when the workload changes; it never falls back to eager execution on its
// own.
//
// Beyond one graph: tensors a workload marks SetUnplanned and workspaces
// with SpillWorkspace come from arena's spillover allocator, also during
// capture (capture-time reuse, side streams joined by events). A Family
// runs several members (batch sizes) on one arena, shared tensors at one
// address, one member at a time (pausing its arena backs the shared
// tensors up and drops the members' private memory); a Chain runs stages planned on one
// timeline and refuses, through the plan's guard, a replay order that
// would overwrite memory a later stage still needs.
//
// It holds no workloads, no kernels and no command-line flags (package
// workloads has the built-in demos), and it is not a file format and not a
// planner: cmd/plan and cmd/run turn plans into files and back.
package graphexec
