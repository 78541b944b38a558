// The allocator's C fast path (fastpath.c): declarations Go calls.
#ifndef ARENAPLAN_FASTPATH_H
#define ARENAPLAN_FASTPATH_H

#include <stddef.h>
#include <stdint.h>

// A block the fast path kept, given back to Go (fp_take).
typedef struct {
	uintptr_t ptr;
	int device;
} fp_entry;

// fp_set opens (1) or shuts (0) the fast path.
void fp_set(int on);
// fp_take moves up to max kept blocks into out and returns how many.
int fp_take(fp_entry *out, int max);
// fp_counts reports the fast path's counters since the library loaded.
void fp_counts(uint64_t *hits, uint64_t *kept, uint64_t *misses);

#endif
