package lifetime

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sharedData returns the project's shared data folder, ../shared/data
// beside the repository root (found by walking up to go.mod), or
// $ARENAPLAN_DATA when set; it skips the test when there is none.
func sharedData(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv("ARENAPLAN_DATA"); d != "" {
		return d
	}
	dir, err := os.Getwd()
	if err != nil {
		tb.Skip("shared data: cannot find the working directory:", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Skip("shared data: no go.mod above the test's directory")
		}
		dir = parent
	}
	d := filepath.Join(dir, "..", "shared", "data")
	if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
		tb.Skipf("shared data not found at %s (set ARENAPLAN_DATA to run this test)", d)
	}
	return d
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	csvPath := write("a.csv", "id,lower,upper,size\nx,0,2,8\n")
	txtPath := write("a.txt", "id,lower,upper,size\nx,0,2,8\n")
	var js strings.Builder
	if err := WriteJSON(&js, &Trace{Name: "ignored", Buffers: []Buffer{{Size: 8, End: 1}}}); err != nil {
		t.Fatal(err)
	}
	jsonPath := write("b.JSON", js.String())

	for _, c := range []struct {
		path, format string
		name         string
	}{
		{csvPath, "", "a.csv"},
		{txtPath, "csv", "a.txt"},
		{jsonPath, "", "ignored"}, // a JSON trace keeps its own name
		{"testdata/torch_nosegments.pickle", "", "torch_nosegments.pickle"},
		{"testdata/torch_nosegments.pickle", "torch", "torch_nosegments.pickle"},
	} {
		ts, err := Load(c.path, c.format)
		if err != nil {
			t.Errorf("Load(%s, %q): %v", c.path, c.format, err)
			continue
		}
		if len(ts) != 1 || ts[0].Name != c.name {
			t.Errorf("Load(%s, %q): %d traces, name %q; want 1, %q", c.path, c.format, len(ts), ts[0].Name, c.name)
		}
	}

	dirPath := filepath.Join(dir, "d.csv")
	if err := os.Mkdir(dirPath, 0o755); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.csv")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxFileSize + 1); err != nil { // sparse: costs no disk
		t.Fatal(err)
	}
	f.Close()

	for _, c := range []struct {
		path, format, want string
	}{
		{txtPath, "", `lifetime: ` + txtPath + `: cannot tell the format from the extension ".txt"`},
		{csvPath, "xml", `lifetime: ` + csvPath + `: unknown format "xml"`},
		{filepath.Join(dir, "none.csv"), "", "lifetime: " + filepath.Join(dir, "none.csv") + ": stat "},
		{dirPath, "csv", "lifetime: " + dirPath + ": not a regular file: is a directory"},
		{big, "", "lifetime: " + big + ": file too large: 1073741825 bytes exceeds the limit of 1073741824"},
		{"/dev/zero", "csv", "lifetime: /dev/zero: not a regular file: Dc"},
		{csvPath, "json", "lifetime: " + csvPath + ": json: not a JSON trace"},
		{csvPath, "torch", "lifetime: " + csvPath + ": torch: not a pickled memory snapshot"},
		{jsonPath, "csv", "lifetime: " + jsonPath + ": csv: line 1: unknown column"},
	} {
		_, err := Load(c.path, c.format)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%s, %q) = %v, want %q", c.path, c.format, err, c.want)
		}
	}
}

// TestLoadFIFO: a FIFO with no writer is refused, not opened (os.Open
// would block forever), and a done context stops a load.
func TestLoadFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "x.csv")
	if err := mkfifo(fifo); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	if _, err := Load(fifo, ""); err == nil || !strings.Contains(err.Error(), "not a regular file: p") {
		t.Errorf("Load(FIFO) = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, p := range []string{"testdata/torch_small.pickle", "../testdata/bert_base_infer.csv"} {
		if _, err := LoadContext(ctx, p, ""); !errors.Is(err, context.Canceled) {
			t.Errorf("LoadContext(%s) with a cancelled context = %v", p, err)
		}
	}
}

func TestKeepPriorOffsets(t *testing.T) {
	tr, err := ReadCSV(strings.NewReader("id,lower,upper,size,offset\na,0,1,4,8\nb,0,1,4,\nc,0,1,4,-1\n"), "k")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range tr.Buffers {
		if b.HasFixed {
			t.Fatalf("%s: Fixed %d before KeepPriorOffsets", b.Name, b.Fixed)
		}
	}
	tr.KeepPriorOffsets()
	fixed := func(b Buffer) int64 {
		if !b.HasFixed {
			return NoOffset
		}
		return b.Fixed
	}
	got := []int64{fixed(tr.Buffers[0]), fixed(tr.Buffers[1]), fixed(tr.Buffers[2])}
	if got[0] != 8 || got[1] != NoOffset || got[2] != NoOffset {
		t.Fatalf("Fixed = %v, want [8 -1 -1]", got)
	}
}

// readmeLBs parses the tables of ../shared/data/minimalloc/README.md into
// file name -> (buffers, LB), using each table's header to find the columns.
func readmeLBs(t *testing.T, path string) map[string][2]int64 {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][2]int64{}
	bufCol, lbCol := -1, -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			bufCol, lbCol = -1, -1
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if cells[0] == "file" {
			for i, c := range cells {
				switch {
				case c == "buffers":
					bufCol = i
				case c == "LB" || strings.HasPrefix(c, "LB ("):
					lbCol = i
				}
			}
			continue
		}
		if bufCol < 0 || lbCol < 0 || lbCol >= len(cells) {
			continue
		}
		n, err1 := strconv.ParseInt(cells[bufCol], 10, 64)
		lb, err2 := strconv.ParseInt(cells[lbCol], 10, 64)
		if err1 == nil && err2 == nil {
			out[cells[0]] = [2]int64{n, lb}
		}
	}
	return out
}

// TestMiniMallocData loads every CSV of ../shared/data/minimalloc and checks
// buffer counts and LowerBound(1) against the README's tables, and the
// omnimalloc instances against the LB in their names.
func TestMiniMallocData(t *testing.T) {
	dir := filepath.Join(sharedData(t), "minimalloc")
	table := readmeLBs(t, filepath.Join(dir, "README.md"))
	if len(table) < 20 {
		t.Fatalf("parsed only %d rows from the README's tables", len(table))
	}
	checked := map[string]bool{}
	nameLB := regexp.MustCompile(`^[a-z]\.(\d+)\.csv$`)
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".csv") {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		t.Run(rel, func(t *testing.T) {
			start := time.Now()
			ts, err := Load(p, "")
			if err != nil {
				t.Fatal(err)
			}
			tr := ts[0]
			lb, _ := tr.LowerBound(1)
			elapsed := time.Since(start)
			for key, want := range table {
				k := key
				if !strings.HasSuffix(k, ".csv") {
					k += ".csv"
				}
				if !strings.HasSuffix(rel, k) || (len(rel) > len(k) && rel[len(rel)-len(k)-1] != '/') {
					continue
				}
				checked[key] = true
				if int64(len(tr.Buffers)) != want[0] || lb != want[1] {
					t.Errorf("%d buffers, LB %d; README says %d buffers, LB %d", len(tr.Buffers), lb, want[0], want[1])
				}
			}
			if m := nameLB.FindStringSubmatch(filepath.Base(p)); m != nil && strings.Contains(rel, "omnimalloc") {
				if want, _ := strconv.ParseInt(m[1], 10, 64); lb != want {
					t.Errorf("LB %d, file name says %d", lb, want)
				}
			}
			if strings.Contains(rel, "iree") && tr.Prior == nil {
				t.Errorf("the offset column did not reach Prior")
			}
			t.Logf("%d buffers, LB %d, %v", len(tr.Buffers), lb, elapsed.Round(time.Microsecond))
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key := range table {
		if !checked[key] {
			t.Errorf("README row %q matched no CSV file", key)
		}
	}
}
