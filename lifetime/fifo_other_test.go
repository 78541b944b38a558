//go:build !unix

package lifetime

import "errors"

func mkfifo(string) error { return errors.New("no FIFOs") }
