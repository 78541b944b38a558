// eager_steps: a recorded step's allocations and frees, replayed as eager
// steps through the C ABI, with what each step cost the allocator.
//
//   eager_steps LIB TRACE.csv [STEPS] [STREAMS]
//
// TRACE.csv is a trace in MiniMalloc's CSV form (id,lower,upper,size: a
// buffer live over [lower, upper) of a step's logical time), as PyTorch's
// memory snapshots give them (../shared/data/torch). Buffers live over the
// whole step are allocated once, before the first step (weights); the
// others are allocated and freed in time order every step, on one stream.
// With STREAMS > 1, every fourth buffer is also used on one of the other
// STREAMS - 1 streams, taken in turn (record_stream, as tensors handed to
// a collective's stream are).
//
// Per step it prints the fast path's hits and the calls into Go (Go
// allocs; the frees handed to Go and the calls that carried frees alone:
// the others rode along with an allocation or a record_stream), the
// drains, the segments mapped and unmapped, the cross-stream frees and
// the waits, and the host time of the step's allocator calls; at the end,
// what is mapped and a digest of every address handed out. The first
// steps settle what is mapped and kept, as PyTorch's allocator's first
// steps do; a steady step (the second half of them) must map, unmap, give
// every kept block back and wait for nothing: the program exits 1 where
// one does, so that CI fails.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);
typedef void (*record_fn)(void *, void *);
typedef char *(*stats_fn)(int, char **);
typedef void (*free_string_fn)(char *);
typedef void (*captures_fn)(int);

typedef struct {
  long lower, upper;
  size_t size;
  void *ptr;
  void *stream;
  int shared;
} buffer;

typedef struct {
  long t;
  int alloc; // 1: allocate, 0: free
  int i;
} event;

static int cmp_event(const void *a, const void *b) {
  const event *x = a, *y = b;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  if (x->alloc != y->alloc) return x->alloc - y->alloc; // frees first
  return x->i - y->i;
}

static stats_fn stats;
static free_string_fn free_string;

static unsigned long long field(const char *js, const char *within, const char *key) {
  const char *w = strstr(js, within);
  const char *k = w ? strstr(w, key) : NULL;
  return k ? strtoull(k + strlen(key), NULL, 10) : 0;
}

enum { HITS, GOALLOCS, GOFREES, FREECALLS, LIKE, DRAINS, GROWTH, GROWS, UNMAPS, XFREES, QUERIES, SYNCS, NCOUNT };
static const char *names[NCOUNT] = {"hits",   "Go allocs",      "Go frees", "free calls", "stream drains", "drains",
                                    "growth drains", "maps", "unmaps", "x-stream frees", "event queries", "waits"};

static void read_counts(unsigned long long *c) {
  char *js = NULL;
  char *err = stats(0, &js);
  if (err || !js) {
    fprintf(stderr, "eager_steps: stats: %s\n", err ? err : "(none)");
    exit(2);
  }
  c[HITS] = field(js, "\"FastPath\"", "\"Hits\":");
  c[GOALLOCS] = field(js, "\"FastPath\"", "\"GoAllocs\":");
  c[GOFREES] = field(js, "\"FastPath\"", "\"GoFrees\":");
  c[FREECALLS] = field(js, "\"FastPath\"", "\"FreeCalls\":");
  c[LIKE] = field(js, "\"FastPath\"", "\"LikeDrains\":");
  c[DRAINS] = field(js, "\"FastPath\"", "\"Drains\":");
  c[GROWTH] = field(js, "\"FastPath\"", "\"GrowthDrains\":");
  c[GROWS] = field(js, "\"Spill\"", "\"Grows\":");
  c[UNMAPS] = field(js, "\"Spill\"", "\"Unmaps\":");
  c[XFREES] = field(js, "\"Spill\"", "\"CrossStreamFrees\":");
  c[QUERIES] = field(js, "\"Spill\"", "\"EventQueries\":");
  c[SYNCS] = field(js, "\"Spill\"", "\"Syncs\":");
  free_string(js);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: eager_steps LIB TRACE.csv [STEPS] [STREAMS]\n");
    return 2;
  }
  int steps = argc > 3 ? atoi(argv[3]) : 12, nstreams = argc > 4 ? atoi(argv[4]) : 1;
  if (steps < 4 || nstreams < 1 || nstreams > 64) {
    fprintf(stderr, "eager_steps: want at least 4 steps and 1 to 64 streams\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "eager_steps: %s\n", dlerror());
    return 2;
  }
  alloc_fn ap_alloc = (alloc_fn)dlsym(lib, "arenaplan_alloc");
  free_fn ap_free = (free_fn)dlsym(lib, "arenaplan_free");
  record_fn record = (record_fn)dlsym(lib, "arenaplan_torch_record_stream");
  captures_fn captures = (captures_fn)dlsym(lib, "arenaplan_captures_underway");
  stats = (stats_fn)dlsym(lib, "arenaplan_stats");
  free_string = (free_string_fn)dlsym(lib, "arenaplan_free_string");
  if (!ap_alloc || !ap_free || !record || !captures || !stats || !free_string) {
    fprintf(stderr, "eager_steps: a symbol is missing: %s\n", dlerror());
    return 2;
  }
  FILE *f = fopen(argv[2], "r");
  if (!f) {
    perror(argv[2]);
    return 2;
  }
  char line[256];
  int n = 0, cap = 1024;
  buffer *bs = malloc(sizeof *bs * cap);
  long tmin = -1, tmax = 0;
  while (fgets(line, sizeof line, f)) {
    long id, lo, hi;
    unsigned long long size;
    if (sscanf(line, "%ld,%ld,%ld,%llu", &id, &lo, &hi, &size) != 4) continue; // the header
    if (n == cap) bs = realloc(bs, sizeof *bs * (cap *= 2));
    bs[n++] = (buffer){lo, hi, (size_t)size, NULL, (void *)(uintptr_t)0x1000, 0};
    if (tmin < 0 || lo < tmin) tmin = lo;
    if (hi > tmax) tmax = hi;
  }
  fclose(f);
  captures(0); // the host counts captures (none): the fast path may open
  event *ev = malloc(sizeof *ev * 2 * n);
  int ne = 0;
  for (int i = 0; i < n; i++) {
    if (bs[i].lower == tmin && bs[i].upper == tmax) {
      bs[i].ptr = ap_alloc(bs[i].size, 0, bs[i].stream); // lives across steps
      continue;
    }
    bs[i].shared = nstreams > 1 && i % 4 == 0 ? 1 + (i / 4) % (nstreams - 1) : 0;
    ev[ne++] = (event){bs[i].lower, 1, i};
    ev[ne++] = (event){bs[i].upper, 0, i};
  }
  qsort(ev, ne, sizeof *ev, cmp_event);
  printf("%s: %d buffers, %d a step, %d streams\n", argv[2], n, ne / 2, nstreams);
  printf("step");
  for (int k = 0; k < NCOUNT; k++) printf(" | %s", names[k]);
  printf(" | ns a pair\n");
  unsigned long long c0[NCOUNT], c1[NCOUNT];
  int bad = 0;
  // A digest of every address handed out, in order (FNV-1a): two builds
  // that decide alike print the same.
  unsigned long long digest = 0xcbf29ce484222325ull;
  for (int s = 1; s <= steps; s++) {
    read_counts(c0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int e = 0; e < ne; e++) {
      buffer *b = &bs[ev[e].i];
      if (ev[e].alloc) {
        b->ptr = ap_alloc(b->size, 0, b->stream);
        if (!b->ptr) {
          fprintf(stderr, "eager_steps: step %d: allocation of %zu bytes failed\n", s, b->size);
          return 1;
        }
        digest = (digest ^ (uintptr_t)b->ptr) * 0x100000001b3ull;
        if (b->shared) record(b->ptr, (void *)((uintptr_t)b->stream + 16 * (uintptr_t)b->shared));
      } else {
        ap_free(b->ptr, b->size, 0, b->stream);
        b->ptr = NULL;
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    read_counts(c1);
    double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (ne / 2 > 0 ? ne / 2 : 1);
    printf("%d", s);
    for (int k = 0; k < NCOUNT; k++) printf(" | %llu", c1[k] - c0[k]);
    printf(" | %.0f\n", ns);
    if (s > steps / 2 && (c1[DRAINS] != c0[DRAINS] || c1[GROWTH] != c0[GROWTH] || c1[GROWS] != c0[GROWS] ||
                   c1[UNMAPS] != c0[UNMAPS] || c1[SYNCS] != c0[SYNCS])) {
      bad = 1;
    }
  }
  {
    char *js = NULL;
    if (!stats(0, &js) && js) {
      printf("mapped after the steps: %llu bytes, at most %llu; addresses handed out: digest %016llx\n",
             field(js, "\"Spill\"", "\"Mapped\":"), field(js, "\"Spill\"", "\"PeakMapped\":"), digest);
      free_string(js);
    }
  }
  if (bad) {
    printf("FAIL a steady step (the second half) mapped, unmapped, gave every kept block back or waited\n");
    return 1;
  }
  printf("ok   steady steps map, unmap, drain and wait for nothing\n");
  return 0;
}
