/* attn_layer.cu — a full-attention layer's mixer as ONE kernel (EXPERIMENTAL, QWEN35_ATTN_FUSED=1; contract in
 * ops.h AttnLayerParams): qkv GEMV -> q/k head norm + partial RoPE + K/V append -> flash-decoding attention ->
 * merge + sigmoid gate -> o_proj, for one token. Built like dn_layer.cu (docs/PERF_NOTES.md §16-17): the engine's
 * attention layer is qkv GEMV, attention, o_proj (+ the MLP) as dependent launches, each costing ~2.5 us beyond
 * its bytes; here the kv group's blocks exchange what they need through global memory instead.
 *
 * Grid 128 blocks x 512 threads, one per SM, BG = 128 / Hkv blocks per kv group g (G = Hq / Hkv query heads):
 *   before the PDL wait: block b of group g loads its RB = ceil(NR / BG) of the group's NR = G 2 hd + 2 hd qkv
 *   rows (q|gate rows of heads gG .. gG+G-1, then k_g, v_g) into registers (4 rows per warp, the GEMV's U = 4
 *   layout), and cp.asyncs its o_proj slice W_out[rows r0 .. r0 + ORows) x [head h's hd columns] (h = gG + b /
 *   HPB, HPB = BG / G blocks per head, r0 = (b % HPB) ORows, ORows = D / HPB) and the RoPE table;
 *   after it: the input row normed (bitwise the 512-thread GEMV's), the row sums -> xbuf (exchange 1: the
 *   group's NR values to all its blocks, per-group arrival counter as dn_layer.cu), then every block norms and
 *   ropes the G query heads and k (attention.cu's formulas: K[pos] bitwise), takes positions [b c, (b+1) c) of
 *   the cache (c = max(32, round_up(ceil(kv_len / BG), 32)); the block holding pos appends K/V[pos] and uses
 *   them), per-warp online softmax in base 2 as attention.cu, the warps merged into one partial (m, l, O) per
 *   head -> xbuf (exchange 2), then block b merges head h's S = ceil(kv_len / c) partials, applies the gate and
 *   adds W_out[r0 + r][head h] . out_h to y (one fp32 atomic per row).
 * hd 256, gated (Qwen3.5), D <= 1024; every block resident at once (checked; a 2 s spin traps instead of
 * hanging). Not deterministic (the atomics).
 *
 * H200, 0.8B (docs/PERF_NOTES.md §17): the gated attention output bitwise cuda_attn_decode's, but the step is
 * slower with it: 0.7596 / 0.7822 / 0.8588 vs 0.7507 / 0.7712 / 0.8376 ms/token at ctx 128 / 2048 / 16384. */
#include "cuda/common.cuh"

enum {
    AL_BLOCKS = 128,
    AL_WARPS = 16,
    AL_THREADS = 32 * AL_WARPS,
    AL_HD = 256,
    AL_E = AL_HD / 32, /* dims per lane */
    AL_U = 4,          /* positions per warp per batch */
    AL_MAX_G = 4
};

struct AlShape {
    int BG, G, HPB, NR, RB, ORows;
};
static __host__ __device__ inline AlShape al_shape(int D, int Hq, int Hkv) {
    AlShape s;
    s.BG = AL_BLOCKS / Hkv;
    s.G = Hq / Hkv;
    s.HPB = s.BG / s.G;
    s.NR = s.G * 2 * AL_HD + 2 * AL_HD;
    s.RB = (s.NR + s.BG - 1) / s.BG;
    s.RB = (s.RB + 3) & ~3;
    s.ORows = D / s.HPB;
    return s;
}
/* exchange buffer per group: the NR row values, then BG x G partials (O [hd], then m, l) */
static __host__ __device__ inline size_t al_xgroup(const AlShape &s) {
    return (size_t)s.NR + (size_t)s.BG * s.G * (AL_HD + 2);
}
/* shared memory: xs [D] | wo [ORows][hd] bf16 | qkv [NR] | qn [G + 1][hd] | wo_part [16][G][hd] | wm, wl [16][G] */
static __host__ __device__ inline size_t al_smem_bytes(int D, int Hq, int Hkv) {
    const AlShape s = al_shape(D, Hq, Hkv);
    return (size_t)D * 4 + (size_t)s.ORows * AL_HD * 2 + (size_t)s.NR * 4 + (size_t)(s.G + 1) * AL_HD * 4 +
           (size_t)AL_WARPS * s.G * AL_HD * 4 + (size_t)2 * AL_WARPS * s.G * 4;
}

static __device__ __forceinline__ void al_cp_async16(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}

/* Arrival of this block at counter cnt (BG arrivals per round; it only grows) after the barrier, then the wait
 * for the round's BG arrivals (a release add, an acquire spin; a wait over 2 s traps). */
static __device__ __forceinline__ void al_exchange(unsigned *cnt, int BG) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned old, v;
        asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(cnt) : "memory");
        const unsigned target = old - old % (unsigned)BG + (unsigned)BG;
        unsigned long long t0 = 0, t;
        for (int it = 0;; it++) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(cnt) : "memory");
            if ((int)(v - target) >= 0) break;
            if ((it & 1023) == 0) {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                if (!t0) t0 = t;
                if (t - t0 > 2000000000ull) __trap();
            }
        }
    }
    __syncthreads();
}

/* One warp: dst[hd] = rope(norm(x[hd])) (attention.cu head_norm_rope<256>, same order). */
static __device__ __forceinline__ void al_norm_rope(const float *x, const float *w, float *dst, const float *cs,
                                                    const float *sn, int R, int norm_mode, float eps, int lane) {
    float v[AL_E], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < AL_E; i += 4) {
        const float4 t = *reinterpret_cast<const float4 *>(x + lane * AL_E + i);
        v[i] = t.x, v[i + 1] = t.y, v[i + 2] = t.z, v[i + 3] = t.w;
    }
#pragma unroll
    for (int i = 0; i < AL_E; i++) ss = fmaf(v[i], v[i], ss);
    const float r = rsqrtf(warp_sum(ss) / (float)AL_HD + eps);
#pragma unroll
    for (int i = 0; i < AL_E; i++) {
        const float wi = w[lane * AL_E + i];
        dst[lane * AL_E + i] = norm_mode == NORM_ZC ? rbf(v[i] * r * (1.0f + wi)) : rbf(wi * rbf(v[i] * r));
    }
    __syncwarp();
    const int half = R / 2;
    for (int i = lane; i < half; i += 32) {
        const float a = dst[i], b = dst[i + half];
        dst[i] = rbf(rbf(a * cs[i]) - rbf(b * sn[i]));
        dst[i + half] = rbf(rbf(b * cs[i]) + rbf(a * sn[i]));
    }
    __syncwarp();
}

static __device__ __forceinline__ uint16_t al_bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

template <int G>
__global__ void __launch_bounds__(AL_THREADS, 1) attn_layer_bf16(const __grid_constant__ AttnLayerParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[32], cs[AL_HD / 2], sn[AL_HD / 2], mlS[2 * AL_BLOCKS];
    const int D = p.D, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const AlShape sh = al_shape(D, p.Hq, p.Hkv);
    const int b = (int)blockIdx.x % sh.BG, g = (int)blockIdx.x / sh.BG;
    const int hl = b / sh.HPB, h = g * G + hl, r0 = (b % sh.HPB) * sh.ORows;
    const int HD = AL_HD, q_rows = p.Hq * 2 * HD;
    float *xs = reinterpret_cast<float *>(smem);
    uint16_t *wo = reinterpret_cast<uint16_t *>(smem + (size_t)D * 4);
    float *qkv = reinterpret_cast<float *>(smem + (size_t)D * 4 + (size_t)sh.ORows * HD * 2);
    float *qn = qkv + sh.NR;                        /* [G + 1][hd]: G query heads, then k */
    float *wpo = qn + (size_t)(G + 1) * HD;         /* [16][G][hd] */
    float *wm = wpo + (size_t)AL_WARPS * G * HD, *wl = wm + AL_WARPS * G;
    float *xg = p.xbuf + (size_t)g * al_xgroup(sh); /* the group's exchange buffer */
    float *xpart = xg + sh.NR;                      /* [BG][G][hd + 2] */
    Q35_TRACE_T0;
    const int pos = p.step->pos; /* before the weights: a load that blocks */
    pdl_trigger();

    /* 1. Before the wait: the block's qkv rows, its o_proj slice, the RoPE table. */
    auto grow = [&](int r) -> long long { /* the group's row r -> w_in row */
        return r < G * 2 * HD     ? (long long)g * G * 2 * HD + r
               : r < G * 2 * HD + HD ? (long long)q_rows + (long long)g * HD + (r - G * 2 * HD)
                                     : (long long)q_rows + (long long)(p.Hkv + g) * HD + (r - G * 2 * HD - HD);
    };
    const int lr0 = b * sh.RB + 4 * warp; /* the warp's 4 rows of the group */
    const bool has_rows = 4 * warp < sh.RB && lr0 < sh.NR;
    uint4 w[4][4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int k = u * 256 + lane * 8;
#pragma unroll
        for (int r = 0; r < 4; r++)
            w[u][r] = has_rows && lr0 + r < sh.NR && k < D
                          ? ld_stream(reinterpret_cast<const uint4 *>(p.w_in + grow(lr0 + r) * D + k))
                          : make_uint4(0u, 0u, 0u, 0u);
    }
    for (int c = tid; c < sh.ORows * (HD / 8); c += AL_THREADS) {
        const int r = c / (HD / 8), q = c % (HD / 8);
        al_cp_async16(wo + r * HD + q * 8, p.w_out + (size_t)(r0 + r) * p.Hq * HD + (size_t)h * HD + q * 8);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    const bool pos_ok = pos >= 0 && pos < p.max_seq;
    for (int i = tid; i < p.R / 2; i += AL_THREADS) {
        float c, s;
        sincosf((float)pos * p.inv_freq[i], &s, &c);
        cs[i] = rbf(c), sn[i] = rbf(s);
    }

    pdl_wait();
    Q35_TRACE_T1_AT(0);

    /* 2. The input row (bitwise the 512-thread GEMV's), the zeroing, the row sums -> exchange 1. */
    stage_norm_row(xs, red, D, p.embed ? p.embed + (size_t)p.step->token * D : NULL, p.x, p.parts, p.n_parts,
                   blockIdx.x == 0 ? p.x_out : NULL, p.ln1, p.norm_mode, p.eps);
    if (p.n_zero > 0 && (p.zero0 || p.zero1))
        for (int i = (int)blockIdx.x * AL_THREADS + tid; i < p.n_zero; i += (int)gridDim.x * AL_THREADS) {
            if (p.zero0) p.zero0[i] = 0.0f;
            if (p.zero1) p.zero1[i] = 0.0f;
        }
    __syncthreads();
    Q35_TRACE_PROBE(1);
    if (has_rows) {
        const float sum = gemv_rows4(w, xs, D, lane); /* lanes 8r .. 8r+7: row r */
        const int r = lr0 + (lane >> 3);
        if ((lane & 7) == 0 && r < sh.NR) {
            const float v = rbf(sum);
            __stcg(xg + r, v);
            if (p.proj) p.proj[grow(r)] = v;
        }
    }
    al_exchange(p.xcnt + (size_t)g * 32, sh.BG);
    for (int i = tid; i < sh.NR; i += AL_THREADS) qkv[i] = __ldcg(xg + i);
    __syncthreads();
    Q35_TRACE_PROBE(2);

    /* 3. Norm + RoPE of the G query heads and k; the split of positions; K/V[pos] by its holder. */
    const int kv_len = pos + 1;
    int c = (kv_len + sh.BG - 1) / sh.BG;
    c = (c + 31) / 32 * 32;
    c = c > 32 ? c : 32;
    const int S = (kv_len + c - 1) / c, t0 = b * c, t1 = min(kv_len, t0 + c);
    uint16_t *Kh = p.k_cache + (size_t)g * p.max_seq * HD, *Vh = p.v_cache + (size_t)g * p.max_seq * HD;
    if (pos_ok) {
        for (int item = warp; item <= G; item += AL_WARPS)
            al_norm_rope(item < G ? qkv + item * 2 * HD : qkv + G * 2 * HD, item < G ? p.q_norm_w : p.k_norm_w,
                         qn + item * HD, cs, sn, p.R, p.norm_mode, p.eps, lane);
        __syncthreads();
        if (t0 < t1 && t1 == kv_len) /* this block holds pos: K/V[pos] */
            for (int d = tid; d < HD; d += AL_THREADS) {
                Kh[(size_t)pos * HD + d] = al_bf16_bits(qn[G * HD + d]);
                Vh[(size_t)pos * HD + d] = al_bf16_bits(qkv[G * 2 * HD + HD + d]);
            }
        __syncthreads(); /* K/V[pos] visible to this block */
    }
    Q35_TRACE_PROBE(3);

    /* 4. Attention over [t0, t1) (attention.cu's loop: scores in base 2, per-warp online softmax). */
    const float qscale = 1.4426950408889634f / sqrtf((float)HD);
    float q[G][AL_E], o[G][AL_E], m[G], l[G];
#pragma unroll
    for (int k = 0; k < G; k++) {
        m[k] = -INFINITY, l[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < AL_E; i++) q[k][i] = qn[k * HD + lane * AL_E + i] * qscale, o[k][i] = 0.0f;
    }
    if (pos_ok)
        for (int tb = t0 + warp * AL_U; tb < t1; tb += AL_WARPS * AL_U) {
            uint4 kr[AL_U], vr[AL_U];
#pragma unroll
            for (int u = 0; u < AL_U; u++) {
                if (tb + u < t1) {
                    kr[u] = *reinterpret_cast<const uint4 *>(Kh + (size_t)(tb + u) * HD + lane * AL_E);
                    vr[u] = *reinterpret_cast<const uint4 *>(Vh + (size_t)(tb + u) * HD + lane * AL_E);
                } else {
                    kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);
                }
            }
            float sc[AL_U][G];
#pragma unroll
            for (int u = 0; u < AL_U; u++) {
                const uint32_t kw[4] = {kr[u].x, kr[u].y, kr[u].z, kr[u].w};
#pragma unroll
                for (int k = 0; k < G; k++) {
                    float d = 0.0f;
#pragma unroll
                    for (int i = 0; i < AL_E; i++) d = fmaf(q[k][i], i & 1 ? bf_hi(kw[i >> 1]) : bf_lo(kw[i >> 1]), d);
                    d = warp_sum(d);
                    sc[u][k] = tb + u < t1 ? d : -INFINITY;
                }
            }
#pragma unroll
            for (int k = 0; k < G; k++) {
                float mx = m[k];
#pragma unroll
                for (int u = 0; u < AL_U; u++) mx = fmaxf(mx, sc[u][k]);
                const float alpha = exp2f(m[k] - mx);
                l[k] *= alpha;
#pragma unroll
                for (int i = 0; i < AL_E; i++) o[k][i] *= alpha;
#pragma unroll
                for (int u = 0; u < AL_U; u++) {
                    const float pu = exp2f(sc[u][k] - mx);
                    const uint32_t vw[4] = {vr[u].x, vr[u].y, vr[u].z, vr[u].w};
                    l[k] += pu;
#pragma unroll
                    for (int i = 0; i < AL_E; i++)
                        o[k][i] = fmaf(pu, i & 1 ? bf_hi(vw[i >> 1]) : bf_lo(vw[i >> 1]), o[k][i]);
                }
                m[k] = mx;
            }
        }
    /* warps -> the block's partial per head (a warp without positions: m = -inf, l = 0, O = 0) -> exchange 2 */
#pragma unroll
    for (int k = 0; k < G; k++) {
        if (lane == 0) wm[warp * G + k] = m[k], wl[warp * G + k] = l[k];
#pragma unroll
        for (int i = 0; i < AL_E; i++) wpo[((size_t)warp * G + k) * HD + lane * AL_E + i] = o[k][i];
    }
    __syncthreads();
    Q35_TRACE_PROBE(4);
    if (b < S)
        for (int idx = tid; idx < G * HD; idx += AL_THREADS) {
            const int k = idx / HD, d = idx % HD;
            float M = -INFINITY;
            for (int ww = 0; ww < AL_WARPS; ww++) M = fmaxf(M, wm[ww * G + k]);
            const float Ms = M == -INFINITY ? 0.0f : M;
            float L = 0.0f, O = 0.0f;
            for (int ww = 0; ww < AL_WARPS; ww++) {
                const float f = exp2f(wm[ww * G + k] - Ms);
                L = fmaf(wl[ww * G + k], f, L);
                O = fmaf(wpo[((size_t)ww * G + k) * HD + d], f, O);
            }
            float *pp = xpart + ((size_t)b * G + k) * (HD + 2);
            __stcg(pp + d, O);
            if (d == 0) __stcg(pp + HD, M), __stcg(pp + HD + 1, L);
        }
    al_exchange(p.xcnt + (size_t)(p.Hkv + g) * 32, sh.BG);
    Q35_TRACE_PROBE(5);

    /* 5. Head h: merge the S partials (split order), the gate, then y[r0 + r] += W_out[r0 + r][head h] . out. */
    float *outs = xs; /* the input row is no longer needed */
    for (int s = tid; s < S; s += AL_THREADS) {
        const float *pp = xpart + ((size_t)s * G + hl) * (HD + 2);
        mlS[2 * s] = __ldcg(pp + HD), mlS[2 * s + 1] = __ldcg(pp + HD + 1);
    }
    __syncthreads();
    if (tid < HD) {
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int s = 0; s < S; s++) M = fmaxf(M, mlS[2 * s]);
        for (int s = 0; s < S; s++) {
            const float f = exp2f(mlS[2 * s] - M);
            L = fmaf(mlS[2 * s + 1], f, L);
            O = fmaf(__ldcg(xpart + ((size_t)s * G + hl) * (HD + 2) + tid), f, O);
        }
        float v = rbf(O / L);
        v = rbf(v * rbf(1.0f / (1.0f + expf(-qkv[hl * 2 * HD + HD + tid]))));
        outs[tid] = pos_ok ? v : 0.0f;
        if (p.out && b % sh.HPB == 0) p.out[(size_t)h * HD + tid] = outs[tid];
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    Q35_TRACE_PROBE(6);
    if (pos_ok)
        for (int gr = warp; gr < sh.ORows / 4; gr += AL_WARPS) {
            float acc[4];
            const float4 a4 = *reinterpret_cast<const float4 *>(outs + lane * 8);
            const float4 b4 = *reinterpret_cast<const float4 *>(outs + lane * 8 + 4);
            const float xv[8] = {a4.x, a4.y, a4.z, a4.w, b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[r] = dot8(*reinterpret_cast<const uint4 *>(wo + (size_t)(4 * gr + r) * HD + lane * 8), xv, 0.0f);
            const float sum = warp_sum_rows4(acc, lane);
            if ((lane & 7) == 0) atomicAdd(p.y + r0 + 4 * gr + (lane >> 3), sum);
        }
    Q35_TRACE_END(60);
}

static int al_shape_ok(int D, int Hq, int Hkv, int hd, int R, int gated) {
    if (hd != AL_HD || !gated || Hkv < 1 || AL_BLOCKS % Hkv || Hq < Hkv || Hq % Hkv || Hq / Hkv > AL_BLOCKS / Hkv ||
        D < 32 || D > 1024 || D % 32 || R < 2 || R > hd || R % 2)
        return 0; /* (and al_shape below divides by nothing that is zero) */
    const AlShape s = al_shape(D, Hq, Hkv);
    return s.G >= 1 && s.G <= AL_MAX_G && s.BG % s.G == 0 && D % s.HPB == 0 && s.ORows % 4 == 0 && s.RB <= 64 &&
           s.BG <= AL_BLOCKS;
}

static void (*al_kernel(int G))(AttnLayerParams) {
    switch (G) {
    case 1: return attn_layer_bf16<1>;
    case 2: return attn_layer_bf16<2>;
    case 4: return attn_layer_bf16<4>;
    default: return NULL;
    }
}

/* every block resident at once (the exchanges spin), remembered for the last (device, shape) */
static int al_fit(int D, int Hq, int Hkv) {
    static int key[4], val, have;
    int dev = 0, optin = 0, n_sm = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    const int k[4] = {dev, D, Hq, Hkv};
    if (have && !memcmp(key, k, sizeof k)) return val;
    void (*kern)(AttnLayerParams) = al_kernel(Hq / Hkv);
    const size_t smem = al_smem_bytes(D, Hq, Hkv);
    int ok = kern != NULL;
    if (ok && (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
               cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
               smem + 8192 > (size_t)optin ||
               cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
               cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, AL_THREADS, smem) != cudaSuccess))
        ok = 0;
    (void)cudaGetLastError();
    val = ok && (long long)n * n_sm >= AL_BLOCKS;
    memcpy(key, k, sizeof k);
    have = 1;
    return val;
}

extern "C" int cuda_attn_layer_supported(int D, int Hq, int Hkv, int hd, int R, int gated) {
    return al_shape_ok(D, Hq, Hkv, hd, R, gated) && al_fit(D, Hq, Hkv);
}
extern "C" size_t cuda_attn_layer_xbuf_floats(int D, int Hq, int Hkv) {
    if (Hkv < 1 || AL_BLOCKS % Hkv || Hq < Hkv || Hq / Hkv > AL_BLOCKS / Hkv) return 0; /* not supported */
    return (size_t)Hkv * al_xgroup(al_shape(D, Hq, Hkv));
}
extern "C" size_t cuda_attn_layer_xcnt_count(int Hkv) { return (size_t)2 * Hkv * 32; }

extern "C" int cuda_attn_layer(const AttnLayerParams *p, const CudaLaunch *l) {
    if (!p || !l || !p->w_in || !p->ln1 || !p->q_norm_w || !p->k_norm_w || !p->inv_freq || !p->k_cache ||
        !p->v_cache || !p->w_out || !p->y || !p->step || (!p->embed && !p->x) || !p->xbuf || !p->xcnt ||
        p->max_seq < 1 || !al_shape_ok(p->D, p->Hq, p->Hkv, p->hd, p->R, 1) ||
        ((p->zero0 || p->zero1) && p->n_zero < 0))
        return (int)cudaErrorInvalidValue;
    if (!al_fit(p->D, p->Hq, p->Hkv)) return (int)cudaErrorInvalidConfiguration;
    return launch_kernel(al_kernel(p->Hq / p->Hkv), dim3(AL_BLOCKS), dim3(AL_THREADS),
                         al_smem_bytes(p->D, p->Hq, p->Hkv), l, *p);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_attn_layer)
