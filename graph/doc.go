// Package graph describes a workload as a graph of kernels over tensors,
// records the tensors' lifetimes in a dry run and plans them: everything
// about a workload that needs no device.
//
// A Graph is tensors (shape, dtype, role: input, weight, state, output,
// intermediate) and ops (a PTX entry, its tensor, workspace and scalar
// arguments, a launch shape), built with a Builder from the program's own
// PTX (Builder.Variant adds a build of the same kernels for newer
// devices). DryRun walks it with a lifetime.Recorder: an intermediate is
// born at its first writer and dies after its last user, a workspace lives
// for its op, everything else lives throughout. Plan plans the trace one
// region per tag (planner.RunByTag); Fingerprint identifies the workload
// so that a plan file is only used for the workload it was made for
// (VerifyPlan). FamilyMembers/PlanFamily and ChainStages/PlanChain lay out
// several graphs in one arena (one planner.GroupPlan).
//
// It is not the executor: package graphexec runs graphs on a device,
// captures and replays them. It links no driver binding (the plan command
// is a static binary), holds no workloads (package workloads has the
// built-in ones) and knows no command-line flags.
package graph
