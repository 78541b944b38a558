package main

/*
#include <stdint.h>
#include <stdlib.h>

// A memory pool's own allocator has PyTorch's CUDAPluggableAllocator ABI.
typedef void *(*ap_pool_alloc_fn)(size_t size, int device, void *stream);
typedef void (*ap_pool_free_fn)(void *ptr, size_t size, int device, void *stream);

static void *ap_pool_call_alloc(uintptr_t f, size_t size, int device, uintptr_t stream) {
	return ((ap_pool_alloc_fn)f)(size, device, (void *)stream);
}
static void ap_pool_call_free(uintptr_t f, uintptr_t ptr, size_t size, int device, uintptr_t stream) {
	((ap_pool_free_fn)f)((void *)ptr, size, device, (void *)stream);
}
*/
import "C"

import (
	"fmt"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/bridge"
	"github.com/arenaplan/arenaplan/cuda"
)

// cPoolAllocator calls a memory pool's C allocator functions.
func cPoolAllocator(allocFn, freeFn uintptr) *bridge.PoolAllocator {
	return &bridge.PoolAllocator{
		Alloc: func(size uint64, ordinal int, stream uintptr) (cuda.DevicePtr, error) {
			p := C.ap_pool_call_alloc(C.uintptr_t(allocFn), C.size_t(size), C.int(ordinal), C.uintptr_t(stream))
			if p == nil {
				return 0, fmt.Errorf("%w: the pool's allocator returned NULL for %d bytes on device %d", arena.ErrOutOfMemory, size, ordinal)
			}
			return cuda.DevicePtr(uintptr(p)), nil
		},
		Free: func(p cuda.DevicePtr, size uint64, ordinal int, stream uintptr) error {
			C.ap_pool_call_free(C.uintptr_t(freeFn), C.uintptr_t(p), C.size_t(size), C.int(ordinal), C.uintptr_t(stream))
			return nil
		},
	}
}

// arenaplan_mempool_new makes a memory pool (PyTorch's MemPool) and sets
// *id to its id. alloc_fn and free_fn are the pool's own allocator, with
// PyTorch's CUDAPluggableAllocator ABI
//
//	void *alloc_fn(size_t size, int device, void *stream);  // NULL: out of memory
//	void  free_fn(void *ptr, size_t size, int device, void *stream);
//
// (both NULL: the pool's memory is arenaplan's). The pool's allocator is
// asked for whole segments (2 MiB for requests of up to 1 MiB, 20 MiB up
// to 10 MiB, larger ones rounded up to 2 MiB) that arenaplan
// sub-allocates; it is called on the allocating thread with arenaplan's
// locks held, and must not allocate through arenaplan.
//
//export arenaplan_mempool_new
func arenaplan_mempool_new(allocFn, freeFn C.uintptr_t, id *C.int) *C.char {
	return control("arenaplan_mempool_new", func(b *bridge.Bridge) error {
		if id == nil {
			return errNil("arenaplan_mempool_new", "id")
		}
		var pa *bridge.PoolAllocator
		switch {
		case allocFn == 0 && freeFn == 0:
		case allocFn == 0 || freeFn == 0:
			return fmt.Errorf("arenaplan_mempool_new: alloc_fn %#x and free_fn %#x: give both or neither", uintptr(allocFn), uintptr(freeFn))
		default:
			pa = cPoolAllocator(uintptr(allocFn), uintptr(freeFn))
		}
		n, err := b.NewMemPool(pa)
		if err == nil {
			*id = C.int(n)
		}
		return err
	})
}

// arenaplan_mempool_new_graphs makes a memory pool for what CUDA graphs
// keep beside their arenas (a capture stream's cuBLAS and cuBLASLt
// workspaces) and sets *id to its id: its segments are laid out beside
// the small arenas, each of its block's size, sharing physical memory
// with them (bridge.Bridge.NewGraphMemPool).
//
//export arenaplan_mempool_new_graphs
func arenaplan_mempool_new_graphs(id *C.int) *C.char {
	return control("arenaplan_mempool_new_graphs", func(b *bridge.Bridge) error {
		if id == nil {
			return errNil("arenaplan_mempool_new_graphs", "id")
		}
		n, err := b.NewGraphMemPool()
		if err == nil {
			*id = C.int(n)
		}
		return err
	})
}

// arenaplan_mempool_begin routes thread's allocations on device (thread:
// the OS thread id, Python's threading.get_native_id()) to pool id until
// arenaplan_mempool_end; routings nest, innermost first. The C fast path
// stays shut while any thread routes to a pool.
//
//export arenaplan_mempool_begin
func arenaplan_mempool_begin(device C.int, thread C.long, id C.int) *C.char {
	return control("arenaplan_mempool_begin", func(b *bridge.Bridge) error {
		return b.BeginMemPool(int(device), int(thread), int(id))
	})
}

// arenaplan_mempool_end ends thread's innermost routing on device, which
// must be to pool id.
//
//export arenaplan_mempool_end
func arenaplan_mempool_end(device C.int, thread C.long, id C.int) *C.char {
	return control("arenaplan_mempool_end", func(b *bridge.Bridge) error {
		return b.EndMemPool(int(device), int(thread), int(id))
	})
}

// arenaplan_mempool_release releases pool id (no thread may route to it):
// its memory goes back, to its own allocator where it has one, as soon as
// nothing in it is allocated.
//
//export arenaplan_mempool_release
func arenaplan_mempool_release(id C.int) *C.char {
	return control("arenaplan_mempool_release", func(b *bridge.Bridge) error { return b.ReleaseMemPool(int(id)) })
}

// arenaplan_mempool_stats sets *out to pool id's state as JSON
// (bridge.MemPoolStats); free it with arenaplan_free_string.
//
//export arenaplan_mempool_stats
func arenaplan_mempool_stats(id C.int, out **C.char) *C.char {
	return control("arenaplan_mempool_stats", func(b *bridge.Bridge) error {
		return setJSON("arenaplan_mempool_stats", out, func() (any, error) { return b.MemPoolStats(int(id)) })
	})
}
