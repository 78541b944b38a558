// abuse runs what a careless or unlucky host program does to its allocator
// against libarenaplan.so on the simulated device, each case in a fresh
// process (an abort of the host is a result, not the end of the run), and
// prints one row per case: exit status, allocations that failed, the error
// the library gave, the host memory it cost. It exits 1 if any case does
// not behave: an allocation that fits must succeed, one that does not
// must fail with a reason, no address may be live twice, nothing may
// abort.
//
//   cc -O2 -o abuse abuse.c -ldl -lpthread
//   ARENAPLAN_DEVICE=sim ./abuse ./libarenaplan.so [CASE ...]
//   ARENAPLAN_DEVICE=sim ./abuse ./libarenaplan-fault.so fault
//
// The fault case needs a library built with -tags arenaplan_fault: it
// makes every export panic and checks that each one reports an error.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define DEVICE_BYTES (1024 * MiB) // the simulated device each case runs on

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);

static void *lib;
static alloc_fn ap_alloc;
static free_fn ap_free;
static char *(*last_error)(void);
static void (*free_string)(char *);
static void (*captures)(int);

// result is what a case reports back to the parent (through a pipe).
typedef struct {
	int bad;      // checks that failed
	long failed;  // allocations that returned NULL
	long allocs;  // allocations made
	char err[200]; // the library's last error, or a note
	char note[200];
} result;

static void *sym(const char *name) { return dlsym(lib, name); }

static void take_error(result *r) {
	char *e = last_error ? last_error() : NULL;
	if (e) {
		snprintf(r->err, sizeof r->err, "%s", e);
		free_string(e);
	}
}

static long rss_kib(void) {
	FILE *f = fopen("/proc/self/statm", "r");
	long pages = 0, res = 0;
	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
		fclose(f);
	}
	return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

static void *alloc_counted(result *r, size_t size, int device, void *stream) {
	void *p = ap_alloc(size, device, stream);
	r->allocs++;
	if (!p) r->failed++;
	return p;
}

// variable: 2000 steps of 4 tensors of 256 KiB x 1..512 (at most 512 MiB
// live) on a 1 GiB device: every allocation fits.
static void case_variable(result *r) {
	void *st = (void *)(uintptr_t)0x11;
	for (int step = 0; step < 2000; step++) {
		void *p[4];
		size_t sz[4];
		for (int i = 0; i < 4; i++) {
			sz[i] = (256 << 10) * (1 + next() % 512);
			p[i] = alloc_counted(r, sz[i], 0, st);
		}
		for (int i = 0; i < 4; i++) ap_free(p[i], sz[i], 0, st);
	}
	if (r->failed) take_error(r), r->bad++;
}

// free-bigger: free 600 MiB, then ask for 700 MiB.
static void case_free_bigger(result *r) {
	void *p = alloc_counted(r, 600 * MiB, 0, NULL);
	ap_free(p, 600 * MiB, 0, NULL);
	void *q = alloc_counted(r, 700 * MiB, 0, NULL);
	if (!q) take_error(r), r->bad++;
	ap_free(q, 700 * MiB, 0, NULL);
}

// grow: 192, 256 and 768 MiB one after another (each freed), then 1280
// MiB, more than the device: the last fails with a reason, and the
// allocator still serves what fits.
static void case_grow(result *r) {
	size_t sizes[] = {192 * MiB, 256 * MiB, 768 * MiB};
	for (int i = 0; i < 3; i++) {
		void *p = alloc_counted(r, sizes[i], 0, NULL);
		if (!p) r->bad++;
		ap_free(p, sizes[i], 0, NULL);
	}
	void *big = alloc_counted(r, 1280 * MiB, 0, NULL);
	take_error(r);
	if (big || !strstr(r->err, "CUDA out of memory.")) r->bad++;
	void *again = alloc_counted(r, 768 * MiB, 0, NULL);
	if (!again) r->bad++;
	ap_free(again, 768 * MiB, 0, NULL);
}

// double-free: a block freed twice is reported; the next two allocations
// of its size get different addresses.
static void case_double_free(result *r) {
	void *p = alloc_counted(r, 65536, 0, NULL);
	ap_free(p, 65536, 0, NULL);
	ap_free(p, 65536, 0, NULL);
	take_error(r);
	void *a = alloc_counted(r, 65536, 0, NULL), *b = alloc_counted(r, 65536, 0, NULL);
	if (!r->err[0]) r->bad++;
	if (a == b) r->bad++, snprintf(r->note, sizeof r->note, "one address handed out twice: %p", a);
	ap_free(a, 65536, 0, NULL);
	ap_free(b, 65536, 0, NULL);
}

// interior-free: a free of an address inside a block is reported and
// changes nothing.
static void case_interior_free(result *r) {
	void *p = alloc_counted(r, 65536, 0, NULL);
	ap_free((char *)p + 256, 65536, 0, NULL);
	take_error(r);
	void *q = alloc_counted(r, 65536, 0, NULL);
	if (!r->err[0] || q == p) r->bad++;
	ap_free(q, 65536, 0, NULL);
	ap_free(p, 65536, 0, NULL);
}

// wrong-device: a free that names another device is reported; the block
// stays live until its real free.
static void case_wrong_device(result *r) {
	void *p = alloc_counted(r, 65536, 0, NULL);
	ap_free(p, 65536, 1, NULL);
	take_error(r);
	void *q = alloc_counted(r, 65536, 0, NULL);
	if (!r->err[0] || q == p) r->bad++;
	ap_free(q, 65536, 0, NULL);
	ap_free(p, 65536, 0, NULL);
}

// error-per-thread: a failure on one thread is not another thread's last
// error, and a success clears it.
static void *fail_once(void *arg) {
	(void)arg;
	ap_alloc((size_t)1 << 50, 0, NULL);
	return NULL;
}
static void case_error_per_thread(result *r) {
	pthread_t t;
	pthread_create(&t, NULL, fail_once, NULL);
	pthread_join(t, NULL);
	take_error(r);
	if (r->err[0]) r->bad++, snprintf(r->note, sizeof r->note, "another thread's failure");
	ap_alloc((size_t)1 << 50, 0, NULL);
	char *e = last_error();
	if (!e) r->bad++;
	else free_string(e);
	void *p = alloc_counted(r, 4096, 0, NULL);
	e = last_error();
	if (e) r->bad++, snprintf(r->note, sizeof r->note, "kept after a success: %s", e), free_string(e);
	ap_free(p, 4096, 0, NULL);
}

// null-args: every out-pointer and path argument NULL.
static void case_null_args(result *r) {
	char *(*step_new)(int, const char *, int *) = sym("arenaplan_step_new");
	char *(*stats)(int, char **) = sym("arenaplan_stats");
	char *(*step_report)(int, char **) = sym("arenaplan_step_report");
	char *(*step_save)(int, const char *) = sym("arenaplan_step_save");
	char *(*family_new)(int, const char *, int *) = sym("arenaplan_family_new");
	char *(*chain_new)(int, const char *, int *) = sym("arenaplan_chain_new");
	char *(*family_member)(int, const char *, int *) = sym("arenaplan_family_member");
	char *(*family_report)(int, char **) = sym("arenaplan_family_report");
	char *(*region_begin)(int, long, const char *, int) = sym("arenaplan_region_begin");
	int id = -1, fid = -1, errors = 0, calls = 0;
	char *e;
#define NULLCALL(call)                                 \
	do {                                           \
		calls++;                               \
		e = (call);                            \
		if (e) errors++, free_string(e);       \
	} while (0)
	NULLCALL(step_new(0, "n", NULL));
	NULLCALL(stats(0, NULL));
	e = step_new(0, "n", &id);
	if (e) free_string(e);
	NULLCALL(step_report(id, NULL));
	NULLCALL(step_save(id, NULL));
	NULLCALL(family_new(0, "f", NULL));
	NULLCALL(chain_new(0, "c", NULL));
	e = family_new(0, "f", &fid);
	if (e) free_string(e);
	NULLCALL(family_member(fid, "m", NULL));
	NULLCALL(family_report(fid, NULL));
	NULLCALL(region_begin(0, 1, NULL, 0));
	NULLCALL(((char *(*)(int, char **))sym("arenaplan_memory_stats"))(0, NULL));
	NULLCALL(((char *(*)(int, char **))sym("arenaplan_snapshot"))(0, NULL));
	NULLCALL(((char *(*)(int, char **))sym("arenaplan_paused"))(0, NULL));
	NULLCALL(((char *(*)(uintptr_t, uintptr_t, int *))sym("arenaplan_mempool_new"))(0, 0, NULL));
	e = ((char *(*)(uintptr_t, uintptr_t, int *))sym("arenaplan_mempool_new"))(0, 0, &id);
	if (e) free_string(e);
	NULLCALL(((char *(*)(int, char **))sym("arenaplan_mempool_stats"))(id, NULL));
	snprintf(r->note, sizeof r->note, "%d of %d calls returned an error", errors, calls);
	if (errors != calls) r->bad++;
}

// step-order: step calls out of order and on closed or unknown steps.
static void case_step_order(result *r) {
	char *(*step_new)(int, const char *, int *) = sym("arenaplan_step_new");
	char *(*step_serve)(int, void *, int) = sym("arenaplan_step_serve");
	char *(*step_record)(int, void *) = sym("arenaplan_step_record");
	char *(*step_end)(int, int) = sym("arenaplan_step_end");
	char *(*step_plan)(int, double) = sym("arenaplan_step_plan");
	char *(*step_close)(int) = sym("arenaplan_step_close");
	char *(*step_report)(int, char **) = sym("arenaplan_step_report");
	int id = -1, errors = 0, calls = 0;
	char *e = step_new(0, "order", &id), *js = NULL;
	if (e) free_string(e);
	void *st = (void *)(uintptr_t)0x22;
	NULLCALL(step_serve(id, st, 1));        // before any plan
	NULLCALL(step_end(id, 0));              // nothing running
	NULLCALL(step_plan(id, 1.0));           // nothing recorded
	NULLCALL(step_plan(id, 0.0 / 0.0));     // NaN budget
	e = step_record(id, st);                // fine
	if (e) free_string(e), r->bad++;
	NULLCALL(step_record(id, st));          // recording already
	void *p = ap_alloc(4096, 0, st);
	ap_free(p, 4096, 0, st);
	e = step_end(id, 0);
	if (e) free_string(e), r->bad++;
	e = step_close(id);
	if (e) free_string(e), r->bad++;
	NULLCALL(step_close(id));               // closed already
	NULLCALL(step_report(id, &js));         // closed
	NULLCALL(step_serve(-5, st, 0));        // unknown
	snprintf(r->note, sizeof r->note, "%d of %d wrong calls returned an error", errors, calls);
	if (errors != calls) r->bad++;
}

// threads: 8 threads on 3 streams, 4 live blocks each of up to 16 MiB (at
// most 512 MiB live of 1 GiB): every allocation fits, and no two live
// blocks overlap. (Nearer the device's capacity, free blocks inside
// segments another stream owns can refuse a request, as in PyTorch's
// allocator: a block is reused only on its own stream.)
#define THREADS 8
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t live_p[THREADS * 4];
static size_t live_sz[THREADS * 4];
static long thread_failed, thread_overlaps;

static void *thread_work(void *arg) {
	int id = (int)(intptr_t)arg;
	void *st = (void *)(uintptr_t)(0x100 + id % 3);
	uint64_t x = 0x9E3779B97F4A7C15ull * (id + 1);
	for (int i = 0; i < 4000; i++) {
		int slot = id * 4 + i % 4;
		if (live_p[slot]) {
			pthread_mutex_lock(&live_mu);
			uintptr_t old = live_p[slot];
			size_t osz = live_sz[slot];
			live_p[slot] = 0;
			pthread_mutex_unlock(&live_mu);
			ap_free((void *)old, osz, 0, st);
		}
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t size = (size_t)(1 + x % 64) * (256 << 10);
		void *p = ap_alloc(size, 0, st);
		pthread_mutex_lock(&live_mu);
		if (!p) {
			thread_failed++;
		} else {
			for (int j = 0; j < THREADS * 4; j++) {
				uintptr_t a = live_p[j], b = (uintptr_t)p;
				if (a && b < a + live_sz[j] && a < b + size) thread_overlaps++;
			}
			live_p[slot] = (uintptr_t)p, live_sz[slot] = size;
		}
		pthread_mutex_unlock(&live_mu);
	}
	for (int k = 0; k < 4; k++) {
		// Out of the live list before the free, as above: another thread
		// may get the memory as soon as it is freed.
		int slot = id * 4 + k;
		pthread_mutex_lock(&live_mu);
		uintptr_t old = live_p[slot];
		size_t osz = live_sz[slot];
		live_p[slot] = 0;
		pthread_mutex_unlock(&live_mu);
		if (old) ap_free((void *)old, osz, 0, st);
	}
	return NULL;
}
static void case_threads(result *r) {
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, thread_work, (void *)(intptr_t)i);
	for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
	r->allocs = THREADS * 4000, r->failed = thread_failed;
	snprintf(r->note, sizeof r->note, "%ld overlapping live blocks", thread_overlaps);
	if (thread_failed || thread_overlaps) take_error(r), r->bad++;
}

// stat_field reads the number after "name": in the library's statistics
// of device 0 (arenaplan_stats), or -1.
static long long stat_field(const char *name) {
	char *js = NULL, key[64];
	char *e = ((char *(*)(int, char **))sym("arenaplan_stats"))(0, &js);
	if (e) free_string(e);
	long long v = -1;
	snprintf(key, sizeof key, "\"%s\":", name);
	char *at = js ? strstr(js, key) : NULL;
	if (at) v = strtoll(at + strlen(key), NULL, 10);
	if (js) free_string(js);
	return v;
}

// after reads the number after key in the first object named within of
// device 0's statistics (stats: arenaplan_stats, else
// arenaplan_memory_stats), or -1. Every read hands the queued frees to Go
// first.
static long long after(int stats, const char *within, const char *key) {
	char *js = NULL;
	char *e = ((char *(*)(int, char **))sym(stats ? "arenaplan_stats" : "arenaplan_memory_stats"))(0, &js);
	if (e) free_string(e);
	const char *w = js ? strstr(js, within) : NULL;
	const char *k = w ? strstr(w, key) : NULL;
	long long v = k ? strtoll(k + strlen(key), NULL, 10) : -1;
	if (js) free_string(js);
	return v;
}

static void *free_on_thread(void *arg) {
	ap_free(arg, 4 * MiB, 0, (void *)(uintptr_t)0x21);
	return NULL;
}

// burst_thread: bursts of 64 allocations of 2 MiB, then their frees, so
// that threads fill the free queue at once (the queue is full in one
// thread while another frees); its count of failures in *arg.
static void *burst_thread(void *arg) {
	int *failed = arg;
	void *st = (void *)(uintptr_t)0x23;
	void *p[64];
	for (int round = 0; round < 200; round++) {
		for (int i = 0; i < 64; i++) {
			p[i] = ap_alloc(2 * MiB, 0, st);
			*failed += p[i] == NULL;
		}
		for (int i = 0; i < 64; i++) {
			if (p[i]) ap_free(p[i], 2 * MiB, 0, st);
		}
	}
	return NULL;
}

// batched-frees: a free the fast path does not keep (blocks of more than
// 1 MiB) waits in its queue for the next call into Go, and Go must decide
// as if it had been told at once: an allocation of a size just freed
// reuses the block without mapping, one freed on another thread too; a
// statistics read right after a free counts it; a second free of a
// queued block is reported to its caller at once; a full queue goes to Go
// by itself. With the fast path shut (ARENAPLAN_FASTPATH=0) every free is
// a call of its own.
static void case_batched_frees(result *r) {
	const char *fp = getenv("ARENAPLAN_FASTPATH");
	int shut = fp && strcmp(fp, "0") == 0;
	void *st = (void *)(uintptr_t)0x21;
	char *note = r->note;
	size_t room = sizeof r->note;
#define BAD(...) (r->bad++, snprintf(note, room, __VA_ARGS__))

	// An allocation carries the frees queued before it.
	void *a = alloc_counted(r, 4 * MiB, 0, st);
	long long grows0 = after(1, "\"Spill\"", "\"Grows\":"), calls0 = after(1, "\"FastPath\"", "\"FreeCalls\":"),
	          frees0 = after(1, "\"FastPath\"", "\"GoFrees\":");
	ap_free(a, 4 * MiB, 0, st);
	void *b = alloc_counted(r, 4 * MiB, 0, st);
	long long grows1 = after(1, "\"Spill\"", "\"Grows\":"), calls1 = after(1, "\"FastPath\"", "\"FreeCalls\":"),
	          frees1 = after(1, "\"FastPath\"", "\"GoFrees\":");
	if (b != a || grows1 != grows0) {
		BAD("4 MiB freed then asked for: %p then %p, segments mapped %lld->%lld (the free came late)", a, b, grows0, grows1);
		return;
	}
	if (frees1 - frees0 != 1 || calls1 - calls0 != (shut ? 1 : 0)) {
		BAD("a free then an allocation: frees handed to Go +%lld (want 1), calls for frees alone +%lld (want %d)",
		    frees1 - frees0, calls1 - calls0, shut ? 1 : 0);
		return;
	}

	// A free on another thread (autograd's), then an allocation here.
	pthread_t t;
	pthread_create(&t, NULL, free_on_thread, b);
	pthread_join(t, NULL);
	void *c = alloc_counted(r, 4 * MiB, 0, st);
	if (c != b) {
		BAD("4 MiB freed on another thread then asked for here: %p then %p", b, c);
		return;
	}

	// Statistics read right after a free count it: the C library's and Go's.
	long long mem0 = after(0, "\"allocated_bytes\":{\"all\":", "\"current\":"),
	          use0 = after(1, "\"Spill\"", "\"InUse\":");
	ap_free(c, 4 * MiB, 0, st);
	long long mem1 = after(0, "\"allocated_bytes\":{\"all\":", "\"current\":"),
	          use1 = after(1, "\"Spill\"", "\"InUse\":");
	if (mem0 - mem1 != (long long)(4 * MiB) || use0 - use1 != (long long)(4 * MiB)) {
		BAD("a free read at once: allocated %lld->%lld, in use %lld->%lld (want 4 MiB less each)", mem0, mem1, use0, use1);
		return;
	}

	// A second free of a queued block: reported to its caller at once.
	void *d = alloc_counted(r, 4 * MiB, 0, st);
	ap_free(d, 4 * MiB, 0, st);
	ap_free(d, 4 * MiB, 0, st);
	take_error(r);
	if (!strstr(r->err, "unknown allocation")) {
		BAD("a second free of a queued block was not reported to its caller");
		return;
	}
	r->err[0] = 0;
	void *e1 = alloc_counted(r, 4 * MiB, 0, st), *e2 = alloc_counted(r, 4 * MiB, 0, st);
	if (!e1 || !e2 || e1 == e2) {
		BAD("after a double free: %p and %p", e1, e2);
		return;
	}
	ap_free(e1, 4 * MiB, 0, st);
	ap_free(e2, 4 * MiB, 0, st);

	// 300 frees and no allocation: the queue goes to Go when full (256),
	// the rest before the statistics are read.
	enum { N = 300 };
	static void *many[N];
	for (int i = 0; i < N; i++) many[i] = alloc_counted(r, 2 * MiB, 0, st);
	calls0 = after(1, "\"FastPath\"", "\"FreeCalls\":"), frees0 = after(1, "\"FastPath\"", "\"GoFrees\":");
	use0 = after(1, "\"Spill\"", "\"InUse\":");
	for (int i = 0; i < N; i++) ap_free(many[i], 2 * MiB, 0, st);
	calls1 = after(1, "\"FastPath\"", "\"FreeCalls\":"), frees1 = after(1, "\"FastPath\"", "\"GoFrees\":");
	use1 = after(1, "\"Spill\"", "\"InUse\":");
	if (frees1 - frees0 != N || calls1 - calls0 != (shut ? N : 2) || use0 - use1 != (long long)(N * 2 * MiB)) {
		BAD("%d frees of 2 MiB: handed to Go %lld, calls for frees alone %lld (want %d), in use %lld MiB less", N,
		    frees1 - frees0, calls1 - calls0, shut ? N : 2, (use0 - use1) >> 20);
		return;
	}
	// Four threads filling the queue at once: every free applied once, no
	// allocation failed, what is allocated back where it was.
	mem0 = after(0, "\"allocated_bytes\":{\"all\":", "\"current\":");
	use0 = after(1, "\"Spill\"", "\"InUse\":");
	pthread_t th[4];
	int failed[4] = {0};
	for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, burst_thread, &failed[i]);
	for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
	mem1 = after(0, "\"allocated_bytes\":{\"all\":", "\"current\":");
	use1 = after(1, "\"Spill\"", "\"InUse\":");
	if (failed[0] + failed[1] + failed[2] + failed[3] != 0 || mem1 != mem0 || use1 != use0) {
		BAD("four threads filling the queue: %d allocations failed, allocated %lld->%lld, in use %lld->%lld",
		    failed[0] + failed[1] + failed[2] + failed[3], mem0, mem1, use0, use1);
		return;
	}
	snprintf(note, room, "reuse, another thread's free, statistics, double free, a full queue, four threads: as if told at once%s",
	         shut ? " (fast path shut: a call each)" : "");
#undef BAD
}

// streams: one allocation and its free on each of 200000 stream handles;
// what the library keeps per stream must not grow with their number, and
// the device memory mapped must not either: a new stream takes over the
// segment others left wholly free (ARENAPLAN_SIM_MEMORY set by the caller
// runs it on a larger device; before, each stream mapped a segment of its
// own until the device was full).
static void case_streams(result *r) {
	long before = rss_kib();
	for (long i = 0; i < 200000; i++) {
		void *st = (void *)(uintptr_t)(0x10000 + i * 16);
		void *p = alloc_counted(r, 4096, 0, st);
		ap_free(p, 4096, 0, st);
	}
	long grew = (rss_kib() - before) / 1024;
	long long peak = stat_field("PeakMapped");
	snprintf(r->note, sizeof r->note, "host memory +%ld MiB, device memory mapped at most %lld MiB", grew,
	         peak >> 20);
	if (r->failed || grew > 64 || peak < 0 || peak > (long long)(16 * MiB)) take_error(r), r->bad++;
}

// flood: 400000 bad frees (addresses inside a live block, and a double
// free of a kept block, alternating) leave a few lines on standard error,
// not one each, and the last error still names the latest; exit writes
// the count of those not written.
static void case_flood(result *r) {
	char path[] = "/tmp/arenaplan-flood-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0) {
		r->bad++;
		return;
	}
	unlink(path);
	fflush(stderr);
	int saved = dup(2);
	dup2(fd, 2);
	void *p = alloc_counted(r, 65536, 0, NULL);
	void *k = alloc_counted(r, 4096, 0, NULL);
	ap_free(k, 4096, 0, NULL); // kept by the fast path
	for (long i = 0; i < 400000; i++) {
		if (i % 2) ap_free(k, 4096, 0, NULL);
		else ap_free((char *)p + 512 + (i % 64) * 512, 65536, 0, NULL);
	}
	take_error(r);
	ap_free(p, 65536, 0, NULL);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	long lines = 0, bytes = 0;
	char buf[65536];
	ssize_t n;
	lseek(fd, 0, SEEK_SET);
	while ((n = read(fd, buf, sizeof buf)) > 0)
		for (ssize_t i = 0; i < n; i++) bytes++, lines += buf[i] == '\n';
	close(fd);
	snprintf(r->note, sizeof r->note, "400000 bad frees wrote %ld lines (%ld bytes) on standard error", lines, bytes);
	if (lines > 20 || !strstr(r->err, "arenaplan")) r->bad++;
}

// fault: every export panics (a library built with -tags arenaplan_fault
// and ARENAPLAN_FAULT_PANIC=all): each reports an error, none aborts.
static void case_fault(result *r) {
	setenv("ARENAPLAN_FAULT_PANIC", "all", 1);
	int errors = 0, calls = 0, id = -1;
	char *js = NULL, *e;
	void *p = ap_alloc(4096, 0, NULL);
	calls++;
	e = last_error();
	if (!p && e && strstr(e, "internal error")) errors++;
	if (e) free_string(e);
	ap_free((void *)(uintptr_t)0x1000, 4096, 0, NULL);
	calls++;
	e = last_error();
	if (e && strstr(e, "internal error")) errors++;
	if (e) free_string(e);
	const char *ctl[] = {"arenaplan_step_new", "arenaplan_family_new", "arenaplan_chain_new"};
	for (int i = 0; i < 3; i++) NULLCALL(((char *(*)(int, const char *, int *))sym(ctl[i]))(0, "x", &id));
	const char *withid[] = {"arenaplan_step_record", "arenaplan_step_join_capture", "arenaplan_step_close",
	                        "arenaplan_family_close"};
	for (int i = 0; i < 4; i++) NULLCALL(((char *(*)(int, void *))sym(withid[i]))(0, NULL));
	NULLCALL(((char *(*)(int, void *, int))sym("arenaplan_step_serve"))(0, NULL, 0));
	NULLCALL(((char *(*)(int, int))sym("arenaplan_step_end"))(0, 0));
	const char *plans[] = {"arenaplan_step_plan", "arenaplan_step_replan", "arenaplan_family_plan"};
	for (int i = 0; i < 3; i++) NULLCALL(((char *(*)(int, double))sym(plans[i]))(0, 1.0));
	NULLCALL(((char *(*)(int, int, double))sym("arenaplan_family_plan_member"))(0, 0, 1.0));
	const char *paths[] = {"arenaplan_step_save", "arenaplan_step_load", "arenaplan_family_save",
	                       "arenaplan_family_load", "arenaplan_family_member"};
	for (int i = 0; i < 5; i++) NULLCALL(((char *(*)(int, const char *, int *))sym(paths[i]))(0, "/x", &id));
	const char *outs[] = {"arenaplan_step_report", "arenaplan_family_report", "arenaplan_stats",
	                      "arenaplan_memory_stats", "arenaplan_snapshot", "arenaplan_paused"};
	for (int i = 0; i < 6; i++) NULLCALL(((char *(*)(int, char **))sym(outs[i]))(0, &js));
	const char *resets[] = {"arenaplan_reset_peak_stats", "arenaplan_reset_accumulated_stats"};
	for (int i = 0; i < 2; i++) NULLCALL(((char *(*)(int))sym(resets[i]))(0));
	NULLCALL(((char *(*)(int, int))sym("arenaplan_record_history"))(1, 0));
	NULLCALL(((char *(*)(int, long, const char *, int))sym("arenaplan_region_begin"))(0, 1, "t", 0));
	NULLCALL(((char *(*)(int, long))sym("arenaplan_region_end"))(0, 1));
	const char *tags[] = {"arenaplan_pause", "arenaplan_resume"};
	for (int i = 0; i < 2; i++) NULLCALL(((char *(*)(int, const char *))sym(tags[i]))(0, ""));
	NULLCALL(((char *(*)(uintptr_t, uintptr_t, int *))sym("arenaplan_mempool_new"))(0, 0, &id));
	const char *routes[] = {"arenaplan_mempool_begin", "arenaplan_mempool_end"};
	for (int i = 0; i < 2; i++) NULLCALL(((char *(*)(int, long, int))sym(routes[i]))(0, 1, 1));
	NULLCALL(((char *(*)(int))sym("arenaplan_mempool_release"))(1));
	NULLCALL(((char *(*)(int, char **))sym("arenaplan_mempool_stats"))(1, &js));
	// The hooks without a result: they must return, and say why.
	const char *quiet[] = {"arenaplan_torch_empty_cache"};
	for (int i = 0; i < 1; i++) {
		((void (*)(void))sym(quiet[i]))();
		calls++;
		e = last_error();
		if (e) errors++, free_string(e);
	}
	captures(0);
	calls++;
	e = last_error();
	if (e) errors++, free_string(e);
	snprintf(r->note, sizeof r->note, "%d of %d exports reported the panic", errors, calls);
	if (errors != calls) r->bad++;
}

// mempool: a C allocator plugged as a memory pool's allocator (PyTorch's
// MemPool(allocator=CUDAPluggableAllocator(...)), as torch_memory_saver
// and vLLM's sleep mode make it). Its memory is addresses reserved with
// mmap (the simulated device never touches a pool's memory). The routed
// thread's allocations must land in its segments (2 MiB and 20 MiB for
// these sizes), other threads' and later ones must not, release must give
// every segment back with the size it was made with, and an allocator
// that returns NULL must make the allocation fail with a reason.
#define POOL_SPACE (256 * MiB)
static char *pool_base;
static size_t pool_used;
static struct { uintptr_t p; size_t size; } pool_segs[64];
static int pool_nsegs, pool_allocs, pool_frees, pool_badfree, pool_refuse;

static void *pool_alloc(size_t size, int device, void *stream) {
	(void)device, (void)stream;
	if (pool_refuse || pool_used + size > POOL_SPACE || pool_nsegs == 64) return NULL;
	void *p = pool_base + pool_used;
	pool_used += (size + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
	pool_segs[pool_nsegs].p = (uintptr_t)p, pool_segs[pool_nsegs].size = size;
	pool_nsegs++, pool_allocs++;
	return p;
}

static void pool_free(void *ptr, size_t size, int device, void *stream) {
	(void)device, (void)stream;
	for (int i = 0; i < pool_nsegs; i++)
		if (pool_segs[i].p == (uintptr_t)ptr && pool_segs[i].size == size) {
			pool_segs[i] = pool_segs[--pool_nsegs];
			pool_frees++;
			return;
		}
	pool_badfree++;
}

static int in_pool(void *p, size_t n) {
	for (int i = 0; i < pool_nsegs; i++)
		if ((uintptr_t)p >= pool_segs[i].p && (uintptr_t)p + n <= pool_segs[i].p + pool_segs[i].size) return 1;
	return 0;
}

static void *outside_alloc(void *arg) { return ap_alloc(64 << 10, 0, arg); }

static void case_mempool(result *r) {
	char *(*mp_new)(uintptr_t, uintptr_t, int *) = sym("arenaplan_mempool_new");
	char *(*mp_begin)(int, long, int) = sym("arenaplan_mempool_begin");
	char *(*mp_end)(int, long, int) = sym("arenaplan_mempool_end");
	char *(*mp_release)(int) = sym("arenaplan_mempool_release");
	int id = -1, bad_id = -1, errors = 0, calls = 0;
	char *e;
	pool_base = mmap(NULL, POOL_SPACE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (pool_base == MAP_FAILED) {
		snprintf(r->note, sizeof r->note, "mmap failed");
		r->bad++;
		return;
	}
	pool_base = (char *)(((uintptr_t)pool_base + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
	NULLCALL(mp_new((uintptr_t)pool_alloc, 0, &id)); // free missing
	e = mp_new((uintptr_t)pool_alloc, (uintptr_t)pool_free, &id);
	if (e) snprintf(r->err, sizeof r->err, "%s", e), free_string(e), r->bad++;
	long tid = syscall(SYS_gettid);
	void *st = (void *)(uintptr_t)0x33;
	e = mp_begin(0, tid, id);
	if (e) snprintf(r->err, sizeof r->err, "%s", e), free_string(e), r->bad++;
	void *small[16], *mid, *outside = NULL, *after;
	for (int i = 0; i < 16; i++) small[i] = alloc_counted(r, 64 << 10, 0, st);
	mid = alloc_counted(r, 5 * MiB, 0, st);
	pthread_t th;
	if (pthread_create(&th, NULL, outside_alloc, st) == 0) pthread_join(th, &outside);
	NULLCALL(mp_release(id)); // still routed
	NULLCALL(mp_end(0, tid, id + 1)); // not the pool routed to
	e = mp_end(0, tid, id);
	if (e) snprintf(r->err, sizeof r->err, "%s", e), free_string(e), r->bad++;
	after = alloc_counted(r, 64 << 10, 0, st);
	int wrong = 0;
	for (int i = 0; i < 16; i++) wrong += !small[i] || !in_pool(small[i], 64 << 10);
	wrong += !mid || !in_pool(mid, 5 * MiB);
	wrong += !outside || in_pool(outside, 1);
	wrong += !after || in_pool(after, 1);
	int segs = pool_allocs;
	e = mp_release(id);
	if (e) snprintf(r->err, sizeof r->err, "%s", e), free_string(e), r->bad++;
	int freed_at_release = pool_frees; // every segment is busy
	for (int i = 0; i < 16; i++) ap_free(small[i], 64 << 10, 0, st);
	ap_free(mid, 5 * MiB, 0, st);
	ap_free(outside, 64 << 10, 0, st);
	ap_free(after, 64 << 10, 0, st);
	// An allocator that returns NULL: the allocation fails with a reason.
	e = mp_new((uintptr_t)pool_alloc, (uintptr_t)pool_free, &bad_id);
	if (e) free_string(e), r->bad++;
	pool_refuse = 1;
	e = mp_begin(0, tid, bad_id);
	if (e) free_string(e), r->bad++;
	void *refused = alloc_counted(r, 4096, 0, st);
	char *why = last_error();
	e = mp_end(0, tid, bad_id);
	if (e) free_string(e), r->bad++;
	int reasoned = !refused && why && strstr(why, "returned NULL") && strstr(why, "out of memory");
	if (why) snprintf(r->err, sizeof r->err, "%s", why), free_string(why);
	if (refused) ap_free(refused, 4096, 0, st);
	snprintf(r->note, sizeof r->note,
	         "%d segments asked, %d at release, %d in all given back (%d bad), %d misplaced, %d of %d misuses refused%s",
	         segs, freed_at_release, pool_frees, pool_badfree, wrong, errors, calls, reasoned ? "" : ", NULL not reported");
	if (segs != 2 || freed_at_release != 0 || pool_frees != 2 || pool_nsegs != 0 || pool_badfree || wrong ||
	    errors != calls || !reasoned)
		r->bad++;
	r->failed--; // the refused allocation is meant to fail
}

struct kase {
	const char *name;
	void (*run)(result *);
	const char *what;
};
static struct kase cases[] = {
    {"variable", case_variable, "2000 steps x 4 tensors of 256 KiB x 1..512 on 1 GiB"},
    {"free-bigger", case_free_bigger, "free 600 MiB, then ask for 700 MiB"},
    {"grow", case_grow, "192, 256, 768 MiB, then 1280 MiB (more than the device)"},
    {"double-free", case_double_free, "free a block twice, then two allocations"},
    {"interior-free", case_interior_free, "free an address inside a block"},
    {"wrong-device", case_wrong_device, "free a block naming another device"},
    {"error-per-thread", case_error_per_thread, "last error of another thread; cleared by success"},
    {"null-args", case_null_args, "NULL out-pointers and paths"},
    {"step-order", case_step_order, "step calls out of order, closed, unknown"},
    {"threads", case_threads, "8 threads on 3 streams, up to half the device live"},
    {"streams", case_streams, "200000 distinct streams"},
    {"mempool", case_mempool, "a C allocator as a memory pool's: routed memory, release, NULL"},
    {"flood", case_flood, "400000 bad frees"},
    {"batched-frees", case_batched_frees, "frees queued in C: Go decides and counts as if told at once"},
    {"fault", case_fault, "every export panics (fault build)"},
};

static void child(const char *path, struct kase *k, int fd) {
	char mem[32];
	snprintf(mem, sizeof mem, "%zu", DEVICE_BYTES);
	setenv("ARENAPLAN_SIM_MEMORY", mem, 0); // a caller may ask for another size (the streams case on a large device)
	result r = {0};
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(r.err, sizeof r.err, "%s", dlerror());
		r.bad = 1;
	} else {
		ap_alloc = sym("arenaplan_alloc");
		ap_free = sym("arenaplan_free");
		if (!ap_alloc) ap_alloc = sym("arenaplan_torch_alloc"), ap_free = sym("arenaplan_torch_free");
		last_error = sym("arenaplan_last_error");
		free_string = sym("arenaplan_free_string");
		captures = sym("arenaplan_captures_underway");
		captures(0); // as arenaplan.torch does at install: the fast path opens
		k->run(&r);
	}
	if (write(fd, &r, sizeof r) != sizeof r) _exit(3);
	_exit(r.bad ? 1 : 0);
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: abuse LIBRARY.so [CASE ...]\n");
		return 2;
	}
	char path[4096];
	if (!realpath(argv[1], path)) {
		perror(argv[1]);
		return 2;
	}
	int bad = 0;
	printf("| case | what | exit | failed allocs | library's error / note | verdict |\n");
	printf("| --- | --- | --- | --- | --- | --- |\n");
	fflush(stdout);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct kase *k = &cases[i];
		int wanted = argc == 2 ? strcmp(k->name, "fault") != 0 : 0;
		for (int a = 2; a < argc; a++) wanted |= strcmp(argv[a], k->name) == 0;
		if (!wanted) continue;
		int fds[2];
		if (pipe(fds) != 0) return 2;
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		pid_t pid = fork();
		if (pid == 0) {
			close(fds[0]);
			child(path, k, fds[1]);
		}
		close(fds[1]);
		result r = {0};
		ssize_t got = read(fds[0], &r, sizeof r);
		close(fds[0]);
		int status = 0;
		waitpid(pid, &status, 0);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		char exit_s[32];
		if (WIFSIGNALED(status)) snprintf(exit_s, sizeof exit_s, "signal %d", WTERMSIG(status));
		else snprintf(exit_s, sizeof exit_s, "%d", WEXITSTATUS(status));
		int ok = got == sizeof r && WIFEXITED(status) && WEXITSTATUS(status) == 0;
		bad += !ok;
		for (char *c = r.err; *c; c++)
			if (*c == '|' || *c == '\n') *c = ' ';
		printf("| %s | %s | %s | %ld of %ld | %.120s%s%s | %s (%.1f s) |\n", k->name, k->what, exit_s, r.failed, r.allocs,
		       r.err, r.err[0] && r.note[0] ? "; " : "", r.note, ok ? "ok" : "FAIL",
		       (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
		fflush(stdout);
	}
	return bad ? 1 : 0;
}
