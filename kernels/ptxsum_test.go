package kernels_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPTXMatchesSource ties the committed PTX to its CUDA source: ptx.sum
// records the SHA-256 of each source as nvcc saw it when it built the PTX
// beside it, so editing kernels.cu or spill.cu without rebuilding and
// committing the PTX fails here. nvcc is not needed to run the test.
func TestPTXMatchesSource(t *testing.T) {
	f, err := os.Open("ptx.sum")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sources := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			t.Fatalf("ptx.sum: %q: want the source's SHA-256, the source, and its PTX files", line)
		}
		want, src, ptxs := fields[0], fields[1], fields[2:]
		sources[src] = true
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s changed since %s were built from it (SHA-256 %s, ptx.sum records %s): rebuild the PTX on a GPU machine "+
				"(scripts/gpu-ptx.sh writes it and ptx.sum) and commit them together", src, strings.Join(ptxs, " and "), got[:12], want[:12])
		}
		for _, p := range ptxs {
			if st, err := os.Stat(p); err != nil || st.Size() == 0 {
				t.Errorf("%s: PTX built from %s is missing or empty", p, src)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// Every CUDA source has its line: a new .cu cannot skip the check.
	cus, _ := filepath.Glob("*.cu")
	for _, cu := range cus {
		if !sources[cu] {
			t.Errorf("%s has no line in ptx.sum", cu)
		}
	}
}
