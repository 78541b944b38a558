// launchex_probe: prints the layout of CUlaunchConfig and CUlaunchAttribute
// in this machine's cuda.h, the enum values cuda/driver_ops.go hard-codes,
// and which function the driver gives for cuLaunchKernelEx (dlsym of the
// plain name against cuGetProcAddress_v2 at CUDA 13.0).
//   gcc -I/usr/local/cuda/include -o /tmp/probe kernels/bench/launchex_probe.c -ldl
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

int main(void) {
    printf("CUDA_VERSION %d\n", CUDA_VERSION);
    printf("sizeof CUlaunchConfig %zu: grid@%zu block@%zu shared@%zu stream@%zu attrs@%zu numAttrs@%zu\n",
           sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, gridDimX), offsetof(CUlaunchConfig, blockDimX),
           offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream),
           offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs));
    printf("sizeof CUlaunchAttribute %zu: id@%zu value@%zu sizeof value %zu; programmaticStreamSerializationAllowed@%zu size %zu\n",
           sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, id), offsetof(CUlaunchAttribute, value),
           sizeof(CUlaunchAttributeValue), offsetof(CUlaunchAttributeValue, programmaticStreamSerializationAllowed),
           sizeof(((CUlaunchAttributeValue *)0)->programmaticStreamSerializationAllowed));
    printf("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION %d\n", (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    printf("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR %d MINOR %d\n", (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
           (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("no libcuda.so.1\n"); return 1; }
    CUresult (*init)(unsigned) = dlsym(lib, "cuInit");
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        dlsym(lib, "cuGetProcAddress_v2");
    init(0);
    const char *names[] = {"cuLaunchKernelEx", "cuLaunchKernel", "cuDeviceGetAttribute"};
    for (int i = 0; i < 3; i++) {
        void *p = 0;
        CUdriverProcAddressQueryResult st = 0;
        CUresult r = gpa(names[i], &p, 13000, 0, &st);
        void *plain = dlsym(lib, names[i]);
        char other[64];
        snprintf(other, sizeof other, "%s_ptsz", names[i]);
        void *ptsz = dlsym(lib, other);
        printf("%s: getProcAddress(13000)=%s (r=%d st=%d), plain dlsym %s, _ptsz %s\n", names[i],
               p == 0 ? "NULL" : p == plain ? "plain" : p == ptsz ? "_ptsz" : "other", r, (int)st,
               plain ? "exported" : "missing", ptsz ? "exported" : "missing");
    }
    return 0;
}
