//go:build unix

package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/arenaplan/arenaplan/internal/interrupt"
	"github.com/arenaplan/arenaplan/workloads"
)

// TestNotRegularFiles: a FIFO with no writer and a device are refused by
// name as --plan and as ARENAPLAN_TUNE's ptx and spill_ptx, before
// anything opens them.
func TestNotRegularFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "x.plan")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	for _, tc := range []struct {
		tune string
		args []string
	}{
		{"", []string{"--plan", fifo}},
		{"", []string{"--plan", "/dev/zero"}},
		{"ptx=" + fifo, []string{"--workload", "mlp"}},
		{"ptx=/dev/zero", []string{"--workload", "mlp"}},
		{"spill_ptx=/dev/zero", []string{"--workload", "mlp"}},
	} {
		t.Setenv(workloads.TuneEnv, tc.tune)
		var out, errb bytes.Buffer
		if code := run(context.Background(), append(tc.args, "--device", "sim"), &out, &errb); code != 1 || !strings.Contains(errb.String(), "not a regular file") {
			t.Errorf("%s=%s run %v: exit %d: %s", workloads.TuneEnv, tc.tune, tc.args, code, errb.String())
		}
	}
}

// TestInterrupted: a run whose context is cancelled (Ctrl-C) ends with
// status 130.
func TestInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"--workload", "mlp", "--device", "sim"}, &out, &errb); code != interrupt.ExitCode || !strings.Contains(errb.String(), "interrupted") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}
