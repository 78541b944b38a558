package plans

import (
	"os"
	"path/filepath"
	"testing"
)

// benchFiles are a synthetic 62k-buffer plan and, where the shared data is
// present, the 62k-buffer IOPDDL instance Y_1 (placed by firstFit).
func benchFiles(b *testing.B) map[string]*File {
	files := map[string]*File{"synthetic62k": synthFile(b, 62_000)}
	path := filepath.Join("..", "..", "shared", "data", "minimalloc", "related", "idealloc", "iopddl", "Y_1.csv")
	if _, err := os.Stat(path); err == nil {
		tr, err := readCSV(path)
		if err != nil {
			b.Fatal(err)
		}
		files["Y_1"] = &File{Trace: tr, Plan: planFor(tr, "firstfit-test", 256, firstFit(tr, 256))}
	}
	return files
}

func BenchmarkEncode(b *testing.B) {
	for name, f := range benchFiles(b) {
		b.Run(name, func(b *testing.B) {
			data, err := Encode(f)
			if err != nil {
				b.Fatal(err)
			}
			raw := encodePayload(f)
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(data)), "file-bytes")
			b.ReportMetric(float64(len(raw)), "payload-bytes")
			b.ReportMetric(float64(len(data))/float64(len(f.Trace.Buffers)), "bytes/buffer")
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for name, f := range benchFiles(b) {
		b.Run(name, func(b *testing.B) {
			data, err := Encode(f)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(encodePayload(f))))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(data)), "file-bytes")
		})
	}
}
