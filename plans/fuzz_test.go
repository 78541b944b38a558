package plans

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// fuzzSeeds are the corpus committed under testdata/fuzz/FuzzDecode
// (regenerated with -update): whole files, for the header and checksum
// path, and bare payloads, which the fuzzer can mutate past the checksum.
func fuzzSeeds(t testing.TB) map[string][]byte {
	small := smallFile(t)
	syn := synthFile(t, 40)
	syn.Trace.Buffers[3].Gaps = []lifetime.Gap{{Start: syn.Trace.Buffers[3].Start, End: syn.Trace.Buffers[3].Start + 1}}
	syn.Plan.LowerBound, _ = syn.Trace.LowerBound(syn.Plan.Align)
	empty := &File{Trace: &lifetime.Trace{}, Plan: &planner.Plan{Align: 1}}
	seeds := map[string][]byte{}
	for name, f := range map[string]*File{"small": small, "synthetic": syn, "empty": empty} {
		data, err := Encode(f)
		if err != nil {
			t.Fatal(err)
		}
		seeds["file-"+name] = data
		seeds["payload-"+name] = encodePayload(f)
	}
	seeds["file-truncated"] = seeds["file-small"][:HeaderLen+5]
	return seeds
}

func TestWriteFuzzSeeds(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite testdata/fuzz/FuzzDecode")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range fuzzSeeds(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzDecode feeds each input to the decoder twice: as a whole file and as
// a payload already past the checksum and zstd. Neither may panic, every
// error must wrap a sentinel, and whatever is accepted must be a plan that
// Check accepts and that survives a round trip unchanged; an accepted
// payload must be the one canonical encoding of what it decoded to.
func FuzzDecode(f *testing.F) {
	// Small hostile files (hostile_test.go): a zstd bomb, a buffers bomb,
	// a range past 2^63, many gaps.
	f.Add(zstdBomb(4 << 20))
	f.Add(buffersBomb(70000, 2<<10))
	f.Add(farOffsetFile(f))
	f.Add(gapsFile(f, 200))
	for _, data := range fuzzSeeds(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, err := decode(data); err != nil {
			if !isSentinel(err) {
				t.Fatalf("file: error wraps no sentinel: %v", err)
			}
		} else {
			checkAccepted(t, got)
		}
		got, err := decodeVerified(data, nil)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("payload: error wraps no sentinel: %v", err)
			}
			return
		}
		checkAccepted(t, got)
		if again := encodePayload(got); !bytes.Equal(again, data) {
			t.Fatalf("payload accepted but not canonical:\n in %x\nout %x", data, again)
		}
	})
}

func checkAccepted(t *testing.T, f *File) {
	t.Helper()
	if err := planner.Check(f.Trace, f.Plan); err != nil {
		t.Fatalf("accepted a plan that Check rejects: %v", err)
	}
	data, err := Encode(f)
	if err != nil {
		t.Fatalf("accepted a file that Encode refuses: %v", err)
	}
	back, err := Decode(data)
	if err != nil {
		t.Fatalf("re-encoded file does not decode: %v", err)
	}
	// Files store no planning times (older ones may, as the seeds do).
	if !reflect.DeepEqual(back, withoutTimes(f)) {
		t.Fatalf("round trip changed the file")
	}
}
