/* attn_prep.cuh — one head of one row before attention, by one warp (MODEL.md §3.2): the prefill's attn_prep_bf16_rows
 * (attention_prefill.cu) and the batched step's paged_prep_rows (serve_kernels.cu) both call these, so a row's q and
 * K/V are the same bits on either path. Element e = lane + 32 i of the head (hd a multiple of 32, <= 256). */
#ifndef Q35_CUDA_ATTN_PREP_CUH
#define Q35_CUDA_ATTN_PREP_CUH

#include "cuda/common.cuh"

/* Element e of a head as its destination stores the bf16 value y: bf16 bits, or (the serve step's fp8 KV pools) its
 * e4m3 code (f32_e4m3: exact where y is an e4m3 value, else rounded to nearest even, saturated at +-448). */
__device__ __forceinline__ void kv_store(uint16_t *dst, int e, float y) { dst[e] = bf16_bits(y); }
__device__ __forceinline__ void kv_store(uint8_t *dst, int e, float y) { dst[e] = (uint8_t)f32_e4m3(y); }
/* the same for a value given as its bf16 bits (copied as they are into bf16) */
__device__ __forceinline__ void kv_store_bits(uint16_t *dst, int e, uint16_t b) { dst[e] = b; }
__device__ __forceinline__ void kv_store_bits(uint8_t *dst, int e, uint16_t b) { dst[e] = (uint8_t)f32_e4m3(bf16u(b)); }
/* a bf16 cache holding e4m3 values (kv_bits with e4m3: the prefill of a lone served sequence over fp8 KV pools) */
struct KvE4m3Bf16 {
    uint16_t bits;
};
__device__ __forceinline__ void kv_store(KvE4m3Bf16 *dst, int e, float y) { dst[e].bits = kv_bits(y, 1); }
__device__ __forceinline__ void kv_store_bits(KvE4m3Bf16 *dst, int e, uint16_t b) {
    dst[e].bits = kv_bits(bf16u(b), 1);
}

/* v: copied as projected (bf16 bits, or their e4m3 codes); every load before the first store (no load-use round trip
 * per element) */
template <typename D>
__device__ __forceinline__ void head_copy(const uint16_t *src, D *dst, int hd) {
    const int lane = threadIdx.x & 31, n = hd / 32;
    uint16_t v[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < n) v[k] = src[lane + 32 * k];
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < n) kv_store_bits(dst, lane + 32 * k, v[k]);
}

/* q or k: x = RMSNorm(src) with weight w (norm_apply's mode), then partial NeoX RoPE of the first R elements at
 * position pos with HF's bf16 rounding points:
 *   e < R/2:  y = bf16(bf16(x_e c) - bf16(x_{e+R/2} s)),  e >= R/2 (e < R):  y = bf16(bf16(x_e c) + bf16(x_{e-R/2} s)),
 * c, s = bf16(cos, sin)(pos inv_freq[e mod R/2]); elements past R pass as bf16(x). buf: the warp's 256 floats (the
 * normed head, read across lanes for the rotation). dst: [hd], bf16 (or kv_store's e4m3 codes of the bf16 values). */
template <typename D>
__device__ __forceinline__ void head_norm_rope(const uint16_t *src, const float *w, int hd, float eps, int norm_mode,
                                               const float *inv_freq, int R, int pos, float *buf, D *dst) {
    const int lane = threadIdx.x & 31, n = hd / 32;
    float x[8];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        x[i] = i < n ? bf16u(src[lane + 32 * i]) : 0.0f;
        ss += x[i] * x[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)hd + eps);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i >= n) break;
        const int e = lane + 32 * i;
        x[i] = norm_apply(x[i], r, w[e], norm_mode);
        buf[e] = x[i];
    }
    __syncwarp();
    const int half = R / 2;
    float fr[8]; /* the rotary frequencies, loaded before the stores below */
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = lane + 32 * i;
        fr[i] = i < n && e < R ? inv_freq[e < half ? e : e - half] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i >= n) break;
        const int e = lane + 32 * i;
        float y = x[i];
        if (e < R) {
            float sn, cs;
            sincosf((float)pos * fr[i], &sn, &cs);
            const float c = rbf(cs), s = rbf(sn);
            y = e < half ? rbf(rbf(x[i] * c) - rbf(buf[e + half] * s)) : rbf(rbf(x[i] * c) + rbf(buf[e - half] * s));
        }
        kv_store(dst, e, y);
    }
}

#endif
