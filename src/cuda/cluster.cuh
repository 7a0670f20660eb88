/* cluster.cuh — thread-block cluster helpers (sm_90): split cluster barriers and distributed shared
 * memory (DSMEM) loads/stores, shared by deltanet.cu and attention.cu. The compute_80 PTX in CUARCH
 * has no clusters: there the helpers trap (and the cluster launch itself fails on such devices).
 *
 * Barrier use: every thread of every block of the cluster calls arrive then wait (".aligned": the
 * whole warp executes the same call). arrive_release + wait (acquire) publishes earlier shared
 * memory writes, local or remote, to the cluster. A block may store into another block's shared
 * memory only once that block has started (an arrive at kernel start, the matching wait before the
 * first remote store), and may read another block's shared memory only while that block has not
 * exited. */
#ifndef Q35_CUDA_CLUSTER_CUH
#define Q35_CUDA_CLUSTER_CUH

#include "cuda/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_arrive_release(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed(void) {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait(void) { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
/* Address of *local in the shared memory of cluster block `rank`. */
__device__ __forceinline__ unsigned dsmem_addr(const float *local, unsigned rank) {
    unsigned a = (unsigned)__cvta_generic_to_shared(local), ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    return ra;
}
__device__ __forceinline__ float ld_dsmem(const float *local, unsigned rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(dsmem_addr(local, rank)) : "memory");
    return v;
}
__device__ __forceinline__ void st_dsmem(float *local, unsigned rank, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(dsmem_addr(local, rank)), "f"(v) : "memory");
}
/* local: 16-byte aligned */
__device__ __forceinline__ void st_dsmem4(float *local, unsigned rank, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(dsmem_addr(local, rank)), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
}
#else
__device__ __forceinline__ void cluster_arrive_release(void) { __trap(); }
__device__ __forceinline__ void cluster_arrive_relaxed(void) { __trap(); }
__device__ __forceinline__ void cluster_wait(void) { __trap(); }
__device__ __forceinline__ float ld_dsmem(const float *, unsigned) {
    __trap();
    return 0.0f;
}
__device__ __forceinline__ void st_dsmem(float *, unsigned, float) { __trap(); }
__device__ __forceinline__ void st_dsmem4(float *, unsigned, float4) { __trap(); }
#endif

/* Launches kern with grid.x cut into clusters of cluster_x blocks (grid.x % cluster_x == 0), plus the
 * PDL attribute when l->pdl is set. Kernels take their args struct by value. */
template <typename A>
static inline int launch_cluster(void (*kern)(A), dim3 grid, dim3 block, size_t smem, unsigned cluster_x,
                                 const CudaLaunch *l, const A &a) {
    return launch_ex(kern, grid, block, smem, cluster_x, l, a);
}

#endif
