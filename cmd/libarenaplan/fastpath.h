// The allocator's C fast path (fastpath.c): what Go calls. Every name here
// is hidden: the library exports only arenaplan_* functions.
#ifndef ARENAPLAN_FASTPATH_H
#define ARENAPLAN_FASTPATH_H

#include <stddef.h>
#include <stdint.h>

#define AP_HIDDEN __attribute__((visibility("hidden")))

// A block the fast path kept, given back to Go (ap_fp_take).
typedef struct {
	uintptr_t ptr;
	int device;
} ap_fp_entry;

// A free handed to Go in a batch (arenaplan_go_free_batch, and the
// allocation and record_stream calls that carry the queued frees), in the
// order the frees were made. Go sets ok to 1 for each free it applied.
// The stream is a number, never a pointer Go holds.
typedef struct {
	uintptr_t ptr;
	size_t size;
	uintptr_t stream;
	int device;
	int ok;
} ap_free_entry;

// The fast path's counters since the library loaded; Blocks and Bytes are
// what it holds now. Drains: kept blocks given back after Go failed an
// allocation; growth_drains: before Go would have mapped more memory.
// like_drains: the kept blocks of one stream and size class given back
// before Go would have mapped more memory (growth_drains count the times
// that was not enough and every kept block went back).
typedef struct {
	uint64_t hits, kept, misses, drains, growth_drains, double_frees;
	uint64_t blocks, bytes;
	uint64_t like_drains;
} ap_fp_counts;

// PyTorch's memory statistics a device's allocations keep, counted in C
// on every allocation and free (fast path or not): one stat is current,
// peak and the cumulative allocated and freed; pools 0 all, 1 small (at
// most 1 MiB), 2 large, as PyTorch's caching allocator splits them.
typedef struct {
	int64_t current, peak, allocated, freed;
} ap_stat;
// go_allocs and go_frees: the device's allocations and frees handed to Go
// (fast path shut or missed, blocks not kept). free_calls: the calls into
// Go that carried the device's frees alone (a full queue, a free the fast
// path cannot vouch for, the queue handed over before a control call);
// every other free rode along with an allocation or a record_stream.
typedef struct {
	ap_stat allocation[3], allocated_bytes[3], requested_bytes[3];
	uint64_t num_ooms, num_alloc_retries;
	uint64_t go_allocs, go_frees;
	uint64_t free_calls;
} ap_dev_stats;
#define AP_MAX_DEVICES 64

// ap_dev_read copies device's statistics (zero for a device out of range).
AP_HIDDEN void ap_dev_read(int device, ap_dev_stats *out);
// ap_dev_reset_peak sets every peak of device to its current value.
AP_HIDDEN void ap_dev_reset_peak(int device);
// ap_dev_reset_accumulated zeroes device's cumulative counts and its
// out-of-memory and retry counts.
AP_HIDDEN void ap_dev_reset_accumulated(int device);

// ap_fp_set opens (1) or shuts (0) the fast path.
AP_HIDDEN void ap_fp_set(int on);
// ap_fp_take moves up to max kept blocks into out and returns how many.
AP_HIDDEN int ap_fp_take(ap_fp_entry *out, int max);
// ap_fp_take_like moves up to max kept blocks of device and stream whose
// size class is small's (small: at most 1 MiB once rounded to 512 bytes,
// as the spill allocator splits its segments) into out and returns how
// many.
AP_HIDDEN int ap_fp_take_like(int device, uintptr_t stream, int small, ap_fp_entry *out, int max);
// ap_fq_flush hands every queued free to Go (one call, none if the queue
// is empty) and returns when Go applied them: the control calls and the
// statistics readers call it first, so that Go has seen every free.
AP_HIDDEN void ap_fq_flush(void);
// ap_fp_read copies the counters.
AP_HIDDEN void ap_fp_read(ap_fp_counts *out);

// ap_set_error sets the calling thread's last error (a copy of msg; NULL
// clears it). oom says whether the failure was out of memory.
AP_HIDDEN void ap_set_error(const char *msg, int oom);
// ap_error_peek returns the calling thread's last error, or NULL; it stays
// owned by the thread. *oom says whether it was out of memory.
AP_HIDDEN const char *ap_error_peek(int *oom);

// ap_warn writes msg to standard error, the first few times; later
// messages are counted and summed up (warn.c).
AP_HIDDEN void ap_warn(const char *msg);
// ap_warn_count returns how many messages ap_warn was given.
AP_HIDDEN uint64_t ap_warn_count(void);

// ap_hist_note keeps, for the calling thread, the history Seq of the
// allocation Go just recorded; ap_hist_call hands it to the host's hook
// (history.c).
AP_HIDDEN void ap_hist_note(uint64_t seq);
AP_HIDDEN void ap_hist_call(int device);

#endif
