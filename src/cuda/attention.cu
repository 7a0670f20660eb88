/* attention.cu — full-attention decode (MODEL.md §3.2, §5) in ONE kernel: q/k head norm + partial NeoX
 * RoPE, K/V append at pos, flash-decoding GQA attention over the bf16 cache (split over the sequence),
 * the merge of the splits and Qwen3.5's sigmoid output gate. Contract: ops.h (AttnDecodeParams).
 *
 * attn_decode_f32_cluster<HD, GB>: grid (n_split, Hkv * n_qg), 8 warps, clusters of CS blocks along
 * the sequence. Block (s, y) serves the GB query heads hq0 .. hq0+GB-1 of kv head h (G = GB n_qg;
 * GB = 8, 4, 2 or 1 with GB*HD <= 1024, so any G works: uncommon groups use several blocks per kv head)
 * over positions [s*chunk, min(kv_len, (s+1)*chunk)) (possibly empty). Every block re-derives its GB
 * normed+roped query heads (cheaper than a kernel boundary). Lane l owns dims [l*E, (l+1)*E), E = HD/32;
 * a warp takes U consecutive positions at a time (U K rows + U V rows in flight), scores in base 2
 * (q pre-scaled by log2(e)/sqrt(HD)), per-warp online softmax (m, l, O).
 * Merge, all in fixed order (deterministic):
 *   1. warps -> block partial (shared memory);
 *   2. blocks -> cluster partial through DSMEM: block r of a cluster owns dims [r*SL, (r+1)*SL),
 *      SL = HD/CS; every block PUSHES each slice of its partial into the owner's shared memory
 *      (st.shared::cluster), one cluster barrier, then each block merges its slice locally (so no block
 *      reads remote memory and no trailing barrier is needed);
 *   3. one active cluster (kv_len <= CS*chunk: every context up to 256 for the 0.8B shape): the slice
 *      owner writes the output. Several: slice partials go to `work`, and the last-arriving block of each
 *      (query group, slice) — a per-slice ticket counter — merges the n_cact cluster partials.
 * out = bf16(sum_c 2^(m_c-M) O_c / sum_c 2^(m_c-M) l_c), then the gate. */
#include "cuda/cluster.cuh"

enum { ATT_MIN_CHUNK = 32, ATT_MAX_SPLIT = 512, ATT_MAX_CS = 8, ATT_NW = 8, ATT_NT = 256, ATT_BLOCKS = 264 };

__host__ __device__ static inline int att_cdiv(int a, int b) { return (a + b - 1) / b; }

/* Positions per block for kv_len cached positions: a multiple of 32 (one U-batch per warp at least). */
__device__ __forceinline__ int attn_chunk(int kv_len, int n_split) {
    const int c = (att_cdiv(kv_len, n_split) + ATT_MIN_CHUNK - 1) / ATT_MIN_CHUNK * ATT_MIN_CHUNK;
    return c > ATT_MIN_CHUNK ? c : ATT_MIN_CHUNK;
}

/* Launch shape: GB query heads per block, n_qg = G / GB blocks per (kv head, split), n_split blocks per
 * (kv head, query group) in clusters of cs. ~2 blocks per SM of a 132-SM H200 in all, at most one block
 * per 32 positions of max_seq. */
typedef struct AttnGrid {
    int gb, n_qg, n_split, cs;
} AttnGrid;
static AttnGrid attn_grid(int Hq, int Hkv, int hd, int max_seq) {
    AttnGrid g;
    const int G = Hq / Hkv;
    g.gb = 1;
    for (int b = 8; b > 1; b >>= 1)
        if (G % b == 0 && b * hd <= 1024) {
            g.gb = b;
            break;
        }
    g.n_qg = G / g.gb;
    int n = att_cdiv(ATT_BLOCKS, Hkv * g.n_qg);
    const int cap = att_cdiv(max_seq, ATT_MIN_CHUNK);
    n = n < cap ? n : cap;
    n = n < ATT_MAX_SPLIT ? n : ATT_MAX_SPLIT;
    n = n > 1 ? n : 1;
    g.cs = n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1;
    g.n_split = n / g.cs * g.cs;
    return g;
}
/* work layout: ticket counters u64 [Hkv*n_qg][cs] (padded to 256 B), then part_o [Hq][n_clu][HD] and
 * part_ml [Hq][n_clu][cs][2] floats, n_clu = n_split / cs. */
__host__ __device__ static inline size_t attn_ctr_bytes(int groups, int cs) {
    return ((size_t)groups * cs * 8 + 255) / 256 * 256;
}

typedef struct AttnArgs {
    AttnDecodeParams p;
    int n_qg, cs;
} AttnArgs;

template <int HD, int GB>
struct AttnCfg {
    static constexpr int E = HD / 32;                  /* dims per lane */
    static constexpr int W = (E + 1) / 2;              /* packed bf16 words per lane per row */
    /* positions per warp per batch: U*GB scores and 2*U*W words live in registers (<= 128 per thread) */
    static constexpr int U = GB * E <= 4 ? 8 : GB * E <= 16 ? 4 : GB <= 4 ? 4 : 2;
};

/* E bf16 values at p (E*2-byte aligned) as W packed words (E = 1: the low half of w[0]). */
template <int E>
__device__ __forceinline__ void ld_bf16_row(const uint16_t *p, uint32_t *w) {
    if (E == 8) {
        const uint4 t = *reinterpret_cast<const uint4 *>(p);
        w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
    } else if (E == 4) {
        const uint2 t = *reinterpret_cast<const uint2 *>(p);
        w[0] = t.x, w[1] = t.y;
    } else if (E == 2) {
        w[0] = *reinterpret_cast<const uint32_t *>(p);
    } else {
        w[0] = *p;
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
    if (E % 4 == 0) {
#pragma unroll
        for (int i = 0; i < E; i += 4) {
            const float4 t = *reinterpret_cast<const float4 *>(x + lane * E + i);
            v[i] = t.x, v[i + 1] = t.y, v[i + 2] = t.z, v[i + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; i++) v[i] = x[lane * E + i];
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

/* bf16 output of one dim: bf16(O/L), times bf16(sigmoid(gate)) when gated. */
__device__ __forceinline__ float attn_final(float O, float L, float gate, int gated) {
    float o = rbf(O / L);
    if (gated) o = rbf(o * rbf(1.0f / (1.0f + expf(-gate))));
    return o;
}

/* Ticket of a last-arriver scheme that needs no initialisation: the word holds (tag 32 | n 16 | count 16)
 * with tag = pos + 1 (never 0 or 0xffffffff). An arrival that finds another tag/n, or a full count (the
 * previous layer at this position), starts a new count at 1. True for the n-th arrival. A word that
 * happened to hold (this tag, this n, count < n) before the first arrival would be miscounted; zeroed or
 * 0xff-poisoned memory, and every word this kernel leaves behind, are safe. */
__device__ __forceinline__ bool attn_ticket(unsigned long long *c, unsigned tag, int n) {
    const unsigned long long key = ((unsigned long long)tag << 32) | ((unsigned long long)n << 16);
    unsigned long long old = __ldcg(c), want;
    for (;;) {
        const bool same = (old & ~0xffffull) == key && (old & 0xffffull) < (unsigned long long)n;
        want = same ? old + 1 : key | 1ull;
        const unsigned long long prev = atomicCAS(c, old, want);
        if (prev == old) break;
        old = prev;
    }
    return (want & 0xffffull) == (unsigned long long)n;
}

/* The merge steps 1-3 of the header (after the main loop; block indices re-derived so that they do not
 * hold registers through the loop). */
template <int HD, int GB>
__device__ __forceinline__ void attn_merge(const AttnArgs &a, const float (*wm)[GB], const float (*wl)[GB],
                                           const float (*wo)[GB][HD], float *recv, float (*rml)[GB][2],
                                           const float *gs, int *last_flag, int pos, int n_cact Q35_TRACE_ARG) {
    constexpr int NW = ATT_NW, NT = ATT_NT;
    const AttnDecodeParams &p = a.p;
    const int s = blockIdx.x, n_split = gridDim.x, ncs = a.cs, rank = s % ncs, clu = s / ncs;
    const int n_clu = n_split / ncs, SL = HD / ncs;
    const int grp = blockIdx.y, h = grp / a.n_qg, hq0 = h * GB * a.n_qg + (grp % a.n_qg) * GB;
    const int tid = threadIdx.x;
    /* Gates of the dims this block finishes (idx = tid + k NT < GB*SL, see the cluster merge): gs, staged
     * by the kernel right after its wait. */
    float gv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (p.gated)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int idx = tid + k * NT;
            if (idx < GB * SL) gv[k] = gs[idx];
        }

    /* 1. (cont.) Thread (g, d..d+3): the warps' partials merged, pushed to the owner of their slice
     *    (SL % 4 == 0: HD >= 32, cs <= 8) as one 16-byte remote store (4x fewer than scalar ones; H200
     *    ctx 128: -2.5 us per token, docs/PERF_NOTES.md §15). */
    cluster_wait(); /* phase 1: every block of the cluster runs, so its shared memory may be written */
    Q35_TRACE_PROBE(3);
    for (int idx = tid; idx < GB * HD / 4; idx += NT) {
        const int g = idx / (HD / 4), d = 4 * (idx % (HD / 4)), j = d % SL;
        const unsigned dst = (unsigned)(d / SL);
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < NW; k++) M = fmaxf(M, wm[k][g]);
        const float Ms = M == -INFINITY ? 0.0f : M; /* empty block: every factor 0 */
        float L = 0.0f;
        float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int k = 0; k < NW; k++) {
            const float f = exp2f(wm[k][g] - Ms);
            const float4 w4 = *reinterpret_cast<const float4 *>(&wo[k][g][d]);
            L = fmaf(wl[k][g], f, L);
            O.x = fmaf(w4.x, f, O.x), O.y = fmaf(w4.y, f, O.y), O.z = fmaf(w4.z, f, O.z), O.w = fmaf(w4.w, f, O.w);
        }
        st_dsmem4(&recv[(rank * GB + g) * SL + j], dst, O);
        if (j == 0) {
            st_dsmem(&rml[rank][g][0], dst, M);
            st_dsmem(&rml[rank][g][1], dst, L);
        }
    }
    Q35_TRACE_PROBE(4);
    cluster_arrive_release();
    cluster_wait(); /* phase 2: all slices of this block's dims are in recv */
    Q35_TRACE_PROBE(5);

    /* 2./3. This block's slice: merge the cluster's partials (rank order; rank 0 of an active cluster
     *    always has positions, so M is finite), then finish or hand over to the last arriver. */
    float *part_o = reinterpret_cast<float *>(reinterpret_cast<char *>(p.work) + attn_ctr_bytes(gridDim.y, ncs));
    float *part_ml = part_o + (size_t)p.Hq * n_clu * HD;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int idx = tid + k * NT;
        if (idx < GB * SL) {
            const int g = idx / SL, j = idx % SL, d = rank * SL + j, hq = hq0 + g;
            float M = -INFINITY, L = 0.0f, O = 0.0f;
            for (int r = 0; r < ncs; r++) M = fmaxf(M, rml[r][g][0]);
            for (int r = 0; r < ncs; r++) {
                const float f = exp2f(rml[r][g][0] - M);
                L = fmaf(rml[r][g][1], f, L);
                O = fmaf(recv[(r * GB + g) * SL + j], f, O);
            }
            if (n_cact == 1) {
                p.out[(size_t)hq * HD + d] = attn_final(O, L, gv[k], p.gated);
            } else {
                const size_t row = (size_t)hq * n_clu + clu;
                part_o[row * HD + d] = O;
                if (j == 0) part_ml[(row * ncs + rank) * 2] = M, part_ml[(row * ncs + rank) * 2 + 1] = L;
            }
        }
    }
    Q35_TRACE_PROBE(6);
    if (n_cact == 1) return;
    __threadfence();
    __syncthreads();
    if (tid == 0)
        *last_flag = attn_ticket(reinterpret_cast<unsigned long long *>(p.work) + (size_t)grp * ncs + rank,
                                (unsigned)pos + 1u, n_cact);
    __syncthreads();
    if (!*last_flag) return;
    __threadfence();
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int idx = tid + k * NT;
        if (idx < GB * SL) {
            const int g = idx / SL, j = idx % SL, d = rank * SL + j, hq = hq0 + g;
            const float *ml = part_ml + ((size_t)hq * n_clu * ncs + rank) * 2;
            const float *po = part_o + (size_t)hq * n_clu * HD + d;
            float M = -INFINITY, L = 0.0f, O = 0.0f;
            for (int c = 0; c < n_cact; c++) M = fmaxf(M, __ldcg(ml + (size_t)c * ncs * 2));
            for (int c = 0; c < n_cact; c++) {
                const float f = exp2f(__ldcg(ml + (size_t)c * ncs * 2) - M);
                L = fmaf(__ldcg(ml + (size_t)c * ncs * 2 + 1), f, L);
                O = fmaf(__ldcg(po + (size_t)c * HD), f, O);
            }
            p.out[(size_t)hq * HD + d] = attn_final(O, L, gv[k], p.gated);
        }
    }
}

template <int HD, int GB>
__global__ void __launch_bounds__(ATT_NT, 2) attn_decode_f32_cluster(const __grid_constant__ AttnArgs a) {
    using C = AttnCfg<HD, GB>;
    constexpr int E = C::E, W = C::W, U = C::U, NW = ATT_NW, NT = ATT_NT;
    const AttnDecodeParams &p = a.p;
    __shared__ __align__(16) float qs[GB + 1][HD]; /* GB query heads, then the new k */
    __shared__ float cs[HD / 2], sn[HD / 2];
    __shared__ float wm[NW][GB], wl[NW][GB];
    __shared__ __align__(16) float wo[NW][GB][HD];
    __shared__ __align__(16) float recv[GB * HD]; /* [cs][GB][SL]: slices pushed by the cluster's blocks */
    __shared__ float rml[ATT_MAX_CS][GB][2];   /* their (m, l) */
    __shared__ float gs[GB * HD];              /* [GB][SL] gates of the dims this block finishes (gated) */
    __shared__ int last_flag;

    __shared__ int sh_pos, sh_ncact;
    const int s = blockIdx.x, n_split = gridDim.x, ncs = a.cs, clu = s / ncs;
    const int grp = blockIdx.y, h = grp / a.n_qg, hq0 = h * GB * a.n_qg + (grp % a.n_qg) * GB;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int pos = p.step->pos;
    Q35_TRACE_T0;
    if (pos < 0 || pos >= p.max_seq) {
        pdl_wait();
        return;
    }
    const int kv_len = pos + 1, chunk = attn_chunk(kv_len, n_split);
    const int n_cact = att_cdiv(att_cdiv(kv_len, chunk), ncs); /* active clusters */
    if (clu >= n_cact) { /* the whole cluster exits: no cluster barrier is pending */
        pdl_wait();
        return;
    }
    cluster_arrive_relaxed(); /* phase 1 (this block has started), waited on before the first push */
    if (tid == 0) sh_pos = pos, sh_ncact = n_cact; /* read back after the main loop (registers) */
    const int t0 = s * chunk, t1 = min(kv_len, t0 + chunk); /* t1 <= t0: no positions (still merges) */
    uint16_t *Kh = p.k_cache + (size_t)h * p.max_seq * HD, *Vh = p.v_cache + (size_t)h * p.max_seq * HD;

    /* Before the wait: pull the cached rows of earlier tokens [t0, min(t1, pos)) towards L2, and the
     * RoPE table (constant data only). */
    {
        const int n_rows = min(t1, pos) - t0;
        const int n_lines = n_rows > 0 ? att_cdiv(n_rows * HD * 2, 128) : 0;
        for (int i = tid; i < n_lines; i += NT) {
            prefetch_l2(reinterpret_cast<const char *>(Kh + (size_t)t0 * HD) + (size_t)i * 128);
            prefetch_l2(reinterpret_cast<const char *>(Vh + (size_t)t0 * HD) + (size_t)i * 128);
        }
        for (int i = tid; i < p.R / 2; i += NT) {
            float c, sv;
            sincosf((float)pos * p.inv_freq[i], &sv, &c);
            cs[i] = rbf(c), sn[i] = rbf(sv);
        }
    }
    pdl_wait();
    Q35_TRACE_T1_AT(0);
#ifndef Q35_ATTN_LATE_TRIGGER /* measurement build (make ATTN_LATE=1): o_proj launched at the end instead */
    pdl_trigger();
#endif
    /* The gates the merge needs, now, while the memory system is quiet: loaded at the merge they were
     * the suspect for its ~3.5 us at ctx 128 (step trace); here -0.7 us per token (docs/PERF_NOTES.md §15). */
    if (p.gated) {
        const int SL = HD / ncs, rank = s % ncs;
        for (int idx = tid; idx < GB * SL; idx += NT)
            gs[idx] = p.qkv[(size_t)(hq0 + idx / SL) * 2 * HD + HD + rank * SL + idx % SL];
    }
    __syncthreads();

    /* Query heads hq0 .. hq0+GB-1 (and k/v when this block holds pos). */
    const int q_stride = p.gated ? 2 * HD : HD, q_rows = p.Hq * q_stride;
    const bool owns_pos = t0 < t1 && t1 == kv_len;
    for (int item = w; item < GB + (owns_pos ? 1 : 0); item += NW) {
        if (item < GB) {
            head_norm_rope<HD>(p.qkv + (size_t)(hq0 + item) * q_stride, p.q_norm_w, qs[item], cs, sn, p, lane);
            if (p.q_out && s == 0)
                for (int d = lane; d < HD; d += 32) p.q_out[(size_t)(hq0 + item) * HD + d] = qs[item][d];
        } else {
            head_norm_rope<HD>(p.qkv + q_rows + (size_t)h * HD, p.k_norm_w, qs[GB], cs, sn, p, lane);
            const float *v = p.qkv + q_rows + (size_t)(p.Hkv + h) * HD;
            for (int d = lane; d < HD; d += 32) {
                Kh[(size_t)pos * HD + d] = bf16_bits(qs[GB][d]);
                Vh[(size_t)pos * HD + d] = bf16_bits(v[d]);
            }
        }
    }
    __syncthreads(); /* qs ready; K/V[pos] visible to this block */
    Q35_TRACE_PROBE(1);

    const float qscale = 1.4426950408889634f / sqrtf((float)HD);
    float q[GB][E], o[GB][E], m[GB], l[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < E; i++) q[g][i] = qs[g][lane * E + i] * qscale, o[g][i] = 0.0f;
    }

    for (int tb = t0 + w * U; tb < t1; tb += NW * U) {
        uint32_t kr[U][W], vr[U][W];
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (tb + u < t1) {
                ld_bf16_row<E>(Kh + (size_t)(tb + u) * HD + lane * E, kr[u]);
                ld_bf16_row<E>(Vh + (size_t)(tb + u) * HD + lane * E, vr[u]);
            } else {
#pragma unroll
                for (int i = 0; i < W; i++) kr[u][i] = vr[u][i] = 0u;
            }
        }
        float sc[U][GB];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int g = 0; g < GB; g++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < E; i++) d = fmaf(q[g][i], wbf(kr[u], i), d);
                d = warp_sum(d);
                sc[u][g] = tb + u < t1 ? d : -INFINITY;
            }
#pragma unroll
        for (int g = 0; g < GB; g++) {
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

    /* 1. Warps -> block partial (a warp without positions has m = -inf, l = 0, O = 0), pushed slice by
     *    slice into the owners' recv (2). */
#pragma unroll
    for (int g = 0; g < GB; g++) {
        if (lane == 0) wm[w][g] = m[g], wl[w][g] = l[g];
#pragma unroll
        for (int i = 0; i < E; i++) wo[w][g][lane * E + i] = o[g][i];
    }
    __syncthreads();
    Q35_TRACE_PROBE(2);
    attn_merge<HD, GB>(a, wm, wl, wo, recv, rml, gs, &last_flag, sh_pos, sh_ncact Q35_TRACE_PASS);
#ifdef Q35_ATTN_LATE_TRIGGER
    pdl_trigger(); /* blocks that returned early from attn_merge count as exited */
#endif
    Q35_TRACE_END(30);
}

template <int HD, int GB>
static int attn_launch(const AttnDecodeParams *p, const AttnGrid &g, const CudaLaunch *l) {
    AttnArgs a;
    a.p = *p;
    a.n_qg = g.n_qg;
    a.cs = g.cs;
    const dim3 grid((unsigned)g.n_split, (unsigned)(p->Hkv * g.n_qg));
    return launch_cluster(attn_decode_f32_cluster<HD, GB>, grid, dim3(ATT_NT), 0, (unsigned)g.cs, l, a);
}

template <int HD>
static int attn_launch_hd(const AttnDecodeParams *p, const AttnGrid &g, const CudaLaunch *l) {
    constexpr int GB8 = HD <= 128 ? 8 : 4; /* GB*HD <= 1024: attn_grid never picks 8 for HD 256 */
    switch (g.gb) {
    case 1: return attn_launch<HD, 1>(p, g, l);
    case 2: return attn_launch<HD, 2>(p, g, l);
    case 4: return attn_launch<HD, 4>(p, g, l);
    case 8: return attn_launch<HD, GB8>(p, g, l);
    default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int cuda_attn_decode_splits(int Hkv, int max_seq) {
    return Hkv < 1 || max_seq < 1 ? 1 : attn_grid(Hkv, Hkv, 128, max_seq).n_split;
}

extern "C" size_t cuda_attn_decode_work_bytes(int Hq, int Hkv, int hd, int max_seq) {
    if (Hkv < 1 || Hq < Hkv || max_seq < 1 || hd < 1) return 256;
    const AttnGrid g = attn_grid(Hq, Hkv, hd, max_seq);
    const size_t n_clu = (size_t)(g.n_split / g.cs);
    return attn_ctr_bytes(Hkv * g.n_qg, g.cs) + sizeof(float) * (size_t)Hq * n_clu * ((size_t)hd + 2 * (size_t)g.cs);
}

extern "C" int cuda_attn_decode(const AttnDecodeParams *p, const CudaLaunch *l) {
    if (!p || !l || !p->qkv || !p->q_norm_w || !p->k_norm_w || !p->inv_freq || !p->k_cache || !p->v_cache ||
        !p->out || !p->work || !p->step || p->Hkv < 1 || p->Hq < p->Hkv || p->Hq % p->Hkv || p->Hkv > 65535 ||
        p->Hq > 65535 || p->max_seq < 1 || p->R < 2 || p->R % 2 || p->R > p->hd ||
        (p->norm_mode != NORM_ZC && p->norm_mode != NORM_PLAIN))
        return (int)cudaErrorInvalidValue;
    const AttnGrid g = attn_grid(p->Hq, p->Hkv, p->hd, p->max_seq);
    if ((long long)p->Hkv * g.n_qg > 65535) return (int)cudaErrorInvalidValue;
    switch (p->hd) {
    case 32: return attn_launch_hd<32>(p, g, l);
    case 64: return attn_launch_hd<64>(p, g, l);
    case 128: return attn_launch_hd<128>(p, g, l);
    case 256: return attn_launch_hd<256>(p, g, l);
    default: return (int)cudaErrorInvalidValue;
    }
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_attention)
