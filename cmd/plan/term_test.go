package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets a test run the command itself: with PLAN_TEST_MAIN set,
// the test binary is the plan command.
func TestMain(m *testing.M) {
	if os.Getenv("PLAN_TEST_MAIN") == "1" {
		os.Args = append([]string{"plan"}, os.Args[1:]...)
		main()
	}
	os.Exit(m.Run())
}

// TestNoControlCodesInLogs: plan FILE >/dev/null 2>err.log leaves no
// terminal control codes in the log. Before, the progress line decided
// "terminal" from standard output (the null device is a character
// device) and wrote "\r\033[K" to standard error.
func TestNoControlCodesInLogs(t *testing.T) {
	log := filepath.Join(t.TempDir(), "err.log")
	errf, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	cmd := exec.Command(os.Args[0], "--budget", "100ms", "../../testdata/bert_base_infer.csv")
	cmd.Env = append(os.Environ(), "PLAN_TEST_MAIN=1")
	cmd.Stdout, cmd.Stderr = null, errf
	runErr := cmd.Run()
	errf.Close()
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if runErr != nil {
		t.Fatalf("plan: %v: %s", runErr, got)
	}
	if strings.ContainsAny(string(got), "\r\033") {
		t.Errorf("standard error holds control codes: %q", got)
	}
}
