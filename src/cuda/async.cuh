/* async.cuh — asynchronous copies into shared memory, written once for every kernel: cp.async (sm_80+),
 * Hopper (sm_90a) mbarriers, TMA (cp.async.bulk and cp.async.bulk.tensor) and
 * named barriers. The host side encodes the tensor maps (cuda_tma_map_bf16, gemm_tma.cu). */
#ifndef Q35_CUDA_ASYNC_CUH
#define Q35_CUDA_ASYNC_CUH

#include <stdint.h>

#include <cuda.h>

/* cp.async: 16 bytes global -> shared, cached at L2 only (.cg); commit_group closes a group; wait<N> waits until
 * at most N groups are in flight. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}
/* The same to a shared-memory address; when pred is false nothing is read and 16 zero bytes are written. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Tensor map of a bf16 row-major [rows][ld] matrix read as [rows][cols] in boxes of 64 columns (128
 * bytes) x box_rows rows (<= 256), 128-byte swizzle (16-byte chunk c of box row r lands at chunk
 * c ^ (r & 7): swz<8> of mma.cuh, for a 1024-byte aligned destination), zero fill outside. 0 or a
 * cudaError_t (cudaErrorNotSupported when the driver has no cuTensorMapEncodeTiled). */
int cuda_tma_map_bf16(CUtensorMap *m, const uint16_t *base, int rows, int cols, int ld, int box_rows);
/* 3-D: element (c, r, h) at base[h * ld2 + r * ld + c] (c < cols, r < rows, h < n3), boxes of 64 columns
 * x box_rows rows x 1, same swizzle and zero fill (rows >= `rows` read as 0). */
int cuda_tma_map_bf16_3d(CUtensorMap *m, const uint16_t *base, int cols, int rows, int n3, long long ld, long long ld2,
                         int box_rows);

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialised barriers visible to the async proxy (the TMA unit); follow with a barrier. */
__device__ __forceinline__ void mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Arrives (count 1) and adds `bytes` to the transaction count the current phase waits for. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}
/* Waits until the phase of parity `parity` has completed. A wait of 2^34 clocks (~9 s) can only be a
 * pipeline bug: it traps, so the launch fails instead of hanging the stream. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if (mbar_try(bar, parity)) return;
    const long long t0 = clock64();
    while (!mbar_try(bar, parity))
        if (clock64() - t0 > (1ll << 34)) __trap();
}
/* A bulk copy (TMA, no registers, no thread waits on it) of `bytes` (a multiple of 16, both ends 16-byte aligned)
 * from global memory into this CTA's shared memory at shared address dst, completing as transaction bytes on the
 * mbarrier at `bar`. */
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* An L2 cache policy that marks lines evict-first (for bulk_g2s_ef: a stream read once, so that it does not push out
 * the lines a kernel prefetched for later). */
__device__ __forceinline__ uint64_t l2_evict_first_policy(void) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
/* bulk_g2s with an L2 cache policy (l2_evict_first_policy). */
__device__ __forceinline__ void bulk_g2s_ef(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar, uint64_t pol) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "l"(pol)
                 : "memory");
}
/* 2-D tiled TMA load of the box at (c0 = inner/K coordinate, c1 = row) into shared dst; completion
 * is signalled on bar as transaction bytes. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
/* 3-D tiled TMA load of the box at (c0, c1, c2) (cuda_tma_map_bf16_3d). */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}
/* Makes a tensor map that the host copied into global memory visible to the TMA unit. */
__device__ __forceinline__ void tma_map_acquire(const CUtensorMap *map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"((uint64_t)map) : "memory");
}
/* Named barrier `id` (1..15) over `n` threads: bar_arrive signals without waiting, bar_sync waits. */
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* Warpgroup register budget (setmaxnreg): a producer warpgroup gives registers back, consumers take them. */
template <int R>
__device__ __forceinline__ void regs_dec(void) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_inc(void) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
/* This block's rank in its cluster. */
__device__ __forceinline__ uint32_t cluster_rank(void) {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

#endif
