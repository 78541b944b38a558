package workloads

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/launch"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/spf13/pflag"
)

// Shape is the dimensions of a built-in workload. Zero fields take the
// workload's defaults; Seed (default 1) picks the random weights and
// inputs and is no part of the fingerprint.
type Shape struct {
	// Iters and JoinEvery shape spill-demo (see spill_demo.go).
	Iters, JoinEvery int

	Layers, Width, Heads, KVLen, Batch, Vocab int
	// MaxBatch is the batch that the tensors a family shares (the KV
	// cache, constant inputs) are sized for, so that every member of a
	// family of batch sizes finds them at one address with one size and
	// uses their first Batch rows; 0 or at most Batch: Batch. Above Batch
	// it is recorded as the shape dimension "max_batch".
	MaxBatch int
	Seed     uint64
}

// Workload is a built-in workload.
type Workload struct {
	Name     string
	Doc      string
	Defaults Shape
	// Dims are the shape fields the workload uses, by flag name.
	Dims  []string
	build func(Shape, Kernels) (*graph.Graph, error)
}

var workloads = map[string]*Workload{}

func register(w *Workload) { workloads[w.Name] = w }

// Workloads lists the built-in workloads' names, sorted.
func Workloads() []string {
	var names []string
	for n := range workloads {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the named built-in workload.
func Lookup(name string) (*Workload, error) {
	w, ok := workloads[name]
	if !ok {
		return nil, fmt.Errorf("workloads: unknown workload %q (have %s)", name, strings.Join(Workloads(), ", "))
	}
	return w, nil
}

// Build builds the named workload with shape s (zero fields: defaults)
// from the embedded kernels.
func Build(name string, s Shape) (*graph.Graph, error) {
	return BuildWith(name, s, EmbeddedKernels())
}

// BuildWith is Build with other kernels: PTX built from a modified
// kernels.cu, another device's multiprocessor count, tuned launch shapes.
func BuildWith(name string, s Shape, k Kernels) (*graph.Graph, error) {
	w, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	return w.BuildWith(s, k)
}

// Build builds the workload with shape s (zero fields: defaults) from the
// embedded kernels.
func (w *Workload) Build(s Shape) (*graph.Graph, error) {
	return w.BuildWith(s, EmbeddedKernels())
}

// BuildWith is Build with other kernels.
func (w *Workload) BuildWith(s Shape, k Kernels) (*graph.Graph, error) {
	if k.Multiprocessors < 0 || k.Multiprocessors > 1<<16 {
		return nil, fmt.Errorf("workloads: %s: %d multiprocessors: want 1..65536 (0: 132)", w.Name, k.Multiprocessors)
	}
	return w.build(w.Resolve(s), k)
}

// Kernels are the PTX modules the built-in workloads load, and the device
// their launch grids are sized for. The graphs they build hold them;
// nothing global is changed.
type Kernels struct {
	// PTX holds the entries of package kernels (gpt2-decode, mlp): the
	// compute_80 build, which every device since sm_80 can JIT.
	PTX []byte
	// PTX90 is the same kernels built for compute_90 (programmatic
	// dependent launch), loaded on devices of 9.0 and later; nil: none.
	PTX90 []byte
	// SpillPTX holds spill-demo's entries.
	SpillPTX []byte
	// Multiprocessors is the multiprocessor count of the device that the
	// launch grids are sized for (cuda.Device.Multiprocessors); 0: 132,
	// an H100 SXM or H200. The grids are part of the workload's
	// fingerprint, so a plan file made for one count is refused on a
	// device of another.
	Multiprocessors int
	// tune overrides launch shapes (Tune).
	tune tuning
}

// EmbeddedKernels are the kernels embedded in package kernels.
func EmbeddedKernels() Kernels {
	return Kernels{PTX: kernels.PTX, PTX90: kernels.PTX90, SpillPTX: kernels.SpillPTX}
}

// module adds k's kernels to b, with their compute_90 variant.
func (k Kernels) module(b *graph.Builder) {
	b.Module(k.PTX)
	b.Variant(9, k.PTX90)
}

// Resolve fills s's zero fields from the workload's defaults.
func (w *Workload) Resolve(s Shape) Shape {
	d := w.Defaults
	pick := func(v, def int) int {
		if v == 0 {
			return def
		}
		return v
	}
	s.Iters, s.JoinEvery = pick(s.Iters, d.Iters), pick(s.JoinEvery, d.JoinEvery)
	s.Layers, s.Width, s.Heads = pick(s.Layers, d.Layers), pick(s.Width, d.Width), pick(s.Heads, d.Heads)
	s.KVLen, s.Batch, s.Vocab = pick(s.KVLen, d.KVLen), pick(s.Batch, d.Batch), pick(s.Vocab, d.Vocab)
	if s.MaxBatch < s.Batch {
		s.MaxBatch = s.Batch
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	return s
}

// PlanShape reads back the shape of the built-in workload a plan file
// records (plans.Workload's Name and Shape), refusing a plan of anything
// else with what it is: a plan the PyTorch bridge saved, or a workload
// this build does not have.
func PlanShape(name string, dims []graph.Dim) (Shape, error) {
	if name == plans.TorchStep {
		return Shape{}, fmt.Errorf("workloads: the plan was saved by arenaplan.torch for a PyTorch step (workload %q, %s), "+
			"not made for a built-in workload: load it with arenaplan.torch.graph(fn, plan=...) or graphs(..., plan=...); "+
			"plans for run --plan come from plan --workload NAME --output FILE", name, fmtDims(dims))
	}
	if _, err := Lookup(name); err != nil {
		return Shape{}, err
	}
	return ShapeOf(dims)
}

func fmtDims(dims []graph.Dim) string {
	if len(dims) == 0 {
		return "no dimensions"
	}
	s := make([]string, len(dims))
	for i, d := range dims {
		s[i] = fmt.Sprintf("%s=%d", d.Name, d.Value)
	}
	return strings.Join(s, " ")
}

// ShapeOf reads a shape back from a graph's (or a plan file's) dimensions.
func ShapeOf(dims []graph.Dim) (Shape, error) {
	var s Shape
	for _, d := range dims {
		if d.Value < 1 || d.Value > 1<<31 {
			return Shape{}, fmt.Errorf("workloads: shape dimension %s=%d out of range", d.Name, d.Value)
		}
		v := int(d.Value)
		switch d.Name {
		case "iters":
			s.Iters = v
		case "join_every":
			s.JoinEvery = v
		case "layers":
			s.Layers = v
		case "width":
			s.Width = v
		case "heads":
			s.Heads = v
		case "kv_len":
			s.KVLen = v
		case "batch":
			s.Batch = v
		case "vocab":
			s.Vocab = v
		case "max_batch":
			s.MaxBatch = v
		default:
			return Shape{}, fmt.Errorf("workloads: unknown shape dimension %q", d.Name)
		}
	}
	return s, nil
}

// ShapeFlags are the shape flags shared by the plan and run commands.
type ShapeFlags struct {
	fs *pflag.FlagSet
	s  Shape
}

// AddShapeFlags adds --layers, --width, --heads, --kv-len, --batch, --vocab
// and --seed to fs.
func AddShapeFlags(fs *pflag.FlagSet) *ShapeFlags {
	f := &ShapeFlags{fs: fs}
	fs.IntVar(&f.s.Layers, "layers", 0, "workload layers (default: 12 for gpt2-decode, 64 for mlp)")
	fs.IntVar(&f.s.Width, "width", 0, "workload width (default: 768 for gpt2-decode, 256 for mlp)")
	fs.IntVar(&f.s.Heads, "heads", 0, "attention heads of gpt2-decode (default 12)")
	fs.IntVar(&f.s.KVLen, "kv-len", 0, "KV cache length of gpt2-decode (default 1024)")
	fs.IntVar(&f.s.Batch, "batch", 0, "batch rows (default 1)")
	fs.IntVar(&f.s.Vocab, "vocab", 0, "vocabulary of gpt2-decode (default 50257)")
	fs.IntVar(&f.s.Iters, "iters", 0, "iterations of spill-demo's cross-stream pattern captured in one step (default 100)")
	fs.IntVar(&f.s.JoinEvery, "join-every", 0, "spill-demo: the side stream joins back every N iterations (default 1)")
	fs.Uint64Var(&f.s.Seed, "seed", 1, "seed of the random weights and inputs")
	return f
}

// Shape returns the flags' shape (zero fields where not given).
func (f *ShapeFlags) Shape() Shape { return f.s }

// Changed lists the shape flags given on the command line (--seed aside).
func (f *ShapeFlags) Changed() []string {
	var out []string
	for _, n := range []string{"layers", "width", "heads", "kv-len", "batch", "vocab", "iters", "join-every"} {
		if f.fs.Changed(n) {
			out = append(out, "--"+n)
		}
	}
	return out
}

// Check rejects flags that the named workload does not use.
func (f *ShapeFlags) Check(workload string) error {
	w, err := Lookup(workload)
	if err != nil {
		return err
	}
	for _, c := range f.Changed() {
		name := strings.ReplaceAll(strings.TrimPrefix(c, "--"), "-", "_")
		ok := false
		for _, d := range w.Dims {
			ok = ok || d == name
		}
		if !ok {
			return fmt.Errorf("%s does not apply to workload %s", c, workload)
		}
	}
	return nil
}

// ---- random contents ----

// rng returns a generator for one named tensor of a seeded workload.
func rng(seed uint64, name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// uniform returns an init function filling float32s uniform in [-a, a)
// around center.
func uniform(seed uint64, name string, center, a float32) func([]byte) {
	return func(dst []byte) {
		r := rng(seed, name)
		for i := 0; i+4 <= len(dst); i += 4 {
			v := center + a*(2*r.Float32()-1)
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(v))
		}
	}
}

// splitmix is a stateless mixer for per-step feeds.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// SimKernels are the Go references of every built-in workload's kernels,
// by PTX entry name, for the simulated device (cuda.SimConfig.Kernels,
// cuda.SizedSimConfig). Each call returns a new map.
func SimKernels() map[string]launch.KernelFunc {
	k := kernels.Reference()
	maps.Copy(k, kernels.SpillReference())
	return k
}
