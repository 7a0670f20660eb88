/* megastep.cu — every layer of one decode step in ONE persistent kernel (contract: ops.h MegaParams).
 * EXPERIMENTAL, opt-in (--persistent / QWEN35_PERSISTENT=1): correct (test_decode, golden fixtures) but
 * measured slower than the per-phase graph (1.30 vs 0.81 ms/token at ctx 128 on the H200); the phase
 * trace (bench --ops) and what was tried are in docs/PERF_NOTES.md §9.
 *
 * Why: one decode step is ~125 dependent phases of 1-17 MB each. As separate kernels each phase pays
 * a launch/drain boundary plus the DRAM round trip of its first loads (~2.5 us over its bandwidth time,
 * docs/PERF_NOTES.md §7-8). Here the weights do not wait for the phases: each block streams its rows
 * of every GEMV of the step, in order, into a shared-memory ring (MG_NS slots x 32 KiB, cp.async.bulk
 * completing on an mbarrier per slot); thread 0 refills a slot as soon as the block has consumed it,
 * so MG_NS pieces are always requested ahead, across phase boundaries and mixers. The 16 warps run
 * the phases, separated by a grid barrier (one arrival counter + generation word).
 *
 * Block b of G owns rows [b N/G, (b+1) N/G) of every GEMV (pairs of rows for the interleaved gate/up),
 * so no split-K: a row is summed by one block in a fixed order (deterministic). A ring piece holds pr
 * rows (pr = 16, 8, 4, 2 or 1 so that pr rows of K bf16 fit 32 KiB); warp w handles row w / S of the
 * piece over column slice w % S (S = 16 / pr), lane l the 16-byte chunks slice_start + l + 32 i
 * (i < 4), with its x values in registers for the whole phase.
 *
 * Mixers: the DeltaNet step as work items (v head, 16-column slice of dv) — the state slice and the
 * conv history are loaded before the barrier that precedes the phase; the gated RMSNorm is redone
 * by every block in the out_proj prologue. Attention as items (kv head, split of the positions):
 * flash-decoding partials (m, l, O) of the group's query heads into `work`, merged (and gated) in
 * one more phase; the new K/V row is written by the item that owns position pos, which is the only
 * reader of it in this step. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda/common.cuh"

enum {
    MG_CW = 16,            /* warps */
    MG_CT = MG_CW * 32,    /* threads */
    MG_SLOT = 32768,       /* bytes per ring slot */
    MG_NS = 5,             /* ring slots */
    MG_BIG = 32768,        /* xs (GEMV input, fp32) | attention warp partials */
    MG_SMALL = 16384,      /* DeltaNet / attention scratch */
    MG_MIN_CHUNK = 32      /* attention: positions per split at least */
};
#define MG_MAX_L 128       /* layers in the shared-memory GEMV table */
#define MG_SMEM_BYTES ((size_t)MG_NS * MG_SLOT + MG_BIG + MG_SMALL + 2 * MG_CW * 4 + MG_NS * 8 + MG_MAX_L * 40 + 128)

/* The kernel uses sm_90 instructions (mbarrier tx, cp.async.bulk); the compute_80 PTX of this file
 * gets an empty kernel (cuda_mega_prepare is only reached on sm_90 devices: backend.cu checks). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MG_SM90 0
#else
#define MG_SM90 1
#endif

/* Rows per ring piece: the largest power of two <= 16 with pr rows of K bf16 in one slot. */
__host__ __device__ __forceinline__ int mg_rows_per_piece(int K) {
    int pr = 16;
    while (pr > 1 && pr * K * 2 > MG_SLOT) pr >>= 1;
    return pr;
}
enum { DN_COLS = 16 }; /* DeltaNet state columns per item: 4 column groups of 4 x 128 row lanes = 512 threads */

#if MG_SM90
/* ---- primitives ------------------------------------------------------------------------------- */

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    unsigned ok;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(ok)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
    } while (!ok);
}
/* bytes (multiple of 16) from global src to shared dst, completion counted on bar. */
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
/* Block barrier (barrier 1, all MG_CT threads). */
static_assert(MG_CT == 512, "cbar() names 512 threads");
__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, 512;" ::: "memory"); }

/* Sum over the block, same value to all; red: shared float[MG_CW] (free on entry). */
__device__ __forceinline__ float csum(float v, float *red) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    cbar();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < MG_CW; i++) s += red[i];
    cbar(); /* red may be reused right after */
    return s;
}

/* Grid barrier: bar[0] arrivals, bar[32] generation. The last arriver resets the count, then
 * publishes the next generation; the others spin on it. Self-resetting across launches. */
__device__ __forceinline__ void grid_sync_raw(unsigned *bar) {
    if (threadIdx.x == 0) {
        unsigned g, v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(bar + 32) : "memory");
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 32), "r"(g + 1u) : "memory");
        } else {
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar + 32) : "memory");
            } while (v == g);
        }
        __threadfence();
    }
}

__device__ __forceinline__ float mg_silu(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ uint16_t mg_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

/* ---- GEMV geometry (shared by the weight stream and the phases) -------------------------------- */

typedef struct MgGemv {
    const uint16_t *W;
    int N, K, unit; /* rows, cols, rows that must stay in one block (2: gate/up pairs) */
} MgGemv;

/* Per layer, what the GEMV geometry needs (copied to shared memory at kernel start). */
typedef struct MgTab {
    const uint16_t *w[4]; /* w_in, w_out, w_gu, w_down */
    int in_rows, out_cols;
} MgTab;

__device__ __forceinline__ MgGemv mg_gemv_of(const MegaParams &p, const MgTab &t, int m) {
    MgGemv g;
    g.W = t.w[m];
    if (m == 0) g.N = t.in_rows, g.K = p.D, g.unit = 1;
    else if (m == 1) g.N = p.D, g.K = t.out_cols, g.unit = 1;
    else if (m == 2) g.N = 2 * p.F, g.K = p.D, g.unit = 2;
    else g.N = p.D, g.K = p.F, g.unit = 1;
    return g;
}
__device__ __forceinline__ void mg_rows(const MgGemv &g, int b, int G, int *r0, int *r1) {
    const long long nu = g.N / g.unit;
    *r0 = (int)(nu * b / G) * g.unit;
    *r1 = (int)(nu * (b + 1) / G) * g.unit;
}

/* ---- the weight stream (thread 0) ----------------------------------------------------------------
 * The block's pieces in consumption order: layers, then in / out / gu / down, then row ranges of pr
 * rows. Piece n goes to slot n % MG_NS. */
struct MgCursor {
    int l, m, r, r1, pr, K;
    const uint16_t *W;
    unsigned n; /* pieces issued */
};

/* Moves c to the first non-empty GEMV at or after (c.l, c.m) (c.l = L: the stream is done). */
__device__ void cur_settle(const MegaParams &p, const MgTab *tab, MgCursor &c) {
    for (; c.l < p.L; c.m = c.m == 3 ? 0 : c.m + 1, c.l += c.m == 0) {
        const MgGemv g = mg_gemv_of(p, tab[c.l], c.m);
        int r0;
        mg_rows(g, blockIdx.x, gridDim.x, &r0, &c.r1);
        if (r0 < c.r1) {
            c.r = r0, c.pr = mg_rows_per_piece(g.K), c.K = g.K, c.W = g.W;
            return;
        }
    }
}
/* Requests the next piece into its slot (its previous contents consumed). */
__device__ void cur_issue(const MegaParams &p, const MgTab *tab, MgCursor &c, char *ring, uint64_t *full) {
    if (c.l >= p.L) return;
    const unsigned slot = c.n % MG_NS, bytes = (unsigned)(min(c.pr, c.r1 - c.r) * c.K * 2);
    mbar_expect_tx(&full[slot], bytes);
    bulk_g2s(ring + (size_t)slot * MG_SLOT, c.W + (size_t)c.r * c.K, bytes, &full[slot]);
    c.n++;
    c.r += c.pr;
    if (c.r >= c.r1) {
        c.m = c.m == 3 ? 0 : c.m + 1;
        c.l += c.m == 0;
        cur_settle(p, tab, c);
    }
}

/* ---- consumer state -------------------------------------------------------------------------- */

struct MgSm {
    char *ring;
    float *xs;      /* big: GEMV input [K] */
    float *big;
    float *small;
    float *red;     /* [2][MG_CW] */
    uint64_t *full; /* [MG_NS] */
    MgTab *tab;     /* [L] */
    unsigned n;     /* ring pieces consumed so far (same in every thread) */
    MgCursor cur;   /* the weight stream (thread 0's copy is the live one) */
    /* trace (thread 0): phases ended, clock at the current phase's start, ring-wait cycles in it */
    unsigned k;
    long long t0, rwait, tpro, tiss; /* + cycles before the GEMV's piece loop, in cur_issue */
};

/* Ends the current phase (its kind: MG_PH_*): block barrier, grid barrier, block barrier. With
 * p.trace, thread 0 records [work cycles, grid-barrier wait cycles, ring-wait cycles, kind]. */
__device__ void grid_sync(const MegaParams &p, MgSm &s, int kind) {
    cbar();
    if (threadIdx.x == 0) {
        const long long ta = clock64();
        grid_sync_raw(p.bar);
        const long long tr = clock64();
        if (p.trace && (int)s.k < p.trace_n) {
            unsigned *e = p.trace + ((size_t)s.k * gridDim.x + blockIdx.x) * 8;
            e[0] = (unsigned)(ta - s.t0), e[1] = (unsigned)(tr - ta), e[2] = (unsigned)s.rwait, e[3] = (unsigned)kind;
            e[4] = (unsigned)s.tpro, e[5] = (unsigned)s.tiss;
        }
        s.k++, s.t0 = tr, s.rwait = 0, s.tpro = 0, s.tiss = 0;
    }
    cbar();
}

enum { EPI_STORE = 0, EPI_RAW = 1, EPI_SILU = 2 };

/* y = W xs for this block's rows of GEMV m of layer ly (xs complete and published by a cbar). */
template <int EPI>
__device__ void mg_gemv(const MegaParams &p, int l, int m, MgSm &s, float *y) {
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const MgGemv g = mg_gemv_of(p, s.tab[l], m);
    const int pr = mg_rows_per_piece(g.K), S = MG_CW / pr, slice = w % S, prow = w / S;
    const int kc = g.K / 8, cs = (kc + S - 1) / S, c0 = slice * cs, c1 = min(kc, c0 + cs);
    int r0, r1;
    mg_rows(g, blockIdx.x, gridDim.x, &r0, &r1);
    float xr[4][8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = c0 + lane + 32 * i;
#pragma unroll
        for (int k = 0; k < 8; k++) xr[i][k] = c < c1 ? s.xs[c * 8 + k] : 0.0f;
    }
    if (tid == 0 && p.trace) s.tpro = clock64() - s.t0;
    for (int r = r0; r < r1; r += pr, s.n++) {
        const int rows = min(pr, r1 - r), slot = s.n % MG_NS, par = s.n & 1;
        const long long tw = tid == 0 && p.trace ? clock64() : 0;
        mbar_wait(&s.full[slot], (s.n / MG_NS) & 1);
        if (tid == 0 && p.trace) s.rwait += clock64() - tw;
        float acc = 0.0f;
        if (prow < rows) {
            const uint4 *wr = reinterpret_cast<const uint4 *>(s.ring + (size_t)slot * MG_SLOT) + (size_t)prow * kc;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int c = c0 + lane + 32 * i;
                if (c < c1) acc = dot8(wr[c], xr[i], acc);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) s.red[par * MG_CW + w] = acc;
        cbar(); /* the slot is consumed: refill it with the piece MG_NS ahead */
        if (tid == 0) {
            const long long ti = p.trace ? clock64() : 0;
            cur_issue(p, s.tab, s.cur, s.ring, s.full);
            if (p.trace) s.tiss += clock64() - ti;
        }
        if (EPI == EPI_SILU) {
            if (tid < rows / 2) {
                float gt = 0.0f, up = 0.0f;
                for (int j = 0; j < S; j++) gt += s.red[par * MG_CW + 2 * tid * S + j];
                for (int j = 0; j < S; j++) up += s.red[par * MG_CW + (2 * tid + 1) * S + j];
                y[(r >> 1) + tid] = rbf(rbf(silu_f(rbf(gt))) * rbf(up));
            }
        } else if (tid < rows) {
            float a = 0.0f;
            for (int j = 0; j < S; j++) a += s.red[par * MG_CW + tid * S + j];
            y[r + tid] = EPI == EPI_STORE ? rbf(a) : a;
        }
    }
}

/* xs = norm(x) with x = E[token] (res NULL) or bf16(res + bf16(add)); block 0 stores x to x_out. */
__device__ void mg_in_resid(const MegaParams &p, MgSm &s, const float *res, const float *add, float *x_out,
                            const float *w) {
    const int D = p.D;
    float ss = 0.0f;
    const uint16_t *e = res ? NULL : p.embed + (size_t)p.step->token * D;
    for (int i = threadIdx.x; i < D; i += MG_CT) {
        const float v = e ? bf16u(e[i]) : rbf(__ldcg(res + i) + rbf(__ldcg(add + i)));
        s.xs[i] = v;
        if (blockIdx.x == 0) x_out[i] = v;
        ss += v * v;
    }
    const float r = rsqrtf(csum(ss, s.red) / (float)D + p.eps);
    for (int i = threadIdx.x; i < D; i += MG_CT) s.xs[i] = norm_apply(s.xs[i], r, w[i], p.norm_mode);
    cbar();
}

__device__ void mg_in_vec(MgSm &s, const float *v, int n) {
    for (int i = threadIdx.x; i < n; i += MG_CT) s.xs[i] = __ldcg(v + i);
    cbar();
}

/* DeltaNet out_proj input: per v head j, y = bf16(bf16(w bf16(o rstd_j)) silu(z)). */
__device__ void mg_in_gated(const MegaParams &p, const MegaLayer &ly, MgSm &s) {
    const int lane = threadIdx.x & 31, dv = p.dv;
    for (int j = threadIdx.x >> 5; j < p.Hv; j += MG_CW) {
        const float *o = p.mix + (size_t)j * dv;
        float ss = 0.0f;
        for (int c = lane; c < dv; c += 32) {
            const float v = __ldcg(o + c);
            ss = fmaf(v, v, ss);
        }
        const float rstd = rsqrtf(warp_sum(ss) / (float)dv + p.eps);
        for (int c = lane; c < dv; c += 32) {
            const float u = rbf(__ldcg(o + c) * rstd), wu = rbf(ly.lin_norm[c] * u);
            s.xs[j * dv + c] = rbf(wu * mg_silu(__ldcg(p.proj + p.conv_dim + (size_t)j * dv + c)));
        }
    }
    cbar();
}

#include "cuda/megastep_mixers.cuh"

#endif /* MG_SM90 */

/* ---- the kernel ------------------------------------------------------------------------------ */

/* 512 threads x 128 registers = the whole register file of an SM (one block per SM). */
__global__ void __launch_bounds__(MG_CT, 1) mega_step_bf16(const __grid_constant__ MegaParams p) {
#if MG_SM90
    extern __shared__ __align__(128) char smem[];
    MgSm s;
    s.ring = smem;
    s.big = reinterpret_cast<float *>(smem + (size_t)MG_NS * MG_SLOT);
    s.xs = s.big;
    s.small = s.big + MG_BIG / 4;
    s.red = s.small + MG_SMALL / 4;
    s.full = reinterpret_cast<uint64_t *>(s.red + 2 * MG_CW);
    s.tab = reinterpret_cast<MgTab *>(s.full + MG_NS);
    s.n = 0, s.k = 0, s.t0 = clock64(), s.rwait = 0, s.tpro = 0, s.tiss = 0;
    for (int l = threadIdx.x; l < p.L; l += MG_CT) {
        const MegaLayer &ly = p.layers[l];
        MgTab t;
        t.w[0] = ly.w_in, t.w[1] = ly.w_out, t.w[2] = ly.w_gu, t.w[3] = ly.w_down;
        t.in_rows = ly.in_rows, t.out_cols = ly.out_cols;
        s.tab[l] = t;
    }
    if (threadIdx.x == 0) {
        for (int i = 0; i < MG_NS; i++) mbar_init(&s.full[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* the first MG_NS pieces of the weight stream */
        s.cur.l = 0, s.cur.m = 0, s.cur.n = 0;
        cur_settle(p, s.tab, s.cur);
        for (int i = 0; i < MG_NS; i++) cur_issue(p, s.tab, s.cur, s.ring, s.full);
    }
    const int nsp = (p.dv + DN_COLS - 1) / DN_COLS;
    const int dn_items = p.Hv * nsp;
    int xi = 0;
    for (int l = 0; l < p.L; l++) {
        const MegaLayer ly = p.layers[l];
        float *xa = xi ? p.x1 : p.x0, *xb = xi ? p.x0 : p.x1;
        /* in: proj = W_in norm1(x) */
        if (l == 0) {
            mg_in_resid(p, s, NULL, NULL, p.x0, ly.ln1);
        } else {
            grid_sync(p, s, MG_PH_DOWN);
            mg_in_resid(p, s, xa, p.dout, xb, ly.ln1);
            xi ^= 1;
        }
        mg_gemv<EPI_STORE>(p, l, 0, s, p.proj);
        if (ly.type == 0) { /* LAYER_LINEAR_ATTN */
            DnPre pre;
            if ((int)blockIdx.x < dn_items) dn_load(p, ly, blockIdx.x, s, pre);
            grid_sync(p, s, MG_PH_IN);
            for (int item = blockIdx.x; item < dn_items; item += gridDim.x) {
                if (item != (int)blockIdx.x) {
                    dn_load(p, ly, item, s, pre);
                    cbar();
                }
                dn_compute(p, ly, item, s, pre);
            }
            grid_sync(p, s, MG_PH_DELTANET);
            mg_in_gated(p, ly, s);
        } else {
            att_pre(p, ly, s);
            grid_sync(p, s, MG_PH_IN);
            att_items(p, ly, s);
            grid_sync(p, s, MG_PH_ATTN);
            att_combine(p);
            grid_sync(p, s, MG_PH_COMBINE);
            mg_in_vec(s, p.mix, ly.out_cols);
        }
        mg_gemv<EPI_RAW>(p, l, 1, s, p.aout);
        /* gu: x += aout, mlp = SwiGLU(W_gu norm2(x)) */
        xa = xi ? p.x1 : p.x0, xb = xi ? p.x0 : p.x1;
        grid_sync(p, s, MG_PH_OUT);
        mg_in_resid(p, s, xa, p.aout, xb, ly.ln2);
        xi ^= 1;
        mg_gemv<EPI_SILU>(p, l, 2, s, p.mlp);
        grid_sync(p, s, MG_PH_GU);
        mg_in_vec(s, p.mlp, p.F);
        mg_gemv<EPI_RAW>(p, l, 3, s, p.dout);
    }
    if (threadIdx.x == 0 && p.trace && (int)s.k < p.trace_n) { /* the last phase: no barrier after it */
        unsigned *e = p.trace + ((size_t)s.k * gridDim.x + blockIdx.x) * 8;
        e[0] = (unsigned)(clock64() - s.t0), e[1] = 0, e[2] = (unsigned)s.rwait, e[3] = MG_PH_DOWN;
        e[4] = (unsigned)s.tpro, e[5] = (unsigned)s.tiss;
    }
#else
    (void)p;
#endif
}

/* ---- host ------------------------------------------------------------------------------------ */

extern "C" size_t cuda_mega_work_bytes(int Hq, int hd, int n_sm, int Hkv) {
    const int ns = Hkv > 0 && n_sm / Hkv > 1 ? n_sm / Hkv : 1;
    return sizeof(float) * (size_t)(Hq > 0 ? Hq : 1) * ns * ((size_t)(hd > 0 ? hd : 0) + 2);
}

static int mg_refuse(char *why, size_t n, const char *msg, int code) {
    if (why && n) snprintf(why, n, "%s", msg);
    return code;
}

extern "C" int cuda_mega_prepare(const MegaParams *p, int n_sm, char *why, size_t why_n) {
    const int bad = (int)cudaErrorInvalidValue;
    if (!p || !p->layers || !p->step || !p->embed || !p->bar || p->L < 1 || p->D < 8 || p->D % 8 || p->F % 8 ||
        n_sm < 1)
        return mg_refuse(why, why_n, "missing buffers or D, F not multiples of 8", bad);
    if (p->L > MG_MAX_L) return mg_refuse(why, why_n, "more than 128 layers", bad);
    /* GEMV inputs fit xs; gate/up pieces hold whole pairs; K of every GEMV <= 8192 */
    const int kmax = p->D > p->F ? p->D : p->F;
    if ((size_t)kmax * 4 > MG_BIG || mg_rows_per_piece(p->D) < 2 || p->F > 8192)
        return mg_refuse(why, why_n, "hidden or intermediate size too large for the shared-memory tiles", bad);
    if (p->Hv > 0) { /* DeltaNet: dk <= 256, dv % 4, scratch fits */
        if (p->Hk < 1 || p->Hv % p->Hk || p->dk < 1 || p->dk > 256 || p->dv < 4 || p->dv % 4 ||
            (size_t)p->value_dim * 4 > MG_BIG || (size_t)(6 * p->dk + 6 * DN_COLS + 2 * MG_CW * DN_COLS) * 4 > MG_SMALL)
            return mg_refuse(why, why_n, "DeltaNet shapes (needs dk <= 256, dv % 4 == 0)", bad);
    }
    if (p->Hq > 0) { /* attention: hd 32..256, group scratch fits */
        const int gq = p->Hkv > 0 ? p->Hq / p->Hkv : 0;
        const int GQ = gq % 2 == 0 ? 2 : 1;
        if ((p->hd != 32 && p->hd != 64 && p->hd != 128 && p->hd != 256) || gq < 1 || gq * p->Hkv != p->Hq ||
            p->R < 2 || p->R % 2 || p->R > p->hd || p->nsplit < 1 || !p->work ||
            (size_t)(p->hd + (gq + 1) * p->hd + 8 * MG_CW) * 4 > MG_SMALL || (size_t)8 * GQ * p->hd * 4 > MG_BIG ||
            (size_t)p->attn_dim * 4 > MG_BIG)
            return mg_refuse(why, why_n, "attention shapes (head_dim 32-256, group scratch)", bad);
    }
    cudaError_t e = cudaFuncSetAttribute(mega_step_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MG_SMEM_BYTES);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        char m[160];
        snprintf(m, sizeof m, "shared-memory attribute (%zu bytes): %s", (size_t)MG_SMEM_BYTES, cudaGetErrorString(e));
        return mg_refuse(why, why_n, m, (int)e);
    }
    int per_sm = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mega_step_bf16, MG_CT, MG_SMEM_BYTES);
    if (e != cudaSuccess || per_sm < 1) {
        (void)cudaGetLastError();
        cudaFuncAttributes fa;
        memset(&fa, 0, sizeof fa);
        cudaFuncGetAttributes(&fa, mega_step_bf16);
        char m[200];
        snprintf(m, sizeof m, "occupancy %d blocks/SM (%s; %d registers, %zu B static smem, max %d threads)", per_sm,
                 cudaGetErrorString(e), fa.numRegs, fa.sharedSizeBytes, fa.maxThreadsPerBlock);
        return mg_refuse(why, why_n, m, e != cudaSuccess ? (int)e : (int)cudaErrorInvalidConfiguration);
    }
    return 0;
}

/* n_blocks <= SMs with one block per SM: every block is resident, as the grid barrier needs. */
extern "C" int cuda_mega_step(const MegaParams *p, int n_blocks, const CudaLaunch *l) {
    if (!p || !l || n_blocks < 1) return (int)cudaErrorInvalidValue;
    CudaLaunch nl = *l;
    nl.pdl = 0; /* it writes state the previous step's kernels read: plain stream order */
    return launch_kernel(mega_step_bf16, dim3((unsigned)n_blocks), dim3(MG_CT), MG_SMEM_BYTES, &nl, *p);
}
