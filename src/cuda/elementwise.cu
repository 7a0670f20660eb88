/* elementwise.cu — small utility kernels: a counter-hash random fill (bench: KV cache contents)
 * and a streaming-read bandwidth probe (bench: the ceiling ops are compared with). */
#include "cuda/common.cuh"

/* splitmix64 finaliser: a counter-based hash. */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* buf[i] = bf16(scale (2u - 1)), u = uniform from mix64(seed ^ i). Grid-stride. */
__global__ void fill_bf16_hash(const __grid_constant__ FillParams p) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (int64_t)gridDim.x * blockDim.x) {
        float u = (float)(mix64(p.seed ^ (uint64_t)i) >> 40) * (1.0f / 16777216.0f);
        p.buf[i] = __bfloat16_as_ushort(__float2bfloat16_rn(p.scale * (2.0f * u - 1.0f)));
    }
}

extern "C" int cuda_fill_bf16(const FillParams *p, const CudaLaunch *l) {
    if (!p->buf || p->n < 0) return (int)cudaErrorInvalidValue;
    if (p->n == 0) return 0;
    int64_t blocks = (p->n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    return launch_kernel(fill_bf16_hash, dim3((unsigned)blocks), dim3(256), 0, l, *p);
}

/* Reads src once with 16-byte streaming loads (4 in flight per thread), XOR-folds the words
 * so the loads cannot be dropped, and writes one word per block to sink. */
__global__ void __launch_bounds__(512) read_bw_u4(const __grid_constant__ ReadBwParams p) {
    pdl_wait();
    pdl_trigger();
    const uint4 *src = reinterpret_cast<const uint4 *>(p.src);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < p.n_u4; i += 4 * stride) {
        uint4 a = ld_stream(src + i), b = ld_stream(src + i + stride);
        uint4 c = ld_stream(src + i + 2 * stride), d = ld_stream(src + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < p.n_u4; i += stride) {
        uint4 a = ld_stream(src + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(p.sink + blockIdx.x, acc);
}

extern "C" int cuda_read_bw(const ReadBwParams *p, const CudaLaunch *l) {
    if (!p->src || !p->sink || p->n_u4 <= 0 || p->blocks <= 0) return (int)cudaErrorInvalidValue;
    return launch_kernel(read_bw_u4, dim3((unsigned)p->blocks), dim3(512), 0, l, *p);
}
