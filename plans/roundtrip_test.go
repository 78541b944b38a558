package plans

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

func equalFiles(t *testing.T, got, want *File) {
	t.Helper()
	if !reflect.DeepEqual(got.Trace, want.Trace) {
		t.Errorf("trace differs:\n got %+v\nwant %+v", got.Trace, want.Trace)
	}
	if !reflect.DeepEqual(got.Plan, want.Plan) {
		t.Errorf("plan differs:\n got %+v\nwant %+v", got.Plan, want.Plan)
	}
	if !reflect.DeepEqual(got.Workload, want.Workload) {
		t.Errorf("workload differs:\n got %+v\nwant %+v", got.Workload, want.Workload)
	}
}

func TestRoundTrip(t *testing.T) {
	bare := smallFile(t)
	bare.Workload = nil
	bare.Trace.Prior, bare.Trace.Torch = nil, nil
	empty := &File{Trace: &lifetime.Trace{Name: "empty"}, Plan: &planner.Plan{Algo: "none", Align: 256, Optimal: true}}
	noDims := smallFile(t)
	noDims.Workload.Shape = nil
	cases := map[string]*File{
		"small":     smallFile(t),
		"bare":      bare,
		"empty":     empty,
		"no dims":   noDims,
		"synthetic": synthFile(t, 3000),
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			data, err := Encode(f)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			equalFiles(t, got, f)
			again, err := Encode(got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, data) {
				t.Errorf("re-encoding a decoded file changed its bytes")
			}
			t.Logf("%d buffers: %d bytes", len(f.Trace.Buffers), len(data))
		})
	}
}

func TestEncodeRefusesInvalid(t *testing.T) {
	overlap := smallFile(t)
	overlap.Plan.Offsets[1] = overlap.Plan.Offsets[0] // both live at time 0
	badArena := smallFile(t)
	badArena.Plan.Arena += 256
	badLB := smallFile(t)
	badLB.Plan.LowerBound--
	badTrace := smallFile(t)
	badTrace.Trace.Buffers[3].End = badTrace.Trace.Buffers[3].Start
	dupDim := smallFile(t)
	dupDim.Workload.Shape = append(dupDim.Workload.Shape, Dim{Name: "seq", Value: 1})
	cases := map[string]*File{
		"nil":           nil,
		"no plan":       {Trace: smallTrace()},
		"overlap":       overlap,
		"arena":         badArena,
		"lower bound":   badLB,
		"invalid trace": badTrace,
		"dup dimension": dupDim,
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Encode(f)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Encode: got %v, want ErrInvalid", err)
			}
			t.Log(err)
		})
	}
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "step.plan")
	f := smallFile(t)
	if err := Save(path, synthFile(t, 100)); err != nil {
		t.Fatal(err)
	}
	if err := Save(path, f); err != nil { // overwrites
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	equalFiles(t, got, f)
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries after Save, want 1 (temporary file left?)", len(ents))
	}

	// A flipped payload byte is a checksum mismatch that names the file.
	data, _ := os.ReadFile(path)
	data[len(data)-3] ^= 0x10
	os.WriteFile(path, data, 0o644)
	_, err = Load(path)
	if !errors.Is(err, ErrChecksum) || !strings.HasPrefix(err.Error(), "plans: "+path+": checksum mismatch") {
		t.Errorf("Load of a corrupted file: %v", err)
	}

	if _, err := Load(filepath.Join(dir, "missing.plan")); err == nil || !strings.Contains(err.Error(), "missing.plan") {
		t.Errorf("Load of a missing file: %v", err)
	}
	if err := Save(filepath.Join(dir, "no", "such", "dir.plan"), f); err == nil {
		t.Errorf("Save into a missing directory succeeded")
	} else if !errors.Is(err, fs.ErrNotExist) || strings.Contains(err.Error(), ".tmp") {
		t.Errorf("Save into a missing directory: %q; want ErrNotExist and no temporary file name", err)
	}
	if err := Save(filepath.Join(dir, "bad.plan"), &File{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Save of an empty File: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "bad.plan")); err == nil {
		t.Errorf("Save of an invalid file wrote it")
	}
}

func TestLoadTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.plan")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: no disk is used, and Load must refuse before reading.
	if err := fh.Truncate(MaxFile + 1); err != nil {
		t.Skip("cannot make a sparse file:", err)
	}
	fh.Close()
	_, err = Load(path)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), path) {
		t.Fatalf("got %v, want ErrTooLarge naming the file", err)
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Fatalf("Load of a directory succeeded")
	}
}

// TestSamePlanSameBytes: two runs that find the same plan in different
// times write the same file, single or family.
func TestSamePlanSameBytes(t *testing.T) {
	f := smallFile(t)
	a, b := *f, *f
	pa, pb := *f.Plan, *f.Plan
	pa.Elapsed, pa.ToBest = 3*time.Second, time.Second
	pb.Elapsed, pb.ToBest = 5*time.Millisecond, time.Millisecond
	a.Plan, b.Plan = &pa, &pb
	da, err := Encode(&a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Encode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(da, db) {
		t.Fatalf("the same plan planned in different times gives different files (%d and %d bytes)", len(da), len(db))
	}
	back, err := Decode(da)
	if err != nil {
		t.Fatal(err)
	}
	if back.Plan.Elapsed != 0 || back.Plan.ToBest != 0 {
		t.Errorf("decoded times %v, %v: want none stored", back.Plan.Elapsed, back.Plan.ToBest)
	}
	if pa.Elapsed != 3*time.Second {
		t.Error("Encode changed the caller's plan")
	}

	fam := familyFile(t, 1, 2)
	fa, fb := *fam, *fam
	fpa, fpb := *fam.Plan, *fam.Plan
	fpa.Elapsed, fpb.Elapsed = time.Second, time.Millisecond
	fa.Plan, fb.Plan = &fpa, &fpb
	ea, err := EncodeFamily(&fa)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := EncodeFamily(&fb)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ea, eb) {
		t.Fatal("the same family plan planned in different times gives different files")
	}
}

// TestFileMessages: a file too large says so once, with both sizes; a
// save without a file name says that, not "rename: no such file".
func TestFileMessages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.plan")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(MaxFile + 1); err != nil {
		t.Skip("cannot make a sparse file:", err)
	}
	fh.Close()
	_, err = Load(path)
	want := fmt.Sprintf("plans: %s: plan file too large: %d bytes exceeds the limit of %d", path, MaxFile+1, MaxFile)
	if err == nil || err.Error() != want {
		t.Errorf("Load: %v\nwant %s", err, want)
	}
	if err := writeAtomic("", []byte("x")); err == nil || !strings.Contains(err.Error(), "no file name") {
		t.Errorf("save to \"\": %v, want it to say no file name was given", err)
	}
}
