//go:build !linux

package term

import "os"

// isTerminal takes a character device other than the null device for a
// terminal, where the terminal driver is not asked.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}
