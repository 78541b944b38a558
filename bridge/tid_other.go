//go:build !linux

package bridge

import "os"

// gettid has no per-thread answer here: regions then apply to every
// thread of the process.
func gettid() int { return os.Getpid() }
