// Command libarenaplan is the shared library PyTorch loads as its CUDA
// allocator (torch.cuda.memory.CUDAPluggableAllocator): the exported C
// functions over package bridge, and nothing else. It is the project's only
// cgo; build it with
//
//	CGO_ENABLED=1 go build -buildmode=c-shared -o libarenaplan.so ./cmd/libarenaplan
//
// which also writes libarenaplan.h with the prototypes. The allocator pair
// has PyTorch's ABI:
//
//	void *arenaplan_torch_alloc(size_t size, int device, cudaStream_t stream);
//	void  arenaplan_torch_free(void *ptr, size_t size, int device, cudaStream_t stream);
//
// arenaplan_torch_alloc throws a C++ exception when it cannot serve a
// request (torch_alloc.cc), as PyTorch's own allocators do; C programs
// call arenaplan_alloc and arenaplan_free instead, which return NULL and
// leave the reason in arenaplan_last_error (per thread, cleared by the
// next allocator call that succeeds).
//
// The pair (and the record_stream hook) are C (fastpath.c): a freed block
// of the spill allocator's default pool is kept there and handed out again
// for the next request of the same size, device and stream without a call
// into Go, while no capture, step or region could want it; everything
// else goes to the Go exports arenaplan_go_*. Every control function
// shuts that path and gives the kept blocks back first (fenced), and so
// does an allocation Go cannot serve before it is tried again.
// ARENAPLAN_FASTPATH=0 keeps it shut.
//
// While the fast path is open, a free it does not keep is queued there
// and handed to Go with the next call (arenaplan_go_alloc and
// arenaplan_go_record_stream take the queued frees and apply them first,
// in order), so that a free costs no call into Go of its own. Every
// control call and statistics read hands the queue over first
// (C.ap_fq_flush, in fenced and reader): Go has seen every free before it
// decides or reports anything.
//
// The control functions return NULL on success or an error message that
// the caller frees with arenaplan_free_string; a NULL out-pointer is an
// error. No Go panic crosses the C boundary: each export recovers and
// reports it as an error. With ARENAPLAN_DEVICE=sim in the environment
// the library runs on the simulated device (for tests without a GPU).
package main

/*
#include <stdlib.h>
#include <stdint.h>
#include "fastpath.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/bridge"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/spill"
)

func main() {}

var (
	once   sync.Once
	lib    *bridge.Bridge
	libErr error
)

func get() (*bridge.Bridge, error) {
	once.Do(func() {
		cfg, err := bridge.ConfigFromEnv(cgetenv)
		if err != nil {
			libErr = err
			return
		}
		lib = bridge.New(cfg)
		watchPauses(lib)
		noFast = cgetenv("ARENAPLAN_FASTPATH") == "0"
	})
	return lib, libErr
}

// cgetenv is C's getenv: it sees what the host program set after start.
func cgetenv(name string) string {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return ""
	}
	return C.GoString(v)
}

// fault, when set (fault.go, built with -tags arenaplan_fault for tests),
// runs at the start of every export with its name: a test makes it panic
// to check that no panic crosses the C boundary.
var fault func(export string)

// call runs f for export on the bridge, turning a panic into an error.
func call(export string, f func(*bridge.Bridge) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("arenaplan: %s: internal error (a bug; please report it): %v", export, r)
		}
	}()
	if fault != nil {
		fault(export)
	}
	b, err := get()
	if err != nil {
		return err
	}
	return f(b)
}

// allocator runs f for an export of the allocator pair, which cannot
// return an error: a failure (or a panic) becomes the calling thread's
// last error (arenaplan_last_error) and success clears it. A C callback
// runs on its caller's thread, so the thread-local error is the caller's.
func allocator(export string, f func(*bridge.Bridge) error) bool {
	err := call(export, f)
	setLastError(err)
	return err == nil
}

// setLastError makes err (nil: none) the calling thread's last error.
func setLastError(err error) {
	if err == nil {
		C.ap_set_error(nil, 0)
		return
	}
	cs := C.CString(err.Error())
	oom := C.int(0)
	if errors.Is(err, arena.ErrOutOfMemory) {
		oom = 1
	}
	C.ap_set_error(cs, oom)
	C.free(unsafe.Pointer(cs))
}

// arenaplan_go_alloc serves arenaplan_alloc (fastpath.c) when its fast
// path cannot, after applying the n frees queued there (applyFrees);
// keepable says whether the block may be kept there at its free
// (bridge.Bridge.AllocCacheable). With grow 0 it maps no memory: it
// returns NULL and sets *wouldGrow where serving would need more (the fast
// path then gives back what it keeps and asks again).
//
//export arenaplan_go_alloc
func arenaplan_go_alloc(size C.size_t, device C.int, stream C.uintptr_t, grow C.int, keepable, wouldGrow *C.int, frees *C.ap_free_entry, n C.int) unsafe.Pointer {
	h := uintptr(stream)
	applyFrees(frees, n, false)
	var p cuda.DevicePtr
	ok := allocator("alloc", func(b *bridge.Bridge) error {
		var keep bool
		var seq uint64
		var err error
		p, keep, seq, err = b.AllocSeq(uint64(size), int(device), h, grow != 0)
		if seq != 0 {
			C.ap_hist_note(C.uint64_t(seq)) // for the host's hook, once the call is back in C
		}
		if errors.Is(err, spill.ErrWouldGrow) {
			*wouldGrow = 1
			return nil
		}
		if err != nil {
			return outOfMemory(uint64(size), int(device), err)
		}
		if keep {
			*keepable = 1
		}
		return nil
	})
	if !ok || p == 0 {
		return nil
	}
	// A device address, never dereferenced by Go.
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}

// outOfMemory words an allocation failure: out of memory as PyTorch words
// it ("CUDA out of memory. Tried to allocate ..."), which retry logic such
// as accelerate's find_executable_batch_size looks for.
func outOfMemory(size uint64, device int, err error) error {
	if !errors.Is(err, arena.ErrOutOfMemory) {
		return err
	}
	return fmt.Errorf("CUDA out of memory. Tried to allocate %s on device %d. arenaplan: %w", fmtBytes(size), device, err)
}

func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}

// arenaplan_go_drain gives the blocks the C fast path keeps back to Go
// (fastpath.c calls it before trying a failed allocation again, and before
// an allocation that would map more memory).
//
//export arenaplan_go_drain
func arenaplan_go_drain() {
	allocator("drain", func(b *bridge.Bridge) error { return fenced(b, func() error { return nil }) })
}

// arenaplan_go_drain_like gives the kept blocks of device and stream of
// one size class (small: at most 1 MiB) back to the bridge, for an
// allocation of that class that would otherwise map more memory, and
// returns how many; the fast path stays open. The stream is a handle, not
// a Go pointer: a small one (a host's own stream numbers) held as
// unsafe.Pointer across a stack copy is fatal to the runtime.
//
//export arenaplan_go_drain_like
func arenaplan_go_drain_like(small C.int, device C.int, stream C.uintptr_t) C.int {
	n := 0
	allocator("drain", func(b *bridge.Bridge) error {
		var errs []error
		var buf [256]C.ap_fp_entry
		for {
			k := int(C.ap_fp_take_like(device, stream, small, &buf[0], C.int(len(buf))))
			for _, e := range buf[:k] {
				errs = append(errs, b.Free(cuda.DevicePtr(e.ptr), int(e.device)))
			}
			n += k
			if k < len(buf) {
				return errors.Join(errs...)
			}
		}
	})
	return C.int(n)
}

// arenaplan_go_free_batch serves arenaplan_free (fastpath.c) for the
// blocks its fast path does not keep: it applies the n frees in order
// (applyFrees). With own 1 the last one is the calling thread's free that
// the fast path could not vouch for: its outcome becomes the thread's
// last error, as an allocator call's does.
//
//export arenaplan_go_free_batch
func arenaplan_go_free_batch(frees *C.ap_free_entry, n C.int, own C.int) {
	applyFrees(frees, n, own != 0)
}

// applyFrees frees, in order, the n blocks of frees (C memory: the fast
// path's queue) and sets each entry's ok to 1 when the bridge freed it. A
// refused free is written to standard error (PyTorch will not see it:
// said where a person will, without flooding the log when the host
// repeats it, warn.c); with own, the last entry's outcome is also the
// calling thread's last error. A panic stops the batch: the entries not
// yet applied stay refused.
func applyFrees(frees *C.ap_free_entry, n C.int, own bool) {
	if n <= 0 {
		return
	}
	es := unsafe.Slice(frees, int(n))
	var ownErr error
	err := call("free", func(b *bridge.Bridge) error {
		for i := range es {
			e := &es[i]
			err := b.Free(cuda.DevicePtr(e.ptr), int(e.device))
			if err != nil {
				cs := C.CString("arenaplan: " + err.Error())
				C.ap_warn(cs)
				C.free(unsafe.Pointer(cs))
				if own && i == len(es)-1 {
					ownErr = err
				}
				continue
			}
			e.ok = 1
		}
		return nil
	})
	if !own {
		return
	}
	if err == nil {
		err = ownErr
	}
	setLastError(err)
}

// arenaplan_go_record_stream serves arenaplan_torch_record_stream
// (fastpath.c), which first makes sure the fast path never keeps ptr,
// after applying the n frees queued there (applyFrees). The pointer and
// the stream are numbers (see handle).
//
//export arenaplan_go_record_stream
func arenaplan_go_record_stream(ptr, stream C.uintptr_t, frees *C.ap_free_entry, n C.int) {
	applyFrees(frees, n, false)
	p, h := cuda.DevicePtr(ptr), uintptr(stream)
	allocator("record_stream", func(b *bridge.Bridge) error {
		return b.RecordStreamAny(p, h)
	})
}

// handle turns a C pointer that is a handle or a device address (a
// stream, a block), never a Go pointer, into a number at once: kept as an
// unsafe.Pointer while the goroutine's stack is copied, a small one (a
// host's stream numbered 0x101) is fatal to the runtime ("invalid pointer
// found on stack").
func handle(p unsafe.Pointer) uintptr { return uintptr(p) }

//export arenaplan_torch_empty_cache
func arenaplan_torch_empty_cache() {
	allocator("empty_cache", func(b *bridge.Bridge) error { return fenced(b, b.EmptyCache) })
}

// arenaplan_captures_underway tells the library how many graph captures
// are underway (see bridge.Bridge.CapturesUnderway).
//
//export arenaplan_captures_underway
func arenaplan_captures_underway(n C.int) {
	allocator("captures_underway", func(b *bridge.Bridge) error {
		return fenced(b, func() error { b.CapturesUnderway(int(n)); return nil })
	})
}

//export arenaplan_free_string
func arenaplan_free_string(s *C.char) { C.free(unsafe.Pointer(s)) }

// errNil is the error for a NULL out-pointer.
func errNil(export, arg string) error {
	return fmt.Errorf("arenaplan: %s: %s is NULL", export, arg)
}

// control runs a control call f of export, fenced, and returns its error
// as a C string.
func control(export string, f func(*bridge.Bridge) error) *C.char {
	err := call(export, func(b *bridge.Bridge) error { return fenced(b, func() error { return f(b) }) })
	if err == nil {
		return nil
	}
	return C.CString(err.Error())
}

//export arenaplan_step_new
func arenaplan_step_new(device C.int, name *C.char, id *C.int) *C.char {
	return control("arenaplan_step_new", func(b *bridge.Bridge) error {
		return setID("arenaplan_step_new", "id", id, func() (*bridge.Step, error) { return b.NewStep(int(device), goString(name)) })
	})
}

// setID makes a step or family with create and sets *id (export's
// argument arg, which must not be NULL) to its ID.
func setID[T interface{ ID() int }](export, arg string, id *C.int, create func() (T, error)) error {
	if id == nil {
		return errNil(export, arg)
	}
	v, err := create()
	if err == nil {
		*id = C.int(v.ID())
	}
	return err
}

// goString is C.GoString (NULL: "").
func goString(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// step runs f on step id.
func step(export string, id C.int, f func(*bridge.Step) error) *C.char {
	return control(export, func(b *bridge.Bridge) error {
		s, err := b.Step(int(id))
		if err != nil {
			return err
		}
		return f(s)
	})
}

// withBudget runs plan with the planning budget of budgetSeconds
// (bridge.BudgetSeconds).
func withBudget(budgetSeconds C.double, plan func(time.Duration) error) error {
	budget, err := bridge.BudgetSeconds(float64(budgetSeconds))
	if err != nil {
		return err
	}
	return plan(budget)
}

// withPath runs f on the plan file path of export, which must not be NULL.
func withPath(export string, path *C.char, f func(string) error) error {
	if path == nil {
		return errNil(export, "path")
	}
	return f(C.GoString(path))
}

//export arenaplan_step_record
func arenaplan_step_record(id C.int, stream unsafe.Pointer) *C.char {
	h := handle(stream)
	return step("arenaplan_step_record", id, func(s *bridge.Step) error { return s.Record(h) })
}

//export arenaplan_step_serve
func arenaplan_step_serve(id C.int, stream unsafe.Pointer, strict C.int) *C.char {
	h := handle(stream)
	return step("arenaplan_step_serve", id, func(s *bridge.Step) error { return s.Serve(h, strict != 0) })
}

//export arenaplan_step_join_capture
func arenaplan_step_join_capture(id C.int) *C.char {
	return step("arenaplan_step_join_capture", id, func(s *bridge.Step) error { return s.JoinCapture() })
}

//export arenaplan_step_end
func arenaplan_step_end(id C.int, failed C.int) *C.char {
	return step("arenaplan_step_end", id, func(s *bridge.Step) error { return s.End(failed != 0) })
}

//export arenaplan_step_plan
func arenaplan_step_plan(id C.int, budgetSeconds C.double) *C.char {
	return step("arenaplan_step_plan", id, func(s *bridge.Step) error { return withBudget(budgetSeconds, s.Plan) })
}

// arenaplan_step_replan plans the step again from its last served run,
// which diverged (bridge.Step.Replan); destroy that run's graph and free
// its outputs first.
//
//export arenaplan_step_replan
func arenaplan_step_replan(id C.int, budgetSeconds C.double) *C.char {
	return step("arenaplan_step_replan", id, func(s *bridge.Step) error { return withBudget(budgetSeconds, s.Replan) })
}

// arenaplan_step_drop_captures gives back the spill pools of the step's
// earlier captures (bridge.Step.DropCaptures); destroy their graphs first.
//
//export arenaplan_step_drop_captures
func arenaplan_step_drop_captures(id C.int) *C.char {
	return step("arenaplan_step_drop_captures", id, func(s *bridge.Step) error { return s.DropCaptures() })
}

//export arenaplan_step_save
func arenaplan_step_save(id C.int, path *C.char) *C.char {
	return step("arenaplan_step_save", id, func(s *bridge.Step) error { return withPath("arenaplan_step_save", path, s.Save) })
}

//export arenaplan_step_load
func arenaplan_step_load(id C.int, path *C.char) *C.char {
	return step("arenaplan_step_load", id, func(s *bridge.Step) error { return withPath("arenaplan_step_load", path, s.Load) })
}

//export arenaplan_step_close
func arenaplan_step_close(id C.int) *C.char {
	return step("arenaplan_step_close", id, func(s *bridge.Step) error { return s.Close() })
}

// setJSON sets *out to v as JSON (free it with arenaplan_free_string).
func setJSON(export string, out **C.char, v func() (any, error)) error {
	if out == nil {
		return errNil(export, "out")
	}
	val, err := v()
	if err != nil {
		return err
	}
	js, err := json.Marshal(val)
	if err != nil {
		return err
	}
	*out = C.CString(string(js))
	return nil
}

// arenaplan_step_report sets *out to the step's report as JSON (free it
// with arenaplan_free_string).
//
//export arenaplan_step_report
func arenaplan_step_report(id C.int, out **C.char) *C.char {
	return step("arenaplan_step_report", id, func(s *bridge.Step) error {
		return setJSON("arenaplan_step_report", out, func() (any, error) { return s.Report(), nil })
	})
}

// FastPath counts, for every device, the allocations the C fast path
// served (Hits) or passed on to Go while open (Misses), the frees it kept
// (Kept), the times a failed allocation (Drains) or one that would have
// mapped more memory (GrowthDrains) made it give its blocks back, the
// second frees of a kept block it refused (DoubleFrees), what it holds
// now (Blocks, Bytes); and the device's allocations that called into Go
// and frees handed to Go (GoAllocs, GoFrees). A steady eager step should
// be served by Hits and Kept, with GrowthDrains and Drains unchanged.
type FastPath struct {
	Hits, Kept, Misses, Drains, GrowthDrains, DoubleFrees, Blocks, Bytes uint64
	GoAllocs, GoFrees                                                    uint64
	// LikeDrains: the kept blocks of one stream and size class given back
	// before Go would have mapped more (GrowthDrains: every kept block,
	// where that was not enough).
	LikeDrains uint64
	// FreeCalls: the calls into Go that carried the device's frees alone
	// (a full queue, a free the fast path could not vouch for, the queue
	// handed over before a control call or a statistics read). The other
	// frees rode along with an allocation or a record_stream: GoFrees -
	// FreeCalls calls saved; GoAllocs + FreeCalls are the allocator pair's
	// calls into Go for the device.
	FreeCalls uint64
}

func fastPathCounts(device int) FastPath {
	var c C.ap_fp_counts
	C.ap_fp_read(&c)
	var d C.ap_dev_stats
	C.ap_dev_read(C.int(device), &d)
	return FastPath{uint64(c.hits), uint64(c.kept), uint64(c.misses), uint64(c.drains), uint64(c.growth_drains), uint64(c.double_frees),
		uint64(c.blocks), uint64(c.bytes), uint64(d.go_allocs), uint64(d.go_frees), uint64(c.like_drains), uint64(d.free_calls)}
}

// arenaplan_stats sets *out to device's counters as JSON. It leaves the
// fast path as it is (see reader): the spill allocator's in-use bytes
// include the blocks the fast path keeps (FastPath.Bytes).
//
//export arenaplan_stats
func arenaplan_stats(device C.int, out **C.char) *C.char {
	return reader("arenaplan_stats", func(b *bridge.Bridge) error {
		return setJSON("arenaplan_stats", out, func() (any, error) {
			st, err := b.Stats(int(device))
			return struct {
				bridge.DeviceStats
				FastPath FastPath
			}{st, fastPathCounts(int(device))}, err
		})
	})
}

var (
	fpMu   sync.Mutex // orders the control calls' fences
	noFast bool       // ARENAPLAN_FASTPATH=0: the C fast path stays shut
)

// fenced runs a control call with the C fast path (fastpath.c) shut, the
// frees it queued applied and the blocks it kept given back to the
// bridge, then opens it again if the bridge allows it
// (bridge.Bridge.FastPathAllowed). The queue is handed over after the
// fast path is shut, so that nothing is queued while f runs.
func fenced(b *bridge.Bridge, f func() error) error {
	fpMu.Lock()
	defer fpMu.Unlock()
	C.ap_fp_set(0)
	C.ap_fq_flush()
	var errs []error
	var buf [256]C.ap_fp_entry
	for {
		n := int(C.ap_fp_take(&buf[0], C.int(len(buf))))
		for _, e := range buf[:n] {
			errs = append(errs, b.Free(cuda.DevicePtr(e.ptr), int(e.device)))
		}
		if n < len(buf) {
			break
		}
	}
	errs = append(errs, f())
	if !noFast && b.FastPathAllowed() {
		C.ap_fp_set(1)
	}
	return errors.Join(errs...)
}

// reader runs a call of export that reads or resets counters and changes
// nothing the fast path depends on: unlike control, it leaves the fast
// path open with the blocks it keeps, so that a program that reads
// torch.cuda.memory_allocated() (or resets a peak) every step does not
// start every step with an empty fast path, each allocation a call into
// Go. The C library's counts are exact at any time; the spill
// allocator's count the kept blocks as in use. The frees the fast path
// queued are handed to Go first, so that what it reads counts them.
func reader(export string, f func(*bridge.Bridge) error) *C.char {
	if err := call(export, func(b *bridge.Bridge) error { C.ap_fq_flush(); return f(b) }); err != nil {
		return C.CString(err.Error())
	}
	return nil
}

// family runs f on family id.
func family(export string, id C.int, f func(*bridge.Family) error) *C.char {
	return control(export, func(b *bridge.Bridge) error {
		fam, err := b.Family(int(id))
		if err != nil {
			return err
		}
		return f(fam)
	})
}

// arenaplan_family_new makes a family of steps planned into one arena.
//
//export arenaplan_family_new
func arenaplan_family_new(device C.int, name *C.char, id *C.int) *C.char {
	return control("arenaplan_family_new", func(b *bridge.Bridge) error {
		return setID("arenaplan_family_new", "id", id, func() (*bridge.Family, error) { return b.NewFamily(int(device), goString(name)) })
	})
}

// arenaplan_chain_new makes a chain: a family whose members run in turn
// and hand buffers on (a forward and its backward), planned on one
// timeline into one arena (bridge.NewChain). The family calls serve it.
//
//export arenaplan_chain_new
func arenaplan_chain_new(device C.int, name *C.char, id *C.int) *C.char {
	return control("arenaplan_chain_new", func(b *bridge.Bridge) error {
		return setID("arenaplan_chain_new", "id", id, func() (*bridge.Family, error) { return b.NewChain(int(device), goString(name)) })
	})
}

// arenaplan_family_member adds a member step; *sid is its step id.
//
//export arenaplan_family_member
func arenaplan_family_member(id C.int, name *C.char, sid *C.int) *C.char {
	return family("arenaplan_family_member", id, func(f *bridge.Family) error {
		return setID("arenaplan_family_member", "sid", sid, func() (*bridge.Step, error) { return f.NewMember(goString(name)) })
	})
}

//export arenaplan_family_plan
func arenaplan_family_plan(id C.int, budgetSeconds C.double) *C.char {
	return family("arenaplan_family_plan", id, func(f *bridge.Family) error { return withBudget(budgetSeconds, f.Plan) })
}

// arenaplan_family_plan_ahead starts planning member sid of family id,
// its recording finished, in the background while the program records
// the other members; arenaplan_family_plan with the same budget takes
// that plan instead of planning the member again.
//
//export arenaplan_family_plan_ahead
func arenaplan_family_plan_ahead(id, sid C.int, budgetSeconds C.double) *C.char {
	return aroundMember("arenaplan_family_plan_ahead", id, sid, budgetSeconds, nil, 0,
		func(f *bridge.Family, s *bridge.Step, budget time.Duration, _ []bridge.Range) error {
			return f.PlanAhead(s, budget)
		})
}

// arenaplan_family_plan_member plans member sid, added to planned family
// id after its plan and since recorded, on its own into the family's
// arena; the other members keep their plans. On an error (its plan does
// not fit in the arena: "does not fit in the family's arena") the member
// is closed and leaves the family.
//
//export arenaplan_family_plan_member
func arenaplan_family_plan_member(id, sid C.int, budgetSeconds C.double) *C.char {
	return aroundMember("arenaplan_family_plan_member", id, sid, budgetSeconds, nil, 0,
		func(f *bridge.Family, s *bridge.Step, budget time.Duration, _ []bridge.Range) error {
			return f.PlanMember(s, budget)
		})
}

//export arenaplan_family_save
func arenaplan_family_save(id C.int, path *C.char) *C.char {
	return family("arenaplan_family_save", id, func(f *bridge.Family) error { return withPath("arenaplan_family_save", path, f.Save) })
}

//export arenaplan_family_load
func arenaplan_family_load(id C.int, path *C.char) *C.char {
	return family("arenaplan_family_load", id, func(f *bridge.Family) error { return withPath("arenaplan_family_load", path, f.Load) })
}

//export arenaplan_family_close
func arenaplan_family_close(id C.int) *C.char {
	return family("arenaplan_family_close", id, func(f *bridge.Family) error { return f.Close() })
}

// arenaplan_family_report sets *out to the family's report as JSON.
//
//export arenaplan_family_report
func arenaplan_family_report(id C.int, out **C.char) *C.char {
	return family("arenaplan_family_report", id, func(f *bridge.Family) error {
		return setJSON("arenaplan_family_report", out, func() (any, error) { return f.Report(), nil })
	})
}

// arenaplan_region_begin routes thread's allocations on device (thread:
// the OS thread id, Python's threading.get_native_id()) to region tag.
//
//export arenaplan_region_begin
func arenaplan_region_begin(device C.int, thread C.long, tag *C.char, backup C.int) *C.char {
	return control("arenaplan_region_begin", func(b *bridge.Bridge) error {
		if tag == nil {
			return errNil("arenaplan_region_begin", "tag")
		}
		return b.BeginRegion(int(device), int(thread), C.GoString(tag), backup != 0)
	})
}

//export arenaplan_region_end
func arenaplan_region_end(device C.int, thread C.long) *C.char {
	return control("arenaplan_region_end", func(b *bridge.Bridge) error { return b.EndRegion(int(device), int(thread)) })
}

// arenaplan_pause releases the memory of the regions named in tags (comma
// separated; "graphs" for the graphs; empty or NULL: everything) on
// device.
//
//export arenaplan_pause
func arenaplan_pause(device C.int, tags *C.char) *C.char {
	return control("arenaplan_pause", func(b *bridge.Bridge) error {
		return b.Pause(int(device), splitTags(goString(tags))...)
	})
}

//export arenaplan_resume
func arenaplan_resume(device C.int, tags *C.char) *C.char {
	return control("arenaplan_resume", func(b *bridge.Bridge) error {
		return b.Resume(int(device), splitTags(goString(tags))...)
	})
}

func splitTags(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
