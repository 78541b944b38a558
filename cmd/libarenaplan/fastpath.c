// The allocator pair, with a fast path in C in front of Go.
//
// Each call from C into Go costs 255-337 ns (measured on an H100 host),
// so an eager step's ~250 allocation pairs pay two of them each. Most of
// them are a block freed and the same size asked for again on the same
// stream. While Go allows it (ap_fp_set: no capture underway as the host
// counts them, no step running, no region open), a free of a block that
// Go said may be kept (it came from the spill allocator's default pool)
// keeps it here, and the next allocation of that size class (512-byte
// multiples: the spill allocator rounds every request up to one, so the
// block holds any request of its class), device and stream takes it back
// without calling Go: the reuse PyTorch's own caching allocator makes. By
// class, not size: a decoding loop's tensors that grow by a token each
// step (the ids so far, a mask) are of a new size every step. Go keeps
// counting the block as in use. Before every control call (steps, captures, regions, pause, statistics, empty_cache)
// Go shuts the fast path and takes the kept blocks back (ap_fp_take).
//
// What it keeps can never make an allocation fail nor the process hold
// more memory: when Go cannot serve one without mapping more memory, or
// at all, the kept blocks go back to Go and the allocation is tried once
// more (arenaplan_go_drain). It keeps at most KEEP_MAX_BYTES in blocks of at
// most KEEP_MAX_BLOCK bytes. The blocks it handed out or keeps are in one
// table (live), with their state, so a second free of a kept block is
// reported, never kept twice.
//
// Blocks used on another stream (record_stream) are never kept: their
// free goes to Go, which orders their reuse with events. A 0-byte request
// gets a token (an address of its own, never memory) that is kept and
// handed out again like a block of size 0: PyTorch asks for hundreds of
// them in a step of eager code (a decoding loop's, each token), two calls
// into Go each otherwise. A kept token is no live allocation's, so two
// live allocations still never share an address.
//
// A free the fast path does not keep costs no call of its own while the
// fast path is open: a block it handed out (in live, freed once, on its
// device) is queued here, in the order of the frees, and the queue rides
// along with the next call into Go (an allocation the fast path cannot
// serve, a record_stream) or goes alone when it is full (FREE_QUEUE) or
// before a control call or a statistics read (ap_fq_flush). Go applies
// the frees in order before the allocation they ride with, so that it
// decides as if each free had called it: the same addresses, the same
// segments mapped. One lock (fq_mu) is held across every call that hands
// frees to Go, so that a call never overtakes frees another thread took
// from the queue earlier. A free the fast path cannot vouch for (an
// address it did not hand out, freed already, on another device, or of a
// block used on another stream, whose free records events on those
// streams at once) goes to Go at once, after the queue, in one call: it
// is reported to its caller as before. The statistics count a queued free
// when it is queued (Go applies every free the fast path vouched for; one
// it refused is taken back).
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"
#include "fastpath.h"

// Only small blocks are kept (at most SMALL, the spill allocator's
// SmallBlock), as those are most of an eager step's allocations and live
// in segments of their own. A large block kept here is free memory Go
// cannot see: a request of another size is then served by splitting
// another free block, where PyTorch's allocator (and Go, told of every
// free) would have taken the freed one, and large segments fragment.
// Replaying the recorded real steps of ../shared/data/torch as eager
// steps, keeping blocks of up to 64 MiB mapped up to 1.54 times what
// no fast path maps (GPT-2 inference 2265 against 1491 MB); keeping only
// small ones, within 0.6% of it on every trace, with a third to two
// thirds of the hits. On an H100, an eager GPT-2 training step then
// reserves what PyTorch's allocator does (1242 against 1244 MiB, 1498
// before). Both caps can be set when building
// (CGO_CFLAGS=-DKEEP_MAX_BLOCK=...) to measure what they cost.
#ifndef KEEP_MAX_BLOCK
#define KEEP_MAX_BLOCK ((size_t)1 << 20)
#endif
#ifndef KEEP_MAX_BYTES
#define KEEP_MAX_BYTES ((uint64_t)64 << 20)
#endif

// The frees waiting for the next call into Go: at most FREE_QUEUE (8 KiB
// at 256), so that a flush is a short loop in Go and nothing the fast path
// queued waits long for a program that frees much and allocates little.
#ifndef FREE_QUEUE
#define FREE_QUEUE 256
#endif

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
// fq_mu is held across every call into Go that hands it frees; taken
// before mu, never while mu is held.
static pthread_mutex_t fq_mu = PTHREAD_MUTEX_INITIALIZER;
static int on;
static ap_fp_counts counts;
static ap_dev_stats dstats[AP_MAX_DEVICES];

// Statistics round a request as the spill allocator does (512 bytes).
#define ROUND(n) (((int64_t)(n) + 511) & ~(int64_t)511)
#define SMALL ((size_t)1 << 20)

static inline void stat_add(ap_stat *s, int64_t n) {
	s->current += n;
	s->allocated += n;
	if (s->current > s->peak) {
		s->peak = s->current;
	}
}

static inline void stat_sub(ap_stat *s, int64_t n) {
	s->current -= n;
	s->freed += n;
}

// stat_unsub takes back a stat_sub (a queued free that Go refused).
static inline void stat_unsub(ap_stat *s, int64_t n) {
	s->current += n;
	s->freed -= n;
}

static inline void count_pool(ap_dev_stats *d, int pool, size_t size, int add) {
	if (add < 0) {
		stat_unsub(&d->allocation[pool], 1);
		stat_unsub(&d->allocated_bytes[pool], ROUND(size));
		stat_unsub(&d->requested_bytes[pool], (int64_t)size);
	} else if (add) {
		stat_add(&d->allocation[pool], 1);
		stat_add(&d->allocated_bytes[pool], ROUND(size));
		stat_add(&d->requested_bytes[pool], (int64_t)size);
	} else {
		stat_sub(&d->allocation[pool], 1);
		stat_sub(&d->allocated_bytes[pool], ROUND(size));
		stat_sub(&d->requested_bytes[pool], (int64_t)size);
	}
}

// counted records an allocation (add 1) or a free (0) of size bytes on
// device in its statistics, or takes a free back (-1); mu is held.
static inline void counted(int device, size_t size, int add) {
	// A 0-byte request is not counted: PyTorch's own allocator never sees
	// one (it hands out no memory for it), so its statistics do not.
	if (size > 0 && (unsigned)device < AP_MAX_DEVICES) {
		count_pool(&dstats[device], 0, size, add);
		count_pool(&dstats[device], size <= SMALL ? 1 : 2, size, add);
	}
}

// live: the blocks Go said may be kept, handed out now (OUT) or kept here
// (KEPT). Open addressing, backward-shift deletion.
#define LIVE_BITS 16
#define LIVE_CAP (1u << LIVE_BITS)
enum { OUT = 1, KEPT = 2 };
typedef struct {
	uintptr_t ptr; // 0: empty
	size_t size;
	void *stream;
	int device;
	int state;
} live_entry;
static live_entry live[LIVE_CAP];
static unsigned live_n;

static unsigned live_home(uintptr_t p) {
	return (unsigned)(((uint64_t)(p >> 8) * 0x9E3779B97F4A7C15ull) >> (64 - LIVE_BITS));
}

static live_entry *live_find(uintptr_t p) {
	unsigned i = live_home(p);
	while (live[i].ptr != p) {
		if (live[i].ptr == 0) {
			return NULL;
		}
		i = (i + 1) & (LIVE_CAP - 1);
	}
	return &live[i];
}

static void live_put(uintptr_t p, size_t size, void *stream, int device) {
	if (live_n >= LIVE_CAP / 4 * 3) {
		return; // its free will go to Go
	}
	unsigned i = live_home(p);
	while (live[i].ptr != 0) {
		i = (i + 1) & (LIVE_CAP - 1);
	}
	live[i] = (live_entry){p, size, stream, device, OUT};
	live_n++;
}

static void live_del(live_entry *e) {
	unsigned i = (unsigned)(e - live);
	for (unsigned j = i;;) {
		j = (j + 1) & (LIVE_CAP - 1);
		if (live[j].ptr == 0) {
			break;
		}
		unsigned k = live_home(live[j].ptr);
		if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) {
			continue; // live[j] is still reachable from its home
		}
		live[i] = live[j];
		i = j;
	}
	live[i].ptr = 0;
	live_n--;
}

// bins: kept blocks by (size class, stream, device), a few each, found within
// BIN_PROBES slots of their home (so a call costs a bounded scan however
// many sizes a program uses). An empty bin may take another key; a take
// of every block forgets every key. A class holds many sizes, so a bin
// holds up to 32: replaying a Hugging Face decoding call's 3,793
// allocations as eager steps on the simulated device, 8 left 148 of them
// to Go each step, 16 left 14, 32 none (by exact size with 8: 8).
#define BIN_BITS 9
#define BIN_N (1u << BIN_BITS)
#define BIN_DEPTH 32
#define BIN_PROBES 16
typedef struct {
	int used;
	size_t size;
	void *stream;
	int device;
	int n;
	uintptr_t ptr[BIN_DEPTH];
} bin;
static bin bins[BIN_N];

static unsigned bin_home(size_t size, void *stream, int device) {
	uint64_t h = (uint64_t)size * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)stream * 0xC2B2AE3D27D4EB4Full ^
	             (uint64_t)device * 0x165667B19E3779F9ull;
	return (unsigned)(h >> (64 - BIN_BITS));
}

// bin_find returns the bin holding blocks of a key; with make, else a bin
// for it (the key's own, or an empty one); NULL if none is near.
static bin *bin_find(size_t size, void *stream, int device, int make) {
	unsigned i = bin_home(size, stream, device);
	bin *spare = NULL;
	for (unsigned probe = 0; probe < BIN_PROBES; probe++, i = (i + 1) & (BIN_N - 1)) {
		bin *b = &bins[i];
		if (b->used && b->size == size && b->stream == stream && b->device == device && (b->n > 0 || make)) {
			return b;
		}
		if (spare == NULL && (!b->used || b->n == 0)) {
			spare = b;
		}
	}
	if (!make || spare == NULL) {
		return NULL;
	}
	spare->used = 1, spare->size = size, spare->stream = stream, spare->device = device, spare->n = 0;
	return spare;
}

// The free queue (guarded by mu) and what one call hands to Go (guarded
// by fq_mu: one more entry, for a free that goes at once).
static ap_free_entry fq[FREE_QUEUE];
static int fq_n;
static ap_free_entry fq_out[FREE_QUEUE + 1];

// fq_take moves the queue into fq_out and returns how many frees it
// held, each counted as handed to Go; fq_mu and mu are held.
static int fq_take(void) {
	int n = fq_n;
	for (int i = 0; i < n; i++) {
		fq_out[i] = fq[i];
		if ((unsigned)fq[i].device < AP_MAX_DEVICES) {
			dstats[fq[i].device].go_frees++;
		}
	}
	fq_n = 0;
	return n;
}

// fq_settle takes back, in the statistics, the first n frees of fq_out
// that Go refused (counted when they were queued); fq_mu is held.
static void fq_settle(int n) {
	int refused = 0;
	for (int i = 0; i < n; i++) {
		refused |= !fq_out[i].ok;
	}
	if (!refused) {
		return;
	}
	pthread_mutex_lock(&mu);
	for (int i = 0; i < n; i++) {
		if (!fq_out[i].ok) {
			counted(fq_out[i].device, fq_out[i].size, -1);
		}
	}
	pthread_mutex_unlock(&mu);
}

// fq_flush hands the queued frees to Go in one call, then own (a free
// the fast path cannot vouch for, or NULL): own's outcome becomes the
// calling thread's last error, and the statistics count it once Go
// applied it. No call when there is nothing to hand.
static void fq_flush(const ap_free_entry *own) {
	pthread_mutex_lock(&fq_mu);
	pthread_mutex_lock(&mu);
	int n = fq_take();
	if (own != NULL) {
		fq_out[n] = *own;
		fq_out[n].ok = 0;
		if ((unsigned)own->device < AP_MAX_DEVICES) {
			dstats[own->device].go_frees++;
		}
	}
	int total = n + (own != NULL);
	uint64_t seen = 0; // the devices this call carries frees of
	for (int i = 0; i < total; i++) {
		unsigned d = (unsigned)fq_out[i].device;
		if (d < AP_MAX_DEVICES && !(seen >> d & 1)) {
			seen |= (uint64_t)1 << d;
			dstats[d].free_calls++;
		}
	}
	pthread_mutex_unlock(&mu);
	if (total > 0) {
		arenaplan_go_free_batch(fq_out, total, own != NULL);
		fq_settle(n);
		if (own != NULL && fq_out[n].ok) {
			pthread_mutex_lock(&mu);
			counted(own->device, own->size, 0);
			pthread_mutex_unlock(&mu);
		}
	}
	pthread_mutex_unlock(&fq_mu);
}

void ap_fq_flush(void) { fq_flush(NULL); }

// The calling thread's last failure of an allocator call. Initial-exec:
// every allocation reads it, and the general model's __tls_get_addr call
// cost ~10 ns a pair.
static __thread char *last_err __attribute__((tls_model("initial-exec")));
static __thread int last_oom __attribute__((tls_model("initial-exec")));

void ap_set_error(const char *msg, int oom) {
	free(last_err);
	last_err = msg != NULL ? strdup(msg) : NULL;
	last_oom = oom;
}

const char *ap_error_peek(int *oom) {
	if (oom != NULL) {
		*oom = last_oom;
	}
	return last_err;
}

static inline void clear_error(void) {
	if (__builtin_expect(last_err != NULL, 0)) {
		ap_set_error(NULL, 0);
	}
}

// arenaplan_last_error returns a copy of the calling thread's last failure
// of an allocator call (cleared by the next one that succeeds), or NULL;
// free it with arenaplan_free_string.
char *arenaplan_last_error(void) { return last_err != NULL ? strdup(last_err) : NULL; }

// go_alloc asks Go. While blocks are kept here Go may not map memory for
// it beyond what it held before: where it would have to, the kept blocks
// that can make room (the same device, stream and size class: Go's
// segments serve one stream and one class) go back to Go and Go is asked
// again; where that is not enough, or where Go fails, every kept block
// goes back and Go is asked once more, so that what the fast path keeps
// never makes the process hold more memory nor fail an allocation. (A
// steady step gave every kept block back before: each of its next
// allocations then a call into Go.)
//
// Each call carries the queued frees (go_alloc_call).
static void *go_alloc_call(size_t size, int device, void *stream, int grow, int *keepable, int *would_grow) {
	pthread_mutex_lock(&fq_mu);
	pthread_mutex_lock(&mu);
	int n = fq_take();
	pthread_mutex_unlock(&mu);
	void *p = arenaplan_go_alloc(size, device, (uintptr_t)stream, grow, keepable, would_grow, fq_out, n);
	fq_settle(n);
	pthread_mutex_unlock(&fq_mu);
	return p;
}

static void *go_alloc(size_t size, int device, void *stream) {
	pthread_mutex_lock(&mu);
	int kept = counts.blocks > 0;
	if ((unsigned)device < AP_MAX_DEVICES) {
		dstats[device].go_allocs++;
	}
	pthread_mutex_unlock(&mu);
	int keepable = 0, would_grow = 0;
	void *p = go_alloc_call(size, device, stream, !kept, &keepable, &would_grow);
	if (p == NULL && would_grow && arenaplan_go_drain_like(ROUND(size) <= (int64_t)SMALL, device, (uintptr_t)stream) > 0) {
		pthread_mutex_lock(&mu);
		counts.like_drains++;
		pthread_mutex_unlock(&mu);
		keepable = 0;
		would_grow = 0;
		p = go_alloc_call(size, device, stream, 0, &keepable, &would_grow);
	}
	if (p == NULL) {
		pthread_mutex_lock(&mu);
		uint64_t held = counts.blocks;
		if (would_grow) {
			counts.growth_drains++;
		} else if (held > 0) {
			counts.drains++;
			if ((unsigned)device < AP_MAX_DEVICES) {
				dstats[device].num_alloc_retries++;
			}
		}
		pthread_mutex_unlock(&mu);
		if (would_grow || held > 0) {
			arenaplan_go_drain();
			keepable = 0;
			would_grow = 0;
			p = go_alloc_call(size, device, stream, 1, &keepable, &would_grow);
		}
	}
	pthread_mutex_lock(&mu);
	if (p == NULL) {
		if (last_oom && (unsigned)device < AP_MAX_DEVICES) {
			dstats[device].num_ooms++;
		}
		pthread_mutex_unlock(&mu);
		return NULL;
	}
	if (keepable) {
		live_put((uintptr_t)p, size, stream, device);
	}
	counted(device, size, 1);
	pthread_mutex_unlock(&mu);
	ap_hist_call(device); // after every lock: the host's hook may take its own
	return p;
}

// arenaplan_alloc is the allocator for C callers: size bytes on device for
// use on stream, or NULL with the reason in arenaplan_last_error.
void *arenaplan_alloc(size_t size, int device, void *stream) {
	pthread_mutex_lock(&mu);
	if (on) {
		bin *b = bin_find((size_t)ROUND(size), stream, device, 0);
		if (b != NULL && b->n > 0) {
			uintptr_t p = b->ptr[--b->n];
			live_entry *e = live_find(p);
			e->state = OUT;
			counts.hits++;
			counts.blocks--;
			counts.bytes -= e->size;
			e->size = size; // what its free will say
			counted(device, size, 1);
			pthread_mutex_unlock(&mu);
			clear_error();
			return (void *)p;
		}
		counts.misses++;
	}
	pthread_mutex_unlock(&mu);
	return go_alloc(size, device, stream);
}

// double_free reports a second free of a block the fast path keeps; the
// block stays kept once.
static void double_free(void *ptr) {
	char msg[160];
	snprintf(msg, sizeof msg, "arenaplan: free of %p: freed already (a double free); ignored", ptr);
	ap_warn(msg);
	ap_set_error(msg, 0);
}

// arenaplan_free gives back an allocation; size, device and stream are
// what it was allocated with (PyTorch passes them back): the device's
// statistics count size as freed.
void arenaplan_free(void *ptr, size_t size, int device, void *stream) {
	if (ptr == NULL) {
		return; // PyTorch never frees NULL; C's free(NULL) does nothing
	}
	pthread_mutex_lock(&mu);
	live_entry *e = live_find((uintptr_t)ptr);
	if (e != NULL) {
		if (e->state == KEPT) {
			counts.double_frees++;
			pthread_mutex_unlock(&mu);
			double_free(ptr);
			return;
		}
		// Kept only when the free says what the allocation was (PyTorch
		// passes its size and device); a free on another device is Go's
		// to report, with the block still handed out.
		if (e->device == device) {
			if (on && e->size == size && size <= KEEP_MAX_BLOCK && counts.bytes + size <= KEEP_MAX_BYTES) {
				bin *b = bin_find((size_t)ROUND(e->size), e->stream, e->device, 1);
				if (b != NULL && b->n < BIN_DEPTH) {
					b->ptr[b->n++] = (uintptr_t)ptr;
					e->state = KEPT;
					counts.kept++;
					counts.blocks++;
					counts.bytes += size;
					counted(device, size, 0);
					pthread_mutex_unlock(&mu);
					clear_error();
					return;
				}
			}
			live_del(e);
			if (on && fq_n < FREE_QUEUE) {
				// Handed out here and freed once: Go will apply it. (A
				// full queue is being handed over by the thread that
				// filled it: this free then goes with it below.)
				fq[fq_n++] = (ap_free_entry){(uintptr_t)ptr, size, (uintptr_t)stream, device, 0};
				counted(device, size, 0);
				int full = fq_n == FREE_QUEUE;
				pthread_mutex_unlock(&mu);
				clear_error();
				if (full) {
					fq_flush(NULL);
				}
				return;
			}
		}
	}
	pthread_mutex_unlock(&mu);
	ap_free_entry own = {(uintptr_t)ptr, size, (uintptr_t)stream, device, 0};
	fq_flush(&own);
}

void arenaplan_torch_free(void *ptr, size_t size, int device, void *stream) { arenaplan_free(ptr, size, device, stream); }

// arenaplan_torch_record_stream carries the queued frees too.
void arenaplan_torch_record_stream(void *ptr, void *stream) {
	pthread_mutex_lock(&fq_mu);
	pthread_mutex_lock(&mu);
	live_entry *e = live_find((uintptr_t)ptr);
	if (e != NULL && e->state == OUT) {
		live_del(e); // used elsewhere: its free goes to Go at once
	}
	int n = fq_take();
	pthread_mutex_unlock(&mu);
	arenaplan_go_record_stream((uintptr_t)ptr, (uintptr_t)stream, fq_out, n);
	fq_settle(n);
	pthread_mutex_unlock(&fq_mu);
}

void ap_fp_set(int v) {
	pthread_mutex_lock(&mu);
	on = v;
	pthread_mutex_unlock(&mu);
}

// take_bin moves bin b's kept blocks into out[n:max] and returns the new
// n; mu is held.
static int take_bin(bin *b, ap_fp_entry *out, int n, int max) {
	while (b->n > 0 && n < max) {
		uintptr_t p = b->ptr[--b->n];
		live_entry *e = live_find(p);
		counts.blocks--;
		counts.bytes -= e->size;
		live_del(e);
		out[n++] = (ap_fp_entry){p, b->device};
	}
	return n;
}

int ap_fp_take(ap_fp_entry *out, int max) {
	int n = 0;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < BIN_N && n < max; i++) {
		n = take_bin(&bins[i], out, n, max);
	}
	if (n < max) {
		memset(bins, 0, sizeof bins); // all taken: forget the keys
	}
	pthread_mutex_unlock(&mu);
	return n;
}

int ap_fp_take_like(int device, uintptr_t stream, int small, ap_fp_entry *out, int max) {
	int n = 0;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < BIN_N && n < max; i++) {
		bin *b = &bins[i];
		if (b->used && b->device == device && (uintptr_t)b->stream == stream &&
		    (ROUND(b->size) <= (int64_t)SMALL) == !!small) {
			n = take_bin(b, out, n, max);
		}
	}
	pthread_mutex_unlock(&mu);
	return n;
}

void ap_fp_read(ap_fp_counts *out) {
	pthread_mutex_lock(&mu);
	*out = counts;
	pthread_mutex_unlock(&mu);
}

void ap_dev_read(int device, ap_dev_stats *out) {
	pthread_mutex_lock(&mu);
	if ((unsigned)device < AP_MAX_DEVICES) {
		*out = dstats[device];
	} else {
		memset(out, 0, sizeof *out);
	}
	pthread_mutex_unlock(&mu);
}

void ap_dev_reset_peak(int device) {
	pthread_mutex_lock(&mu);
	if ((unsigned)device < AP_MAX_DEVICES) {
		ap_dev_stats *d = &dstats[device];
		for (int i = 0; i < 3; i++) {
			d->allocation[i].peak = d->allocation[i].current;
			d->allocated_bytes[i].peak = d->allocated_bytes[i].current;
			d->requested_bytes[i].peak = d->requested_bytes[i].current;
		}
	}
	pthread_mutex_unlock(&mu);
}

void ap_dev_reset_accumulated(int device) {
	pthread_mutex_lock(&mu);
	if ((unsigned)device < AP_MAX_DEVICES) {
		ap_dev_stats *d = &dstats[device];
		for (int i = 0; i < 3; i++) {
			d->allocation[i].allocated = d->allocation[i].freed = 0;
			d->allocated_bytes[i].allocated = d->allocated_bytes[i].freed = 0;
			d->requested_bytes[i].allocated = d->requested_bytes[i].freed = 0;
		}
		d->num_ooms = d->num_alloc_retries = 0;
	}
	pthread_mutex_unlock(&mu);
}
