// Package graphexec is the engine: it runs a graph.Graph on a device,
// eagerly on an arena built from its plan, captures it once into a CUDA
// graph and replays that graph.
//
// An Executor builds its arena.Layout from the plan (or plans the graph's
// dry run itself, graph.Plan): the checked plan, the arena and every
// tensor's address, as the PyTorch bridge does for a step; loads each module in the build the device takes
// (graph.Graph.ModulePTX), runs steps eagerly or as replays of one captured
// graph, writes per-step inputs into their arena tensors before each step
// (so the graph never changes for them), and Rebind decides whether a
// captured graph is reused, updated in place or re-planned and re-captured
// when the workload changes (the layout's Fit: the same arena and
// addresses when the new run fits the plan); it never falls back to eager
// execution on its own.
//
//	graph ─ DryRun ─► trace ─► plan ─► arena.NewLayout ─► tensor addresses ─► kernel arguments
//	family: arena.NewFamilyLayout ─► one Layout per member (Executor over the group's arena)
//	chain:  arena.NewGroupLayout  ─► one Layout per stage  (Executor over the group's arena)
//
// Beyond one graph: tensors a workload marks SetUnplanned and workspaces
// with SpillWorkspace come from package spill's allocator, also during
// capture (capture-time reuse, side streams joined by events). A Group
// runs several graphs laid on one joint timeline in one arena: a family's
// members (batch sizes), shared tensors at one address, one member at a
// time (pausing its arena backs the shared tensors up and drops the
// members' private memory), or a chain's stages planned on one timeline
// (pausing its arena backs up the stages' weights and state, as an
// Executor's), refusing through the plan's guard a replay order that would
// overwrite memory a later stage still needs.
//
// It holds no workloads, no kernels and no command-line flags (package
// workloads has the built-in demos), and it is not a file format and not a
// planner: cmd/plan and cmd/run turn plans into files and back.
package graphexec
