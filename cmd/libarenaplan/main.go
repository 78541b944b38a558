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
// The pair (and the record_stream hook) are C (fastpath.c): a freed block
// of the spill allocator's default pool is kept there and handed out again
// for the next request of the same size, device and stream without a call
// into Go, while no capture, step or region could want it; everything
// else goes to the Go exports arenaplan_go_*. Every control function
// shuts that path and gives the kept blocks back first (fenced).
// ARENAPLAN_FASTPATH=0 keeps it shut.
//
// The control functions return NULL on success or an error message that
// the caller frees with arenaplan_free_string. No Go panic crosses the C
// boundary: each export recovers and reports it as an error. With
// ARENAPLAN_DEVICE=sim in the environment the library runs on the
// simulated device (for tests without a GPU).
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
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/arenaplan/arenaplan/bridge"
	"github.com/arenaplan/arenaplan/cuda"
)

func main() {}

var (
	once    sync.Once
	lib     *bridge.Bridge
	libErr  error
	errMu   sync.Mutex
	lastErr string
)

func get() (*bridge.Bridge, error) {
	once.Do(func() {
		cfg, err := bridge.ConfigFromEnv(cgetenv)
		if err != nil {
			libErr = err
			return
		}
		lib = bridge.New(cfg)
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

func setLast(err error) {
	errMu.Lock()
	lastErr = err.Error()
	errMu.Unlock()
}

// guard turns a panic into an error; use as defer guard(&err).
func guard(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("arenaplan: internal error (a bug; please report it): %v", r)
	}
}

func cerr(err error) *C.char {
	if err == nil {
		return nil
	}
	return C.CString(err.Error())
}

// arenaplan_go_alloc serves arenaplan_torch_alloc (fastpath.c) when its
// fast path cannot; keepable says whether the block may be kept there at
// its free (bridge.Bridge.AllocCacheable).
//
//export arenaplan_go_alloc
func arenaplan_go_alloc(size C.size_t, device C.int, stream unsafe.Pointer, keepable *C.int) (ptr unsafe.Pointer) {
	var err error
	defer func() {
		guard(&err)
		if err != nil {
			setLast(err)
			ptr = nil
		}
	}()
	b, err := get()
	if err != nil {
		return nil
	}
	var p cuda.DevicePtr
	var keep bool
	p, keep, err = b.AllocCacheable(uint64(size), int(device), uintptr(stream))
	if err != nil {
		return nil
	}
	if keep {
		*keepable = 1
	}
	// A device address, never dereferenced by Go.
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}

// quietly runs f for an export that cannot return an error: a failure, or
// a panic, becomes the last error (arenaplan_last_error).
func quietly(f func(*bridge.Bridge) error) {
	var err error
	defer func() {
		guard(&err)
		if err != nil {
			setLast(err)
		}
	}()
	b, err := get()
	if err != nil {
		return
	}
	err = f(b)
}

// arenaplan_go_free serves arenaplan_torch_free (fastpath.c) for the
// blocks its fast path does not keep.
//
//export arenaplan_go_free
func arenaplan_go_free(ptr unsafe.Pointer, size C.size_t, device C.int, stream unsafe.Pointer) {
	quietly(func(b *bridge.Bridge) error {
		err := b.Free(cuda.DevicePtr(uintptr(ptr)), int(device))
		if err != nil {
			// PyTorch will not see it: say it where a person will.
			fmt.Fprintln(os.Stderr, "arenaplan:", err)
		}
		return err
	})
}

// arenaplan_go_record_stream serves arenaplan_torch_record_stream
// (fastpath.c), which first makes sure the fast path never keeps ptr.
//
//export arenaplan_go_record_stream
func arenaplan_go_record_stream(ptr unsafe.Pointer, stream unsafe.Pointer) {
	quietly(func(b *bridge.Bridge) error {
		return b.RecordStreamAny(cuda.DevicePtr(uintptr(ptr)), uintptr(stream))
	})
}

//export arenaplan_torch_empty_cache
func arenaplan_torch_empty_cache() {
	quietly(func(b *bridge.Bridge) error { return fenced(b, b.EmptyCache) })
}

// arenaplan_captures_underway tells the library how many graph captures
// are underway (see bridge.Bridge.CapturesUnderway).
//
//export arenaplan_captures_underway
func arenaplan_captures_underway(n C.int) {
	quietly(func(b *bridge.Bridge) error {
		return fenced(b, func() error { b.CapturesUnderway(int(n)); return nil })
	})
}

// arenaplan_last_error returns the last failure of an allocator call (they
// cannot return one), or NULL; free it with arenaplan_free_string.
//
//export arenaplan_last_error
func arenaplan_last_error() *C.char {
	errMu.Lock()
	defer errMu.Unlock()
	if lastErr == "" {
		return nil
	}
	return C.CString(lastErr)
}

//export arenaplan_free_string
func arenaplan_free_string(s *C.char) { C.free(unsafe.Pointer(s)) }

//export arenaplan_step_new
func arenaplan_step_new(device C.int, name *C.char, id *C.int) (e *C.char) {
	var err error
	defer func() { guard(&err); e = cerr(err) }()
	b, err := get()
	if err != nil {
		return
	}
	s, err := b.NewStep(int(device), C.GoString(name))
	if err == nil {
		*id = C.int(s.ID())
	}
	return
}

// step runs f on step id.
func step(id C.int, f func(*bridge.Step) error) *C.char {
	return bridgeCall(func(b *bridge.Bridge) error {
		s, err := b.Step(int(id))
		if err != nil {
			return err
		}
		return f(s)
	})
}

//export arenaplan_step_record
func arenaplan_step_record(id C.int, stream unsafe.Pointer) *C.char {
	return step(id, func(s *bridge.Step) error { return s.Record(uintptr(stream)) })
}

//export arenaplan_step_serve
func arenaplan_step_serve(id C.int, stream unsafe.Pointer, strict C.int) *C.char {
	return step(id, func(s *bridge.Step) error { return s.Serve(uintptr(stream), strict != 0) })
}

//export arenaplan_step_join_capture
func arenaplan_step_join_capture(id C.int) *C.char {
	return step(id, func(s *bridge.Step) error { return s.JoinCapture() })
}

//export arenaplan_step_end
func arenaplan_step_end(id C.int, failed C.int) *C.char {
	return step(id, func(s *bridge.Step) error { return s.End(failed != 0) })
}

//export arenaplan_step_plan
func arenaplan_step_plan(id C.int, budgetSeconds C.double) *C.char {
	return step(id, func(s *bridge.Step) error {
		budget, err := bridge.BudgetSeconds(float64(budgetSeconds))
		if err != nil {
			return err
		}
		return s.Plan(budget)
	})
}

// arenaplan_step_replan plans the step again from its last served run,
// which diverged (bridge.Step.Replan); destroy that run's graph and free
// its outputs first.
//
//export arenaplan_step_replan
func arenaplan_step_replan(id C.int, budgetSeconds C.double) *C.char {
	return step(id, func(s *bridge.Step) error {
		budget, err := bridge.BudgetSeconds(float64(budgetSeconds))
		if err != nil {
			return err
		}
		return s.Replan(budget)
	})
}

//export arenaplan_step_save
func arenaplan_step_save(id C.int, path *C.char) *C.char {
	return step(id, func(s *bridge.Step) error { return s.Save(C.GoString(path)) })
}

//export arenaplan_step_load
func arenaplan_step_load(id C.int, path *C.char) *C.char {
	return step(id, func(s *bridge.Step) error { return s.Load(C.GoString(path)) })
}

//export arenaplan_step_close
func arenaplan_step_close(id C.int) *C.char {
	return step(id, func(s *bridge.Step) error { return s.Close() })
}

// arenaplan_step_report sets *out to the step's report as JSON (free it
// with arenaplan_free_string).
//
//export arenaplan_step_report
func arenaplan_step_report(id C.int, out **C.char) *C.char {
	return step(id, func(s *bridge.Step) error {
		js, err := json.Marshal(s.Report())
		if err == nil {
			*out = C.CString(string(js))
		}
		return err
	})
}

// arenaplan_stats sets *out to device's counters as JSON.
//
//export arenaplan_stats
func arenaplan_stats(device C.int, out **C.char) *C.char {
	return bridgeCall(func(b *bridge.Bridge) error {
		st, err := b.Stats(int(device))
		if err != nil {
			return err
		}
		var h, k, m C.uint64_t
		C.fp_counts(&h, &k, &m)
		js, err := json.Marshal(struct {
			bridge.DeviceStats
			// FastPath counts, for every device, the allocations the C
			// fast path served (Hits) or passed on to Go while open
			// (Misses), and the frees it kept (Kept).
			FastPath struct{ Hits, Kept, Misses uint64 }
		}{st, struct{ Hits, Kept, Misses uint64 }{uint64(h), uint64(k), uint64(m)}})
		if err == nil {
			*out = C.CString(string(js))
		}
		return err
	})
}

// bridgeCall runs f on the bridge, fenced, and returns its error as a C
// string.
func bridgeCall(f func(*bridge.Bridge) error) (e *C.char) {
	var err error
	defer func() { guard(&err); e = cerr(err) }()
	b, err := get()
	if err != nil {
		return
	}
	err = fenced(b, func() error { return f(b) })
	return
}

var (
	fpMu   sync.Mutex // orders the control calls' fences
	noFast bool       // ARENAPLAN_FASTPATH=0: the C fast path stays shut
)

// fenced runs a control call with the C fast path (fastpath.c) shut and
// the blocks it kept given back to the bridge, then opens it again if the
// bridge allows it (bridge.Bridge.FastPathAllowed).
func fenced(b *bridge.Bridge, f func() error) error {
	fpMu.Lock()
	defer fpMu.Unlock()
	C.fp_set(0)
	var errs []error
	var buf [256]C.fp_entry
	for {
		n := int(C.fp_take(&buf[0], C.int(len(buf))))
		for _, e := range buf[:n] {
			errs = append(errs, b.Free(cuda.DevicePtr(e.ptr), int(e.device)))
		}
		if n < len(buf) {
			break
		}
	}
	errs = append(errs, f())
	if !noFast && b.FastPathAllowed() {
		C.fp_set(1)
	}
	return errors.Join(errs...)
}

// family runs f on family id.
func family(id C.int, f func(*bridge.Family) error) *C.char {
	return bridgeCall(func(b *bridge.Bridge) error {
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
	return bridgeCall(func(b *bridge.Bridge) error {
		f, err := b.NewFamily(int(device), C.GoString(name))
		if err == nil {
			*id = C.int(f.ID())
		}
		return err
	})
}

// arenaplan_family_member adds a member step; *sid is its step id.
//
//export arenaplan_family_member
func arenaplan_family_member(id C.int, name *C.char, sid *C.int) *C.char {
	return family(id, func(f *bridge.Family) error {
		s, err := f.NewMember(C.GoString(name))
		if err == nil {
			*sid = C.int(s.ID())
		}
		return err
	})
}

//export arenaplan_family_plan
func arenaplan_family_plan(id C.int, budgetSeconds C.double) *C.char {
	return family(id, func(f *bridge.Family) error {
		budget, err := bridge.BudgetSeconds(float64(budgetSeconds))
		if err != nil {
			return err
		}
		return f.Plan(budget)
	})
}

//export arenaplan_family_save
func arenaplan_family_save(id C.int, path *C.char) *C.char {
	return family(id, func(f *bridge.Family) error { return f.Save(C.GoString(path)) })
}

//export arenaplan_family_load
func arenaplan_family_load(id C.int, path *C.char) *C.char {
	return family(id, func(f *bridge.Family) error { return f.Load(C.GoString(path)) })
}

//export arenaplan_family_close
func arenaplan_family_close(id C.int) *C.char {
	return family(id, func(f *bridge.Family) error { return f.Close() })
}

// arenaplan_family_report sets *out to the family's report as JSON.
//
//export arenaplan_family_report
func arenaplan_family_report(id C.int, out **C.char) *C.char {
	return family(id, func(f *bridge.Family) error {
		js, err := json.Marshal(f.Report())
		if err == nil {
			*out = C.CString(string(js))
		}
		return err
	})
}

// arenaplan_region_begin routes thread's allocations on device (thread:
// the OS thread id, Python's threading.get_native_id()) to region tag.
//
//export arenaplan_region_begin
func arenaplan_region_begin(device C.int, thread C.long, tag *C.char, backup C.int) *C.char {
	return bridgeCall(func(b *bridge.Bridge) error {
		return b.BeginRegion(int(device), int(thread), C.GoString(tag), backup != 0)
	})
}

//export arenaplan_region_end
func arenaplan_region_end(device C.int, thread C.long) *C.char {
	return bridgeCall(func(b *bridge.Bridge) error { return b.EndRegion(int(device), int(thread)) })
}

// arenaplan_pause releases the memory of the regions named in tags (comma
// separated; "graphs" for the graphs; empty: everything) on device.
//
//export arenaplan_pause
func arenaplan_pause(device C.int, tags *C.char) *C.char {
	return bridgeCall(func(b *bridge.Bridge) error { return b.Pause(int(device), splitTags(C.GoString(tags))...) })
}

//export arenaplan_resume
func arenaplan_resume(device C.int, tags *C.char) *C.char {
	return bridgeCall(func(b *bridge.Bridge) error { return b.Resume(int(device), splitTags(C.GoString(tags))...) })
}

func splitTags(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
