// Package workloads holds the built-in demo workloads: gpt2-decode (one
// decode step of a GPT-2-shaped transformer), mlp (a launch-bound chain of
// small layers, also split into chain stages by MLPStages) and spill-demo
// (the cross-stream spillover pattern), built as graph.Graphs from the
// kernels of package kernels, and the shape flags that the plan and run
// commands share (AddShapeFlags).
//
// It is demo code and command-line wording, kept out of the engine: a
// program that runs its own graphs imports graph and graphexec and never
// this package. Build and BuildWith take the kernels to use as a value
// (Kernels); nothing global changes. It links no driver binding.
package workloads
