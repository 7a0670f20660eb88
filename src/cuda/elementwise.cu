/* elementwise.cu — small utility kernels: a counter-hash random fill (bench: KV cache contents), an FP8 weight
 * dequantized to bf16 (the prefill GEMMs' operand), fp32 <-> bf16 copies (a lone sequence's states between a bf16
 * serve slot and the context) and a streaming-read bandwidth probe (bench: the ceiling ops are compared with). */
#include "cuda/common.cuh"
#include "cuda/mma.cuh" /* pack_bf16 */

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

__global__ void cast_f32_bf16(const __grid_constant__ CastParams p) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (int64_t)gridDim.x * blockDim.x)
        if (p.to_bf16)
            ((uint16_t *)p.dst)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(((const float *)p.src)[i]));
        else
            ((float *)p.dst)[i] = __uint_as_float((uint32_t)((const uint16_t *)p.src)[i] << 16);
}

extern "C" int cuda_cast_f32_bf16(const CastParams *p, const CudaLaunch *l) {
    if (!p->src || !p->dst || p->n < 0) return (int)cudaErrorInvalidValue;
    if (p->n == 0) return 0;
    int64_t blocks = (p->n + 255) / 256;
    if (blocks > 1024) blocks = 1024;
    return launch_kernel(cast_f32_bf16, dim3((unsigned)blocks), dim3(256), 0, l, *p);
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

/* Thread i takes piece i of 16 columns (one 16-byte load, one scale): 16 e4m3 -> fp32 (exact) * scale -> bf16.
 * No early trigger: the GEMM after it issues its weight loads before its own wait (weights are immutable there), so
 * it may only start once this grid has completed. */
__global__ void __launch_bounds__(256) fp8_to_bf16_k(const __grid_constant__ Fp8ToBf16Params p) {
    pdl_wait();
    const int pr = p.cols / 16, ld = (p.rows + 3) & ~3;
    const int64_t n = (int64_t)p.rows * pr;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / pr), c = (int)(i % pr) * 16;
        const uint4 w = *reinterpret_cast<const uint4 *>(p.w8 + (size_t)r * p.cols + c);
        const float s = p.scale[(size_t)(c / 128) * ld + r];
        const uint32_t q[4] = {w.x, w.y, w.z, w.w};
        uint32_t o[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 a = e4m3x2_f32(q[j]), b = e4m3x2_f32(q[j] >> 16);
            o[2 * j] = pack_bf16(a.x * s, a.y * s);
            o[2 * j + 1] = pack_bf16(b.x * s, b.y * s);
        }
        uint4 *d = reinterpret_cast<uint4 *>(p.out + (size_t)r * p.ldo + c);
        d[0] = make_uint4(o[0], o[1], o[2], o[3]);
        d[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

extern "C" int cuda_fp8_to_bf16(const Fp8ToBf16Params *p, const CudaLaunch *l) {
    if (!p->w8 || !p->scale || !p->out || p->rows < 1 || p->cols < 16 || p->cols % 16 || p->ldo < p->cols ||
        p->ldo % 8 || ((uintptr_t)p->w8 & 15) || ((uintptr_t)p->out & 15))
        return (int)cudaErrorInvalidValue;
    int64_t blocks = ((int64_t)p->rows * (p->cols / 16) + 255) / 256;
    if (blocks > 2048) blocks = 2048;
    return launch_kernel(fp8_to_bf16_k, dim3((unsigned)blocks), dim3(256), 0, l, *p);
}
