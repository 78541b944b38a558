// PyTorch's allocation entry. PyTorch's CUDAPluggableAllocator turns
// whatever the allocation function returns into a tensor's address
// without looking at it: a NULL for a request of some bytes becomes a
// tensor at address 0, and the first kernel that touches it poisons the
// CUDA context with an illegal memory access. PyTorch's own allocators
// throw instead, and every caller of an allocator is ready for that; so
// does this entry. PyTorch turns the exception into a RuntimeError whose
// text holds the library's message ("CUDA out of memory. Tried to
// allocate ..." when the device is full, as PyTorch words it, which
// retry-on-out-of-memory code such as accelerate's looks for).
//
// C callers cannot catch an exception: they use arenaplan_alloc.
#include <cstddef>
#include <cstdio>
#include <stdexcept>

extern "C" {
#include "fastpath.h"
void *arenaplan_alloc(size_t size, int device, void *stream);
void *arenaplan_torch_alloc(size_t size, int device, void *stream);
}

namespace {

// AllocationError is what arenaplan_torch_alloc throws.
class AllocationError : public std::runtime_error {
  public:
	using std::runtime_error::runtime_error;
};

} // namespace

void *arenaplan_torch_alloc(size_t size, int device, void *stream) {
	void *p = arenaplan_alloc(size, device, stream);
	if (p == nullptr && size > 0) {
		const char *msg = ap_error_peek(nullptr);
		if (msg != nullptr) {
			throw AllocationError(msg);
		}
		char why[96];
		snprintf(why, sizeof why, "arenaplan: allocating %zu bytes on device %d failed", size, device);
		throw AllocationError(why);
	}
	return p;
}
