// The allocator pair PyTorch calls, with a fast path in C in front of Go.
//
// Each call from C into Go costs 255-337 ns (measured on an H100 host),
// so an eager step's ~250 allocation pairs pay two of them each. Most of
// them are a block freed and the same size asked for again on the same
// stream. While Go allows it (fp_set: no capture underway as the host
// counts them, no step running, no region open), a free of a block that
// Go said may be kept (it came from the spill allocator's default pool)
// keeps it here, and the next allocation of that size, device and stream
// takes it back without calling Go: the reuse PyTorch's own caching
// allocator makes. Go keeps counting the block as in use. Before every
// control call (steps, captures, regions, pause, statistics, empty_cache)
// Go shuts the fast path and takes the kept blocks back (fp_take).
//
// Blocks used on another stream (record_stream) are never kept: their
// free goes to Go, which orders their reuse with events. 0-byte requests
// always go to Go (each needs an address of its own).
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "_cgo_export.h"
#include "fastpath.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int on;
static uint64_t hits, kept, misses;

// live: the blocks Go said may be kept, handed out now. Open addressing,
// backward-shift deletion.
#define LIVE_BITS 16
#define LIVE_CAP (1u << LIVE_BITS)
typedef struct {
	uintptr_t ptr; // 0: empty
	size_t size;
	void *stream;
	int device;
} live_entry;
static live_entry live[LIVE_CAP];
static unsigned live_n;

static unsigned live_home(uintptr_t p) {
	return (unsigned)(((uint64_t)(p >> 8) * 0x9E3779B97F4A7C15ull) >> (64 - LIVE_BITS));
}

static int live_put(uintptr_t p, size_t size, void *stream, int device) {
	if (live_n >= LIVE_CAP / 4 * 3) {
		return 0; // its free will go to Go
	}
	unsigned i = live_home(p);
	while (live[i].ptr != 0) {
		i = (i + 1) & (LIVE_CAP - 1);
	}
	live[i] = (live_entry){p, size, stream, device};
	live_n++;
	return 1;
}

static int live_del(uintptr_t p, live_entry *out) {
	unsigned i = live_home(p);
	while (live[i].ptr != p) {
		if (live[i].ptr == 0) {
			return 0;
		}
		i = (i + 1) & (LIVE_CAP - 1);
	}
	if (out != NULL) {
		*out = live[i];
	}
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
	return 1;
}

// bins: kept blocks by (size, stream, device), a few each, found within
// BIN_PROBES slots of their home (so a call costs a bounded scan however
// many sizes a program uses). An empty bin may take another key; fp_take
// forgets every key.
#define BIN_BITS 9
#define BIN_N (1u << BIN_BITS)
#define BIN_DEPTH 8
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

void *arenaplan_torch_alloc(size_t size, int device, void *stream) {
	if (size > 0) {
		pthread_mutex_lock(&mu);
		if (on) {
			bin *b = bin_find(size, stream, device, 0);
			if (b != NULL && b->n > 0) {
				uintptr_t p = b->ptr[--b->n];
				live_put(p, size, stream, device);
				hits++;
				pthread_mutex_unlock(&mu);
				return (void *)p;
			}
			misses++;
		}
		pthread_mutex_unlock(&mu);
	}
	int keepable = 0;
	void *p = arenaplan_go_alloc(size, device, stream, &keepable);
	if (p != NULL && keepable) {
		pthread_mutex_lock(&mu);
		live_put((uintptr_t)p, size, stream, device);
		pthread_mutex_unlock(&mu);
	}
	return p;
}

void arenaplan_torch_free(void *ptr, size_t size, int device, void *stream) {
	if (ptr != NULL) {
		pthread_mutex_lock(&mu);
		live_entry e;
		// Kept only when the free says what the allocation was (PyTorch
		// passes its size); either way it leaves the live set.
		if (live_del((uintptr_t)ptr, &e) && on && e.size == size && e.device == device) {
			bin *b = bin_find(e.size, e.stream, e.device, 1);
			if (b != NULL && b->n < BIN_DEPTH) {
				b->ptr[b->n++] = (uintptr_t)ptr;
				kept++;
				pthread_mutex_unlock(&mu);
				return;
			}
		}
		pthread_mutex_unlock(&mu);
	}
	arenaplan_go_free(ptr, size, device, stream);
}

void arenaplan_torch_record_stream(void *ptr, void *stream) {
	pthread_mutex_lock(&mu);
	live_del((uintptr_t)ptr, NULL); // used elsewhere: its free goes to Go
	pthread_mutex_unlock(&mu);
	arenaplan_go_record_stream(ptr, stream);
}

void fp_set(int v) {
	pthread_mutex_lock(&mu);
	on = v;
	pthread_mutex_unlock(&mu);
}

int fp_take(fp_entry *out, int max) {
	int n = 0;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < BIN_N && n < max; i++) {
		bin *b = &bins[i];
		while (b->n > 0 && n < max) {
			out[n++] = (fp_entry){b->ptr[--b->n], b->device};
		}
	}
	if (n < max) {
		memset(bins, 0, sizeof bins); // all taken: forget the keys
	}
	pthread_mutex_unlock(&mu);
	return n;
}

void fp_counts(uint64_t *h, uint64_t *k, uint64_t *m) {
	pthread_mutex_lock(&mu);
	*h = hits, *k = kept, *m = misses;
	pthread_mutex_unlock(&mu);
}
