package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A hand-made trace whose optimum (at align 1) is 12: the MiniMalloc toy.
const toyCSV = `id,lower,upper,size
b1,0,3,4
b2,3,9,4
b3,0,9,4
b4,9,21,4
b5,0,21,4
`

func writeTemp(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runPlan(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb, false)
	return code, out.String(), errb.String()
}

func TestJSONKeys(t *testing.T) {
	p := writeTemp(t, "toy.csv", toyCSV)
	code, out, errs := runPlan(t, "--json", "--compare", "--align", "1", p)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"trace", "buffers", "lower_bound", "arena", "ratio", "algo", "millis", "baselines", "optimal", "millis_to_best", "bound", "ratio_bound", "stop"} {
		if _, ok := r[k]; !ok {
			t.Errorf("key %q missing in %s", k, out)
		}
	}
	if r["trace"] != p || r["buffers"].(float64) != 5 || r["lower_bound"].(float64) != 12 {
		t.Errorf("wrong report: %s", out)
	}
	if a := r["arena"].(float64); a < 12 {
		t.Errorf("arena %v below the lower bound 12", a)
	}
	bl := r["baselines"].(map[string]any)
	if _, ok := bl["bestfit"]; !ok {
		t.Errorf("baselines lack bestfit: %v", bl)
	}
}

func TestWritesCheckedPlanAndInspects(t *testing.T) {
	dir := t.TempDir()
	p := writeTemp(t, "toy.csv", toyCSV)
	out := filepath.Join(dir, "toy.plan")
	svg := filepath.Join(dir, "toy.svg")
	if code, _, errs := runPlan(t, "-o", out, "--svg", svg, "--align", "1", p); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	code, text, errs := runPlan(t, "inspect", out)
	if code != 0 {
		t.Fatalf("inspect exit %d: %s", code, errs)
	}
	if !strings.Contains(text, "buffers") || !strings.Contains(text, "check") {
		t.Errorf("inspect output lacks fields:\n%s", text)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "<rect"); n != 6 { // frame + 5 buffers
		t.Errorf("svg has %d rects, want 6", n)
	}
	// A corrupted plan file is refused with one line and status 1.
	data, _ := os.ReadFile(out)
	data[len(data)-1] ^= 0xff
	bad := filepath.Join(dir, "bad.plan")
	os.WriteFile(bad, data, 0o644)
	code, _, errs = runPlan(t, "inspect", bad)
	if code != 1 || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, bad) {
		t.Errorf("corrupt plan: exit %d, stderr %q; want 1 and one line naming the file", code, errs)
	}
}

func TestExitCodes(t *testing.T) {
	good := writeTemp(t, "toy.csv", toyCSV)
	bad := writeTemp(t, "bad.csv", "id,lower,upper,size\nx,5,1,4\n")
	empty := writeTemp(t, "empty.csv", "id,lower,upper,size\n")
	cases := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no trace", nil, 2, "no trace"},
		{"unknown flag", []string{"--frobnicate", good}, 2, "frobnicate"},
		{"bad align", []string{"--align", "0", good}, 2, "--align"},
		{"align not a power of two", []string{"--align", "3", good}, 2, "power of two"},
		{"workload align not a power of two", []string{"--workload", "mlp", "--align", "3"}, 2, "power of two"},
		{"unknown algo", []string{"--algo", "magic", good}, 2, "magic"},
		{"missing file", []string{"/nonexistent/x.csv"}, 1, "/nonexistent/x.csv"},
		{"bad trace", []string{bad}, 1, "bad.csv"},
		{"two traces one output", []string{"-o", "x.plan", good, good}, 2, "exactly one"},
		{"empty trace", []string{empty}, 1, "has no buffers"},
		{"output in a missing directory", []string{"-o", "/nonexistent/x.plan", good}, 1, "/nonexistent/x.plan: open: no such file"},
		{"bad workload shape", []string{"--workload", "mlp", "--layers", "-4"}, 2, "--layers -4"},
		{"trace flag with a workload", []string{"--workload", "mlp", "--svg", "x.svg"}, 2, "--svg"},
		{"workload flag with a trace", []string{"--layers", "4", good}, 2, "--layers"},
		{"ok", []string{good}, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runPlan(t, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, c.code, errs)
			}
			if c.msg != "" && !strings.Contains(errs, c.msg) {
				t.Errorf("stderr %q lacks %q", errs, c.msg)
			}
			if strings.Contains(errs, ".tmp") {
				t.Errorf("stderr %q names a temporary file", errs)
			}
		})
	}
}

// TestSamePlanSameFile: planning the same trace twice writes the same
// bytes (planning times stay out of the file).
func TestSamePlanSameFile(t *testing.T) {
	dir := t.TempDir()
	p := writeTemp(t, "toy.csv", toyCSV)
	var files [][]byte
	for i := range 2 {
		out := filepath.Join(dir, fmt.Sprintf("toy%d.plan", i))
		if code, _, errs := runPlan(t, "-o", out, "--workers", "1", p); code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, b)
	}
	if !bytes.Equal(files[0], files[1]) {
		t.Error("two plans of the same trace differ byte for byte")
	}
}

// TestHelp: --help is a request, not an error: usage on stdout, exit 0,
// with the trace flags and the workload flags apart.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"inspect", "--help"}} {
		code, out, errs := runPlan(t, args...)
		if code != 0 || errs != "" || !strings.Contains(out, "usage: plan") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", args, code, out, errs)
		}
	}
	_, out, _ := runPlan(t, "--help")
	tr, wl := strings.Index(out, "trace flags (TRACE...):"), strings.Index(out, "workload flags (--workload):")
	if tr < 0 || wl < tr || strings.Index(out, "--svg") > wl || strings.Index(out, "--kv-len") < wl {
		t.Errorf("help does not show trace flags (--svg) and workload flags (--kv-len) apart:\n%s", out)
	}
}
