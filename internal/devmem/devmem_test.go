package devmem

import "testing"

func TestBytes(t *testing.T) {
	const MiB, GiB = 1 << 20, 1 << 30
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB",
		2 * MiB: "2 MiB", 16 * GiB: "16 GiB", 3*GiB + 256*MiB: "3.25 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
