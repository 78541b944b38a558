package main

import "testing"

// --pause: the arena gives back every mapped byte halfway through a
// replayed sequence and takes it again; the weights and KV cache are kept
// in page-locked host memory, and the sequence ends with eager's outputs
// and state bit for bit. (With a family plan it is a usage error:
// TestRunFamilyUsage.)
func TestRunPause(t *testing.T) {
	r, code, stderr := runJSON(t, append(append([]string{}, small...), "--steps", "6", "--pause")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	p := r.Pause
	if p == nil {
		t.Fatal("no pause report")
	}
	if !p.OutputsEqual {
		t.Error("outputs after pause and resume differ from eager's")
	}
	if p.ReturnedBytes != int64(r.MappedBytes) {
		t.Errorf("pause returned %d bytes, the arena maps %d", p.ReturnedBytes, r.MappedBytes)
	}
	if want := uint64(r.WeightBytes + r.KVBytes); p.HostBytes != want || !p.Pinned {
		t.Errorf("host memory kept %d (pinned %v), want %d (weights + KV cache), pinned", p.HostBytes, p.Pinned, want)
	}
}
