// arenaplan.h: the C ABI of libarenaplan.so, and which entry point is for
// whom.
//
// Three kinds of callers load the library:
//
//   - C and C++ hosts (an inference server, a runtime that is not
//     PyTorch): arenaplan_alloc and arenaplan_free. They never throw: a
//     failed allocation returns NULL and arenaplan_last_error says why.
//   - PyTorch, through torch.cuda.memory.CUDAPluggableAllocator (what
//     arenaplan.torch.install() sets up): arenaplan_torch_alloc,
//     arenaplan_torch_free, arenaplan_torch_record_stream and
//     arenaplan_torch_empty_cache. arenaplan_torch_alloc THROWS a C++
//     exception when it cannot serve a request (c10::OutOfMemoryError
//     where PyTorch is in the process, else std::runtime_error), because
//     PyTorch turns a NULL into a tensor at address 0. A C host that calls
//     it aborts on the first failure (std::terminate): C hosts call
//     arenaplan_alloc.
//   - The Python package (ctypes): the control calls below (steps,
//     families, regions, statistics). Any host may call them.
//
// Control calls return NULL on success or an error message the caller
// frees with arenaplan_free_string; outputs of JSON (char **out) are freed
// the same way. No call lets a panic or an exception other than
// arenaplan_torch_alloc's escape. Device ordinals are CUDA's; stream is a
// CUstream (NULL: the legacy default stream). With ARENAPLAN_DEVICE=sim
// the library runs on simulated devices (no GPU; ARENAPLAN_SIM_MEMORY,
// ARENAPLAN_SIM_DEVICES).
//
// The functions named arenaplan_go_* are the library's own (its C fast
// path calls them): never call them.
#ifndef ARENAPLAN_H
#define ARENAPLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- C and C++ hosts ----

// arenaplan_alloc returns size bytes of device memory for use on stream,
// 512-byte aligned, or NULL with the reason in arenaplan_last_error
// (out of memory is worded as PyTorch words it). It never throws.
void *arenaplan_alloc(size_t size, int device, void *stream);
// arenaplan_free gives back an allocation; size, device and stream are
// what it was allocated with. A bad free (never allocated, freed twice,
// inside a block) changes nothing: it is reported through
// arenaplan_last_error and on standard error (the first five; later ones
// are counted).
void arenaplan_free(void *ptr, size_t size, int device, void *stream);
// arenaplan_last_error returns the calling thread's last error (a copy to
// free with arenaplan_free_string), or NULL; a success clears it.
char *arenaplan_last_error(void);
// arenaplan_free_string frees a string the library returned.
void arenaplan_free_string(char *s);
// arenaplan_captures_underway tells the library how many CUDA graph
// captures are underway in the process (0 at start): while none is, freed
// blocks are handed out again without a call into Go, and the frees of
// other blocks wait in C for the next call into Go (in order, before it:
// every control and statistics call hands them over first).
void arenaplan_captures_underway(int n);

// ---- PyTorch's CUDAPluggableAllocator (not for C hosts) ----

// arenaplan_torch_alloc is arenaplan_alloc that throws a C++ exception
// instead of returning NULL (see above). For PyTorch only.
void *arenaplan_torch_alloc(size_t size, int device, void *stream);
void arenaplan_torch_free(void *ptr, size_t size, int device, void *stream);
void arenaplan_torch_record_stream(void *ptr, void *stream);
void arenaplan_torch_empty_cache(void);

// ---- Control calls (the Python package; any host) ----

char *arenaplan_step_new(int device, char *name, int *id);
char *arenaplan_step_record(int id, void *stream);
char *arenaplan_step_serve(int id, void *stream, int strict);
char *arenaplan_step_join_capture(int id);
char *arenaplan_step_end(int id, int failed);
char *arenaplan_step_plan(int id, double budgetSeconds);
char *arenaplan_step_replan(int id, double budgetSeconds);
char *arenaplan_step_drop_captures(int id);
char *arenaplan_step_save(int id, char *path);
char *arenaplan_step_load(int id, char *path);
char *arenaplan_step_close(int id);
char *arenaplan_step_report(int id, char **out);

// A family's member names must differ: a repeated one is refused here.
char *arenaplan_family_new(int device, char *name, int *id);
char *arenaplan_chain_new(int device, char *name, int *id);
char *arenaplan_family_member(int id, char *name, int *sid);
char *arenaplan_family_plan(int id, double budgetSeconds);
// Starts planning member sid, its recording finished, in the background;
// arenaplan_family_plan with the same budget takes that plan.
char *arenaplan_family_plan_ahead(int id, int sid, double budgetSeconds);
char *arenaplan_family_plan_member(int id, int sid, double budgetSeconds);
// As arenaplan_family_plan_member, for a member that replays while the
// program holds memory in the family's arena: its plan leaves the n
// address ranges [ranges[2k], ranges[2k+1]) alone, and the arena grows in
// place where it needs more room.
char *arenaplan_family_plan_member_around(int id, int sid, double budgetSeconds, uint64_t *ranges, int n);
// Plans member sid, planned already, again around the n address ranges
// [ranges[2k], ranges[2k+1]) and those its plan left alone before, its
// outputs kept where they are; the arena grows in place where it needs
// more room. Reset the member's graphs first. On an error the member
// keeps its plan and its captures.
char *arenaplan_family_replan_member_around(int id, int sid, double budgetSeconds, uint64_t *ranges, int n);
char *arenaplan_family_save(int id, char *path);
char *arenaplan_family_load(int id, char *path);
char *arenaplan_family_close(int id);
char *arenaplan_family_report(int id, char **out);

char *arenaplan_region_begin(int device, long int thread, char *tag, int backup);
char *arenaplan_region_end(int device, long int thread);
char *arenaplan_pause(int device, char *tags);
char *arenaplan_resume(int device, char *tags);
char *arenaplan_paused(int device, char **out);
// arenaplan_pause_generation changes after every pause or resume call (read
// it atomically): a host keeping what it knows of paused regions looks again
// when it changed.
extern uint64_t arenaplan_pause_generation;

char *arenaplan_mempool_new(uintptr_t allocFn, uintptr_t freeFn, int *id);
char *arenaplan_mempool_new_graphs(int *id);
char *arenaplan_mempool_begin(int device, long int thread, int id);
char *arenaplan_mempool_end(int device, long int thread, int id);
char *arenaplan_mempool_release(int id);
char *arenaplan_mempool_stats(int id, char **out);

char *arenaplan_stats(int device, char **out);
char *arenaplan_memory_stats(int device, char **out);
char *arenaplan_reset_peak_stats(int device);
char *arenaplan_reset_accumulated_stats(int device);
char *arenaplan_snapshot(int device, char **out);
char *arenaplan_record_history(int enabled, int maxEntries);
// arenaplan_history_hook sets (fn not 0) or clears the function called
// after each allocation recorded in the history, as
// void fn(int device, uint64_t seq) with the entry's "seq", on the
// allocating thread, with no lock of the library held (the Python package
// takes the Python stack there). Never called while history is off.
void arenaplan_history_hook(uintptr_t fn);

#ifdef __cplusplus
}
#endif

#endif
