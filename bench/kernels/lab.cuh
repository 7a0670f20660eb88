/* lab.cuh — what the labs (burst_lab.cu, step_lab.cu, gemv_lab.cu, gemm_lab.cu) share: a CUDA call that exits on error, and the
 * global timer (ns, the same clock on every SM). */
#ifndef Q35_BENCH_LAB_CUH
#define Q35_BENCH_LAB_CUH

#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                 \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

__device__ __forceinline__ unsigned long long gtimer(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#endif
