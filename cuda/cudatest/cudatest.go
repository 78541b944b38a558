// Package cudatest is the conformance suite of package cuda: the same cases
// run against the real driver and the simulated device, and each prints one
// canonical result line (no addresses, ids or timings), so that the two runs
// can be compared line by line. A case also checks its own expectations and
// reports an error when they fail.
//
// Packages that build on cuda reuse it: Run checks a Device, Kernels and PTX
// give a device the suite's kernels, and Hash and Label help write further
// cases in the same canonical style.
package cudatest

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// Case is one conformance case. Run returns the case's canonical line, and
// an error when the device did not behave as the case expects; the line is
// worth printing either way.
type Case struct {
	Name string
	Run  func(dev cuda.Device) (string, error)
}

// Cases are the suite, in the order Run runs them.
var Cases = []Case{
	{"memory", caseMemory},
	{"pinned", casePinned},
	{"kernel_eager", caseKernelEager},
	{"kernel_graph", caseKernelGraph},
	{"launch_ex", caseLaunchEx},
	{"capture_alloc", caseCaptureAlloc},
	{"capture_free", caseCaptureFree},
	{"captured_event", caseCapturedEvent},
	{"fork_join", caseForkJoin},
	{"unjoined", caseUnjoined},
	{"empty_node", caseEmptyNode},
	{"vmm_capture", caseVMMCapture},
	{"exec_update", caseExecUpdate},
	{"meminfo_vmm", caseMemInfoVMM},
	{"events", caseEvents},
	{"capture_sync_copy", caseCaptureSyncCopy},
	{"capture_sync", caseCaptureSync},
}

// Prefix starts every line that Run logs: "CONFORMANCE <backend> <line>".
const Prefix = "CONFORMANCE"

// Run runs every case on dev, logs "CONFORMANCE backend name: result" for
// each, fails t for each case whose expectations fail, and returns the
// lines "name: result" in order. It binds the calling goroutine to dev's
// context first.
func Run(t testing.TB, backend string, dev cuda.Device) []string {
	t.Helper()
	if err := dev.BindThread(); err != nil {
		t.Fatalf("%s: BindThread: %v", backend, err)
	}
	var lines []string
	for _, c := range Cases {
		line, err := c.Run(dev)
		full := c.Name + ": " + line
		t.Logf("%s %s %s", Prefix, backend, full)
		if err != nil {
			t.Errorf("%s %s: %v", backend, c.Name, err)
		}
		lines = append(lines, full)
	}
	return lines
}

// Hash is FNV-1a over b, for result lines.
func Hash(b []byte) string {
	h := fnv.New32a()
	h.Write(b)
	return fmt.Sprintf("%08x", h.Sum32())
}

// Label names graph nodes by the order in which a case first sees them, so
// that lines do not print handles.
type Label struct {
	names map[cuda.GraphNode]string
	next  int
}

// Name returns n's label, giving it the next one ("n1", "n2", ...) if new.
func (l *Label) Name(n cuda.GraphNode) string {
	if l.names == nil {
		l.names = map[cuda.GraphNode]string{}
	}
	if s, ok := l.names[n]; ok {
		return s
	}
	l.next++
	s := fmt.Sprintf("n%d", l.next)
	l.names[n] = s
	return s
}

// Set sets n's label.
func (l *Label) Set(n cuda.GraphNode, name string) {
	if l.names == nil {
		l.names = map[cuda.GraphNode]string{}
	}
	l.names[n] = name
}

// List returns the sorted labels of nodes as "[a b]".
func (l *Label) List(nodes []cuda.GraphNode) string {
	var s []string
	for _, n := range nodes {
		s = append(s, l.Name(n))
	}
	sort.Strings(s)
	return "[" + strings.Join(s, " ") + "]"
}

// code is cuda.CodeName, short.
func code(err error) string { return cuda.CodeName(err) }

// checker collects the first failed expectation of a case.
type checker struct{ err error }

func (c *checker) expect(ok bool, format string, args ...any) {
	if !ok && c.err == nil {
		c.err = fmt.Errorf(format, args...)
	}
}

func (c *checker) must(err error, what string) bool {
	if err != nil && c.err == nil {
		c.err = fmt.Errorf("%s: %w", what, err)
	}
	return err == nil
}

// streamAndBuffer makes a stream and size bytes of device memory for a
// case; done frees and closes them. Where either fails, fail is the
// case's result ("stream=CODE", "alloc=CODE") and nothing is left open.
func (c *checker) streamAndBuffer(dev cuda.Device, size uint64) (s cuda.Stream, p cuda.DevicePtr, done func(), fail string) {
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return nil, 0, nil, "stream=" + code(err)
	}
	p, err = dev.Alloc(size)
	if !c.must(err, "Alloc") {
		s.Close()
		return nil, 0, nil, "alloc=" + code(err)
	}
	return s, p, func() { dev.Free(p); s.Close() }, ""
}

// endCapture reads the state of s's capture, then ends it and closes the
// graph, if it made one: for cases that look at the state and at the
// end's error only.
func (c *checker) endCapture(dev cuda.Device, s cuda.Stream) (cuda.CaptureInfo, error) {
	info, err := dev.CaptureInfo(s)
	c.must(err, "CaptureInfo")
	g, endErr := dev.EndCapture(s)
	if endErr == nil {
		g.Close()
	}
	return info, endErr
}

// words reads n uint32 words at p.
func words(dev cuda.Device, p cuda.DevicePtr, n int) ([]uint32, error) {
	b := make([]byte, 4*n)
	if err := dev.CopyDtoH(b, p); err != nil {
		return nil, err
	}
	w := make([]uint32, n)
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w, nil
}

func allEqual(w []uint32, v uint32) bool {
	for _, x := range w {
		if x != v {
			return false
		}
	}
	return true
}

func okStr(ok bool) string {
	if ok {
		return "ok"
	}
	return "BAD"
}

// ---- cases ----

func caseMemory(dev cuda.Device) (string, error) {
	var c checker
	const size = 1 << 20
	p, err := dev.Alloc(size)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(p)
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	c.must(dev.Memset32(p, 0xdeadbeef, size/4, s), "Memset32")
	c.must(s.Synchronize(), "Synchronize")
	w, err := words(dev, p, size/4)
	c.must(err, "CopyDtoH")
	memsetOK := err == nil && allEqual(w, 0xdeadbeef)

	pattern := make([]byte, 8192)
	for i := range pattern {
		pattern[i] = byte(i*7 + 3)
	}
	c.must(dev.CopyHtoD(p.Add(4096), pattern), "CopyHtoD")
	c.must(dev.CopyDtoD(p.Add(size/2), p.Add(4096), uint64(len(pattern)), s), "CopyDtoD")
	c.must(s.Synchronize(), "Synchronize")
	back := make([]byte, len(pattern))
	c.must(dev.CopyDtoH(back, p.Add(size/2)), "CopyDtoH")
	dtodOK := slices.Equal(back, pattern)
	all := make([]byte, size)
	c.must(dev.CopyDtoH(all, p), "CopyDtoH")
	free, total, err := dev.MemGetInfo()
	c.must(err, "MemGetInfo")
	infoOK := err == nil && total > 0 && free <= total
	c.expect(memsetOK && dtodOK && infoOK, "memset %v, dtod %v, meminfo %v", memsetOK, dtodOK, infoOK)
	return fmt.Sprintf("memset=%s htod+dtod+dtoh=%s meminfo=%s hash=%s",
		okStr(memsetOK), okStr(dtodOK), okStr(infoOK), Hash(all)), c.err
}

// casePinned: page-locked host memory round trip through the device, and
// the frees that must fail (part of a buffer, a Go slice, a second free)
// without reaching the driver.
func casePinned(dev cuda.Device) (string, error) {
	var c checker
	const size = 3<<20 + 5
	up, err := dev.PinnedAlloc(size)
	if !c.must(err, "PinnedAlloc") {
		return "alloc=" + code(err), c.err
	}
	down, err := dev.PinnedAlloc(size)
	if !c.must(err, "PinnedAlloc") {
		dev.PinnedFree(up)
		return "alloc=" + code(err), c.err
	}
	for i := range up {
		up[i] = byte(i*13 + 1)
	}
	p, err := dev.Alloc(size)
	if !c.must(err, "Alloc") {
		dev.PinnedFree(up)
		dev.PinnedFree(down)
		return "dev_alloc=" + code(err), c.err
	}
	defer dev.Free(p)
	c.must(dev.CopyHtoD(p, up), "CopyHtoD")
	c.must(dev.CopyDtoH(down, p), "CopyDtoH")
	roundOK := slices.Equal(up, down)
	// The same round trip enqueued on a stream, in two halves each way.
	asyncOK := false
	if st, err := dev.NewStream(); c.must(err, "NewStream") {
		for i := range up {
			up[i] = byte(i*7 + 3)
		}
		clear(down)
		h := uint64(size / 2)
		c.must(dev.CopyHtoDAsync(p, up[:h], st), "CopyHtoDAsync")
		c.must(dev.CopyHtoDAsync(p.Add(h), up[h:], st), "CopyHtoDAsync")
		c.must(dev.CopyDtoHAsync(down[:h], p, st), "CopyDtoHAsync")
		c.must(dev.CopyDtoHAsync(down[h:], p.Add(h), st), "CopyDtoHAsync")
		c.must(st.Synchronize(), "Synchronize")
		asyncOK = slices.Equal(up, down)
		c.must(st.Close(), "stream Close")
	}
	part := code(dev.PinnedFree(up[:size/2]))
	goSlice := code(dev.PinnedFree(make([]byte, 16)))
	_, zeroErr := dev.PinnedAlloc(0)
	zero := code(zeroErr)
	c.must(dev.PinnedFree(up), "PinnedFree")
	c.must(dev.PinnedFree(down), "PinnedFree")
	again := code(dev.PinnedFree(up))
	c.expect(roundOK, "pinned round trip differs")
	c.expect(asyncOK, "pinned async round trip differs")
	return fmt.Sprintf("roundtrip=%s async=%s free_part=%s free_go=%s alloc_0=%s free_again=%s",
		okStr(roundOK), okStr(asyncOK), part, goSlice, zero, again), c.err
}

// saxpyInputs returns the suite's x and y for n elements.
func saxpyInputs(n int) (x, y []float32) {
	x, y = make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = float32(i%17)*0.37 - 1.5
		y[i] = float32(i)*0.125 + 0.1
	}
	return x, y
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

type kernels struct {
	mod         cuda.Module
	fill, saxpy cuda.Function
}

func loadKernels(dev cuda.Device) (*kernels, error) {
	m, err := dev.LoadModule(PTX)
	if err != nil {
		return nil, fmt.Errorf("LoadModule: %w", err)
	}
	k := &kernels{mod: m}
	if k.fill, err = m.Function("fill_u32"); err == nil {
		k.saxpy, err = m.Function("saxpy")
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return k, nil
}

const (
	kn    = 1000 // not a multiple of the block, to test the bound
	block = 256
)

func grid(n int) cuda.Dim3 { return cuda.D1(uint32((n + block - 1) / block)) }

func caseKernelEager(dev cuda.Device) (string, error) {
	var c checker
	k, err := loadKernels(dev)
	if !c.must(err, "kernels") {
		return "load=" + code(err), c.err
	}
	defer k.mod.Close()
	_, err = k.mod.Function("no_such_kernel")
	missing := code(err)
	c.expect(cuda.Code(err) == cuda.ErrorNotFound, "missing kernel: %v", err)

	buf, err := dev.Alloc(3 * 4 * kn)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(buf)
	xp, yp, zp := buf, buf.Add(4*kn), buf.Add(8*kn)
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	x, y := saxpyInputs(kn)
	c.must(dev.CopyHtoD(xp, f32bytes(x)), "CopyHtoD x")
	c.must(dev.CopyHtoD(yp, f32bytes(y)), "CopyHtoD y")
	c.must(dev.Memset32(zp, 0, kn, s), "Memset32")
	const a = float32(1.75)
	c.must(dev.Launch(k.saxpy, grid(kn), cuda.D1(block), 0, s, cuda.Ptr(yp), cuda.Ptr(xp), cuda.F32(a), cuda.U32(kn)), "Launch saxpy")
	// fill only the first kn-10 words: the rest must stay 0.
	c.must(dev.Launch(k.fill, grid(kn), cuda.D1(block), 0, s, cuda.Ptr(zp), cuda.U32(0x3f800000), cuda.U32(kn-10)), "Launch fill")
	c.must(s.Synchronize(), "Synchronize")
	got := make([]byte, 4*kn)
	c.must(dev.CopyDtoH(got, yp), "CopyDtoH y")
	want := make([]float32, kn)
	for i := range want {
		want[i] = SaxpyRef(a, x[i], y[i])
	}
	saxpyOK := slices.Equal(got, f32bytes(want))
	z, err := words(dev, zp, kn)
	c.must(err, "CopyDtoH z")
	fillOK := err == nil && allEqual(z[:kn-10], 0x3f800000) && allEqual(z[kn-10:], 0)
	c.expect(saxpyOK && fillOK, "saxpy %v, fill %v", saxpyOK, fillOK)
	return fmt.Sprintf("missing=%s saxpy=%s fill=%s hash=%s", missing, okStr(saxpyOK), okStr(fillOK), Hash(got)), c.err
}

func caseKernelGraph(dev cuda.Device) (string, error) {
	var c checker
	k, err := loadKernels(dev)
	if !c.must(err, "kernels") {
		return "load=" + code(err), c.err
	}
	defer k.mod.Close()
	buf, err := dev.Alloc(4 * 4 * kn)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(buf)
	xp, yp, zp, wp := buf, buf.Add(4*kn), buf.Add(8*kn), buf.Add(12*kn)
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	x, y := saxpyInputs(kn)
	c.must(dev.CopyHtoD(xp, f32bytes(x)), "CopyHtoD x")
	c.must(dev.CopyHtoD(yp, f32bytes(y)), "CopyHtoD y")
	c.must(dev.Memset32(zp, 0, 2*kn, s), "Memset32")
	c.must(s.Synchronize(), "Synchronize")

	const a = float32(-0.625)
	if !c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture") {
		return "begin=" + code(c.err), c.err
	}
	c.must(dev.Launch(k.fill, grid(kn), cuda.D1(block), 0, s, cuda.Ptr(zp), cuda.U32(7), cuda.U32(kn)), "Launch fill")
	c.must(dev.Launch(k.saxpy, grid(kn), cuda.D1(block), 0, s, cuda.Ptr(yp), cuda.Ptr(xp), cuda.F32(a), cuda.U32(kn)), "Launch saxpy")
	c.must(dev.Memset32(wp, 0x01020304, kn, s), "Memset32")
	g, err := dev.EndCapture(s)
	if !c.must(err, "EndCapture") {
		return "end=" + code(err), c.err
	}
	defer g.Close()
	// Nothing ran during capture.
	z, err := words(dev, zp, kn)
	c.must(err, "CopyDtoH")
	notRun := err == nil && allEqual(z, 0)
	nodes, err := g.Nodes()
	c.must(err, "Nodes")
	var types []string
	for _, n := range nodes {
		t, err := g.NodeType(n)
		c.must(err, "NodeType")
		types = append(types, t.String())
	}
	sort.Strings(types)
	x1, err := g.Instantiate(0)
	if !c.must(err, "Instantiate") {
		return "instantiate=" + code(err), c.err
	}
	defer x1.Close()
	const replays = 3
	for i := 0; i < replays; i++ {
		c.must(x1.Launch(s), "Exec.Launch")
	}
	c.must(s.Synchronize(), "Synchronize")
	want := slices.Clone(y)
	for r := 0; r < replays; r++ {
		for i := range want {
			want[i] = SaxpyRef(a, x[i], want[i])
		}
	}
	got := make([]byte, 4*kn)
	c.must(dev.CopyDtoH(got, yp), "CopyDtoH y")
	replayOK := slices.Equal(got, f32bytes(want))
	z, err = words(dev, zp, kn)
	c.must(err, "CopyDtoH z")
	w, err2 := words(dev, wp, kn)
	c.must(err2, "CopyDtoH w")
	othersOK := err == nil && err2 == nil && allEqual(z, 7) && allEqual(w, 0x01020304)
	c.expect(notRun && replayOK && othersOK && len(nodes) == 3,
		"not run during capture %v, replay %v, fill+memset %v, %d nodes", notRun, replayOK, othersOK, len(nodes))
	return fmt.Sprintf("capture_ran_nothing=%s nodes=%d types=%s replays=%d saxpy=%s fill+memset=%s hash=%s",
		okStr(notRun), len(nodes), strings.Join(types, ","), replays, okStr(replayOK), okStr(othersOK), Hash(got)), c.err
}

// caseLaunchEx runs fill then saxpy twice with LaunchEx (the saxpys with
// programmatic serialization), eagerly and captured, and requires the bytes
// of plain Launch; the captured graph is a chain of three kernel nodes.
func caseLaunchEx(dev cuda.Device) (string, error) {
	var c checker
	major, _, err := dev.ComputeCapability()
	c.must(err, "ComputeCapability")
	c.expect(major >= 1, "compute capability major %d", major)
	sms, err := dev.Multiprocessors()
	c.must(err, "Multiprocessors")
	c.expect(sms >= 1, "%d multiprocessors", sms)
	k, err := loadKernels(dev)
	if !c.must(err, "kernels") {
		return "load=" + code(err), c.err
	}
	defer k.mod.Close()
	buf, err := dev.Alloc(5 * 4 * kn)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(buf)
	xp, yPlain, yEx, yGraph, zp := buf, buf.Add(4*kn), buf.Add(8*kn), buf.Add(12*kn), buf.Add(16*kn)
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	x, y := saxpyInputs(kn)
	c.must(dev.CopyHtoD(xp, f32bytes(x)), "CopyHtoD x")
	for _, p := range []cuda.DevicePtr{yPlain, yEx, yGraph} {
		c.must(dev.CopyHtoD(p, f32bytes(y)), "CopyHtoD y")
	}
	const a = float32(0.375)
	cfg := func(pdl bool) cuda.LaunchConfig {
		return cuda.LaunchConfig{Grid: grid(kn), Block: cuda.D1(block), Stream: s, ProgrammaticSerialization: pdl}
	}
	// Plain launches, then the same with LaunchEx.
	c.must(dev.Launch(k.fill, grid(kn), cuda.D1(block), 0, s, cuda.Ptr(zp), cuda.U32(5), cuda.U32(kn)), "Launch fill")
	for i := 0; i < 2; i++ {
		c.must(dev.Launch(k.saxpy, grid(kn), cuda.D1(block), 0, s, cuda.Ptr(yPlain), cuda.Ptr(xp), cuda.F32(a), cuda.U32(kn)), "Launch saxpy")
	}
	seq := func(y cuda.DevicePtr) {
		c.must(dev.LaunchEx(k.fill, cfg(false), cuda.Ptr(zp), cuda.U32(9), cuda.U32(kn)), "LaunchEx fill")
		for i := 0; i < 2; i++ {
			c.must(dev.LaunchEx(k.saxpy, cfg(true), cuda.Ptr(y), cuda.Ptr(xp), cuda.F32(a), cuda.U32(kn)), "LaunchEx saxpy")
		}
	}
	seq(yEx)
	c.must(s.Synchronize(), "Synchronize")
	plain := make([]byte, 4*kn)
	c.must(dev.CopyDtoH(plain, yPlain), "CopyDtoH plain")
	ex := make([]byte, 4*kn)
	c.must(dev.CopyDtoH(ex, yEx), "CopyDtoH ex")
	want := slices.Clone(y)
	for r := 0; r < 2; r++ {
		for i := range want {
			want[i] = SaxpyRef(a, x[i], want[i])
		}
	}
	eagerOK := slices.Equal(plain, f32bytes(want)) && slices.Equal(ex, plain)
	z, err := words(dev, zp, kn)
	c.must(err, "CopyDtoH z")
	fillOK := err == nil && allEqual(z, 9)

	// Captured: three kernel nodes in a chain; one replay = the eager run.
	if !c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture") {
		return "begin=" + code(c.err), c.err
	}
	seq(yGraph)
	g, err := dev.EndCapture(s)
	if !c.must(err, "EndCapture") {
		return "end=" + code(err), c.err
	}
	defer g.Close()
	nodes, err := g.Nodes()
	c.must(err, "Nodes")
	var types []string
	chain := 0
	for _, n := range nodes {
		t, err := g.NodeType(n)
		c.must(err, "NodeType")
		types = append(types, t.String())
		depth := 1
		for m := n; ; depth++ {
			deps, err := g.Dependencies(m)
			if !c.must(err, "Dependencies") || len(deps) != 1 {
				break
			}
			m = deps[0]
		}
		chain = max(chain, depth)
	}
	sort.Strings(types)
	xg, err := g.Instantiate(0)
	if !c.must(err, "Instantiate") {
		return "instantiate=" + code(err), c.err
	}
	defer xg.Close()
	c.must(xg.Launch(s), "Exec.Launch")
	c.must(s.Synchronize(), "Synchronize")
	got := make([]byte, 4*kn)
	c.must(dev.CopyDtoH(got, yGraph), "CopyDtoH graph")
	graphOK := slices.Equal(got, plain)
	c.expect(eagerOK && fillOK && graphOK && len(nodes) == 3 && chain == 3,
		"eager %v, fill %v, replay %v, %d nodes, chain %d", eagerOK, fillOK, graphOK, len(nodes), chain)
	return fmt.Sprintf("eager_ex=plain:%s fill=%s nodes=%d types=%s chain=%d replay=plain:%s hash=%s",
		okStr(eagerOK), okStr(fillOK), len(nodes), strings.Join(types, ","), chain, okStr(graphOK), Hash(got)), c.err
}

func caseCaptureAlloc(dev cuda.Device) (string, error) {
	var c checker
	s, p, done, fail := c.streamAndBuffer(dev, 4096)
	if fail != "" {
		return fail, c.err
	}
	defer done()
	c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture")
	c.must(dev.Memset32(p, 1, 1024, s), "Memset32")
	q, allocErr := dev.Alloc(4096)
	if allocErr == nil {
		dev.Free(q)
	}
	info, endErr := c.endCapture(dev, s)
	after, err := dev.CaptureInfo(s)
	c.must(err, "CaptureInfo after")
	q, againErr := dev.Alloc(4096)
	if againErr == nil {
		dev.Free(q)
	}
	c.expect(cuda.Code(allocErr) == cuda.ErrorStreamCaptureUnsupported, "Alloc in capture: %v", allocErr)
	c.expect(cuda.Code(endErr) == cuda.ErrorStreamCaptureInvalidated, "EndCapture: %v", endErr)
	c.expect(againErr == nil, "Alloc after capture: %v", againErr)
	return fmt.Sprintf("alloc=%s status=%s end=%s status_after=%s alloc_after=%s",
		code(allocErr), info.Status, code(endErr), after.Status, code(againErr)), c.err
}

func caseCaptureFree(dev cuda.Device) (string, error) {
	var c checker
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	p, err := dev.Alloc(4096)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture")
	c.must(dev.Memset32(p, 1, 1024, s), "Memset32")
	freeErr := dev.Free(p)
	info, endErr := c.endCapture(dev, s)
	againErr := dev.Free(p)
	c.expect(cuda.Code(freeErr) == cuda.ErrorStreamCaptureUnsupported, "Free in capture: %v", freeErr)
	c.expect(cuda.Code(endErr) == cuda.ErrorStreamCaptureInvalidated, "EndCapture: %v", endErr)
	c.expect(againErr == nil, "Free after capture: %v", againErr)
	return fmt.Sprintf("free=%s status=%s end=%s free_after=%s",
		code(freeErr), info.Status, code(endErr), code(againErr)), c.err
}

func caseCapturedEvent(dev cuda.Device) (string, error) {
	var c checker
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	e, err := dev.NewEvent(false)
	if !c.must(err, "NewEvent") {
		return "event=" + code(err), c.err
	}
	defer e.Close()
	p, err := dev.Alloc(4096)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(p)
	c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture")
	c.must(dev.Memset32(p, 1, 1024, s), "Memset32")
	c.must(e.Record(s), "Record")
	queryErr := e.Query()
	info, endErr := c.endCapture(dev, s)
	// The query fails, and (driver 580) invalidates the capture.
	c.expect(cuda.Code(queryErr) == cuda.ErrorCapturedEvent, "Query in capture: %v", queryErr)
	c.expect(cuda.Code(endErr) == cuda.ErrorStreamCaptureInvalidated, "EndCapture: %v", endErr)
	// A fresh record outside capture is an ordinary event again.
	c.must(e.Record(s), "Record after")
	c.must(e.Synchronize(), "Synchronize after")
	afterErr := e.Query()
	c.expect(afterErr == nil, "Query after a fresh record: %v", afterErr)
	return fmt.Sprintf("query=%s status=%s end=%s query_after_rerecord=%s",
		code(queryErr), info.Status, code(endErr), code(afterErr)), c.err
}

func caseForkJoin(dev cuda.Device) (string, error) {
	var c checker
	var streams [2]cuda.Stream
	var events [2]cuda.Event
	for i := range streams {
		s, err := dev.NewStream()
		if !c.must(err, "NewStream") {
			return "stream=" + code(err), c.err
		}
		defer s.Close()
		streams[i] = s
		e, err := dev.NewEvent(false)
		if !c.must(err, "NewEvent") {
			return "event=" + code(err), c.err
		}
		defer e.Close()
		events[i] = e
	}
	s0, s1 := streams[0], streams[1]
	const words4 = 1024
	buf, err := dev.Alloc(4 * 4 * words4)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(buf)
	part := func(i int) cuda.DevicePtr { return buf.Add(uint64(4 * words4 * i)) }
	var l Label
	terms := func(s cuda.Stream) ([]cuda.GraphNode, uint64) {
		info, err := dev.CaptureInfo(s)
		c.must(err, "CaptureInfo")
		c.expect(info.Status == cuda.CaptureActive, "capture status %v", info.Status)
		return info.Terminals, info.ID
	}
	c.must(dev.BeginCapture(s0, cuda.CaptureModeGlobal), "BeginCapture")
	c.must(dev.Memset32(part(0), 1, words4, s0), "Memset A")
	t, id0 := terms(s0)
	if len(t) == 1 {
		l.Set(t[0], "a")
	}
	c.must(events[0].Record(s0), "Record e0")
	c.must(s1.WaitEvent(events[0]), "s1 wait e0")
	t1, id1 := terms(s1)
	forkTerms := l.List(t1)
	c.must(dev.Memset32(part(1), 2, words4, s1), "Memset B")
	if t, _ := terms(s1); len(t) == 1 {
		l.Set(t[0], "b")
	}
	c.must(dev.Memset32(part(2), 3, words4, s0), "Memset C")
	if t, _ := terms(s0); len(t) == 1 {
		l.Set(t[0], "c")
	}
	c.must(events[1].Record(s1), "Record e1")
	c.must(s0.WaitEvent(events[1]), "s0 wait e1")
	tj, _ := terms(s0)
	joinTerms := l.List(tj)
	c.must(dev.Memset32(part(3), 4, words4, s0), "Memset D")
	if t, _ := terms(s0); len(t) == 1 {
		l.Set(t[0], "d")
	}
	g, err := dev.EndCapture(s0)
	if !c.must(err, "EndCapture") {
		return "end=" + code(err), c.err
	}
	defer g.Close()
	nodes, err := g.Nodes()
	c.must(err, "Nodes")
	var deps []string
	for _, n := range nodes {
		d, err := g.Dependencies(n)
		c.must(err, "Dependencies")
		deps = append(deps, l.Name(n)+"<-"+l.List(d))
	}
	sort.Strings(deps)
	x, err := g.Instantiate(0)
	if !c.must(err, "Instantiate") {
		return "instantiate=" + code(err), c.err
	}
	defer x.Close()
	c.must(dev.Memset32(buf, 0, 4*words4, s0), "clear")
	c.must(x.Launch(s0), "Exec.Launch")
	c.must(s0.Synchronize(), "Synchronize")
	w, err := words(dev, buf, 4*words4)
	c.must(err, "CopyDtoH")
	replayOK := err == nil
	for i := 0; replayOK && i < 4; i++ {
		replayOK = allEqual(w[i*words4:(i+1)*words4], uint32(i+1))
	}
	sameID := id0 != 0 && id0 == id1
	wantDeps := "a<-[] b<-[a] c<-[a] d<-[b c]"
	c.expect(sameID && forkTerms == "[a]" && joinTerms == "[b c]" && strings.Join(deps, " ") == wantDeps && replayOK,
		"same id %v, fork %s, join %s, deps %s, replay %v", sameID, forkTerms, joinTerms, deps, replayOK)
	return fmt.Sprintf("same_capture_id=%v s1_after_wait=%s s0_after_join=%s nodes=%d deps=%s replay=%s",
		sameID, forkTerms, joinTerms, len(nodes), strings.Join(deps, " "), okStr(replayOK)), c.err
}

func caseUnjoined(dev cuda.Device) (string, error) {
	var c checker
	s0, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s0.Close()
	s1, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s1.Close()
	e, err := dev.NewEvent(false)
	if !c.must(err, "NewEvent") {
		return "event=" + code(err), c.err
	}
	defer e.Close()
	p, err := dev.Alloc(8192)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(p)
	c.must(dev.BeginCapture(s0, cuda.CaptureModeGlobal), "BeginCapture")
	c.must(dev.Memset32(p, 1, 1024, s0), "Memset")
	c.must(e.Record(s0), "Record")
	c.must(s1.WaitEvent(e), "WaitEvent")
	c.must(dev.Memset32(p.Add(4096), 2, 1024, s1), "Memset side")
	g, endErr := dev.EndCapture(s0)
	if endErr == nil {
		g.Close()
	}
	i0, err := dev.CaptureInfo(s0)
	c.must(err, "CaptureInfo s0")
	i1, err := dev.CaptureInfo(s1)
	c.must(err, "CaptureInfo s1")
	c.expect(cuda.Code(endErr) == cuda.ErrorStreamCaptureUnjoined, "EndCapture: %v", endErr)
	return fmt.Sprintf("end=%s s0_after=%s s1_after=%s", code(endErr), i0.Status, i1.Status), c.err
}

func caseEmptyNode(dev cuda.Device) (string, error) {
	var c checker
	s, p, done, fail := c.streamAndBuffer(dev, 8192)
	if fail != "" {
		return fail, c.err
	}
	defer done()
	var l Label
	c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture")
	c.must(dev.Memset32(p, 5, 1024, s), "Memset 1")
	info, err := dev.CaptureInfo(s)
	if !c.must(err, "CaptureInfo") || info.Graph == nil || len(info.Terminals) != 1 {
		c.expect(false, "capture info %+v", info)
		dev.EndCapture(s)
		return "info=" + code(err), c.err
	}
	n1 := info.Terminals[0]
	l.Set(n1, "m1")
	e, err := info.Graph.AddEmptyNode([]cuda.GraphNode{n1})
	c.must(err, "AddEmptyNode")
	l.Set(e, "e")
	closeErr := info.Graph.Close() // the capture owns it
	c.must(dev.UpdateCaptureDependencies(s, []cuda.GraphNode{e}, cuda.DepsSet), "Update(SET)")
	afterSet, err := dev.CaptureInfo(s)
	c.must(err, "CaptureInfo")
	c.must(dev.UpdateCaptureDependencies(s, []cuda.GraphNode{n1}, cuda.DepsAdd), "Update(ADD)")
	afterAdd, err := dev.CaptureInfo(s)
	c.must(err, "CaptureInfo")
	c.must(dev.Memset32(p.Add(4096), 6, 1024, s), "Memset 2")
	last, err := dev.CaptureInfo(s)
	c.must(err, "CaptureInfo")
	if len(last.Terminals) == 1 {
		l.Set(last.Terminals[0], "m2")
	}
	g, err := dev.EndCapture(s)
	if !c.must(err, "EndCapture") {
		return "end=" + code(err), c.err
	}
	defer g.Close()
	nodes, err := g.Nodes()
	c.must(err, "Nodes")
	var deps []string
	for _, n := range nodes {
		d, err := g.Dependencies(n)
		c.must(err, "Dependencies")
		t, err := g.NodeType(n)
		c.must(err, "NodeType")
		deps = append(deps, l.Name(n)+":"+t.String()+"<-"+l.List(d))
	}
	sort.Strings(deps)
	x, err := g.Instantiate(cuda.InstantiateAutoFreeOnLaunch)
	if !c.must(err, "Instantiate") {
		return "instantiate=" + code(err), c.err
	}
	defer x.Close()
	c.must(x.Launch(s), "Exec.Launch")
	c.must(s.Synchronize(), "Synchronize")
	w, err := words(dev, p, 2048)
	c.must(err, "CopyDtoH")
	replayOK := err == nil && allEqual(w[:1024], 5) && allEqual(w[1024:], 6)
	line := fmt.Sprintf("close_capture_graph=%s after_set=%s after_add=%s nodes=%d deps=%s replay=%s",
		code(closeErr), l.List(afterSet.Terminals), l.List(afterAdd.Terminals), len(nodes), strings.Join(deps, " "), okStr(replayOK))
	c.expect(closeErr != nil && replayOK && len(nodes) == 3 &&
		strings.Join(deps, " ") == "e:EMPTY<-[m1] m1:MEMSET<-[] m2:MEMSET<-[e m1]",
		"unexpected: %s", line)
	return line, c.err
}

func caseVMMCapture(dev cuda.Device) (string, error) {
	var c checker
	gmin, err := dev.Granularity(false)
	c.must(err, "Granularity(min)")
	grec, err := dev.Granularity(true)
	c.must(err, "Granularity(recommended)")
	if c.err != nil || gmin == 0 {
		return "granularity=" + code(c.err), c.err
	}
	size := 2 * gmin
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	va, err := dev.AddressReserve(size, 0)
	if !c.must(err, "AddressReserve") {
		return "reserve=" + code(err), c.err
	}
	_, oddErr := dev.MemCreate(gmin + 4096)
	c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture")
	h, createErr := dev.MemCreate(size)
	mapErr := dev.MemMap(va, size, h)
	accessErr := dev.MemSetAccess(va, size)
	c.must(dev.Memset32(va, 0xabcdef01, size/4, s), "Memset32")
	info, err := dev.CaptureInfo(s)
	c.must(err, "CaptureInfo")
	g, endErr := dev.EndCapture(s)
	replayOK := false
	if endErr == nil {
		x, err := g.Instantiate(0)
		if c.must(err, "Instantiate") {
			c.must(x.Launch(s), "Exec.Launch")
			c.must(s.Synchronize(), "Synchronize")
			first, err1 := words(dev, va, 1)
			last, err2 := words(dev, va.Add(size-4), 1)
			replayOK = err1 == nil && err2 == nil && first[0] == 0xabcdef01 && last[0] == 0xabcdef01
			x.Close()
		}
		g.Close()
	}
	unmapErr := dev.MemUnmap(va, size)
	releaseErr := dev.MemRelease(h)
	freeErr := dev.AddressFree(va, size)
	line := fmt.Sprintf("gran_min=%d gran_rec=%d create_unaligned=%s in_capture: create=%s map=%s access=%s status=%s end=%s replay=%s unmap=%s release=%s addr_free=%s",
		gmin, grec, code(oddErr), code(createErr), code(mapErr), code(accessErr), info.Status, code(endErr), okStr(replayOK),
		code(unmapErr), code(releaseErr), code(freeErr))
	c.expect(createErr == nil && mapErr == nil && accessErr == nil && info.Status == cuda.CaptureActive &&
		endErr == nil && replayOK && unmapErr == nil && releaseErr == nil && freeErr == nil && oddErr != nil,
		"unexpected: %s", line)
	return line, c.err
}

func caseExecUpdate(dev cuda.Device) (string, error) {
	var c checker
	k, err := loadKernels(dev)
	if !c.must(err, "kernels") {
		return "load=" + code(err), c.err
	}
	defer k.mod.Close()
	s, p, done, fail := c.streamAndBuffer(dev, 8*kn)
	if fail != "" {
		return fail, c.err
	}
	defer done()
	capture := func(values ...uint32) cuda.Graph {
		if !c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture") {
			return nil
		}
		for i, v := range values {
			c.must(dev.Launch(k.fill, grid(kn), cuda.D1(block), 0, s, cuda.Ptr(p.Add(uint64(4*kn*i))), cuda.U32(v), cuda.U32(kn)), "Launch")
		}
		g, err := dev.EndCapture(s)
		c.must(err, "EndCapture")
		return g
	}
	g1 := capture(11)
	if g1 == nil {
		return "capture=" + code(c.err), c.err
	}
	defer g1.Close()
	x, err := g1.Instantiate(0)
	if !c.must(err, "Instantiate") {
		return "instantiate=" + code(err), c.err
	}
	defer x.Close()
	c.must(x.Launch(s), "Launch 1")
	c.must(s.Synchronize(), "Synchronize")
	w, err := words(dev, p, kn)
	first := err == nil && allEqual(w, 11)

	g2 := capture(22)
	if g2 == nil {
		return "capture=" + code(c.err), c.err
	}
	defer g2.Close()
	sameRes, sameErr := x.Update(g2)
	c.must(x.Launch(s), "Launch 2")
	c.must(s.Synchronize(), "Synchronize")
	w, err = words(dev, p, kn)
	updated := err == nil && allEqual(w, 22)

	g3 := capture(33, 44)
	if g3 == nil {
		return "capture=" + code(c.err), c.err
	}
	defer g3.Close()
	diffRes, diffErr := x.Update(g3)
	line := fmt.Sprintf("first=%s same_topology=%s/%s replay_after_update=%s other_topology=%s/%s",
		okStr(first), sameRes, code(sameErr), okStr(updated), diffRes, code(diffErr))
	c.expect(first && sameErr == nil && sameRes == cuda.UpdateSuccess && updated &&
		cuda.Code(diffErr) == cuda.ErrorGraphExecUpdateFailure && diffRes == cuda.UpdateTopologyChanged,
		"unexpected: %s", line)
	return line, c.err
}

func caseMemInfoVMM(dev cuda.Device) (string, error) {
	var c checker
	gran, err := dev.Granularity(false)
	if !c.must(err, "Granularity") {
		return "granularity=" + code(err), c.err
	}
	size := alignUp(64<<20, gran)
	va, err := dev.AddressReserve(size, 0)
	if !c.must(err, "AddressReserve") {
		return "reserve=" + code(err), c.err
	}
	defer dev.AddressFree(va, size)
	c.must(dev.Synchronize(), "Synchronize")
	free0, _, err := dev.MemGetInfo()
	c.must(err, "MemGetInfo")
	h, err := dev.MemCreate(size)
	if !c.must(err, "MemCreate") {
		return "create=" + code(err), c.err
	}
	c.must(dev.MemMap(va, size, h), "MemMap")
	c.must(dev.MemSetAccess(va, size), "MemSetAccess")
	free1, _, err := dev.MemGetInfo()
	c.must(err, "MemGetInfo")
	c.must(dev.MemUnmap(va, size), "MemUnmap")
	c.must(dev.MemRelease(h), "MemRelease")
	free2, _, err := dev.MemGetInfo()
	c.must(err, "MemGetInfo")
	took := free0 >= free1 && free0-free1 >= size
	returned := free2 >= free1 && free2-free1 >= size
	c.expect(took && returned, "free %d -> %d -> %d for %d bytes", free0, free1, free2, size)
	return fmt.Sprintf("create_took>=size=%v release_returned>=size=%v", took, returned), c.err
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) / a * a }

func caseEvents(dev cuda.Device) (string, error) {
	var c checker
	s, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s.Close()
	var ev [3]cuda.Event
	for i := range ev {
		e, err := dev.NewEvent(i < 2)
		if !c.must(err, "NewEvent") {
			return "event=" + code(err), c.err
		}
		defer e.Close()
		ev[i] = e
	}
	p, err := dev.Alloc(1 << 20)
	if !c.must(err, "Alloc") {
		return "alloc=" + code(err), c.err
	}
	defer dev.Free(p)
	c.must(ev[0].Record(s), "Record start")
	c.must(dev.Memset32(p, 9, 1<<18, s), "Memset32")
	c.must(ev[1].Record(s), "Record end")
	c.must(ev[2].Record(s), "Record untimed")
	c.must(ev[1].Synchronize(), "Synchronize")
	c.must(ev[2].Synchronize(), "Synchronize")
	queryErr := ev[1].Query()
	d, elapsedErr := dev.ElapsedTime(ev[0], ev[1])
	_, untimedErr := dev.ElapsedTime(ev[0], ev[2])
	// s1 waits for an event of s: the memset must be visible after s1 syncs.
	s1, err := dev.NewStream()
	if !c.must(err, "NewStream") {
		return "stream=" + code(err), c.err
	}
	defer s1.Close()
	c.must(dev.Memset32(p, 10, 1<<18, s), "Memset32")
	c.must(ev[2].Record(s), "Record")
	c.must(s1.WaitEvent(ev[2]), "WaitEvent")
	c.must(dev.CopyDtoD(p.Add(1<<19), p, 4096, s1), "CopyDtoD")
	c.must(s1.Synchronize(), "Synchronize")
	w, err := words(dev, p.Add(1<<19), 1024)
	waitOK := err == nil && allEqual(w, 10)
	line := fmt.Sprintf("query=%s elapsed=%s elapsed>=0=%v untimed=%s wait=%s",
		code(queryErr), code(elapsedErr), d >= 0, code(untimedErr), okStr(waitOK))
	c.expect(queryErr == nil && elapsedErr == nil && d >= 0 && untimedErr != nil && waitOK, "unexpected: %s", line)
	return line, c.err
}

// caseCaptureSyncCopy records what a synchronous copy does during a global
// capture. On driver 580 it runs (on the legacy stream, which does not wait
// for the non-blocking capturing stream) and the capture stays active.
func caseCaptureSyncCopy(dev cuda.Device) (string, error) {
	var c checker
	s, p, done, fail := c.streamAndBuffer(dev, 4096)
	if fail != "" {
		return fail, c.err
	}
	defer done()
	c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture")
	c.must(dev.Memset32(p, 1, 1024, s), "Memset32")
	b := make([]byte, 16)
	copyErr := dev.CopyDtoH(b, p)
	info, endErr := c.endCapture(dev, s)
	c.expect(copyErr == nil && endErr == nil, "copy %v, end %v", copyErr, endErr)
	return fmt.Sprintf("dtoh=%s status=%s end=%s", code(copyErr), info.Status, code(endErr)), c.err
}

// caseCaptureSync records what device and stream synchronisation do during
// a global capture.
func caseCaptureSync(dev cuda.Device) (string, error) {
	var c checker
	s, p, done, fail := c.streamAndBuffer(dev, 4096)
	if fail != "" {
		return fail, c.err
	}
	defer done()
	var parts []string
	for _, which := range []string{"device", "stream"} {
		c.must(dev.BeginCapture(s, cuda.CaptureModeGlobal), "BeginCapture")
		c.must(dev.Memset32(p, 1, 1024, s), "Memset32")
		var syncErr error
		if which == "device" {
			syncErr = dev.Synchronize()
		} else {
			syncErr = s.Synchronize()
		}
		info, endErr := c.endCapture(dev, s)
		parts = append(parts, fmt.Sprintf("%s_sync=%s status=%s end=%s", which, code(syncErr), info.Status, code(endErr)))
	}
	c.must(s.Synchronize(), "Synchronize after")
	return strings.Join(parts, " "), c.err
}
