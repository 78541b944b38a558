// Messages the library writes to standard error where the host will not
// see an error otherwise (a refused free: PyTorch's free returns nothing).
// A host that repeats a mistake must not flood its log: the first few
// messages are written whole, later ones counted and summed up in one
// line at most every WARN_EVERY seconds, and once more when the process
// exits. arenaplan_last_error still names the latest one.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "fastpath.h"

#define WARN_FIRST 5
#define WARN_EVERY 10

static pthread_mutex_t warn_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t warn_total, warn_held;
static time_t warn_last;

static time_t now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

void ap_warn(const char *msg) {
	pthread_mutex_lock(&warn_mu);
	warn_total++;
	if (warn_total <= WARN_FIRST) {
		fprintf(stderr, "%s\n", msg);
		if (warn_total == WARN_FIRST) {
			fprintf(stderr, "arenaplan: %d messages written; more are counted (a count at most every %d s, and at exit)\n",
			        WARN_FIRST, WARN_EVERY);
			warn_last = now();
		}
	} else {
		warn_held++;
		time_t t = now();
		if (t - warn_last >= WARN_EVERY) {
			fprintf(stderr, "arenaplan: %llu more messages (%llu in all), the latest: %s\n", (unsigned long long)warn_held,
			        (unsigned long long)warn_total, msg);
			warn_held = 0;
			warn_last = t;
		}
	}
	pthread_mutex_unlock(&warn_mu);
}

uint64_t ap_warn_count(void) {
	pthread_mutex_lock(&warn_mu);
	uint64_t n = warn_total;
	pthread_mutex_unlock(&warn_mu);
	return n;
}

__attribute__((destructor)) static void warn_at_exit(void) {
	pthread_mutex_lock(&warn_mu);
	if (warn_held > 0)
		fprintf(stderr, "arenaplan: %llu more messages not written (%llu in all)\n", (unsigned long long)warn_held,
		        (unsigned long long)warn_total);
	warn_held = 0;
	pthread_mutex_unlock(&warn_mu);
}
