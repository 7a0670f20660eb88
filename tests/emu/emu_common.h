/* emu_common.h — what src/cuda/common.cuh (the device helpers a decode kernel uses, its step-trace stamps,
 * launch_ex / launch_kernel) and the CUDA runtime calls of a launcher provide on the GPU, for the host
 * emulation of emu.h. Include after emu.h and cuda/ops.h. The reds are plain adds (one CTA runs at a time);
 * a launch checks its shared memory against what cudaFuncSetAttribute allowed and counts the CTAs it runs. */
#pragma once
#include <map>

#define __ldcg(p) (*(p))
static inline float __shfl_down_sync(unsigned, float v, int d) {
    const int lane = me().tid & 31;
    return emu_shfl(v, lane + d < 32 ? lane + d : lane);
}
static inline uint4 ld_stream(const uint4 *p) { return *p; }
static inline void red_add4(float *y, float a, float b, float c, float d) {
    if ((uintptr_t)y % 16) {
        fprintf(stderr, "emu: red.v4 address %p not 16-byte aligned\n", (void *)y);
        exit(2);
    }
    y[0] += a, y[1] += b, y[2] += c, y[3] += d;
}
#define Q35_TRACE_T0       (void)0 /* common.cuh's step-trace stamps: off, as in the default build */
#define Q35_TRACE_T1       (void)0
#define Q35_TRACE_T1_AT(n) (void)0
#define Q35_TRACE_PROBE(n) (void)0
#define Q35_TRACE_END(kid) (void)0
#define Q35_TRACE_FETCH_FN(fname)
#define Q35_TRACE_ARG
#define Q35_TRACE_PASS
#define Q35_TRACE_T1_DECL (void)0
#define Q35_TRACE_T1_SET  (void)0

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
/* what cudaFuncSetAttribute allowed each kernel (48 KiB without it, as on the device) */
inline std::map<const void *, int> emu_max_smem;
template <class F>
static cudaError_t cudaFuncSetAttribute(F *f, cudaFuncAttribute attr, int v) {
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) /* a hint: nothing to emulate */
        return v >= -1 && v <= 100 ? cudaSuccess : cudaErrorInvalidValue;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || v > 227 * 1024) return cudaErrorInvalidValue;
    emu_max_smem[(const void *)f] = v;
    return cudaSuccess;
}
/* common.cuh's smem_attr: here every call sets it (a test may clear emu_max_smem between launches) */
template <auto KERN, bool MAX_CARVEOUT = false>
static cudaError_t smem_attr(int bytes) {
    return cudaFuncSetAttribute(KERN, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
/* the code a kernel runs: the sm_90a SASS (binaryVersion and ptxVersion 90) when built with the wgmma path */
template <class F>
static cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F *) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    a->binaryVersion = a->ptxVersion = 90;
#else
    a->binaryVersion = a->ptxVersion = 80;
#endif
    return cudaSuccess;
}
static int emu_smem_allowed(const void *f) {
    const auto it = emu_max_smem.find(f);
    return it == emu_max_smem.end() ? 48 * 1024 : it->second;
}
inline long emu_ctas; /* CTAs launched (all launches) */
template <class... KArgs, class... Args>
static int launch_ex(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x, const CudaLaunch *,
                     Args... args) {
    if ((int)smem > emu_smem_allowed((const void *)kern) || cluster_x > 1 || block.x * block.y * block.z > 1024)
        return (int)cudaErrorInvalidValue;
    emu_ctas += (long)grid.x * grid.y * grid.z;
    emu_launch(grid, (int)(block.x * block.y * block.z), smem, 1, [&] { kern(args...); });
    return 0;
}
template <typename P>
static int launch_kernel(void (*kern)(P), dim3 grid, dim3 block, size_t smem, const CudaLaunch *l, const P &p) {
    return launch_ex(kern, grid, block, smem, 0, l, p);
}
