/* attention.cu — full-attention decode (MODEL.md §3.2, §5) in ONE kernel: q/k head norm + partial NeoX
 * RoPE, K/V append at pos, flash-decoding GQA attention over the bf16 cache (split over the sequence),
 * the merge of the splits and Qwen3.5's sigmoid output gate. Contract: ops.h (AttnDecodeParams).
 * At the end of the file, attn_short_oproj: the same attention AND o_proj in one kernel for short contexts,
 * without any merge (ops.h AttnShortParams).
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
#include "cuda/async.cuh"
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
    static constexpr int E = HD / 32;     /* dims per lane */
    static constexpr int W = (E + 1) / 2; /* packed bf16 words per lane per row */
    /* positions per warp per batch: U*GB scores and 2*U*W words live in registers (<= 128 per thread) */
    static constexpr int U = GB * E <= 4 ? 8 : GB * E <= 16 ? 4 : GB <= 4 ? 4 : 2;
};

/* E bf16 values at p (E*2-byte aligned) as W packed words (E = 1: the low half of w[0]). */
template <int E>
__device__ __forceinline__ void ld_bf16_row(const uint16_t *p, uint32_t *w) {
    if (E == 8) {
        const uint4 t = *reinterpret_cast<const uint4 *>(p);
        w[0] = t.x;
        w[1] = t.y;
        w[2] = t.z;
        w[3] = t.w;
    } else if (E == 4) {
        const uint2 t = *reinterpret_cast<const uint2 *>(p);
        w[0] = t.x;
        w[1] = t.y;
    } else if (E == 2) {
        w[0] = *reinterpret_cast<const uint32_t *>(p);
    } else {
        w[0] = *p;
    }
}
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
    if (gated) o = rbf(o * rbf(sigmoid_acc(gate)));
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
                                           const float (*wo)[GB][HD], float *recv, float (*rml)[GB][2], const float *gs,
                                           int *last_flag, int pos, int n_cact Q35_TRACE_ARG) {
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
     *    ctx 128: -2.5 us per token). */
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
            O.x = fmaf(w4.x, f, O.x);
            O.y = fmaf(w4.y, f, O.y);
            O.z = fmaf(w4.z, f, O.z);
            O.w = fmaf(w4.w, f, O.w);
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
    __shared__ float rml[ATT_MAX_CS][GB][2];      /* their (m, l) */
    __shared__ float gs[GB * HD];                 /* [GB][SL] gates of the dims this block finishes (gated) */
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
    if (tid == 0) {           /* read back after the main loop (registers) */
        sh_pos = pos;
        sh_ncact = n_cact;
    }
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
            cs[i] = rbf(c);
            sn[i] = rbf(sv);
        }
    }
    pdl_wait();
    Q35_TRACE_T1_AT(0);
    pdl_trigger();
    /* The gates the merge needs, now, while the memory system is quiet: loaded at the merge they were
     * the suspect for its ~3.5 us at ctx 128 (step trace); here -0.7 us per token. */
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
                Kh[(size_t)pos * HD + d] = kv_bits(qs[GB][d], p.kv_e4m3);
                Vh[(size_t)pos * HD + d] = kv_bits(v[d], p.kv_e4m3);
            }
        }
    }
    __syncthreads(); /* qs ready; K/V[pos] visible to this block */
    Q35_TRACE_PROBE(1);

    const float qscale = 1.4426950408889634f / sqrtf((float)HD);
    float q[GB][E], o[GB][E], m[GB], l[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
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
                for (int i = 0; i < E; i++) d = fmaf(q[g][i], bf_at(kr[u], i), d);
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
                for (int i = 0; i < E; i++) o[g][i] = fmaf(pu, bf_at(vr[u], i), o[g][i]);
            }
            m[g] = mx;
        }
    }

    /* 1. Warps -> block partial (a warp without positions has m = -inf, l = 0, O = 0), pushed slice by
     *    slice into the owners' recv (2). */
#pragma unroll
    for (int g = 0; g < GB; g++) {
        if (lane == 0) {
            wm[w][g] = m[g];
            wl[w][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < E; i++) wo[w][g][lane * E + i] = o[g][i];
    }
    __syncthreads();
    Q35_TRACE_PROBE(2);
    attn_merge<HD, GB>(a, wm, wl, wo, recv, rml, gs, &last_flag, sh_pos, sh_ncact Q35_TRACE_PASS);
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
    if (!p || !l || !p->qkv || !p->q_norm_w || !p->k_norm_w || !p->inv_freq || !p->k_cache || !p->v_cache || !p->out ||
        !p->work || !p->step || p->Hkv < 1 || p->Hq < p->Hkv || p->Hq % p->Hkv || p->Hkv > 65535 || p->Hq > 65535 ||
        p->max_seq < 1 || p->R < 2 || p->R % 2 || p->R > p->hd ||
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

/* ---- short contexts: attention + o_proj in one kernel (ops.h cuda_attn_short) ----------------------------- */

enum { AS_NT = 512, AS_NW = 16, AS_SL = 16, AS_CAP = 256 };

/* Dynamic shared memory: K rows [max_len][HD] bf16, then this block's V columns [max_len][16] bf16. */
template <int HD>
__global__ void __launch_bounds__(AS_NT, 1) attn_short_oproj(const __grid_constant__ AttnShortParams p) {
    constexpr int E = HD / 32;
    const AttnDecodeParams &a = p.a;
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t *ks = reinterpret_cast<uint16_t *>(smem);
    uint16_t *vs = ks + (size_t)p.max_len * HD;
    __shared__ __align__(16) float qs[HD], kn[HD];
    __shared__ float cs[HD / 2], sn[HD / 2], sc[AS_CAP], red[32], gate[AS_SL], vn[AS_SL], o16[AS_SL];
    __shared__ float pv[AS_NW][AS_SL];
    const int s = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int G = a.Hq / a.Hkv, kvh = h / G, d0 = s * AS_SL, pos = a.step->pos;
    Q35_TRACE_T0;
    if (pos < 0 || pos >= a.max_seq || pos >= p.max_len) {
        pdl_wait();
        if (pos >= 0 && pos < a.max_seq) __trap(); /* the engine never captures such a step: fail loudly */
        return;
    }
    const int kv_len = pos + 1;
    uint16_t *Kh = a.k_cache + (size_t)kvh * a.max_seq * HD, *Vh = a.v_cache + (size_t)kvh * a.max_seq * HD;

    /* First (immutable): the cached rows of earlier tokens into shared memory. cp.async issue stalls once
     * an SM has loads outstanding (burst_lab issue: 64 KB alone issue in 0.64 us, but 128 KB take 2.2 us), while
     * register loads do not (192 KB in 0.8 us): so the cp.async goes before any register load, or the block
     * reaches its PDL wait only as the loads ahead of it land. */
    for (int c = tid; c < pos * (HD / 8); c += AS_NT) cp_async16(ks + (size_t)c * 8, Kh + (size_t)c * 8);
    for (int c = tid; c < 2 * pos; c += AS_NT)
        cp_async16(vs + (size_t)c * 8, Vh + (size_t)(c >> 1) * HD + d0 + (c & 1) * 8);
    cp_async_commit();

    /* Before the wait (immutable data only): W_o's 16 columns of this block (rows 2 tid, 2 tid + 1), the RoPE
     * table. */
    uint4 wr[2][2];
    float wsc[2] = {0.0f, 0.0f}; /* FP8: the rows' scales for the block's 16 columns (one 128-column block) */
    const size_t ldo = (size_t)a.Hq * HD;
    const bool f8 = p.w8_o != nullptr;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int r = 2 * tid + j;
        if (f8) {
            wr[j][0] = r < p.D ? ld_stream(reinterpret_cast<const uint4 *>(p.w8_o + r * ldo + (size_t)h * HD + d0))
                               : make_uint4(0u, 0u, 0u, 0u);
            wr[j][1] = make_uint4(0u, 0u, 0u, 0u);
            wsc[j] = r < p.D ? __ldg(p.s_o + (size_t)((h * HD + d0) / 128) * ((p.D + 3) & ~3) + r) : 0.0f;
            continue;
        }
#pragma unroll
        for (int k = 0; k < 2; k++)
            wr[j][k] = r < p.D
                           ? ld_stream(reinterpret_cast<const uint4 *>(p.w_o + r * ldo + (size_t)h * HD + d0 + 8 * k))
                           : make_uint4(0u, 0u, 0u, 0u);
    }
    for (int i = tid; i < a.R / 2; i += AS_NT) {
        float c, sv;
        sincosf((float)pos * a.inv_freq[i], &sv, &c);
        cs[i] = rbf(c);
        sn[i] = rbf(sv);
    }
    pdl_wait();
    Q35_TRACE_T1_AT(0);
    pdl_trigger();
    if (p.zero) {
        const int nb = gridDim.x * gridDim.y, b = blockIdx.y * gridDim.x + blockIdx.x;
        for (int i = b * AS_NT + tid; i < p.n_zero; i += nb * AS_NT) p.zero[i] = 0.0f;
    }
    __syncthreads(); /* cs, sn */

    /* q of head h (warp 0), the new k of kv head kvh (warp 1), this block's gate and new-v columns (warp 2) */
    const int q_stride = a.gated ? 2 * HD : HD, q_rows = a.Hq * q_stride;
    if (w == 0) {
        head_norm_rope<HD>(a.qkv + (size_t)h * q_stride, a.q_norm_w, qs, cs, sn, a, lane);
    } else if (w == 1) {
        head_norm_rope<HD>(a.qkv + q_rows + (size_t)kvh * HD, a.k_norm_w, kn, cs, sn, a, lane);
    } else if (w == 2 && lane < AS_SL) {
        gate[lane] = a.gated ? a.qkv[(size_t)h * 2 * HD + HD + d0 + lane] : 0.0f;
        vn[lane] = a.qkv[q_rows + (size_t)(a.Hkv + kvh) * HD + d0 + lane];
    }
    cp_async_wait<0>();
    __syncthreads();
    /* row pos of K and V as the cache stores them, here and (the kv head's first query head) in the cache */
    for (int d = tid; d < HD; d += AS_NT) ks[(size_t)pos * HD + d] = kv_bits(kn[d], a.kv_e4m3);
    if (tid < AS_SL) {
        vs[(size_t)pos * AS_SL + tid] = kv_bits(vn[tid], a.kv_e4m3);
        if (h % G == 0) {
            Kh[(size_t)pos * HD + d0 + tid] = kv_bits(kn[d0 + tid], a.kv_e4m3);
            Vh[(size_t)pos * HD + d0 + tid] = kv_bits(vn[tid], a.kv_e4m3);
        }
    }
    if (a.q_out && s == 0)
        for (int d = tid; d < HD; d += AS_NT) a.q_out[(size_t)h * HD + d] = qs[d];
    __syncthreads();
    Q35_TRACE_PROBE(1); /* (trace build, T1_AT: the qkv rows read, q and k normed and roped, K/V[pos] stored) */

    /* scores (base 2): warp w takes positions w, w + 16, ...; lane l dims [l E, (l + 1) E) (cuda_attn_decode's
     * per-lane order and warp_sum: the same values) */
    {
        const float qscale = 1.4426950408889634f / sqrtf((float)HD);
        float q[E];
#pragma unroll
        for (int i = 0; i < E; i++) q[i] = qs[lane * E + i] * qscale;
        for (int t = w; t < kv_len; t += AS_NW) {
            uint32_t kr[(E + 1) / 2];
            ld_bf16_row<E>(ks + (size_t)t * HD + lane * E, kr);
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < E; i++) d = fmaf(q[i], bf_at(kr, i), d);
            d = warp_sum(d);
            if (lane == 0) sc[t] = d;
        }
    }
    __syncthreads();
    Q35_TRACE_PROBE(2); /* the scores */
    /* softmax over the kv_len <= 256 scores: one per thread */
    float m = tid < kv_len ? sc[tid] : -INFINITY;
    m = warp_max(m);
    if (lane == 0) red[w] = m;
    __syncthreads();
    m = lane < AS_NW ? red[lane] : -INFINITY;
    m = warp_max(m);
    const float pt = tid < kv_len ? exp2f(sc[tid] - m) : 0.0f;
    if (tid < kv_len) sc[tid] = pt;
    const float L = block_sum(pt, red); /* its barriers also publish sc */
    Q35_TRACE_PROBE(3);                 /* the softmax */

    /* o for dims [d0, d0 + 16): thread (t = tid / 2, half) adds p_t v_t over 8 dims; lanes of one parity sum
     * over the warp, the 16 warps' sums in order */
    {
        const int t = tid >> 1, hf = tid & 1;
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.0f;
        if (t < kv_len) {
            const float pw = sc[t];
            const uint4 v4 = *reinterpret_cast<const uint4 *>(vs + (size_t)t * AS_SL + hf * 8);
            acc[0] = pw * bf_lo(v4.x);
            acc[1] = pw * bf_hi(v4.x);
            acc[2] = pw * bf_lo(v4.y);
            acc[3] = pw * bf_hi(v4.y);
            acc[4] = pw * bf_lo(v4.z);
            acc[5] = pw * bf_hi(v4.z);
            acc[6] = pw * bf_lo(v4.w);
            acc[7] = pw * bf_hi(v4.w);
        }
#pragma unroll
        for (int o = 2; o < 32; o <<= 1)
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
        if (lane < 2)
#pragma unroll
            for (int i = 0; i < 8; i++) pv[w][lane * 8 + i] = acc[i];
    }
    __syncthreads();
    if (tid < AS_SL) {
        float O = 0.0f;
#pragma unroll
        for (int k = 0; k < AS_NW; k++) O += pv[k][tid];
        o16[tid] = attn_final(O, L, gate[tid], a.gated);
    }
    __syncthreads();
    Q35_TRACE_PROBE(4); /* o and the gate */

    /* o_proj: rows 2 tid, 2 tid + 1 of y += W_o[:, h HD + d0 .. +16] o16; even lanes add 4 rows at once */
    float yv[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (f8) { /* the 16 products' chain, times the row's scale */
            yv[j] = dot16_e4m3(wr[j][0], o16) * wsc[j];
            continue;
        }
        float acc = 0.0f;
        acc = dot8(wr[j][0], o16, acc);
        yv[j] = dot8(wr[j][1], o16 + 8, acc);
    }
    const float y2 = __shfl_down_sync(0xffffffffu, yv[0], 1), y3 = __shfl_down_sync(0xffffffffu, yv[1], 1);
    if (!(tid & 1) && 2 * tid < p.D) red_add4(p.y + 2 * tid, yv[0], yv[1], y2, y3); /* D % 4 == 0 */
    Q35_TRACE_END(35);
}

extern "C" int cuda_attn_short_cap(int hd, int D) {
    if ((hd != 64 && hd != 128 && hd != 256) || D < 4 || D % 4 || D > 2 * AS_NT) return 0;
    return AS_CAP;
}

/* what cuda_attn_short requires */
static int as_params_ok(const AttnShortParams *p) {
    const AttnDecodeParams *a = &p->a;
    return a->q_norm_w && a->k_norm_w && a->inv_freq && a->k_cache && a->v_cache && a->step &&
           (p->w8_o ? !p->w_o && p->s_o && a->hd % 16 == 0 : p->w_o && !p->s_o) && p->y &&
           !(p->n_zero > 0 && !p->zero) && p->n_zero >= 0 && a->Hkv >= 1 && a->Hq >= a->Hkv && a->Hq % a->Hkv == 0 &&
           a->Hq <= 65535 && a->max_seq >= 1 && a->R >= 2 && a->R % 2 == 0 && a->R <= a->hd &&
           (a->norm_mode == NORM_ZC || a->norm_mode == NORM_PLAIN) && cuda_attn_short_cap(a->hd, p->D) > 0 &&
           p->max_len >= 1 && p->max_len <= cuda_attn_short_cap(a->hd, p->D);
}

extern "C" int cuda_attn_short(const AttnShortParams *p, const CudaLaunch *l) {
    if (!p || !l || !p->a.qkv || !as_params_ok(p)) return (int)cudaErrorInvalidValue;
    const AttnDecodeParams *a = &p->a;
    const size_t smem = (size_t)p->max_len * ((size_t)a->hd + AS_SL) * 2;
    const dim3 grid((unsigned)(a->hd / AS_SL), (unsigned)a->Hq);
    void (*kern)(AttnShortParams) = a->hd == 64    ? attn_short_oproj<64>
                                    : a->hd == 128 ? attn_short_oproj<128>
                                                   : attn_short_oproj<256>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)e;
    }
    return launch_kernel(kern, grid, dim3(AS_NT), smem, l, *p);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_attention)
