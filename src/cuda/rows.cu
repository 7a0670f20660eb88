/* rows.cu — row ops of the prefill path (RMSNorm to bf16, embedding rows, the last real row) and the prefill's
 * buffer sizes. */
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops.h"

/* ---- row ops --------------------------------------------------------------------------- */

/* grid ceil(T/8), 256 threads: warp per row, float4 loads (any D % 4 == 0; the fallback of the
 * register form below). */
__global__ void __launch_bounds__(256) rmsnorm_f32_rows_bf16(const __grid_constant__ RmsnormRowsParams p) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    pdl_wait();
    if (row >= p.T) return;
    const float4 *x = (const float4 *)(p.x + (size_t)row * p.D);
    const float4 *w = (const float4 *)p.w;
    uint2 *y = (uint2 *)(p.y + (size_t)row * p.D);
    const int n4 = p.D / 4;
    float ss = 0.0f;
    for (int i = lane; i < n4; i += 32) {
        const float4 v = x[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)p.D + p.eps);
    for (int i = lane; i < n4; i += 32) {
        const float4 v = x[i], g = w[i];
        float o[4];
        const float xv[4] = {v.x, v.y, v.z, v.w}, wv[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
        for (int e = 0; e < 4; e++) o[e] = norm_apply(xv[e], r, wv[e], p.mode);
        y[i] = make_uint2(pack_bf16(o[0], o[1]), pack_bf16(o[2], o[3]));
    }
}

/* The same with the row in registers, 8 consecutive elements per lane and chunk (NC chunks of
 * 8 per lane, D <= 256 NC, D % 8 == 0): the weight chunks are loaded first (immutable: before
 * pdl_wait), then all x loads of the row are in flight before the reduction, and each chunk is
 * stored as one 16-byte word. The earlier form (float4 per lane, weights loaded one by one after
 * the reduction, 8-byte stores) measured 8.9 us for 2048 x 1024 on the H200 where 12 MB of traffic
 * needs ~3-4 us. */
template <int NC>
__global__ void __launch_bounds__(256) rmsnorm_f32_rows_bf16_v8(const __grid_constant__ RmsnormRowsParams p) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31, n8 = p.D / 8;
    const float4 *w = (const float4 *)p.w;
    float4 g[2 * NC];
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int i = lane + 32 * k;
        g[2 * k] = i < n8 ? __ldg(w + 2 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        g[2 * k + 1] = i < n8 ? __ldg(w + 2 * i + 1) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    pdl_begin(); /* the next kernel (a GEMM streaming its weights first) may start now */
    if (row >= p.T) return;
    const float4 *x = (const float4 *)(p.x + (size_t)row * p.D);
    uint4 *y = (uint4 *)(p.y + (size_t)row * p.D);
    float4 v[2 * NC];
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int i = lane + 32 * k;
        v[2 * k] = i < n8 ? __ldcg(x + 2 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[2 * k + 1] = i < n8 ? __ldcg(x + 2 * i + 1) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < 2 * NC; k++) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / (float)p.D + p.eps);
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int i = lane + 32 * k;
        if (i < n8) {
            const float4 a = v[2 * k], b = v[2 * k + 1], ga = g[2 * k], gb = g[2 * k + 1];
            uint4 o;
            o.x = pack_bf16(norm_apply(a.x, r, ga.x, p.mode), norm_apply(a.y, r, ga.y, p.mode));
            o.y = pack_bf16(norm_apply(a.z, r, ga.z, p.mode), norm_apply(a.w, r, ga.w, p.mode));
            o.z = pack_bf16(norm_apply(b.x, r, gb.x, p.mode), norm_apply(b.y, r, gb.y, p.mode));
            o.w = pack_bf16(norm_apply(b.z, r, gb.z, p.mode), norm_apply(b.w, r, gb.w, p.mode));
            y[i] = o;
        }
    }
}

extern "C" int cuda_rmsnorm_rows_bf16(const RmsnormRowsParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->D < 4 || p->D % 4 || ((uintptr_t)p->x & 15) || ((uintptr_t)p->w & 15) || ((uintptr_t)p->y & 7) ||
        (p->mode != NORM_ZC && p->mode != NORM_PLAIN))
        return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)((p->T + 7) / 8)), block(256);
    const bool v8 = p->D % 8 == 0 && ((uintptr_t)p->y & 15) == 0;
    if (v8 && p->D <= 512) return launch_kernel(rmsnorm_f32_rows_bf16_v8<2>, grid, block, 0, l, *p);
    if (v8 && p->D <= 1024) return launch_kernel(rmsnorm_f32_rows_bf16_v8<4>, grid, block, 0, l, *p);
    if (v8 && p->D <= 2048) return launch_kernel(rmsnorm_f32_rows_bf16_v8<8>, grid, block, 0, l, *p);
    return launch_kernel(rmsnorm_f32_rows_bf16, grid, block, 0, l, *p);
}

/* grid T, 128 threads. */
__global__ void __launch_bounds__(128) embed_bf16_rows(const __grid_constant__ EmbedRowsParams p) {
    pdl_begin();
    const int t = blockIdx.x, tok = p.tokens[t];
    const bool ok = tok >= 0 && tok < p.V;
    const uint16_t *e = p.E + (size_t)(ok ? tok : 0) * p.D;
    float *x = p.x + (size_t)t * p.D;
    /* __ldg: the table is read-only, so the compiler may issue its loads ahead of the stores (a plain load stays
     * behind a store that may alias it: one round trip per element) */
    for (int i = threadIdx.x; i < p.D; i += 128) x[i] = ok ? __uint_as_float((uint32_t)__ldg(e + i) << 16) : 0.0f;
}

extern "C" int cuda_embed_rows(const EmbedRowsParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->D < 1 || p->V < 1) return (int)cudaErrorInvalidValue;
    return launch_ex(embed_bf16_rows, dim3(p->T), dim3(128), 0, 0, l, *p);
}

/* grid ceil(D / 1024), 256 threads: one float4 per thread */
__global__ void __launch_bounds__(256) row_last_f32(float *x, const int32_t *t_real, int T, int D) {
    pdl_begin();
    const int r = *t_real - 1, i = 4 * (blockIdx.x * 256 + threadIdx.x);
    if (r == T - 1 || r < 0 || r >= T || i >= D) return;
    *(float4 *)(x + (size_t)(T - 1) * D + i) = *(const float4 *)(x + (size_t)r * D + i);
}

extern "C" int cuda_row_last(float *x, const int32_t *t_real, int T, int D, const CudaLaunch *l) {
    if (!x || !t_real || T < 1 || D < 4 || D % 4) return (int)cudaErrorInvalidValue;
    return launch_ex(row_last_f32, dim3((D + 1023) / 1024), dim3(256), 0, 0, l, x, t_real, T, D);
}

/* ---- buffers --------------------------------------------------------------------------- */

static int imax(int a, int b) { return a > b ? a : b; }
static int q_rows(const PrefillDims *d) { return d->Hq * d->hd * (d->attn_gate ? 2 : 1); }
static int conv_dim(const PrefillDims *d) { return 2 * d->Hk * d->dk + d->Hv * d->dv; }

extern "C" void cuda_prefill_buffer_sizes(const PrefillDims *d, int T, size_t *h, size_t *proj, size_t *q, size_t *act,
                                          size_t *scratch_bytes) {
    const int n_attn = q_rows(d) + 2 * d->Hkv * d->hd;
    const int n_dn = d->Hk > 0 ? conv_dim(d) + d->Hv * d->dv + 2 * d->Hv : 0;
    *h = (size_t)T * d->D;
    *proj = (size_t)T * imax(n_attn, n_dn);
    *q = (size_t)T * d->Hq * d->hd;
    *act = (size_t)T * imax(d->F, imax(d->Hq * d->hd, d->Hv * d->dv));
    *scratch_bytes = d->Hk > 0 ? cuda_deltanet_prefill_scratch(NULL, NULL, T, d->Hk, d->Hv, d->dk, d->dv) : 0;
}
