// The pause generation (sleep.go): a counter that readers poll without a
// call into the library.
#include <stdint.h>

// arenaplan_pause_generation changes after every pause or resume call
// (arenaplan_pause, arenaplan_resume): a caller that keeps arenaplan_paused's answer with the value it
// read before asking knows the answer still holds while the value stays.
uint64_t arenaplan_pause_generation;

__attribute__((visibility("hidden"))) void arenaplan_pause_generation_bump(void) {
	__atomic_add_fetch(&arenaplan_pause_generation, 1, __ATOMIC_SEQ_CST);
}
