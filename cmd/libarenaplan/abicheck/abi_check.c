// abi_check loads libarenaplan.so with dlopen, as PyTorch does, and calls
// its exported C ABI: the allocator pair for C (arenaplan_alloc, _free) (concurrently from several
// threads), 0-byte requests, a step recorded, planned and served twice at
// the same addresses, errors as strings, and the cost of alloc + free.
//
//   cc -O2 -o abi_check abi_check.c -ldl -lpthread   (a C program of its own: it
// lives outside the cgo package so that it is not linked into the library)
//   ARENAPLAN_DEVICE=sim ./abi_check ./libarenaplan.so      # no GPU needed
//   ./abi_check ./libarenaplan.so bench                      # on a GPU: timing only
//
// Exits 0 when every check passes; prints one line per check.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);
typedef char *(*step_new_fn)(int, const char *, int *);
typedef char *(*step_stream_fn)(int, void *);
typedef char *(*step_serve_fn)(int, void *, int);
typedef char *(*step_int_fn)(int, int);
typedef char *(*step_plan_fn)(int, double);
typedef char *(*step_id_fn)(int);
typedef char *(*step_report_fn)(int, char **);
typedef void (*free_string_fn)(char *);
typedef char *(*last_error_fn)(void);

static alloc_fn ap_alloc;
static free_fn ap_free;
static free_string_fn ap_free_string;
static int failures;

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      failures++;                                        \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);        \
      printf(__VA_ARGS__);                               \
      printf("\n");                                      \
    }                                                    \
  } while (0)

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "abi_check: %s missing: %s\n", name, dlerror());
    exit(2);
  }
  return p;
}

// ok checks that a control call returned no error.
static int ok(char *err, const char *what) {
  if (err) {
    printf("FAIL %s: %s\n", what, err);
    ap_free_string(err);
    failures++;
    return 0;
  }
  return 1;
}

// step_run makes a model-like step's allocations on stream and writes
// their addresses to out (n of them); the output stays live and is
// returned.
#define LAYERS 10
#define STEP_ALLOCS (2 * LAYERS + 1)
static void *step_run(void *stream, void **out) {
  void *acts[LAYERS];
  int n = 0, live0 = 0;
  for (int i = 0; i < LAYERS; i++) {
    acts[i] = ap_alloc(4096 + 1000 * i, 0, stream);
    out[n++] = acts[i];
    void *ws = ap_alloc(65536, 0, stream);
    out[n++] = ws;
    void *z = ap_alloc(0, 0, stream);
    ap_free(ws, 65536, 0, stream);
    ap_free(z, 0, 0, stream);
    if (i - live0 >= 2) {
      ap_free(acts[live0], 4096 + 1000 * live0, 0, stream);
      live0++;
    }
  }
  void *o = ap_alloc(8192, 0, stream);
  out[n++] = o;
  for (int i = live0; i < LAYERS; i++) ap_free(acts[i], 4096 + 1000 * i, 0, stream);
  return o;
}

struct worker {
  int id;
  int errors;
};

// work allocates and frees from one thread on a stream of its own (odd
// workers pass the size back at free, as PyTorch does, so the fast path
// keeps and hands out their blocks), and counts failures and live
// allocations that overlap.
static void *work(void *arg) {
  struct worker *w = arg;
  void *stream = (void *)(uintptr_t)(0x1000 + w->id);
  void *live[8] = {0};
  size_t sizes[8] = {0};
  for (int i = 0; i < 20000; i++) {
    size_t size = 256 * (1 + (i * 7 + w->id) % 13);
    void *p = ap_alloc(size, 0, stream);
    if (!p) w->errors++;
    int slot = i % 8;
    if (live[slot]) ap_free(live[slot], w->id % 2 ? sizes[slot] : 0, 0, stream);
    live[slot] = p, sizes[slot] = size;
    for (int j = 0; j < 8; j++) {
      uintptr_t a = (uintptr_t)live[j], b = (uintptr_t)p;
      if (j != slot && a && b < a + sizes[j] && a < b + size) w->errors++;
    }
  }
  for (int i = 0; i < 8; i++)
    if (live[i]) ap_free(live[i], sizes[i], 0, stream);
  return NULL;
}

// fastpath_counts reads the fast path's counters from arenaplan_stats.
static void fastpath_counts(char *(*stats)(int, char **), unsigned long long *h, unsigned long long *k,
                            unsigned long long *m) {
  char *js = NULL, *e = stats(0, &js);
  *h = *k = *m = ~0ull;
  if (e) {
    ap_free_string(e);
    return;
  }
  char *f = js ? strstr(js, "\"FastPath\"") : NULL;
  if (f) sscanf(f, "\"FastPath\":{\"Hits\":%llu,\"Kept\":%llu,\"Misses\":%llu", h, k, m);
  if (js) ap_free_string(js);
}

// stat_after reads the number after key, searched for after the first
// occurrence of within in arenaplan_stats's JSON (~0 if absent).
static unsigned long long stat_after(char *(*stats)(int, char **), const char *within, const char *key) {
  char *js = NULL, *e = stats(0, &js);
  unsigned long long v = ~0ull;
  if (e) {
    ap_free_string(e);
    return v;
  }
  char *w = js ? strstr(js, within) : NULL;
  char *k = w ? strstr(w, key) : NULL;
  if (k) sscanf(k + strlen(key), "%llu", &v);
  if (js) ap_free_string(js);
  return v;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// bench prints the median and p99 of alloc + free of size bytes on stream:
// the mean of a pair over each of 400 batches of 500 pairs, after a
// warm-up (a clock read costs more than a pair on the fast path).
static void bench(size_t size, void *stream, const char *what) {
  enum { BATCHES = 400, PAIRS = 500 };
  static double t[BATCHES];
  for (int i = 0; i < 1000; i++) ap_free(ap_alloc(size, 0, stream), size, 0, stream);
  for (int b = 0; b < BATCHES; b++) {
    double t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
      void *p = ap_alloc(size, 0, stream);
      ap_free(p, size, 0, stream);
    }
    t[b] = (now_ns() - t0) / PAIRS;
  }
  qsort(t, BATCHES, sizeof t[0], cmp_double);
  printf("bench alloc+free %zu B on %s: median %.1f ns, p99 %.1f ns (%d batches of %d pairs)\n", size, what,
         t[BATCHES / 2], t[BATCHES * 99 / 100], BATCHES, PAIRS);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: abi_check LIBRARY.so [bench]\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "abi_check: %s\n", dlerror());
    return 2;
  }
  ap_alloc = (alloc_fn)dlsym(lib, "arenaplan_alloc");
  ap_free = (free_fn)dlsym(lib, "arenaplan_free");
  if (!ap_alloc) { // a library from before the C pair had its own names
    ap_alloc = (alloc_fn)sym(lib, "arenaplan_torch_alloc");
    ap_free = (free_fn)sym(lib, "arenaplan_torch_free");
  }
  ap_free_string = (free_string_fn)sym(lib, "arenaplan_free_string");
  step_new_fn step_new = (step_new_fn)sym(lib, "arenaplan_step_new");
  step_stream_fn step_record = (step_stream_fn)sym(lib, "arenaplan_step_record");
  step_serve_fn step_serve = (step_serve_fn)sym(lib, "arenaplan_step_serve");
  step_int_fn step_end = (step_int_fn)sym(lib, "arenaplan_step_end");
  step_plan_fn step_plan = (step_plan_fn)sym(lib, "arenaplan_step_plan");
  step_id_fn step_close = (step_id_fn)sym(lib, "arenaplan_step_close");
  step_report_fn step_report = (step_report_fn)sym(lib, "arenaplan_step_report");
  last_error_fn last_error = (last_error_fn)sym(lib, "arenaplan_last_error");

  if (argc > 2 && strcmp(argv[2], "bench") == 0) {
    // On a GPU: the first allocation opens the device and makes its
    // primary context current on this thread; then a real stream.
    ap_free(ap_alloc(256, 0, NULL), 256, 0, NULL);
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*stream_create)(void **, unsigned) = cu ? (int (*)(void **, unsigned))dlsym(cu, "cuStreamCreate") : NULL;
    void *st = NULL;
    bench(4096, NULL, "the legacy stream");
    if (stream_create && stream_create(&st, 1) == 0) {
      bench(4096, st, "a created stream (capture query per allocation)");
      // What arenaplan.torch does: it reports PyTorch's capture count, so
      // no allocation outside a capture asks the driver.
      void (*captures)(int) = (void (*)(int))sym(lib, "arenaplan_captures_underway");
      captures(0);
      bench(4096, st, "a created stream (host reports 0 captures)");
    }
    ((void (*)(int))sym(lib, "arenaplan_captures_underway"))(0);
    bench(1 << 20, NULL, "the legacy stream (host reports 0 captures)");
    // The floor under every export: one call from C into Go that does
    // almost nothing (a lock and a NULL; arenaplan_captures_underway is
    // a control call now, which shuts and drains the fast path).
    {
      enum { N = 200000 };
      static double t[N];
      for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        char *e = last_error();
        t[i] = now_ns() - t0;
        if (e) ap_free_string(e);
      }
      qsort(t, N, sizeof t[0], cmp_double);
      printf("bench one near-empty call into Go (arenaplan_last_error): median %.0f ns, p99 %.0f ns\n", t[N / 2],
             t[N * 99 / 100]);
    }
    return 0;
  }

  // What arenaplan.torch does at install: it reports PyTorch's capture
  // count, which opens the C fast path (no capture, no step, no region):
  // every check below runs with it open.
  void (*captures)(int) = (void (*)(int))sym(lib, "arenaplan_captures_underway");
  void (*record_stream)(void *, void *) = (void (*)(void *, void *))sym(lib, "arenaplan_torch_record_stream");
  char *(*stats)(int, char **) = (char *(*)(int, char **))sym(lib, "arenaplan_stats");
  captures(0);

  // Plain allocations: distinct, 256-byte aligned, NULL on failure with a reason.
  void *a = ap_alloc(1000, 0, NULL), *b = ap_alloc(1000, 0, NULL);
  CHECK(a && b && a != b, "two live allocations: %p %p", a, b);
  CHECK(((uintptr_t)a & 255) == 0 && ((uintptr_t)b & 255) == 0, "alignment: %p %p", a, b);
  ap_free(a, 1000, 0, NULL);
  ap_free(b, 1000, 0, NULL);
  // Kept by size class (512-byte multiples): a request of another size in
  // the freed blocks' class (513..1024) gets one of them back.
  void *c = ap_alloc(700, 0, NULL);
  CHECK(c == a || c == b, "700 B after two 1000 B blocks were freed: %p, not %p or %p", c, a, b);
  ap_free(c, 700, 0, NULL);
  if (c == a || c == b) printf("ok   a freed block serves the next request of its size class\n");
  void *huge = ap_alloc((size_t)1 << 50, 0, NULL);
  char *why = last_error();
  CHECK(huge == NULL && why && strstr(why, "CUDA out of memory. Tried to allocate"), "1 PiB: %p, last error %s", huge, why ? why : "(none)");
  if (why) printf("ok   out of memory says: %s\n", why), ap_free_string(why);

  // 0-byte requests: distinct non-NULL addresses while live.
  void *z[100];
  int zdup = 0;
  for (int i = 0; i < 100; i++) {
    z[i] = ap_alloc(0, 0, NULL);
    for (int j = 0; j < i; j++) zdup += z[i] == z[j];
  }
  CHECK(z[0] != NULL && zdup == 0, "100 live 0-byte allocations: %d duplicates", zdup);
  for (int i = 0; i < 100; i++) ap_free(z[i], 0, 0, NULL);
  if (!zdup) printf("ok   0-byte requests: 100 distinct addresses\n");
  // Their tokens kept by the fast path and handed out again: still
  // distinct while live, through frees and new requests interleaved.
  void *zl[300];
  int nl = 0, zbad = 0;
  for (int round = 0; round < 6; round++) {
    for (int i = 0; i < 40; i++) zl[nl++] = ap_alloc(0, 0, NULL);
    for (int i = round % 2; i < nl; i += 2) ap_free(zl[i], 0, 0, NULL), zl[i] = NULL;
    int k = 0;
    for (int i = 0; i < nl; i++)
      if (zl[i] != NULL) zl[k++] = zl[i];
    nl = k;
    for (int i = 0; i < nl; i++) {
      zbad += zl[i] == NULL;
      for (int j = 0; j < i; j++) zbad += zl[i] == zl[j];
    }
  }
  CHECK(zbad == 0, "0-byte tokens handed out again: %d NULL or shared among %d live", zbad, nl);
  for (int i = 0; i < nl; i++) ap_free(zl[i], 0, 0, NULL);
  if (!zbad) printf("ok   0-byte tokens kept and handed out again: distinct while live\n");

  // A step: record, plan, serve twice at the same addresses.
  void *stream = (void *)(uintptr_t)0x77;
  int id = -1;
  void *rec[STEP_ALLOCS], *run1[STEP_ALLOCS], *run2[STEP_ALLOCS];
  // Blocks of the step's sizes kept by the fast path on its stream: a step
  // must see every allocation all the same.
  for (int i = 0; i < 3; i++) ap_free(ap_alloc(65536, 0, stream), 65536, 0, stream);
  if (ok(step_new(0, "abi", &id), "step_new") && ok(step_record(id, stream), "record")) {
    void *o = step_run(stream, rec);
    ok(step_end(id, 0), "end recording");
    ap_free(o, 8192, 0, stream);
    ok(step_plan(id, 1.0), "plan");
    for (int r = 0; r < 2; r++) {
      ok(step_serve(id, stream, 1), "serve");
      o = step_run(stream, r ? run2 : run1);
      ok(step_end(id, 0), "end serving");
      ap_free(o, 8192, 0, stream);
    }
    int same = memcmp(run1, run2, sizeof run1) == 0;
    CHECK(same, "two served runs got different addresses");
    char *js = NULL;
    ok(step_report(id, &js), "report");
    // Every allocation of both runs came from the plan: none was taken by
    // the fast path (it is shut while a step runs).
    CHECK(js && strstr(js, "\"divergences\":0") && strstr(js, "\"runs\":2") && strstr(js, "\"served\":42") &&
              strstr(js, "\"buffers\":21"),
          "report: %s", js ? js : "(none)");
    if (same && js) printf("ok   step served twice at the same addresses: %s\n", js);
    if (js) ap_free_string(js);
    ok(step_close(id), "close");
  }
  char *e = step_serve(9999, stream, 0);
  CHECK(e && strstr(e, "no step 9999"), "serve of an unknown step: %s", e ? e : "(no error)");
  if (e) printf("ok   unknown step refused: %s\n", e), ap_free_string(e);

  // The fast path: a freed block is kept in C and handed out again for the
  // same size and stream, never for another stream, never after
  // record_stream.
  {
    unsigned long long h0, k0, m0, h1, k1, m1;
    void *s1 = (void *)(uintptr_t)0x501, *s2 = (void *)(uintptr_t)0x502;
    fastpath_counts(stats, &h0, &k0, &m0);
    void *p = ap_alloc(20480, 0, s1);
    ap_free(p, 20480, 0, s1);
    void *q = ap_alloc(20480, 0, s1);
    void *r = ap_alloc(20480, 0, s2);
    fastpath_counts(stats, &h1, &k1, &m1);
    const char *env = getenv("ARENAPLAN_FASTPATH");
    int shut = env && strcmp(env, "0") == 0; // then nothing is kept
    CHECK(shut ? h1 == h0 && k1 == k0 : q == p && h1 == h0 + 1 && k1 == k0 + 1,
          "fast path%s: freed %p, got %p back; hits %llu->%llu, kept %llu->%llu", shut ? " (shut)" : "", p, q, h0, h1, k0, k1);
    CHECK(r != p && r != NULL, "fast path: another stream got %p (the kept block is %p)", r, p);
    ap_free(q, 20480, 0, s1);
    ap_free(r, 20480, 0, s2);
    void *x = ap_alloc(36864, 0, s1);
    record_stream(x, s2);
    fastpath_counts(stats, &h0, &k0, &m0);
    ap_free(x, 36864, 0, s1);
    fastpath_counts(stats, &h1, &k1, &m1);
    CHECK(k1 == k0, "fast path kept a block used on another stream (kept %llu->%llu)", k0, k1);
    // Reading or resetting statistics (a program that logs
    // torch.cuda.memory_allocated() every step) leaves the kept blocks
    // where they are: the next allocation of that size is still a hit.
    {
      char *(*mstats)(int, char **) = (char *(*)(int, char **))sym(lib, "arenaplan_memory_stats");
      char *(*reset_peak)(int) = (char *(*)(int))sym(lib, "arenaplan_reset_peak_stats");
      void *y = ap_alloc(45056, 0, s1);
      ap_free(y, 45056, 0, s1);
      char *mj = NULL;
      ok(mstats(0, &mj), "memory_stats");
      if (mj) ap_free_string(mj);
      ok(reset_peak(0), "reset_peak_stats");
      fastpath_counts(stats, &h0, &k0, &m0);
      void *z = ap_alloc(45056, 0, s1);
      fastpath_counts(stats, &h1, &k1, &m1);
      CHECK(shut ? h1 == h0 : z == y && h1 == h0 + 1,
            "statistics calls drained the fast path: freed %p, got %p after them; hits %llu->%llu", y, z, h0, h1);
      if (!shut && z == y) printf("ok   statistics calls leave the fast path's blocks kept\n");
      ap_free(z, 45056, 0, s1);
    }
    char *js = NULL;
    ok(stats(0, &js), "stats");
    CHECK(js && strstr(js, "\"Kept\""), "stats: %s", js ? js : "(none)");
    if (js) printf("ok   fast path: %s\n", strstr(js, "\"FastPath\"")), ap_free_string(js);

    // What the fast path keeps never makes Go map more: a request of
    // another size that fits only where a kept block lies takes the kept
    // blocks back first (a growth drain) instead of mapping a segment.
    void *s3 = (void *)(uintptr_t)0x503;
    unsigned long long mapped0 = stat_after(stats, "\"Spill\"", "\"Mapped\":");
    unsigned long long grown0 = stat_after(stats, "\"FastPath\"", "\"GrowthDrains\":");
    void *a = ap_alloc(3 << 19, 0, s3);
    ap_free(a, 3 << 19, 0, s3);
    void *b = ap_alloc(2 << 20, 0, s3);
    unsigned long long mapped1 = stat_after(stats, "\"Spill\"", "\"Mapped\":");
    unsigned long long grown1 = stat_after(stats, "\"FastPath\"", "\"GrowthDrains\":");
    // (At least one: blocks kept earlier are still kept, statistics calls
    // leave them, and a's own allocation may take them back too.) At most
    // a's chunk more, which b takes too (requests of 1-10 MiB share
    // segments that map what their blocks need): where the request passes
    // the most ever mapped, the wholly free segments, the drained ones
    // among them, go back to the driver first, and less may be mapped
    // than before.
    long long grew = (long long)mapped1 - (long long)mapped0;
    CHECK(a && b && grew <= 2 << 20 && (shut ? grown1 == grown0 : grown1 > grown0),
          "kept block and growth: 1.5 MiB freed then 2 MiB asked on one stream mapped %lld bytes more (want at "
          "most one 2 MiB chunk), growth drains %llu->%llu",
          grew, grown0, grown1);
    if (grew <= 2 << 20) printf("ok   a kept block is given back before Go maps more memory\n");
    ap_free(b, 2 << 20, 0, s3);
  }

  // Concurrent callers.
  pthread_t th[4];
  struct worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (struct worker){.id = i};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  int errs = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    errs += w[i].errors;
  }
  CHECK(errs == 0, "%d failed or overlapping allocations from 4 threads", errs);
  if (!errs) printf("ok   4 threads x 20000 alloc/free\n");

  bench(4096, NULL, "the legacy stream, fast path open (simulated device)");
  captures(1); // shut: a capture underway as the host counts it
  bench(4096, NULL, "the legacy stream, fast path shut (simulated device)");
  captures(0);
  if (failures) {
    printf("%d checks failed\n", failures);
    return 1;
  }
  printf("all ABI checks passed\n");
  return 0;
}
