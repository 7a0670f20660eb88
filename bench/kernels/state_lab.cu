/* state_lab.cu — how fast can the batched DeltaNet state pass (dn_batch_state_head, serve_kernels.cu) stream its
 * states? Each item is one head's fp32 state, 64 KB, read and written back in place; at B = 256 a layer has
 * 256 x 16 items (268 MB each way). The lab runs that traffic with no arithmetic (each value scaled by a constant)
 * in several shapes and prints GB/s of bytes read + written (median of REPS launches, events):
 *   memcpy      cudaMemcpyAsync device to device of the same bytes (out of place): the copy reference;
 *   rmw         a grid-stride float4 read-modify-write, 8 CTAs of 256 threads per SM, 4 vectors per thread in flight;
 *   ring S/I/C  the state pass's shape: a persistent grid of C CTAs per SM (256 threads), thread 0 keeps S items of
 *               I KB in flight as bulk copies into a shared-memory ring, every thread reads its share of the stage
 *               into registers, a barrier, the stage refilled, the values stored from registers (in place);
 *   ring-oop    the same, stored to a second buffer;
 *   ring-bulk   the same, but the scaled values written back into the stage and stored by one bulk copy
 *               (shared -> global), the stage refilled once the copy has read it;
 *   slots       ring S3 I64K C1 with the items of a sequence slot (16 heads, 1 MB) `stride` MB apart, as the
 *               serving engine lays out a slot (all layers' states and conv rings of one sequence together).
 *   build: make build/bench/state_lab (sm_90a)      run: build/bench/state_lab [items [stride MB]] */
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda/async.cuh"
#include "cuda/mma.cuh"
#include "lab.cuh"

#define REPS 20

__global__ void rmw_k(float4 *x, size_t n4) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += 4 * stride) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (i + u * stride < n4) v[u] = x[i + u * stride];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (i + u * stride < n4)
                x[i + u * stride] = make_float4(0.5f * v[u].x, 0.5f * v[u].y, 0.5f * v[u].z, 0.5f * v[u].w);
    }
}

__device__ __forceinline__ void bulk_s2g(void *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit(void) { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read0(void) { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

/* MODE 0 in place from registers, 1 to `out` from registers, 2 in place by a bulk store from the stage */
template <int MODE>
__global__ void __launch_bounds__(256)
    ring_k(float *x, float *out, int items, int stages, int item_bytes, size_t stride) {
    /* item t at x + (t / 16) stride + (t % 16) item_bytes (stride = 16 item_bytes: contiguous) */
    auto at = [&](float *b, int t) { return (char *)b + (size_t)(t / 16) * stride + (size_t)(t % 16) * item_bytes; };
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, G = gridDim.x, nv = item_bytes / 16 / 256; /* float4 per thread per item */
    const uint32_t sbase = smem_addr(smem), fbar = sbase + stages * item_bytes;
    auto fetch = [&](int t, int st) {
        mbar_arrive_expect_tx(fbar + 8 * st, item_bytes);
        bulk_g2s(sbase + st * item_bytes, at(x, t), item_bytes, fbar + 8 * st);
    };
    if (tid == 0) {
        for (int st = 0; st < stages; st++) mbar_init(fbar + 8 * st, 1);
        mbar_init_fence();
        for (int st = 0; st < stages; st++)
            if (blockIdx.x + st * G < items) fetch(blockIdx.x + st * G, st);
    }
    __syncthreads();
    for (int k = 0, t = blockIdx.x; t < items; k++, t += G) {
        const int st = k % stages;
        mbar_wait(fbar + 8 * st, (uint32_t)(k / stages) & 1u);
        float4 *stage = (float4 *)(smem + (size_t)st * item_bytes);
        float4 v[16];
#pragma unroll
        for (int m = 0; m < 16; m++)
            if (m < nv) v[m] = stage[m * 256 + tid];
        if (MODE == 2) {
#pragma unroll
            for (int m = 0; m < 16; m++)
                if (m < nv)
                    stage[m * 256 + tid] = make_float4(0.5f * v[m].x, 0.5f * v[m].y, 0.5f * v[m].z, 0.5f * v[m].w);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        }
        __syncthreads();
        if (MODE == 2) {
            if (tid == 0) {
                bulk_s2g(at(x, t), sbase + st * item_bytes, item_bytes);
                bulk_commit();
                bulk_wait_read0();
                if (t + stages * G < items) fetch(t + stages * G, st);
            }
            continue;
        }
        if (tid == 0 && t + stages * G < items) fetch(t + stages * G, st);
        float4 *dst = (float4 *)at(MODE == 1 ? out : x, t);
#pragma unroll
        for (int m = 0; m < 16; m++)
            if (m < nv) dst[m * 256 + tid] = make_float4(0.5f * v[m].x, 0.5f * v[m].y, 0.5f * v[m].z, 0.5f * v[m].w);
    }
    if (MODE == 2 && tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    const int items64 = argc > 1 ? atoi(argv[1]) : 4096; /* 64 KB items: 4096 = B 256 x 16 heads */
    const size_t bytes = (size_t)items64 << 16;
    const double stride_mb = argc > 2 ? atof(argv[2]) : 0.0;
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    float *x, *y;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes));
    CK(cudaMemset(x, 0, bytes));
    CK(cudaMemset(y, 0, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto timeit = [&](const char *name, auto &&fn) {
        std::vector<float> ms;
        for (int r = -2; r < REPS; r++) {
            CK(cudaEventRecord(e0));
            fn();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            if (r >= 0) ms.push_back(t);
        }
        CK(cudaGetLastError());
        const float m = median(ms);
        printf("%-28s %8.1f us  %6.0f GB/s (read + written)\n", name, 1e3f * m, 2.0 * bytes / (m * 1e-3) / 1e9);
    };
    printf("%d items of 64 KB (%.0f MB each way), %d SMs\n", items64, bytes / 1e6, n_sm);
    timeit("memcpy", [&] { CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice)); });
    timeit("rmw", [&] { rmw_k<<<n_sm * 8, 256>>>((float4 *)x, bytes / 16); });
    struct Cfg {
        int mode, stages, kb, per_sm;
    } cfgs[] = {{0, 3, 64, 1}, {0, 2, 64, 1},  {1, 3, 64, 1}, {2, 3, 64, 1}, {0, 6, 32, 1}, {0, 3, 32, 2},
                {0, 2, 32, 2}, {0, 12, 16, 1}, {0, 3, 16, 4}, {1, 3, 32, 2}, {2, 3, 32, 2}, {2, 6, 32, 1}};
    for (const Cfg &c : cfgs) {
        const int ib = c.kb << 10, items = (int)(bytes / ib), smem = c.stages * ib + 8 * c.stages;
        const int grid = std::min(items, n_sm * c.per_sm);
        char name[64];
        snprintf(name, sizeof name, "ring%s S%d I%dK C%d",
                 c.mode == 1   ? "-oop"
                 : c.mode == 2 ? "-bulk"
                               : "",
                 c.stages, c.kb, c.per_sm);
        auto k = c.mode == 0 ? ring_k<0> : c.mode == 1 ? ring_k<1> : ring_k<2>;
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        timeit(name, [&] { k<<<grid, 256, smem>>>(x, y, items, c.stages, ib, (size_t)16 * ib); });
    }
    if (stride_mb > 0) {
        const size_t stride = (size_t)(stride_mb * 1048576.0) & ~(size_t)255, big = (size_t)(items64 / 16 + 1) * stride;
        float *z;
        CK(cudaMalloc(&z, big));
        CK(cudaMemset(z, 0, big));
        const int smem = 3 * 65536 + 24;
        CK(cudaFuncSetAttribute(ring_k<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        char name[64];
        snprintf(name, sizeof name, "slots %.1f MB apart", stride_mb);
        timeit(name, [&] { ring_k<0><<<std::min(items64, n_sm), 256, smem>>>(z, z, items64, 3, 65536, stride); });
        CK(cudaFree(z));
    }
    return 0;
}
