// Package term says whether a file is a terminal: the stream a program
// redraws a status line on must be one, or its control codes end up in a
// log.
package term

import "os"

// IsTerminal says whether f is a terminal. A character device that is
// not one (/dev/null) is not.
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	return isTerminal(f)
}
