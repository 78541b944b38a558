//go:build unix

package interrupt

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// TestRun: Run returns f's result, or ErrInterrupted once its context is
// done even while f goes on (f here never returns on its own).
func TestRun(t *testing.T) {
	want := errors.New("f failed")
	if err := Run(context.Background(), func() error { return want }); err != want {
		t.Errorf("Run = %v, want f's error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	block := make(chan struct{})
	defer close(block)
	started := make(chan struct{})
	go func() { <-started; cancel() }()
	err := Run(ctx, func() error { close(started); <-block; return nil })
	if !errors.Is(err, ErrInterrupted) {
		t.Errorf("Run with a cancelled context = %v, want ErrInterrupted", err)
	}
	// f that notices the cancellation itself reads as interrupted too.
	if err := Run(ctx, func() error { return context.Canceled }); !errors.Is(err, ErrInterrupted) {
		t.Errorf("Run = %v, want ErrInterrupted", err)
	}
}

// TestNotifyTwice: in a child process that ignores its context, the first
// SIGINT cancels the context and the second exits with ExitCode.
func TestNotifyTwice(t *testing.T) {
	if os.Getenv("ARENAPLAN_INTERRUPT_CHILD") == "1" {
		ctx, _ := Notify(os.Stderr, "child")
		os.Stdout.WriteString("ready\n")
		<-ctx.Done()
		os.Stdout.WriteString("cancelled\n")
		select {} // ignores the cancellation, as a step that never looks at ctx
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNotifyTwice$")
	cmd.Env = append(os.Environ(), "ARENAPLAN_INTERRUPT_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	read := func(want string) {
		t.Helper()
		got := ""
		for len(got) < len(want) {
			n, err := out.Read(buf)
			if err != nil {
				t.Fatalf("child said %q, then %v", got, err)
			}
			got += string(buf[:n])
		}
		if got != want {
			t.Fatalf("child said %q, want %q", got, want)
		}
	}
	read("ready\n")
	cmd.Process.Signal(syscall.SIGINT)
	read("cancelled\n")
	cmd.Process.Signal(syscall.SIGINT)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitCode {
		t.Fatalf("child ended with %v, want exit status %d", err, ExitCode)
	}
}
