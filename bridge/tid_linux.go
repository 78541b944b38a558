package bridge

import "syscall"

func gettid() int { return syscall.Gettid() }
