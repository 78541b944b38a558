// Where each allocation was asked for, while history is recorded: the
// host's hook (arenaplan_history_hook; the Python package's, which takes
// the Python stack) is called after each recorded allocation with the
// device and the Seq of its history entry, so that snapshots can give
// blocks and events their frames as PyTorch's do. The hook is called after
// the library has let go of every lock of its own; a Python hook takes the
// GIL there, as PyTorch's allocator does to gather Python frames (PyTorch
// releases it while an operator runs). Not while the interpreter is not
// running (Py_IsInitialized, looked up in the process). Off (no hook, or
// no history), nothing of this is on the allocation path but one load.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>

#include "fastpath.h"

typedef void (*hook_fn)(int device, uint64_t seq);

static hook_fn hook;
static int (*py_running)(void);
static __thread uint64_t pending_seq;

void arenaplan_history_hook(uintptr_t fn) {
	if (fn != 0 && py_running == NULL) {
		py_running = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
	}
	__atomic_store_n(&hook, (hook_fn)fn, __ATOMIC_RELEASE);
}

void ap_hist_note(uint64_t seq) { pending_seq = seq; }

void ap_hist_call(int device) {
	uint64_t seq = pending_seq;
	pending_seq = 0;
	hook_fn h = __atomic_load_n(&hook, __ATOMIC_ACQUIRE);
	if (seq == 0 || h == NULL || (py_running != NULL && !py_running())) {
		return;
	}
	h(device, seq);
}
