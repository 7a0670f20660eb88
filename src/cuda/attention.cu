/* attention.cu — full-attention decode (MODEL.md §3.2, §5): q/k head norm + partial NeoX RoPE, K/V
 * append at pos, flash-decoding GQA attention over the bf16 cache (split over the sequence), and a
 * combine kernel that merges the splits and applies Qwen3.5's sigmoid output gate. Contract: ops.h
 * (AttnDecodeParams).
 *
 * attn_decode_splitkv<HD, G>: block (s, h), NW warps. Every block re-derives the G normed+roped query
 * heads of kv head h (G*HD values: cheaper than a kernel boundary). Lane l owns dims [l*E, (l+1)*E),
 * E = HD/32; a warp takes U consecutive positions at a time (U K rows + U V rows in flight), scores
 * s = q.K * log2(e)/sqrt(HD) (base-2 online softmax), per-warp (m, l, O) merged through shared memory
 * into the block's partial. attn_combine: out = sum_s 2^(m_s-M) O_s / sum_s 2^(m_s-M) l_s. */
#include "cuda/common.cuh"

enum { ATT_MIN_CHUNK = 32, ATT_MAX_SPLIT = 512, ATT_COMBINE_THREADS = 64 };

__host__ __device__ static inline int att_cdiv(int a, int b) { return (a + b - 1) / b; }

__host__ __device__ static inline int attn_splits(int Hkv, int max_seq) {
    int n = (264 + Hkv - 1) / Hkv; /* ~2 blocks per SM on a 132-SM H200 */
    const int cap = (max_seq + ATT_MIN_CHUNK - 1) / ATT_MIN_CHUNK;
    n = n < cap ? n : cap;
    n = n < ATT_MAX_SPLIT ? n : ATT_MAX_SPLIT;
    return n > 1 ? n : 1;
}
/* Positions per block for kv_len cached positions: a multiple of 32 (one U-batch per warp at least). */
__device__ __forceinline__ int attn_chunk(int kv_len, int n_split) {
    const int c = (att_cdiv(kv_len, n_split) + ATT_MIN_CHUNK - 1) / ATT_MIN_CHUNK * ATT_MIN_CHUNK;
    return c > ATT_MIN_CHUNK ? c : ATT_MIN_CHUNK;
}

/* Warps per block: 8, or 4 when the per-warp partials (NW*G*HD floats) would pass 32 KiB. */
template <int HD, int G>
struct AttnCfg {
    static constexpr int E = HD / 32;                      /* dims per lane */
    static constexpr int NW = G * HD <= 1024 ? 8 : 4;
    static constexpr int NT = NW * 32;
    static constexpr int U = G * E <= 8 ? 8 : G * E <= 32 ? 4 : 2; /* positions per warp per batch */
};

/* E bf16 values at p (E*2-byte aligned) as E/2 packed words. */
template <int E>
__device__ __forceinline__ void ld_bf16_row(const uint16_t *p, uint32_t *w) {
    if (E == 8) {
        const uint4 t = *reinterpret_cast<const uint4 *>(p);
        w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
    } else if (E == 4) {
        const uint2 t = *reinterpret_cast<const uint2 *>(p);
        w[0] = t.x, w[1] = t.y;
    }
}
__device__ __forceinline__ float wbf(const uint32_t *w, int i) { return i & 1 ? bf_hi(w[i >> 1]) : bf_lo(w[i >> 1]); }
static __device__ __forceinline__ uint16_t bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* One warp: dst[HD] = rope(norm(x[HD])) with the block's cos/sin tables (bf16-valued) cs, sn [R/2]. */
template <int HD>
__device__ __forceinline__ void head_norm_rope(const float *x, const float *w, float *dst, const float *cs,
                                               const float *sn, const AttnDecodeParams &p, int lane) {
    constexpr int E = HD / 32;
    float v[E], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < E; i += 4) {
        const float4 t = *reinterpret_cast<const float4 *>(x + lane * E + i);
        v[i] = t.x, v[i + 1] = t.y, v[i + 2] = t.z, v[i + 3] = t.w;
    }
#pragma unroll
    for (int i = 0; i < E; i++) ss = fmaf(v[i], v[i], ss);
    const float r = rsqrtf(warp_sum(ss) / (float)HD + p.eps);
#pragma unroll
    for (int i = 0; i < E; i++) {
        const float wi = w[lane * E + i];
        dst[lane * E + i] = p.norm_mode == NORM_ZC ? rbf(v[i] * r * (1.0f + wi)) : rbf(wi * rbf(v[i] * r));
    }
    __syncwarp();
    const int half = p.R / 2;
    for (int i = lane; i < half; i += 32) {
        const float a = dst[i], b = dst[i + half];
        dst[i] = rbf(rbf(a * cs[i]) - rbf(b * sn[i]));
        dst[i + half] = rbf(rbf(b * cs[i]) + rbf(a * sn[i]));
    }
    __syncwarp();
}

template <int HD, int G>
__global__ void __launch_bounds__(AttnCfg<HD, G>::NT) attn_decode_splitkv(const __grid_constant__ AttnDecodeParams p) {
    using C = AttnCfg<HD, G>;
    constexpr int E = C::E, NW = C::NW, NT = C::NT, U = C::U;
    __shared__ __align__(16) float qs[G + 1][HD]; /* G query heads, then the new k */
    __shared__ float cs[HD / 2], sn[HD / 2];
    __shared__ float wm[NW][G], wl[NW][G];
    __shared__ float wo[NW][G][HD];

    const int s = blockIdx.x, h = blockIdx.y, n_split = gridDim.x;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int pos = p.step->pos;
    if (pos < 0 || pos >= p.max_seq) {
        pdl_wait();
        return;
    }
    const int kv_len = pos + 1, chunk = attn_chunk(kv_len, n_split), t0 = s * chunk;
    if (t0 >= kv_len) {
        pdl_wait();
        return;
    }
    const int t1 = min(kv_len, t0 + chunk);
    uint16_t *Kh = p.k_cache + (size_t)h * p.max_seq * HD, *Vh = p.v_cache + (size_t)h * p.max_seq * HD;

    /* Before the wait: pull the cached rows of earlier tokens [t0, min(t1, pos)) towards L2, and the
     * RoPE table (constant data only). */
    {
        const int n_lines = (min(t1, pos) - t0) * (HD * 2 / 128);
        for (int i = tid; i < n_lines; i += NT) {
            prefetch_l2(Kh + (size_t)t0 * HD + i * 64);
            prefetch_l2(Vh + (size_t)t0 * HD + i * 64);
        }
        for (int i = tid; i < p.R / 2; i += NT) {
            float c, sv;
            sincosf((float)pos * p.inv_freq[i], &sv, &c);
            cs[i] = rbf(c), sn[i] = rbf(sv);
        }
    }
    pdl_wait();
    pdl_trigger();
    __syncthreads();

    /* Query heads h*G .. h*G+G-1 (and k/v when this block holds pos). */
    const int q_stride = p.gated ? 2 * HD : HD, q_rows = p.Hq * q_stride;
    const bool owns_pos = t1 == kv_len;
    for (int item = w; item < G + (owns_pos ? 1 : 0); item += NW) {
        if (item < G) {
            head_norm_rope<HD>(p.qkv + (size_t)(h * G + item) * q_stride, p.q_norm_w, qs[item], cs, sn, p, lane);
            if (p.q_out && s == 0)
                for (int d = lane; d < HD; d += 32) p.q_out[(size_t)(h * G + item) * HD + d] = qs[item][d];
        } else {
            head_norm_rope<HD>(p.qkv + q_rows + (size_t)h * HD, p.k_norm_w, qs[G], cs, sn, p, lane);
            const float *v = p.qkv + q_rows + (size_t)(p.Hkv + h) * HD;
            for (int d = lane; d < HD; d += 32) {
                Kh[(size_t)pos * HD + d] = bf16_bits(qs[G][d]);
                Vh[(size_t)pos * HD + d] = bf16_bits(v[d]);
            }
        }
    }
    __syncthreads(); /* qs ready; K/V[pos] visible to this block */

    const float qscale = 1.4426950408889634f / sqrtf((float)HD);
    float q[G][E], o[G][E], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < E; i++) q[g][i] = qs[g][lane * E + i] * qscale, o[g][i] = 0.0f;
    }

    for (int tb = t0 + w * U; tb < t1; tb += NW * U) {
        uint32_t kr[U][E / 2], vr[U][E / 2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (tb + u < t1) {
                ld_bf16_row<E>(Kh + (size_t)(tb + u) * HD + lane * E, kr[u]);
                ld_bf16_row<E>(Vh + (size_t)(tb + u) * HD + lane * E, vr[u]);
            } else {
#pragma unroll
                for (int i = 0; i < E / 2; i++) kr[u][i] = vr[u][i] = 0u;
            }
        }
        float sc[U][G];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int g = 0; g < G; g++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < E; i++) d = fmaf(q[g][i], wbf(kr[u], i), d);
                d = warp_sum(d);
                sc[u][g] = tb + u < t1 ? d : -INFINITY;
            }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; u++) mx = fmaxf(mx, sc[u][g]);
            const float alpha = exp2f(m[g] - mx);
            l[g] *= alpha;
#pragma unroll
            for (int i = 0; i < E; i++) o[g][i] *= alpha;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float pu = exp2f(sc[u][g] - mx);
                l[g] += pu;
#pragma unroll
                for (int i = 0; i < E; i++) o[g][i] = fmaf(pu, wbf(vr[u], i), o[g][i]);
            }
            m[g] = mx;
        }
    }

    /* Merge the warps (a warp without positions has m = -inf, l = 0, O = 0). */
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) wm[w][g] = m[g], wl[w][g] = l[g];
#pragma unroll
        for (int i = 0; i < E; i++) wo[w][g][lane * E + i] = o[g][i];
    }
    __syncthreads();
    float *part_o = p.work, *part_ml = p.work + (size_t)p.Hq * n_split * HD;
    for (int idx = tid; idx < G * HD; idx += NT) {
        const int g = idx / HD, d = idx % HD;
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < NW; k++) M = fmaxf(M, wm[k][g]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int k = 0; k < NW; k++) {
            const float f = exp2f(wm[k][g] - M);
            L = fmaf(wl[k][g], f, L);
            O = fmaf(wo[k][g][d], f, O);
        }
        const size_t row = (size_t)(h * G + g) * n_split + s;
        part_o[row * HD + d] = O;
        if (d == 0) part_ml[2 * row] = M, part_ml[2 * row + 1] = L;
    }
}

/* grid (HD/64, Hq), 64 threads: thread = one output dim of query head blockIdx.y. */
template <int HD>
__global__ void __launch_bounds__(ATT_COMBINE_THREADS) attn_combine(const __grid_constant__ AttnDecodeParams p) {
    __shared__ float wts[ATT_MAX_SPLIT], red[32];
    const int pos = p.step->pos;
    pdl_wait();
    pdl_trigger();
    if (pos < 0 || pos >= p.max_seq) return;
    const int n_split = attn_splits(p.Hkv, p.max_seq);
    const int kv_len = pos + 1, n_act = att_cdiv(kv_len, attn_chunk(kv_len, n_split));
    const int hq = blockIdx.y, d = blockIdx.x * ATT_COMBINE_THREADS + threadIdx.x;
    const float *ml = p.work + (size_t)p.Hq * n_split * HD + (size_t)hq * n_split * 2;
    const float *po = p.work + (size_t)hq * n_split * HD + d;

    float mx = -INFINITY;
    for (int s = threadIdx.x; s < n_act; s += ATT_COMBINE_THREADS) mx = fmaxf(mx, __ldcg(ml + 2 * s));
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = red[0];
    for (int k = 1; k < ATT_COMBINE_THREADS / 32; k++) mx = fmaxf(mx, red[k]);
    float L = 0.0f;
    for (int s = threadIdx.x; s < n_act; s += ATT_COMBINE_THREADS) {
        const float f = exp2f(__ldcg(ml + 2 * s) - mx);
        wts[s] = f;
        L = fmaf(__ldcg(ml + 2 * s + 1), f, L);
    }
    L = block_sum(L, red); /* its barriers also publish wts */
    float acc = 0.0f;
    for (int s = 0; s < n_act; s++) acc = fmaf(wts[s], __ldcg(po + (size_t)s * HD), acc);
    float o = rbf(acc / L);
    if (p.gated) {
        const float gate = p.qkv[(size_t)hq * 2 * HD + HD + d];
        o = rbf(o * rbf(1.0f / (1.0f + expf(-gate))));
    }
    p.out[(size_t)hq * HD + d] = o;
}

template <int HD, int G>
static int attn_launch(const AttnDecodeParams *p, const CudaLaunch *l) {
    const int n_split = attn_splits(p->Hkv, p->max_seq);
    int e = launch_kernel(attn_decode_splitkv<HD, G>, dim3((unsigned)n_split, (unsigned)p->Hkv), dim3(AttnCfg<HD, G>::NT),
                          0, l, *p);
    if (e) return e;
    return launch_kernel(attn_combine<HD>, dim3(HD / ATT_COMBINE_THREADS, (unsigned)p->Hq), dim3(ATT_COMBINE_THREADS), 0,
                         l, *p);
}

template <int HD>
static int attn_launch_g(const AttnDecodeParams *p, const CudaLaunch *l) {
    switch (p->Hq / p->Hkv) {
    case 1: return attn_launch<HD, 1>(p, l);
    case 2: return attn_launch<HD, 2>(p, l);
    case 4: return attn_launch<HD, 4>(p, l);
    case 8: return attn_launch<HD, 8>(p, l);
    default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int cuda_attn_decode_splits(int Hkv, int max_seq) { return attn_splits(Hkv, max_seq); }

extern "C" size_t cuda_attn_decode_work_bytes(int Hq, int Hkv, int hd, int max_seq) {
    return sizeof(float) * (size_t)Hq * (size_t)attn_splits(Hkv, max_seq) * (size_t)(hd + 2);
}

extern "C" int cuda_attn_decode(const AttnDecodeParams *p, const CudaLaunch *l) {
    if (!p || !l || !p->qkv || !p->q_norm_w || !p->k_norm_w || !p->inv_freq || !p->k_cache || !p->v_cache ||
        !p->out || !p->work || !p->step || p->Hkv < 1 || p->Hq < p->Hkv || p->Hq % p->Hkv || p->Hkv > 65535 ||
        p->Hq > 65535 || p->max_seq < 1 || p->R < 2 || p->R % 2 || p->R > p->hd ||
        (p->norm_mode != NORM_ZC && p->norm_mode != NORM_PLAIN))
        return (int)cudaErrorInvalidValue;
    switch (p->hd) {
    case 128: return attn_launch_g<128>(p, l);
    case 256: return attn_launch_g<256>(p, l);
    default: return (int)cudaErrorInvalidValue;
    }
}
