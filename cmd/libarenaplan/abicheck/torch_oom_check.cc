// torch_oom_check: arenaplan_torch_alloc, as PyTorch calls it from C++,
// throws PyTorch's c10::OutOfMemoryError when the device is out of memory
// (what Python sees as torch.OutOfMemoryError) and a std::runtime_error
// for any other failure; with no PyTorch in the process, a
// std::runtime_error for both.
//
// This program stands in for libc10: it defines c10::Error and
// c10::OutOfMemoryError as PyTorch declares them (c10/util/Exception.h)
// and exports them (-rdynamic), as libc10.so does; built with -DNO_C10 it
// has no PyTorch at all.
//
//   g++ -O2 -rdynamic -o torch_oom_check torch_oom_check.cc -ldl
//   g++ -O2 -DNO_C10 -o torch_oom_check_nc10 torch_oom_check.cc -ldl
//   ARENAPLAN_DEVICE=sim ./torch_oom_check ./libarenaplan.so
//
// Exits 0 when every check passes.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef NO_C10
namespace c10 {

struct SourceLocation {
	const char *function;
	const char *file;
	uint32_t line;
};

class Error : public std::exception {
	std::string msg_;
	std::vector<std::string> context_;
	std::string backtrace_;
	std::string what_;
	std::string what_without_backtrace_;
	const void *caller_;

  public:
	Error(SourceLocation source_location, std::string msg);
	const char *what() const noexcept override { return what_.c_str(); }
	virtual const char *what_without_backtrace() const noexcept { return what_without_backtrace_.c_str(); }
};

Error::Error(SourceLocation source_location, std::string msg) : msg_(std::move(msg)), caller_(nullptr) {
	what_without_backtrace_ = msg_;
	what_ = msg_ + " (raised in " + source_location.function + ")";
}

class OutOfMemoryError : public Error {
	using Error::Error;
};

// Makes the compiler emit OutOfMemoryError's vtable, type information and
// destructor, as PyTorch's libraries that throw it do.
[[gnu::used]] void throw_one() { throw OutOfMemoryError({"throw_one", __FILE__, __LINE__}, "one"); }

} // namespace c10
#endif

static int failures;

static void check(bool ok, const char *what, const std::string &detail) {
	printf("%s %s: %s\n", ok ? "ok  " : "FAIL", what, detail.c_str());
	failures += !ok;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: torch_oom_check LIBRARY.so\n");
		return 2;
	}
#ifdef NO_C10
	const bool present = false;
#else
	const bool present = true;
#endif
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (lib == nullptr) {
		fprintf(stderr, "torch_oom_check: %s\n", dlerror());
		return 2;
	}
	auto alloc = reinterpret_cast<void *(*)(size_t, int, void *)>(dlsym(lib, "arenaplan_torch_alloc"));
	if (alloc == nullptr) {
		fprintf(stderr, "torch_oom_check: arenaplan_torch_alloc missing\n");
		return 2;
	}

	// Out of memory: 1 PiB.
	try {
		alloc(size_t(1) << 50, 0, nullptr);
		check(false, "1 PiB", "returned instead of throwing");
#ifndef NO_C10
	} catch (const c10::OutOfMemoryError &e) {
		std::string m = e.what_without_backtrace();
		check(present && m.find("CUDA out of memory. Tried to allocate") != std::string::npos,
		      "1 PiB throws c10::OutOfMemoryError", m.substr(0, 100));
#endif
	} catch (const std::runtime_error &e) {
		std::string m = e.what();
		check(!present && m.find("CUDA out of memory. Tried to allocate") != std::string::npos,
		      "1 PiB throws std::runtime_error", m.substr(0, 100));
	}

	// Another failure (a negative device): never an out-of-memory error.
	try {
		alloc(4096, -1, nullptr);
		check(false, "device -1", "returned instead of throwing");
#ifndef NO_C10
	} catch (const c10::Error &e) {
		check(false, "device -1", std::string("threw a c10::Error: ") + e.what());
#endif
	} catch (const std::runtime_error &e) {
		check(std::strstr(e.what(), "device -1") != nullptr, "device -1 throws std::runtime_error", e.what());
	}

	// The process goes on: an allocation that fits is served.
	void *p = nullptr;
	try {
		p = alloc(4096, 0, nullptr);
	} catch (const std::exception &e) {
		check(false, "4 KiB after the failures", e.what());
	}
	check(p != nullptr, "4 KiB after the failures", "served");
	return failures ? 1 : 0;
}
