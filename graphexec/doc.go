// Package graphexec describes workloads as graphs of kernels over tensors,
// records their lifetimes in a dry run, runs them eagerly on an arena,
// captures them once into a CUDA graph and replays that graph.
//
// It is not a file format and not a planner.
package graphexec
