package workloads

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/arenaplan/arenaplan/kernels"
)

// TuneEnv names the environment variable that the run and plan commands
// read launch-shape tuning from (Kernels.Tune's spec). It is for measuring
// launch shapes against the defaults on a GPU, not for users: a workload
// built with other shapes has another fingerprint, so a plan file made
// without the same tuning is refused.
const TuneEnv = "ARENAPLAN_TUNE"

// tuning overrides the launch shapes that the built-in workloads derive
// from the device; a zero field keeps the default.
type tuning struct {
	linearGrid       uint32 // most blocks of a linear launch
	lnGrid           uint32 // most blocks of a linear_ln or linear_ln1 launch
	attentionBlocks  uint32 // most blocks attention_part aims for
	attentionThreads uint32 // threads of an attention_part block
	stagedGrid       uint32 // blocks a linear_st launch aims for
	stagedFromBatch  uint32 // fewest batch rows at which the linears stage their weights
}

// tuneKey is one key of a tuning spec: the field it sets and the values
// it takes.
type tuneKey struct {
	name     string
	field    func(*tuning) *uint32
	min, max uint32
	multiple uint32 // the value must be a multiple of this (0: any)
	doc      string
}

var tuneKeys = []tuneKey{
	{"linear_grid", func(t *tuning) *uint32 { return &t.linearGrid }, 1, 1 << 20, 0, "most blocks of a linear launch"},
	{"ln_grid", func(t *tuning) *uint32 { return &t.lnGrid }, 1, 1 << 20, 0, "most blocks of a layer-norm linear (linear_ln, linear_ln1)"},
	{"attention_blocks", func(t *tuning) *uint32 { return &t.attentionBlocks }, 1, 1 << 20, 0, "most blocks attention_part aims for by splitting the cache positions"},
	{"attention_threads", func(t *tuning) *uint32 { return &t.attentionThreads }, 32, kernels.MaxAttentionPartBlock, 32, "threads of an attention_part block"},
	{"staged_grid", func(t *tuning) *uint32 { return &t.stagedGrid }, 1, 1 << 20, 0, "blocks a linear_st launch aims for"},
	{"staged_from_batch", func(t *tuning) *uint32 { return &t.stagedFromBatch }, 1, 1 << 16, 0, "fewest batch rows at which the linears stage their weights (above 8: never)"},
}

// TuneKeys lists the keys Kernels.Tune takes, each with what it sets.
func TuneKeys() map[string]string {
	m := map[string]string{}
	for _, k := range tuneKeys {
		m[k.name] = k.doc
	}
	return m
}

// Tune returns k with the launch shapes that spec sets: comma-separated
// key=value pairs (TuneKeys), such as "ln_grid=528,attention_threads=64".
// An empty spec changes nothing. Unknown keys, a key given twice and
// values out of range are errors; nothing is silently ignored.
func (k Kernels) Tune(spec string) (Kernels, error) {
	t := k.tune
	seen := map[string]bool{}
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, val, ok := strings.Cut(f, "=")
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		if !ok {
			return k, fmt.Errorf("workloads: tuning %q: want key=value", f)
		}
		i := slices.IndexFunc(tuneKeys, func(tk tuneKey) bool { return tk.name == name })
		if i < 0 {
			var names []string
			for _, tk := range tuneKeys {
				names = append(names, tk.name)
			}
			return k, fmt.Errorf("workloads: tuning: unknown key %q (have %s)", name, strings.Join(names, ", "))
		}
		if seen[name] {
			return k, fmt.Errorf("workloads: tuning: %s given twice", name)
		}
		seen[name] = true
		tk := tuneKeys[i]
		v, err := strconv.ParseUint(val, 10, 32)
		if err != nil || uint32(v) < tk.min || uint32(v) > tk.max || (tk.multiple > 0 && uint32(v)%tk.multiple != 0) {
			want := fmt.Sprintf("%d..%d", tk.min, tk.max)
			if tk.multiple > 0 {
				want = fmt.Sprintf("a multiple of %d, %s", tk.multiple, want)
			}
			return k, fmt.Errorf("workloads: tuning: %s=%q: want %s", name, val, want)
		}
		*tk.field(&t) = uint32(v)
	}
	k.tune = t
	return k, nil
}
