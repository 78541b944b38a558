package lifetime

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadCSV(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     []Buffer
		prior    []int64
	}{
		{
			name: "minimal",
			in:   "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\n",
			want: []Buffer{
				{ID: 0, Name: "b1", Size: 4, Start: 0, End: 3},
				{ID: 1, Name: "b2", Size: 4, Start: 3, End: 9},
			},
		},
		{
			name: "any order, CRLF, blank lines, BOM, spaces in numbers",
			in:   "\ufeffsize,upper,id,lower\r\n\r\n 16 ,5,x y,1\r\n\n",
			want: []Buffer{{Name: "x y", Size: 16, Start: 1, End: 5}},
		},
		{
			name: "aliases; end is inclusive, gap ends too",
			in:   "buffer_id,begin,end,size,gaps\nq,0,9,8,2-3 5-6@0:4\n",
			want: []Buffer{{Name: "q", Size: 8, Start: 0, End: 10,
				Gaps: []Gap{{Start: 2, End: 4}, {Start: 5, End: 7, HasWindow: true, Lo: 0, Hi: 4}}}},
		},
		{
			name: "buffer and start aliases, unsorted gaps are sorted",
			in:   "buffer,start,upper,size,gaps\nq,0,9,8,5-6 1-2\n",
			want: []Buffer{{Name: "q", Size: 8, Start: 0, End: 9,
				Gaps: []Gap{{Start: 1, End: 2}, {Start: 5, End: 6}}}},
		},
		{
			name: "alignment, hint, offset",
			in:   "id,lower,upper,size,alignment,hint,offset\na,0,1,4,64,-1,128\nb,0,1,4,1,32,-1\nc,0,1,4,1,,\n",
			want: []Buffer{
				{ID: 0, Name: "a", Size: 4, Align: 64, Start: 0, End: 1},
				{ID: 1, Name: "b", Size: 4, Align: 1, Start: 0, End: 1, Hint: 32, HasHint: true},
				{ID: 2, Name: "c", Size: 4, Align: 1, Start: 0, End: 1},
			},
			prior: []int64{128, NoOffset, NoOffset},
		},
		{
			name: "header only",
			in:   "id,lower,upper,size\n",
			want: nil,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := ReadCSV(strings.NewReader(c.in), "n")
			if err != nil {
				t.Fatal(err)
			}
			if tr.Name != "n" {
				t.Errorf("name %q", tr.Name)
			}
			for i := range c.want {
				c.want[i].ID = ID(i)
			}
			if !reflect.DeepEqual(tr.Buffers, c.want) {
				t.Errorf("buffers\n got %+v\nwant %+v", tr.Buffers, c.want)
			}
			if !reflect.DeepEqual(tr.Prior, c.prior) {
				t.Errorf("prior %v, want %v", tr.Prior, c.prior)
			}
			if err := tr.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestReadCSVErrors(t *testing.T) {
	const h = "id,lower,upper,size\n"
	var long strings.Builder
	long.WriteString(h)
	for i := range 15 {
		fmt.Fprintf(&long, "b%d,0,1,4\n", i)
	}
	long.WriteString("z,0,1,abc\n")
	for _, c := range []struct {
		name, in, want string
	}{
		{"empty", "", "csv: no header line (want id,lower,upper,size)"},
		{"blank only", "\n\r\n", "csv: no header line"},
		{"missing size", "id,lower,upper\n", `csv: line 1: missing column "size"`},
		{"unknown column", "id,lower,upper,size,colour\n", `csv: line 1: unknown column "colour"`},
		{"repeated column", "id,start,lower,upper,size\n", `csv: line 1: column "lower" repeats column "start"`},
		{"line 17", long.String(), `csv: line 17: column "size": "abc" is not an integer`},
		{"not an integer", h + "a,x,1,4\n", `csv: line 2: column "lower": "x" is not an integer`},
		{"float", h + "a,0,1,4.5\n", `csv: line 2: column "size": "4.5" is not an integer`},
		{"overflow", h + "a,0,1,99999999999999999999\n", `column "size": "99999999999999999999" is not an integer`},
		{"negative time", h + "a,-1,1,4\n", `csv: line 2: column "lower": -1 is negative`},
		{"negative end", "id,lower,end,size\na,0,-3,4\n", `csv: line 2: column "end": -3 is negative`},
		{"zero size", h + "a,0,1,0\n", `csv: line 2: column "size": 0 is not positive`},
		{"huge size", h + "a,0,1,72057594037927937\n", `column "size": 72057594037927937 exceeds the limit 72057594037927936`},
		{"huge time", h + "a,0,72057594037927937,4\n", `column "upper": 72057594037927937 exceeds the limit`},
		{"empty lifetime", h + "\na,3,3,4\n", `csv: line 3: buffer "a": lifetime [3, 3) is empty`},
		{"inverted lifetime", h + "a,5,2,4\n", `lifetime [5, 2) is empty`},
		{"too few fields", h + "a,0,1\n", "csv: line 2: 3 fields, want 4"},
		{"too many fields", h + "a,0,1,4,5\n", "csv: line 2: 5 fields, want 4"},
		{"repeated id", h + "a,0,1,4\nb,0,1,4\na,1,2,4\n", `csv: line 4: column "id": id "a" repeats line 2`},
		{"first of two repeats", h + "a,0,1,4\nb,0,1,4\nb,1,2,4\na,1,2,4\n", `csv: line 4: column "id": id "b" repeats line 3`},
		{"repeat before a bad row", h + "a,0,1,4\na,1,2,4\nc,x,1,4\n", `csv: line 3: column "id": id "a" repeats line 2`},
		{"bad row before a repeat", h + "a,0,1,4\nc,x,1,4\na,1,2,4\n", `csv: line 3: column "lower": "x" is not an integer`},
		{"empty id", h + ",0,1,4\n", `csv: line 2: column "id": empty id`},
		{"id with CR", h + "a\rb,0,1,4\n", `csv: line 2: column "id": "a\rb" has a carriage return`},
		{"zero alignment", "id,lower,upper,size,alignment\na,0,1,4,0\n", `column "alignment": 0 is not positive`},
		{"negative offset", "id,lower,upper,size,offset\na,0,1,4,-5\n", `csv: line 2: column "offset": -5 is negative`},
		{"bad hint", "id,lower,upper,size,hint\na,0,1,4,h\n", `column "hint": "h" is not an integer`},
		{"bad gap", "id,lower,upper,size,gaps\na,0,9,4,1x2\n", `csv: line 2: column "gaps": "1x2" is not a gap (want a-b or a-b@x:y)`},
		{"bad window", "id,lower,upper,size,gaps\na,0,9,4,1-2@3\n", `"1-2@3" is not a gap`},
		{"negative gap", "id,lower,upper,size,gaps\na,0,9,4,1--2\n", `"1--2" is not a gap`},
		{"gap outside", "id,lower,upper,size,gaps\na,2,9,4,1-3\n", `csv: line 2: buffer "a": gap [1, 3) is not inside the lifetime [2, 9)`},
		{"window outside", "id,lower,upper,size,gaps\na,0,9,4,1-3@2:8\n", `gap window [2, 8) is not inside the buffer's 4 bytes`},
		{"overlapping gaps", "id,lower,upper,size,gaps\na,0,9,4,1-4 3-5\n", `column "gaps": gaps [1, 4) and [3, 5) overlap`},
		{"line too long", h + "a,0,1," + strings.Repeat("1", maxCSVLine) + "\n", "csv: line 2: line longer than 16777216 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadCSV(strings.NewReader(c.in), "e")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestReadCSVReaderErrors(t *testing.T) {
	boom := errors.New("boom")
	if _, err := ReadCSV(iotest.ErrReader(boom), "e"); !errors.Is(err, boom) {
		t.Errorf("err = %v, want boom", err)
	}
	// OneByteReader and DataErrReader must not change the result.
	for _, rd := range []func(string) *Trace{
		func(s string) *Trace { tr, _ := ReadCSV(iotest.OneByteReader(strings.NewReader(s)), "e"); return tr },
		func(s string) *Trace { tr, _ := ReadCSV(iotest.DataErrReader(strings.NewReader(s)), "e"); return tr },
	} {
		if tr := rd("id,lower,upper,size\na,0,1,4"); tr == nil || len(tr.Buffers) != 1 {
			t.Errorf("got %+v", tr)
		}
	}
}

func TestLimitReader(t *testing.T) {
	l := &limitReader{r: strings.NewReader("abcdef"), left: 3}
	b := make([]byte, 10)
	n, err := l.Read(b)
	if n != 3 || err != nil {
		t.Fatalf("first read %d, %v", n, err)
	}
	if _, err := l.Read(b); err != errTooLarge {
		t.Fatalf("err = %v, want errTooLarge", err)
	}
	exact := &limitReader{r: strings.NewReader("abc"), left: 3}
	exact.Read(b)
	if _, err := exact.Read(b); err == nil || err == errTooLarge {
		t.Fatalf("input of exactly the limit: err = %v, want EOF", err)
	}
}

// sampleTrace has every attribute the CSV carries.
func sampleTrace() *Trace {
	return &Trace{Name: "s", Buffers: []Buffer{
		{ID: 0, Name: "w0", Size: 100, Align: 256, Start: 0, End: 10, Hint: 512, HasHint: true},
		{ID: 1, Name: "act 1", Size: 7, Align: 1, Start: 2, End: 5,
			Gaps: []Gap{{Start: 3, End: 4, HasWindow: true, Lo: 1, Hi: 3}}},
		{ID: 2, Name: "x", Size: 1 << 40, Align: 1, Start: 5, End: 6,
			Gaps: []Gap{{Start: 5, End: 6}}},
	}}
}

func TestCSVRoundTrip(t *testing.T) {
	tr := sampleTrace()
	offsets := []int64{0, 256, NoOffset}
	for _, offs := range [][]int64{nil, offsets} {
		var b bytes.Buffer
		if err := WriteCSV(&b, tr, offs); err != nil {
			t.Fatal(err)
		}
		got, err := ReadCSV(&b, "s")
		if err != nil {
			t.Fatalf("%v\n%s", err, b.String())
		}
		if !reflect.DeepEqual(got.Buffers, tr.Buffers) {
			t.Errorf("buffers\n got %+v\nwant %+v", got.Buffers, tr.Buffers)
		}
		if !reflect.DeepEqual(got.Prior, offs) {
			t.Errorf("prior %v, want %v", got.Prior, offs)
		}
	}
	var b bytes.Buffer
	if err := WriteCSV(&b, tr, offsets); err != nil {
		t.Fatal(err)
	}
	const want = "id,lower,upper,size,alignment,hint,gaps,offset\n" +
		"w0,0,10,100,256,512,,0\n" +
		"act 1,2,5,7,1,-1,3-4@1:3,256\n" +
		"x,5,6,1099511627776,1,-1,5-6,-1\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	// Without alignment, hints or gaps only the four MiniMalloc columns.
	b.Reset()
	plainTrace := &Trace{Buffers: []Buffer{{Size: 4, Start: 0, End: 1}}}
	if err := WriteCSV(&b, plainTrace, nil); err != nil {
		t.Fatal(err)
	}
	if b.String() != "id,lower,upper,size\n0,0,1,4\n" {
		t.Errorf("got %q", b.String())
	}
}

func TestWriteCSVErrors(t *testing.T) {
	tr := sampleTrace()
	if err := WriteCSV(&bytes.Buffer{}, tr, []int64{1}); err == nil || !strings.Contains(err.Error(), "csv: 1 offsets for 3 buffers") {
		t.Errorf("err = %v", err)
	}
	tr.Buffers[1].Name = "a,b"
	if err := WriteCSV(&bytes.Buffer{}, tr, nil); err == nil || !strings.Contains(err.Error(), `csv: buffer 1: name "a,b" has a comma or line break`) {
		t.Errorf("err = %v", err)
	}
	tr.Buffers[1].Name = "ok"
	if err := WriteCSV(failWriter{}, tr, nil); err == nil {
		t.Errorf("write error not reported")
	}
}

type failWriter struct{}

func (failWriter) Write(p []byte) (int, error) { return 0, errors.New("disk full") }

// TestDemoTrace keeps the README's demo trace loadable.
func TestDemoTrace(t *testing.T) {
	ts, err := Load("../testdata/bert_base_infer.csv", "")
	if err != nil {
		t.Fatal(err)
	}
	if lb, _ := ts[0].LowerBound(1); lb != 69206016 || len(ts[0].Buffers) != 240 {
		t.Errorf("%d buffers, LB %d; want 240, 69206016", len(ts[0].Buffers), lb)
	}
}

func FuzzReadCSV(f *testing.F) {
	f.Add([]byte("id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\n"))
	f.Add([]byte("buffer_id,begin,end,size,gaps,alignment,hint,offset\nq,0,9,8,2-3 5-6@0:4,16,-1,32\n"))
	if data, err := os.ReadFile("../testdata/bert_base_infer.csv"); err == nil {
		f.Add(data)
	}
	f.Add(gapsCSV(200)) // hostile_test.go: one buffer with many gaps
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadCSV(bytes.NewReader(data), "f")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "csv: ") {
				t.Fatalf("error without prefix: %v", err)
			}
			return
		}
		if err := tr.Validate(); err != nil {
			t.Fatalf("accepted an invalid trace: %v", err)
		}
		// Whatever was accepted writes and reads back the same.
		var b bytes.Buffer
		if err := WriteCSV(&b, tr, tr.Prior); err != nil {
			t.Fatal(err)
		}
		back, err := ReadCSV(&b, "f")
		if err != nil {
			t.Fatalf("rereading: %v\n%s", err, b.String())
		}
		// Alignment 0 and 1 both mean none; the writer spells both as 1 or
		// leaves the column out.
		for _, x := range []*Trace{tr, back} {
			for i := range x.Buffers {
				x.Buffers[i].Align = max(x.Buffers[i].Align, 1)
			}
		}
		if !reflect.DeepEqual(back.Buffers, tr.Buffers) || !reflect.DeepEqual(back.Prior, tr.Prior) {
			t.Fatalf("round trip changed the trace\n got %+v\nwant %+v", back.Buffers, tr.Buffers)
		}
	})
}
