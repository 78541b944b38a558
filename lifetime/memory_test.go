package lifetime

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"testing"
)

// TestDecodingMemory: all that decoding allocates, garbage included,
// stays within maxTraceMemory (lowered to 24 MiB here) and a little more,
// for the largest input each importer takes and for inputs past it. At
// full size that is what keeps decoding any input under 512 MB (the
// measurements are in docs/TESTING.md); allocation counts are the same on
// any machine, and inputs this small take a second.
func TestDecodingMemory(t *testing.T) {
	defer func(m uint64) { maxTraceMemory = m }(maxTraceMemory)
	maxTraceMemory = 24 << 20
	csvIn := func(n int) []byte {
		var b bytes.Buffer
		b.WriteString("id,lower,upper,size\n")
		for i := range n {
			fmt.Fprintf(&b, "%x,%d,%d,%d\n", i, i, i+7, 64+i%1000)
		}
		return b.Bytes()
	}
	csvFull := func(n int) []byte {
		var b bytes.Buffer
		b.WriteString("id,lower,upper,size,alignment,hint,gaps,offset\n")
		for i := range n {
			fmt.Fprintf(&b, "buffer-%d,%d,%d,%d,512,%d,%d-%d,%d\n", i, i, i+7, 64+i%1000, 4096*i, i+1, i+2, 4096*i)
		}
		return b.Bytes()
	}
	jsonIn := func(n int) []byte {
		var b bytes.Buffer
		b.WriteString(`{"format":"arenaplan-trace","version":1,"buffers":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"size":%d,"start":%d,"end":%d}`, 64+i%1000, i, i+7)
		}
		b.WriteString("]}")
		return b.Bytes()
	}
	jsonFull := func(n int) []byte {
		var b bytes.Buffer
		b.WriteString(`{"format":"arenaplan-trace","version":1,"buffers":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "\n"+`{"name":"t%d","size":%d,"align":512,"start":%d,"end":%d,"stream":%d,"tag":"%s","prior":%d,"gaps":[{"start":%d,"end":%d}]}`,
				i, 64+i%1000, i, i+7, i%3, Tags[i%len(Tags)], 4096*i, i+1, i+2)
		}
		b.WriteString("]}")
		return b.Bytes()
	}
	torchIn := func(n int) []byte {
		evs := make([]any, n)
		for i := range evs {
			evs[i] = torchEv("alloc", int64(4096*(i+1)), 512)
		}
		return pk([]kv{{"device_traces", []any{evs}}})
	}
	soFar := regexp.MustCompile(`\((\d+) buffers so far\)`)
	for _, c := range []struct {
		name   string
		in     func(int) []byte
		read   func([]byte) (int, error)
		taken  int // buffers of an input it takes
		refuse int // buffers of an input it refuses
	}{
		{"csv", csvIn, readCSVBuffers, 100_000, 400_000},
		{"csv, every column", csvFull, readCSVBuffers, 80_000, 400_000},
		{"json", jsonIn, readJSONBuffers, 100_000, 400_000},
		{"json, every field", jsonFull, readJSONBuffers, 80_000, 400_000},
		{"torch", torchIn, readTorchBuffers, 26_000, 30_000},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Past the bound, then the largest input taken: one buffer
			// less than where the first was refused.
			in := c.in(c.refuse)
			var n int
			var err error
			a := allocated(func() { n, err = c.read(in) })
			if err == nil {
				t.Fatalf("%d buffers taken, want refused", n)
			}
			t.Logf("%d buffers: refused, %.1f MiB allocated: %v", c.refuse, float64(a)/(1<<20), err)
			check(t, a)
			taken := c.taken
			if m := soFar.FindStringSubmatch(err.Error()); m != nil {
				taken, _ = strconv.Atoi(m[1])
				taken--
			}
			in = c.in(taken)
			a = allocated(func() { n, err = c.read(in) })
			if err != nil || n != taken {
				t.Fatalf("%d buffers: %v, %d taken", taken, err, n)
			}
			t.Logf("%d buffers: taken, %.1f MiB allocated", taken, float64(a)/(1<<20))
			check(t, a)
		})
	}
}

// check fails where decoding allocated more than maxTraceMemory and
// 1/16 of it: at full size, 476 of the 488 MiB in 512 MB, which leaves
// the runtime its own 12.
func check(t *testing.T, a uint64) {
	t.Helper()
	if limit := maxTraceMemory + maxTraceMemory/16; a > limit {
		t.Errorf("decoding allocated %d bytes, more than %d", a, limit)
	}
}

func readCSVBuffers(in []byte) (int, error) {
	tr, err := ReadCSV(bytes.NewReader(in), "m")
	if err != nil {
		return 0, err
	}
	return len(tr.Buffers), nil
}

func readJSONBuffers(in []byte) (int, error) {
	tr, err := ReadJSON(bytes.NewReader(in), "m")
	if err != nil {
		return 0, err
	}
	return len(tr.Buffers), nil
}

func readTorchBuffers(in []byte) (int, error) {
	ts, err := readTorchSnapshot(bytes.NewReader(in), "m", len(in))
	if err != nil {
		return 0, err
	}
	return len(ts[0].Buffers), nil
}
