package lifetime

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
)

// fullTrace uses every field the JSON format carries.
func fullTrace() *Trace {
	tr := sampleTrace()
	tr.Buffers[0].Stream = 7
	tr.Buffers[0].Tag = "weight"
	tr.Buffers[0].Fixed, tr.Buffers[0].HasFixed = 0, true
	tr.Buffers[2].Fixed, tr.Buffers[2].HasFixed = 4096, true
	tr.Buffers[1].Align = 0
	tr.Prior = []int64{NoOffset, 0, 1 << 20}
	tr.Torch = &TorchStats{Device: 1, ReservedPeak: 1 << 30, LiveAtStart: 512, HasSegments: true}
	return tr
}

func TestJSONRoundTrip(t *testing.T) {
	for _, tr := range []*Trace{fullTrace(), {Name: "empty"}, sampleTrace()} {
		var b bytes.Buffer
		if err := WriteJSON(&b, tr); err != nil {
			t.Fatal(err)
		}
		got, err := ReadJSON(bytes.NewReader(b.Bytes()), "other")
		if err != nil {
			t.Fatalf("%v\n%s", err, b.String())
		}
		if got.Buffers == nil {
			got.Buffers = tr.Buffers[:0:0]
		}
		if tr.Buffers == nil {
			tr.Buffers = got.Buffers[:0:0]
		}
		if !reflect.DeepEqual(got, tr) {
			t.Errorf("round trip\n got %+v\nwant %+v\n%s", got, tr, b.String())
		}
		if got.Fingerprint() != tr.Fingerprint() {
			t.Errorf("fingerprint changed")
		}
	}
}

func TestWriteJSONShape(t *testing.T) {
	tr := &Trace{Name: "t", Buffers: []Buffer{
		{Name: "a", Size: 8, Start: 0, End: 2},
		{ID: 1, Name: "b", Size: 4, Align: 256, Start: 1, End: 3, Fixed: 0, HasFixed: true, Gaps: []Gap{{Start: 2, End: 3}}},
	}}
	var b bytes.Buffer
	if err := WriteJSON(&b, tr); err != nil {
		t.Fatal(err)
	}
	const want = `{"format":"arenaplan-trace","version":1,"name":"t","buffers":[
{"name":"a","size":8,"start":0,"end":2},
{"name":"b","size":4,"align":256,"start":1,"end":3,"fixed":0,"gaps":[{"start":2,"end":3}]}
]}
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestReadJSONErrors(t *testing.T) {
	const head = `{"format":"arenaplan-trace","version":1,"buffers":[`
	for _, c := range []struct {
		name, in, want string
	}{
		{"empty", ``, "json: empty input"},
		{"white space", "  \n\t", "json: no JSON object (only white space)"},
		{"array", ` [1]`, "json: not a JSON trace: it starts with \"[1]\""},
		{"not json", `id,lower`, "json: not a JSON trace"},
		{"bad json after the brace", `{id,lower`, "json: invalid character"},
		{"no format", `{"version":1,"buffers":[]}`, `json: format is "", want "arenaplan-trace"`},
		{"other format", `{"format":"x","version":1,"buffers":[]}`, `json: format is "x"`},
		{"version 2", `{"format":"arenaplan-trace","version":2,"buffers":[],"new":1}`, "json: unsupported version 2 (this reader knows version 1)"},
		{"no version", `{"format":"arenaplan-trace","buffers":[]}`, "json: unsupported version"},
		{"unknown field", `{"format":"arenaplan-trace","version":1,"buffers":[],"extra":1}`, `json: json: unknown field "extra"`},
		{"unknown buffer field", head + `{"size":1,"start":0,"end":1,"colour":"red"}]}`, `unknown field "colour"`},
		{"trailing", `{"format":"arenaplan-trace","version":1,"buffers":[]} {}`, "json: invalid character '{' after top-level value"},
		{"no buffers", `{"format":"arenaplan-trace","version":1}`, `json: no "buffers" array`},
		{"string size", head + `{"size":"1","start":0,"end":1}]}`, "cannot unmarshal string"},
		{"float size", head + `{"size":1.5,"start":0,"end":1}]}`, "cannot unmarshal number 1.5"},
		{"zero size", head + `{"name":"z","size":0,"start":0,"end":1}]}`, "json: trace \"e\": buffer 0 (z): size 0 is not positive"},
		{"empty lifetime", head + `{"size":1,"start":4,"end":4}]}`, "lifetime [4, 4) is empty"},
		{"negative start", head + `{"size":1,"start":-4,"end":4}]}`, "start -4 is negative"},
		{"negative fixed", head + `{"size":1,"start":0,"end":4,"fixed":-1}]}`, "fixed offset -1 is negative"},
		{"negative hint", head + `{"size":1,"start":0,"end":4,"hint":-1}]}`, "hint -1 is invalid"},
		{"negative prior", head + `{"size":1,"start":0,"end":4,"prior":-1}]}`, "prior offset -1 is invalid"},
		{"half window", head + `{"size":8,"start":0,"end":4,"gaps":[{"start":1,"end":2,"lo":0}]}]}`, "gap 0 has only one of lo and hi"},
		{"unsorted gaps", head + `{"size":8,"start":0,"end":4,"gaps":[{"start":2,"end":3},{"start":1,"end":2}]}]}`, "gap 1 starts before gap 0 ends"},
		{"gap outside", head + `{"size":8,"start":0,"end":4,"gaps":[{"start":2,"end":5}]}]}`, "gap [2, 5) is not inside the lifetime [0, 4)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadJSON(strings.NewReader(c.in), "e")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func FuzzReadJSON(f *testing.F) {
	var b bytes.Buffer
	WriteJSON(&b, fullTrace())
	f.Add(b.Bytes())
	f.Add([]byte(`{"format":"arenaplan-trace","version":1,"buffers":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadJSON(bytes.NewReader(data), "f")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "json: ") {
				t.Fatalf("error without prefix: %v", err)
			}
			return
		}
		if err := tr.Validate(); err != nil {
			t.Fatalf("accepted an invalid trace: %v", err)
		}
		var out bytes.Buffer
		if err := WriteJSON(&out, tr); err != nil {
			t.Fatal(err)
		}
		back, err := ReadJSON(&out, "f")
		if err != nil {
			t.Fatalf("rereading: %v\n%s", err, out.String())
		}
		if !reflect.DeepEqual(back, tr) {
			t.Fatalf("round trip changed the trace\n got %+v\nwant %+v", back, tr)
		}
	})
}

// TestFormatDocExample keeps the example in FORMAT.md readable.
func TestFormatDocExample(t *testing.T) {
	doc, err := os.ReadFile("FORMAT.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```json\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("no json example in FORMAT.md")
	}
	tr, err := ReadJSON(strings.NewReader(example), "doc")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Buffers) != 3 || tr.Buffers[2].Gaps[1].Hi != 1024 || tr.Prior[2] != 8192 || tr.Torch.Reserved() != 367001600-261121536 {
		t.Errorf("example read as %+v", tr)
	}
}
