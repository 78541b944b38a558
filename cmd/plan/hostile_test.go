//go:build unix

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/arenaplan/arenaplan/internal/interrupt"
)

// TestNotRegularFiles: a FIFO with no writer (os.Open would block
// forever) and a device are refused by name, as traces and as plan files.
func TestNotRegularFiles(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"x.csv", "x.plan"} {
		if err := syscall.Mkfifo(filepath.Join(dir, name), 0o600); err != nil {
			t.Skip("mkfifo:", err)
		}
	}
	for _, args := range [][]string{
		{filepath.Join(dir, "x.csv")},
		{"--format", "csv", "/dev/zero"},
		{"inspect", filepath.Join(dir, "x.plan")},
		{"inspect", "/dev/zero"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb, false); code != 1 || !strings.Contains(errb.String(), "not a regular file") {
			t.Errorf("plan %v: exit %d: %s", args, code, errb.String())
		}
	}
}

// TestInterrupted: a command whose context is cancelled (Ctrl-C) ends with
// status 130, whatever step it is in.
func TestInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	trace := filepath.Join(t.TempDir(), "t.csv")
	if err := os.WriteFile(trace, []byte("id,lower,upper,size\na,0,2,4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{trace}, {"inspect", trace}, {"--workload", "mlp"}} {
		var out, errb bytes.Buffer
		if code := run(ctx, args, &out, &errb, false); code != interrupt.ExitCode || !strings.Contains(errb.String(), "interrupted") {
			t.Errorf("plan %v: exit %d: %s", args, code, errb.String())
		}
	}
}
