// vmm_pool_alloc: a pluggable allocator of the kind torch_memory_saver
// ("torch" mode) and vLLM's sleep mode plug as a MemPool's allocator:
// every allocation is its own cuMemCreate + cuMemMap at a reserved
// address, and vmm_pause / vmm_resume release the physical memory and map
// new memory back at the same addresses (contents are lost, as with
// torch_memory_saver without CPU backup). The CUDA driver is opened with
// dlopen, so it builds without the toolkit:
//
//   gcc -O2 -shared -fPIC -o vmm_pool_alloc.so bench/vmm_pool_alloc.c -ldl -lpthread
//
// Used by bench/torch_mempool.py.
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUhandle;
typedef struct {
	int type;                  // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	int requestedHandleTypes;  // none
	int locType, locId;        // CU_MEM_LOCATION_TYPE_DEVICE = 1, ordinal
	void *win32;
	unsigned char flags[8];
} CUprop; // CUmemAllocationProp, 32 bytes
typedef struct {
	int locType, locId;
	int flags; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
} CUaccess;

static CUresult (*pReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*pAddrFree)(CUdeviceptr, size_t);
static CUresult (*pCreate)(CUhandle *, size_t, const CUprop *, unsigned long long);
static CUresult (*pRelease)(CUhandle);
static CUresult (*pMap)(CUdeviceptr, size_t, size_t, CUhandle, unsigned long long);
static CUresult (*pUnmap)(CUdeviceptr, size_t);
static CUresult (*pAccess)(CUdeviceptr, size_t, const CUaccess *, size_t);
static CUresult (*pGran)(size_t *, const CUprop *, int);

#define MAXA 4096
static struct {
	CUdeviceptr p;
	size_t size, mapped_size;
	CUhandle h;
	int device, mapped;
} tab[MAXA];
static int ntab;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long n_alloc, n_free, n_pause, n_resume, last_err;

static int load(void) {
	static int done;
	if (done) return done > 0;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h) return done = -1, 0;
#define SYM(v, n) v = (__typeof__(v))dlsym(h, n)
	SYM(pReserve, "cuMemAddressReserve");
	SYM(pAddrFree, "cuMemAddressFree");
	SYM(pCreate, "cuMemCreate");
	SYM(pRelease, "cuMemRelease");
	SYM(pMap, "cuMemMap");
	SYM(pUnmap, "cuMemUnmap");
	SYM(pAccess, "cuMemSetAccess");
	SYM(pGran, "cuMemGetAllocationGranularity");
	done = pReserve && pAddrFree && pCreate && pRelease && pMap && pUnmap && pAccess && pGran ? 1 : -1;
	return done > 0;
}

static CUprop prop(int device) {
	CUprop p;
	memset(&p, 0, sizeof p);
	p.type = 1, p.locType = 1, p.locId = device;
	return p;
}

static int map_one(int i) {
	CUprop pr = prop(tab[i].device);
	CUhandle h;
	CUresult r = pCreate(&h, tab[i].mapped_size, &pr, 0);
	if (r) return last_err = r, -1;
	if ((r = pMap(tab[i].p, tab[i].mapped_size, 0, h, 0))) return pRelease(h), last_err = r, -1;
	CUaccess a = {1, tab[i].device, 3};
	if ((r = pAccess(tab[i].p, tab[i].mapped_size, &a, 1))) return pUnmap(tab[i].p, tab[i].mapped_size), pRelease(h), last_err = r, -1;
	tab[i].h = h, tab[i].mapped = 1;
	return 0;
}

void *vmm_malloc(size_t size, int device, void *stream) {
	(void)stream;
	if (!load()) return NULL;
	CUprop pr = prop(device);
	size_t g = 0;
	if (pGran(&g, &pr, 0) || !g) return NULL;
	size_t rs = (size + g - 1) / g * g;
	pthread_mutex_lock(&mu);
	void *out = NULL;
	if (ntab < MAXA) {
		CUdeviceptr p;
		CUresult r = pReserve(&p, rs, g, 0, 0);
		if (r) last_err = r;
		else {
			int i = ntab;
			tab[i].p = p, tab[i].size = size, tab[i].mapped_size = rs, tab[i].device = device, tab[i].mapped = 0;
			if (map_one(i) == 0) ntab++, n_alloc++, out = (void *)(uintptr_t)p;
			else pAddrFree(p, rs);
		}
	}
	pthread_mutex_unlock(&mu);
	return out;
}

void vmm_free(void *ptr, size_t size, int device, void *stream) {
	(void)size, (void)device, (void)stream;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < ntab; i++) {
		if (tab[i].p != (CUdeviceptr)(uintptr_t)ptr) continue;
		if (tab[i].mapped) pUnmap(tab[i].p, tab[i].mapped_size), pRelease(tab[i].h);
		pAddrFree(tab[i].p, tab[i].mapped_size);
		tab[i] = tab[--ntab];
		n_free++;
		break;
	}
	pthread_mutex_unlock(&mu);
}

// vmm_pause releases every allocation's physical memory, keeping its
// addresses; returns the bytes released, or -1.
long long vmm_pause(void) {
	long long bytes = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < ntab; i++) {
		if (!tab[i].mapped) continue;
		if (pUnmap(tab[i].p, tab[i].mapped_size) || pRelease(tab[i].h)) bytes = -1;
		tab[i].mapped = 0;
		if (bytes >= 0) bytes += tab[i].mapped_size;
	}
	n_pause++;
	pthread_mutex_unlock(&mu);
	return bytes;
}

// vmm_resume maps new memory at every paused allocation's address;
// returns the bytes mapped, or -1.
long long vmm_resume(void) {
	long long bytes = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < ntab; i++) {
		if (tab[i].mapped) continue;
		if (map_one(i)) {
			bytes = -1;
			break;
		}
		bytes += tab[i].mapped_size;
	}
	n_resume++;
	pthread_mutex_unlock(&mu);
	return bytes;
}

// vmm_counts: allocs, frees, live allocations, their requested bytes,
// pauses, resumes, the last driver error.
void vmm_counts(long long *out) {
	pthread_mutex_lock(&mu);
	long long live = 0;
	for (int i = 0; i < ntab; i++) live += tab[i].size;
	out[0] = n_alloc, out[1] = n_free, out[2] = ntab, out[3] = live, out[4] = n_pause, out[5] = n_resume, out[6] = last_err;
	pthread_mutex_unlock(&mu);
}

// vmm_owns says whether [p, p+n) lies in one live allocation.
int vmm_owns(uintptr_t p, size_t n) {
	int yes = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < ntab && !yes; i++) yes = p >= tab[i].p && p + n <= tab[i].p + tab[i].size;
	pthread_mutex_unlock(&mu);
	return yes;
}
