// PyTorch's allocation entry. PyTorch's CUDAPluggableAllocator turns
// whatever the allocation function returns into a tensor's address
// without looking at it: a NULL for a request of some bytes becomes a
// tensor at address 0, and the first kernel that touches it poisons the
// CUDA context with an illegal memory access. PyTorch's own allocators
// throw instead, and every caller of an allocator is ready for that; so
// does this entry.
//
// Out of memory is thrown as PyTorch's own c10::OutOfMemoryError, which
// Python sees as torch.OutOfMemoryError: the exception is made by
// libc10's exported constructor of c10::Error and typed with libc10's
// type information for OutOfMemoryError (which adds nothing to Error),
// found in the process at the first failure. Nothing of the class's
// layout is assumed but that it fits in kExceptionBytes. Where those
// symbols are not there (no PyTorch in the process, or a PyTorch whose
// constructor has another signature), and for every other failure, a
// std::runtime_error carries the library's message: a RuntimeError in
// Python, worded as PyTorch words out of memory ("CUDA out of memory.
// Tried to allocate ...", which retry code such as accelerate's looks
// for).
//
// C callers cannot catch an exception: they use arenaplan_alloc.
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <typeinfo>

extern "C" {
#include "fastpath.h"
void *arenaplan_alloc(size_t size, int device, void *stream);
void *arenaplan_torch_alloc(size_t size, int device, void *stream);
}

namespace {

// AllocationError is what arenaplan_torch_alloc throws when PyTorch's own
// out-of-memory error cannot be made.
class AllocationError : public std::runtime_error {
  public:
	using std::runtime_error::runtime_error;
};

// c10::SourceLocation, as c10::Error's constructor takes it by value.
struct SourceLocation {
	const char *function;
	const char *file;
	uint32_t line;
};

// The room an exception object gets: c10::Error is 128 to 168 bytes in
// the PyTorch releases of 2023 to 2026.
constexpr size_t kExceptionBytes = 1024;

// TorchOOM is what it takes to throw c10::OutOfMemoryError: libc10's
// c10::Error(SourceLocation, std::string) (the mangled name pins the
// signature), OutOfMemoryError's vtable and type information (exported by
// libc10_cuda, libtorch_cuda and libtorch_python), and its destructor.
struct TorchOOM {
	void (*ctor)(void *, SourceLocation, std::string);
	void **vtable;
	std::type_info *type;
	void (*dtor)(void *);
	bool ok;
};

void *find(const char *name) {
	if (void *p = dlsym(RTLD_DEFAULT, name)) {
		return p;
	}
	// PyTorch loads its libraries as dependencies of its extension,
	// outside the global scope: look in each, loaded already or not at all.
	static const char *const libs[] = {"libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch_python.so"};
	for (const char *lib : libs) {
		void *h = dlopen(lib, RTLD_NOLOAD | RTLD_LAZY);
		if (h == nullptr) {
			continue;
		}
		void *p = dlsym(h, name);
		dlclose(h);
		if (p != nullptr) {
			return p;
		}
	}
	return nullptr;
}

const TorchOOM &torch_oom() {
	static const TorchOOM t = [] {
		TorchOOM t{};
		t.ctor = reinterpret_cast<void (*)(void *, SourceLocation, std::string)>(
		    find("_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"));
		t.vtable = static_cast<void **>(find("_ZTVN3c1016OutOfMemoryErrorE"));
		t.type = static_cast<std::type_info *>(find("_ZTIN3c1016OutOfMemoryErrorE"));
		// The complete-object destructor is the vtable's first virtual
		// function (std::exception's virtual destructor comes first; the
		// Itanium C++ ABI): libc10 does not export it by name.
		if (t.vtable != nullptr) {
			t.dtor = reinterpret_cast<void (*)(void *)>(t.vtable[2]);
		}
		t.ok = t.ctor && t.vtable && t.type && t.dtor;
		return t;
	}();
	return t;
}

// throw_oom throws c10::OutOfMemoryError with msg, if PyTorch's symbols
// are there; else it returns.
void throw_oom(const char *msg) {
	const TorchOOM &t = torch_oom();
	if (!t.ok) {
		return;
	}
	void *e = __cxxabiv1::__cxa_allocate_exception(kExceptionBytes);
	try {
		t.ctor(e, SourceLocation{"arenaplan_torch_alloc", "cmd/libarenaplan/torch_alloc.cc", 0}, std::string(msg));
	} catch (...) {
		__cxxabiv1::__cxa_free_exception(e);
		return;
	}
	// What OutOfMemoryError's inherited constructor does after Error's:
	// point the object at its own vtable (past the offset and the type).
	*static_cast<void ***>(e) = t.vtable + 2;
	__cxxabiv1::__cxa_throw(e, t.type, t.dtor);
}

} // namespace

void *arenaplan_torch_alloc(size_t size, int device, void *stream) {
	void *p = arenaplan_alloc(size, device, stream);
	if (p == nullptr && size > 0) {
		int oom = 0;
		const char *msg = ap_error_peek(&oom);
		if (msg != nullptr && oom) {
			throw_oom(msg);
		}
		if (msg != nullptr) {
			throw AllocationError(msg);
		}
		char why[96];
		snprintf(why, sizeof why, "arenaplan: allocating %zu bytes on device %d failed", size, device);
		throw AllocationError(why);
	}
	return p;
}
