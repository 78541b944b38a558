package bridge

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// TestPlanFilesCarryTheRank: a tensor-parallel rank's plan (step or
// family) loads on the same rank of the same world size and is refused,
// naming both, anywhere else.
func TestPlanFilesCarryTheRank(t *testing.T) {
	dir := t.TempDir()
	stepPath, famPath := filepath.Join(dir, "step.plan"), filepath.Join(dir, "family.plan")
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, Rank: 1, WorldSize: 2})
	p := &program{t: t, b: b, stream: 0x77, layers: 4}
	s := recordAndPlan(t, b, p)
	if err := s.Save(stepPath); err != nil {
		t.Fatal(err)
	}
	f, _ := recordFamily(t, b, []uint64{2, 1})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	if err := f.Save(famPath); err != nil {
		t.Fatal(err)
	}
	b.Close()

	for _, tc := range []struct {
		rank, world int
		ok          bool
	}{{1, 2, true}, {0, 2, false}, {1, 4, false}, {0, 0, false}} {
		o := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, Rank: tc.rank, WorldSize: tc.world})
		st, _ := o.NewStep(0, "x")
		err := st.Load(stepPath)
		fam, _ := o.NewFamily(0, "decode")
		for _, n := range []string{"bs2", "bs1"} {
			if _, err := fam.NewMember(n); err != nil {
				t.Fatal(err)
			}
		}
		ferr := fam.Load(famPath)
		for what, e := range map[string]error{"step": err, "family": ferr} {
			switch {
			case tc.ok && e != nil:
				t.Errorf("rank %d of %d: %s plan of rank 1 of 2 refused: %v", tc.rank, tc.world, what, e)
			case !tc.ok && (e == nil || !strings.Contains(e.Error(), "made by rank 1 of 2")):
				t.Errorf("rank %d of %d: %s plan of rank 1 of 2: %v, want a refusal naming the ranks", tc.rank, tc.world, what, e)
			}
		}
		o.Close()
	}
}

func TestConfigFromEnvRank(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	c, err := ConfigFromEnv(env(map[string]string{"RANK": "3", "WORLD_SIZE": "4"}))
	if err != nil || c.Rank != 3 || c.WorldSize != 4 {
		t.Fatalf("RANK=3 WORLD_SIZE=4: %+v, %v", c, err)
	}
	for _, bad := range []map[string]string{{"RANK": "-1"}, {"WORLD_SIZE": "0"}, {"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x"}} {
		if _, err := ConfigFromEnv(env(bad)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestSimDeviceOrdinals: the simulation has SimDevices devices (8 unless
// told); an ordinal beyond them is refused as the driver refuses it,
// by every call that names a device (pause among them), instead of
// opening a device for any ordinal up to INT_MAX.
func TestSimDeviceOrdinals(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 64 << 20})
	defer b.Close()
	if _, err := b.Paused(7); err != nil {
		t.Fatalf("device 7 of 8: %v", err)
	}
	for _, ord := range []int{8, 1<<31 - 1} {
		err := b.Pause(ord)
		var ce *cuda.Error
		if !errors.As(err, &ce) || ce.Code != cuda.ErrorInvalidDevice || !strings.Contains(err.Error(), "has 8 devices") {
			t.Errorf("Pause(%d): %v, want CUDA_ERROR_INVALID_DEVICE naming the 8 devices", ord, err)
		}
	}
	c, err := ConfigFromEnv(func(k string) string {
		return map[string]string{"ARENAPLAN_DEVICE": "sim", "ARENAPLAN_SIM_DEVICES": "2"}[k]
	})
	if err != nil || c.SimDevices != 2 {
		t.Fatalf("ARENAPLAN_SIM_DEVICES=2: %+v, %v", c, err)
	}
	b2 := New(c)
	defer b2.Close()
	if _, err := b2.Paused(2); err == nil {
		t.Error("device 2 of 2 opened")
	}
}
