/* serve_kernels.cu — the batched step's own kernels (serve.cu; contracts in serve_ops.h): q/k norm + RoPE + append
 * into the paged KV pools, paged attention of each row over its own sequence, the DeltaNet decode step over state
 * slots and its gated norm, and a row gather for the LM head. Every CTA works on one row, so a row's values never
 * depend on the other rows of the step (batch invariance). */
#include <limits.h>

#include "cuda/async.cuh"
#include "cuda/attn_prep.cuh"
#include "cuda/common.cuh"
#include "cuda/deltanet.cuh"
#include "cuda/mma.cuh"
#include "cuda/serve_ops.h"

/* ---- paged prep ------------------------------------------------------------------------------------------------ */

/* Address of position pos of kv head i in a pool (see serve_ops.h). */
__device__ __forceinline__ size_t paged_off(const int32_t *tables, int tab, int pos, int i, int Hkv, int block,
                                            int hd) {
    const int b = tables[tab + pos / block];
    return (((size_t)b * Hkv + i) * block + pos % block) * hd;
}

/* grid (T, ceil((Hq + 2 Hkv) / 4)), 128 threads: warp w handles head unit blockIdx.y*4 + w (q heads, k heads, v
 * heads) of row blockIdx.x, at the row's own position and pages (attn_prep.cuh). */
__global__ void __launch_bounds__(128) paged_prep_rows(const __grid_constant__ PagedPrepParams p) {
    Q35_TRACE_T0;
    pdl_begin();
    Q35_TRACE_T1;
    __shared__ float buf[4][256];
    const int warp = threadIdx.x >> 5, unit = blockIdx.y * 4 + warp, t = blockIdx.x, hd = p.hd;
    const uint16_t *row = p.qkv + (size_t)t * p.ld;
    const int pos = p.pos[t], tab = p.tab[t];
    if (unit >= p.Hq + 2 * p.Hkv) {
        /* a warp past the last head unit: nothing (its block's other warps may have one) */
    } else if (unit >= p.Hq + p.Hkv) { /* v */
        const int i = unit - p.Hq - p.Hkv;
        const size_t off = paged_off(p.tables, tab, pos, i, p.Hkv, p.block, hd);
        if (p.kv_fp8)
            head_copy(row + p.v_off + i * hd, (uint8_t *)p.v_pool + off, hd);
        else
            head_copy(row + p.v_off + i * hd, (uint16_t *)p.v_pool + off, hd);
    } else if (unit < p.Hq) {
        head_norm_rope(row + unit * p.q_hs, p.q_norm, hd, p.eps, p.norm_mode, p.inv_freq, p.R, pos, buf[warp],
                       p.q_out + ((size_t)t * p.Hq + unit) * hd);
    } else {
        const uint16_t *k = row + p.k_off + (unit - p.Hq) * hd;
        const size_t off = paged_off(p.tables, tab, pos, unit - p.Hq, p.Hkv, p.block, hd);
        if (p.kv_fp8)
            head_norm_rope(k, p.k_norm, hd, p.eps, p.norm_mode, p.inv_freq, p.R, pos, buf[warp],
                           (uint8_t *)p.k_pool + off);
        else
            head_norm_rope(k, p.k_norm, hd, p.eps, p.norm_mode, p.inv_freq, p.R, pos, buf[warp],
                           (uint16_t *)p.k_pool + off);
    }
    Q35_TRACE_END(92); /* step trace ids (tools/step_trace.py): 90-99 the batched step's kernels */
}

extern "C" int cuda_paged_prep(const PagedPrepParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->hd % 32 || p->hd > 256 || p->hd < 32 || p->R < 2 || p->R % 2 || p->R > p->hd || p->Hq < 1 ||
        (p->norm_mode != NORM_ZC && p->norm_mode != NORM_PLAIN) || p->Hkv < 1 || p->block < 1 || p->T > 2147483647 ||
        (p->Hq + 2 * p->Hkv + 3) / 4 > 65535)
        return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)p->T, (unsigned)((p->Hq + 2 * p->Hkv + 3) / 4));
    return launch_kernel(paged_prep_rows, grid, dim3(128), 0, l, *p);
}

/* ---- paged attention ------------------------------------------------------------------------------------------- */

#define PA_NW   4            /* warps per CTA of the split kernel */
#define PA_TILE (16 * PA_NW) /* positions per shared-memory tile: 16 per warp */
#define PA_GB   8            /* query heads per CTA at most (rows of the mma's 16-row A operand) */
static_assert(PA_NW * 32 == 2 * PA_TILE, "one thread per K or V row of a tile");

/* The q rows take nchp 16-byte chunks of shared memory: hd / 8 rounded up to a multiple of 8, so that chunk c of row
 * r can sit at c ^ (r % 8) (ldmatrix's 8 rows hit 8 different bank groups). */
static __host__ __device__ __forceinline__ int pa_nchp(int hd) { return (hd / 8 + 7) / 8 * 8; }
__device__ __forceinline__ uint32_t pa_sw(int r, int c, int nchp) { return (uint32_t)(r * nchp + (c ^ (r & 7))) * 16u; }
/* A tile row of n 16-byte chunks takes n | 1 of them: with an odd stride the 8 rows that an ldmatrix or a fragment
 * load reads together start in 8 different bank groups, and each row stays one piece, one bulk copy of a pool row. */
static __host__ __device__ __forceinline__ uint32_t pa_rs(int chunks) { return (uint32_t)(chunks | 1) * 16u; }
/* Shared memory of the split kernel (byte offsets): the tile's K rows and V rows as copied from the pools (rows of
 * rs bytes: hd bf16 values or hd e4m3 codes, padded to an odd number of 16-byte chunks), the PA_GB query rows, the
 * mbarrier of the copies. hd 256: 71.6 KB with bf16 pools (three CTAs an SM), 38.9 KB with fp8 pools (four: the
 * registers' limit). */
struct PaLayout {
    uint32_t rs, k, v, q, bar, bytes;
};
static __host__ __device__ __forceinline__ PaLayout pa_layout(int hd, bool f8) {
    PaLayout L;
    L.rs = f8 ? pa_rs(hd / 16) : pa_rs(hd / 8);
    L.k = 0;
    L.v = PA_TILE * L.rs;
    L.q = 2 * PA_TILE * L.rs;
    L.bar = L.q + PA_GB * (uint32_t)pa_nchp(hd) * 16u;
    L.bytes = L.bar + 8;
    return L;
}

/* Split kernel (sm_90): grid (Hq / GB, T, ms), ms = the launch's max_split (serve_ops.h), PA_NW warps. CTA (x, i, s)
 * takes the GB query heads j0 = GB x .. j0 + GB - 1 (GB divides G = Hq / Hkv, GB <= PA_GB), all reading kv head
 * j0 / G, of row t = rows[i], over positions [s chunk, min(len, (s + 1) chunk)), chunk = pa_chunk(len, ms), len =
 * pos[t] + 1 (a CTA past the row's last split exits). The split's positions go through shared memory PA_TILE at a
 * time: thread r < PA_TILE copies position tb + r's K row of the pool, thread PA_TILE + r its V row, each one bulk
 * copy (hd bf16 or e4m3 codes) counted on one mbarrier, a phase per tile; rows past the split are not copied (their
 * scores are masked, their V rows zeroed). Warp w takes rows 16 w .. 16 w + 15 of each tile, on the tensor cores
 * (mma m16n8k16, mma.cuh's fragment layouts, g = lane / 4, t = lane % 4):
 *   scores   S[h][u] = q_h . K_u                A = q (rows h < GB, the rest zero; staged in shared memory), B = K
 *            tile rows
 *            (fp32 sums of exact products), then x = S scale log2(e): base-2 scores, -inf past the split;
 *   softmax  per head over the warp's 16 positions: m' = max(m, max_u x), alpha = 2^(m - m'), p_u = 2^(x_u - m'),
 *            l = alpha l + sum_u p_u (fp32; m' = -inf counts as 0, so a warp without positions keeps o = l = 0);
 *   values   O^T[d][h] = alpha O^T[d][h] + sum_u V_u[d] p_u[h]   A = V^T (ldmatrix.trans of the V tile rows), B =
 *            p^T: the scores' C fragment is p's B fragment as it stands. p enters as two bf16 terms,
 *            p = hi + lo (hi = bf16(p), lo = bf16(p - hi)), so the products carry ~16 bits of p.
 * F8 (fp8 pools, PagedAttnParams.kv_fp8): the rows come as e4m3 codes (hd bytes a row): the scores read the K codes
 * where they landed, on f16 (exact f16 values in the B fragments, one cvt per two codes; q staged as f16), and so
 * do the values: V^T's A fragments are built from 4-byte loads of the V codes (a cvt per two codes and a byte_perm
 * per fragment register, dims permuted within pairs of 16-dim tiles: see the loop), with no widened V tile, so a CTA
 * takes 38.9 KB of shared memory at hd 256 and four run on an SM (71.6 KB and three with bf16 pools); the values'
 * mma runs on f16 (p = hi + lo as f16 terms: ~22 bits of p, the terms below 2^-24 flushed). Each warp reads only its
 * own 16 rows of a tile, so no barrier comes between a tile's copies landing and its values; the next tile's copies
 * go out once every warp is done with the tile.
 * The warps then merge in order w = 0 .. PA_NW - 1 through shared memory into (o = sum 2^(d - M) V unnormalised, M,
 * L = sum 2^(d - M)) per head, written to work[i][j][s][0 .. hd + 1]. With p.early (decode rows: the positions
 * before pos[t] were written by earlier steps), the first tile's copies of those rows go out before the wait on the
 * kernel that appends position pos[t] (paged_prep_rows) and writes q. */
template <bool F8>
__global__ void __launch_bounds__(PA_NW * 32, 4)
    paged_attn_split(const __grid_constant__ PagedAttnParams p, int GB, int ms) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    Q35_TRACE_T0;
    extern __shared__ float sm[];
    uint8_t *pa_sm = (uint8_t *)sm;
    const int i = blockIdx.y, t = p.rows ? p.rows[i] : i, len = p.pos[t] + 1, chunk = pa_chunk(len, ms);
    const int s0 = blockIdx.z * chunk, s1 = min(len, s0 + chunk);
    /* past the row's last split: out without a wait (split 0 of every row waits, so the grid still completes only
     * after the kernel before it, which is what PDL contract 2 guards) */
    if (s0 >= len) return;
    const int j0 = blockIdx.x * GB, kvh = j0 / (p.Hq / p.Hkv), hd = p.hd, block = p.block;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    const int nch = hd / 8, nchp = pa_nchp(hd), nks = hd / 16;
    const PaLayout L = pa_layout(hd, F8);
    const uint32_t base = smem_addr(pa_sm), sk = base + L.k, sv = base + L.v, sq = base + L.q, bar = base + L.bar;
    const int32_t *table = p.tables + p.tab[t];

    /* this thread's copy: row cr of the tile, of K (tid < PA_TILE) or of V; rowb bytes a pool row */
    const uint32_t rowb = (uint32_t)hd * (F8 ? 1u : 2u);
    const int cr = tid % PA_TILE;
    const char *pool = (const char *)(tid < PA_TILE ? p.k_pool : p.v_pool);
    const uint32_t cdst = base + (tid < PA_TILE ? L.k : L.v) + (uint32_t)cr * L.rs;
    auto copy_row = [&](int tb) {
        const int ps = tb + cr;
        if (ps < s1) {
            const int bi = ps / block;
            const size_t row = ((size_t)table[bi] * p.Hkv + kvh) * block + (ps - bi * block);
            bulk_g2s(cdst, pool + row * rowb, rowb, bar);
        }
    };
    /* the tile's bytes, counted by thread 0 (before or after the copies land: the count may go negative) */
    auto expect = [&](int tb) {
        if (tid == 0) mbar_arrive_expect_tx(bar, 2u * rowb * (uint32_t)min(PA_TILE, s1 - tb));
    };
    if (tid == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
    }
    __syncthreads();
    expect(s0);
    const bool last = s0 + cr == len - 1; /* position len - 1: appended by the kernel before */
    if (p.early && !last) copy_row(s0);
    pdl_wait();
    Q35_TRACE_T1;
    if (!p.early || last) copy_row(s0);
    for (int idx = tid; idx < PA_GB * nch; idx += PA_NW * 32) { /* q rows j0 .. j0 + GB - 1, zeros up to PA_GB */
        const int h = idx / nch, c = idx - h * nch;
        const bool ok = h < GB;
        const uint16_t *src = p.q + ((size_t)t * p.Hq + j0 + h) * hd + c * 8;
        if (F8) { /* as f16, for the scores' f16 mma (exact: a normed q row's entries lie within 2^-17 .. 65504) */
            const uint4 v = ok ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u);
            *(uint4 *)(pa_sm + L.q + pa_sw(h, c, nchp)) =
                make_uint4(pack_f16(bf_lo(v.x), bf_hi(v.x)), pack_f16(bf_lo(v.y), bf_hi(v.y)),
                           pack_f16(bf_lo(v.z), bf_hi(v.z)), pack_f16(bf_lo(v.w), bf_hi(v.w)));
        } else {
            cp_async16(sq + pa_sw(h, c, nchp), ok ? src : p.q, ok);
        }
    }
    cp_async_commit();
    cp_async_wait<0>();      /* q (bf16: seen by every thread after the first tile's barrier) */
    if (F8) __syncthreads(); /* q written by plain stores; the F8 tiles have no barrier of their own before use */
    const float qscale = p.scale * 1.4426950408889634f;
    float o[16][4], m = -INFINITY, l = 0.0f; /* m, l: head g's; o: O^T[dim(mt, row)][heads 2 tq, 2 tq + 1] */
#pragma unroll
    for (int mt = 0; mt < 16; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;

    uint32_t phase = 0;
    for (int tb = s0; tb < s1; tb += PA_TILE, phase ^= 1u) {
        const int nv = min(PA_TILE, s1 - tb); /* the tile's rows in the split */
        if (tb > s0 && !F8) {
            __syncthreads(); /* every warp is done with the previous tile */
            expect(tb);
            copy_row(tb);
        }
        if (!F8 && nv < PA_TILE) /* the V rows past the split (not copied: stale bytes) as zeros */
            for (int idx = tid; idx < (PA_TILE - nv) * nch; idx += PA_NW * 32) {
                const int r = nv + idx / nch, c = idx - (idx / nch) * nch;
                *(uint4 *)(pa_sm + L.v + r * L.rs + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
            }
        mbar_wait(bar, phase);
        if (!F8) __syncthreads(); /* the tile's copies landed (every thread waited); the zeros are written */
        const int r0 = 16 * warp;
        float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        if (F8) {
            /* The e4m3 K rows straight from where they landed, with the mma's k index permuted: thread tq's k slots
             * 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9 of step ks take dims 16 ks + 4 tq .. 16 ks + 4 tq + 3, in q's A
             * fragment (one 8-byte load of row g) and in K's B fragment (one 4-byte load of position row g) alike,
             * so each product is the same and only the order the mma sums them in changes. */
            const uint8_t *k8 = pa_sm + L.k + (size_t)(r0 + g) * L.rs + 4 * tq;
            for (int ks = 0; ks < nks; ks++) {
                const uint2 qq = *(const uint2 *)(pa_sm + L.q + pa_sw(g, 2 * ks + (tq >> 1), nchp) + 8 * (tq & 1));
                const uint32_t a[4] = {qq.x, 0u, qq.y, 0u}; /* q rows 8 .. 15: zero */
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const uint32_t w = *(const uint32_t *)(k8 + 8 * nt * L.rs + 16 * ks);
                    mma_f16(sc[nt], a, e4m3x2_f16x2(w), e4m3x2_f16x2(w >> 16));
                }
            }
        } else {
#pragma unroll
            for (int ks = 0; ks < 16; ks++) {
                if (ks >= nks) break;
                uint32_t kb[4], qa[2];
                ldsm_x4(sk + (r0 + (lane & 7) + ((lane >> 4) << 3)) * L.rs + 16 * (2 * ks + ((lane >> 3) & 1)), kb);
                ldsm_x2(sq + pa_sw(lane & 7, 2 * ks + ((lane >> 3) & 1), nchp), qa);
                const uint32_t a[4] = {qa[0], 0u, qa[1], 0u}; /* q rows 8 .. 15: zero */
                mma_bf16(sc[0], a, kb[0], kb[1]);
                mma_bf16(sc[1], a, kb[2], kb[3]);
            }
        }
        float x[4], mx = -INFINITY; /* positions tb + r0 + 8 nt + 2 tq + e, as x[2 nt + e] */
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int ps = tb + r0 + 8 * (e >> 1) + 2 * tq + (e & 1);
            x[e] = ps < s1 ? sc[e >> 1][e & 1] * qscale : -INFINITY;
            mx = fmaxf(mx, x[e]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx), mu = mn == -INFINITY ? 0.0f : mn, alpha = exp2f(m - mu);
        m = mn;
        float pr[4], ps = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) ps += (pr[e] = exp2f(x[e] - mu));
        l = fmaf(l, alpha, ps);
        uint32_t bh[2], bl[2]; /* p = hi + lo: bf16 terms, or f16 terms (~22 bits of p) against the f16 V values */
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            if (F8) {
                bh[nt] = pack_f16(pr[2 * nt], pr[2 * nt + 1]);
                bl[nt] = pack_f16(pr[2 * nt] - f16_lo(bh[nt]), pr[2 * nt + 1] - f16_hi(bh[nt]));
            } else {
                bh[nt] = pack_bf16(pr[2 * nt], pr[2 * nt + 1]);
                bl[nt] = pack_bf16(pr[2 * nt] - bf_lo(bh[nt]), pr[2 * nt + 1] - bf_hi(bh[nt]));
            }
        }
        const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * tq), a1 = __shfl_sync(0xffffffffu, alpha, 8 * tq + 4);
        if (F8) {
            /* The values' A operand V^T straight from the e4m3 V rows, no widened tile: the mma's k slots are the
             * positions of p's B fragment (rows r0 + 2 tq, + 1, + 8, + 9 of the tile), and its M rows are permuted
             * dims: for the pair of 16-dim tiles 2 mp, 2 mp + 1, row g of tile 2 mp + hh takes dim 32 mp + 4 g + 2 hh
             * and row g + 8 dim 32 mp + 4 g + 2 hh + 1. So one 4-byte load per position gives a pair of tiles' dims
             * (one cvt per two codes, then byte_perm pairs the positions), each product and each sum is what a
             * widened tile would give, and only the dims' places in o change (the write below maps them back).
             * Rows past the split read as zero (their bytes are stale). */
            const uint8_t *v8 = pa_sm + L.v + 4 * g;
            const int pr0 = r0 + 2 * tq;
            const bool ok0 = pr0 < nv, ok1 = pr0 + 1 < nv, ok8 = pr0 + 8 < nv, ok9 = pr0 + 9 < nv;
#pragma unroll
            for (int mp = 0; mp < 8; mp++) {
                if (2 * mp >= nks) break;
                const uint32_t w0 = ok0 ? *(const uint32_t *)(v8 + (size_t)pr0 * L.rs + 32 * mp) : 0u;
                const uint32_t w1 = ok1 ? *(const uint32_t *)(v8 + (size_t)(pr0 + 1) * L.rs + 32 * mp) : 0u;
                const uint32_t w8 = ok8 ? *(const uint32_t *)(v8 + (size_t)(pr0 + 8) * L.rs + 32 * mp) : 0u;
                const uint32_t w9 = ok9 ? *(const uint32_t *)(v8 + (size_t)(pr0 + 9) * L.rs + 32 * mp) : 0u;
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const uint32_t c0 = e4m3x2_f16x2(w0 >> (16 * hh)), c1 = e4m3x2_f16x2(w1 >> (16 * hh)),
                                   c8 = e4m3x2_f16x2(w8 >> (16 * hh)), c9 = e4m3x2_f16x2(w9 >> (16 * hh));
                    const uint32_t va[4] = {__byte_perm(c0, c1, 0x5410), __byte_perm(c0, c1, 0x7632),
                                            __byte_perm(c8, c9, 0x5410), __byte_perm(c8, c9, 0x7632)};
                    float *om = o[2 * mp + hh];
                    om[0] *= a0, om[1] *= a1, om[2] *= a0, om[3] *= a1;
                    mma_f16(om, va, bh[0], bh[1]);
                    mma_f16(om, va, bl[0], bl[1]);
                }
            }
            /* every warp is done with the tile's K and V rows: the next tile's copies go out (the CTAs beside this
             * one keep the SM's loads in flight meanwhile) */
            if (tb + PA_TILE < s1) {
                __syncthreads();
                expect(tb + PA_TILE);
                copy_row(tb + PA_TILE);
            }
        } else {
#pragma unroll
            for (int mt = 0; mt < 16; mt++) {
                if (mt >= nks) break;
                o[mt][0] *= a0, o[mt][1] *= a1, o[mt][2] *= a0, o[mt][3] *= a1;
                uint32_t va[4];
                ldsm_x4_t(sv + (r0 + (lane & 7) + ((lane >> 4) << 3)) * L.rs + 16 * (2 * mt + ((lane >> 3) & 1)), va);
                mma_bf16(o[mt], va, bh[0], bh[1]);
                mma_bf16(o[mt], va, bl[0], bl[1]);
            }
        }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);

    /* the warps' (o, m, l) through shared memory (the tiles' space): o [PA_NW][GB][hd], then m, l [PA_NW][PA_GB] */
    __syncthreads();
    float *so = (float *)pa_sm, *smm = so + PA_NW * GB * hd, *sml = smm + PA_NW * PA_GB;
#pragma unroll
    for (int mt = 0; mt < 16; mt++) {
        if (mt >= nks) break;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = 2 * tq + (e & 1),
                      d = F8 ? 32 * (mt >> 1) + 4 * g + 2 * (mt & 1) + (e >> 1) : 16 * mt + g + 8 * (e >> 1);
            if (h < GB) so[(warp * GB + h) * hd + d] = o[mt][e];
        }
    }
    if (tq == 0 && g < GB) smm[warp * PA_GB + g] = m, sml[warp * PA_GB + g] = l;
    __syncthreads();
    /* per head h: M = max_w m_w, the warps' factors f_w = 2^(m_w - M) and L = sum_w f_w l_w, once
     * (sf: f [PA_NW][PA_GB], then M, L [PA_GB]) */
    float *sf = sml + PA_NW * PA_GB, *sM = sf + PA_NW * PA_GB, *sL = sM + PA_GB;
    if (tid < GB) {
        float M = smm[tid], L = 0.0f;
        for (int w = 1; w < PA_NW; w++) M = fmaxf(M, smm[w * PA_GB + tid]);
        for (int w = 0; w < PA_NW; w++) {
            const float f = exp2f(smm[w * PA_GB + tid] - M);
            L = fmaf(sml[w * PA_GB + tid], f, L);
            sf[w * PA_GB + tid] = f;
        }
        sM[tid] = M, sL[tid] = L;
    }
    __syncthreads();
    const size_t ld = (size_t)hd + 2;
    float *ws = p.work + (((size_t)i * p.Hq + j0) * PA_MAX_SPLIT + blockIdx.z) * ld;
    int h = tid / hd, d = tid - h * hd; /* (head, dim) of idx = tid + PA_NW 32 k */
    for (int idx = tid; idx < GB * hd; idx += PA_NW * 32) {
        float acc = 0.0f;
        for (int w = 0; w < PA_NW; w++) acc = fmaf(so[(w * GB + h) * hd + d], sf[w * PA_GB + h], acc);
        float *wg = ws + (size_t)h * PA_MAX_SPLIT * ld;
        wg[d] = acc;
        if (d == 0) wg[hd] = sM[h], wg[hd + 1] = sL[h];
        for (d += PA_NW * 32; d >= hd; d -= hd) h++;
    }
    pdl_trigger(); /* late: the merge's blocks would take registers from this grid's while they wait */
    Q35_TRACE_END(93);
#else
    (void)p, (void)GB, (void)ms;
    __trap(); /* built without sm_90a: the backend opens only on sm_90 devices */
#endif
}

/* Merge kernel: grid (Hq, T), hd threads: head j of row t = rows[i] from its n = ceil(len / chunk) splits, in order:
 *   M = max_s M_s, L = sum_s 2^(M_s - M) L_s, o = sum_s 2^(M_s - M) o_s;  out = bf16(o / L), then the gate. */
__global__ void __launch_bounds__(256) paged_attn_merge(const __grid_constant__ PagedAttnParams p, int ms) {
    Q35_TRACE_T0;
    pdl_begin();
    Q35_TRACE_T1;
    const int i = blockIdx.y, t = p.rows ? p.rows[i] : i, j = blockIdx.x, d = threadIdx.x, hd = p.hd;
    const int len = p.pos[t] + 1, chunk = pa_chunk(len, ms), n = (len + chunk - 1) / chunk;
    const size_t ld = (size_t)hd + 2;
    const float *ws = p.work + ((size_t)i * p.Hq + j) * PA_MAX_SPLIT * ld;
    float M = ws[hd];
    for (int s = 1; s < n; s++) M = fmaxf(M, ws[s * ld + hd]);
    float L = 0.0f, acc = 0.0f;
#pragma unroll 4
    for (int s = 0; s < n; s++) {
        const float f = exp2f(ws[s * ld + hd] - M);
        L = fmaf(ws[s * ld + hd + 1], f, L);
        acc = fmaf(ws[s * ld + d], f, acc);
    }
    float y = rbf(acc * (1.0f / L));
    if (p.gate) y = rbf(y * rbf(sigmoid_acc(bf16u(p.gate[(size_t)t * p.gate_ld + (size_t)j * p.gate_hs + d]))));
    p.out[(size_t)t * p.Hq * hd + (size_t)j * hd + d] = bf16_bits(y);
    Q35_TRACE_END(94);
}

extern "C" int cuda_paged_attn(const PagedAttnParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->hd % 32 || p->hd < 32 || p->hd > 256 || p->Hq < 1 || p->Hkv < 1 || p->Hq % p->Hkv ||
        p->block < 1 || p->T > 65535 || p->n_sm < 0 || !p->work ||
        p->work_floats < paged_attn_work_floats(p->T, p->Hq, p->hd))
        return (int)cudaErrorInvalidValue;
    const int G = p->Hq / p->Hkv;
    int GB = PA_GB;
    while (G % GB) GB--; /* the largest divisor of G up to PA_GB */
    const size_t smem = pa_layout(p->hd, p->kv_fp8).bytes;
    const cudaError_t e =
        p->kv_fp8 ? smem_attr<paged_attn_split<true>>((int)smem) : smem_attr<paged_attn_split<false>>((int)smem);
    if (e != cudaSuccess) return (int)e;
    const int ms = p->n_sm ? pa_max_split(p->T, p->Hq / GB, p->n_sm) : PA_MAX_SPLIT;
    const dim3 grid((unsigned)(p->Hq / GB), (unsigned)p->T, (unsigned)ms);
    int rc = p->kv_fp8 ? launch_ex(paged_attn_split<true>, grid, dim3(PA_NW * 32), smem, 0, l, *p, GB, ms)
                       : launch_ex(paged_attn_split<false>, grid, dim3(PA_NW * 32), smem, 0, l, *p, GB, ms);
    if (rc) return rc;
    return launch_ex(paged_attn_merge, dim3((unsigned)p->Hq, (unsigned)p->T), dim3((unsigned)p->hd), 0, 0, l, *p, ms);
}

/* ---- paged -> contiguous ---------------------------------------------------------------------------------------- */

/* grid (len, Hkv, 2), hd / 8 threads: 8 elements each (16 bytes of bf16, 8 of e4m3). */
__global__ void paged_gather_rows(const __grid_constant__ PagedGatherParams p) {
    pdl_begin();
    const int s = p.start + blockIdx.x, i = blockIdx.y, hd = p.hd;
    char *pool = (char *)(blockIdx.z ? p.v_pool : p.k_pool);
    uint16_t *out = blockIdx.z ? p.v_out : p.k_out;
    const size_t po = paged_off(p.table, 0, s, i, p.Hkv, p.block, hd);
    uint4 *ct = (uint4 *)(out + ((size_t)i * p.stride + s) * hd);
    if (p.kv_fp8) {
        uint2 *pg = (uint2 *)(pool + po);
        for (int e = threadIdx.x; e < hd / 8; e += blockDim.x) {
            if (p.scatter) {
                const uint4 b = ct[e];
                const uint32_t w[4] = {b.x, b.y, b.z, b.w};
                uint32_t q[2] = {0u, 0u};
#pragma unroll
                for (int j = 0; j < 8; j++)
                    q[j >> 2] |= f32_e4m3(bf16u((uint16_t)(w[j >> 1] >> (16 * (j & 1))))) << (8 * (j & 3));
                pg[e] = make_uint2(q[0], q[1]);
            } else {
                const uint2 q = pg[e];
                ct[e] = make_uint4(e4m3x2_bf16x2(q.x), e4m3x2_bf16x2(q.x >> 16), e4m3x2_bf16x2(q.y),
                                   e4m3x2_bf16x2(q.y >> 16));
            }
        }
        return;
    }
    uint4 *pg = (uint4 *)(pool + 2 * po);
    uint4 *dst = p.scatter ? pg : ct;
    const uint4 *src = p.scatter ? ct : pg;
    for (int e = threadIdx.x; e < hd / 8; e += blockDim.x) dst[e] = src[e];
}

extern "C" int cuda_paged_gather(const PagedGatherParams *p, const CudaLaunch *l) {
    if (p->start < 0 || p->start >= p->len || p->len > p->stride || p->Hkv < 1 || p->Hkv > 65535 || p->hd < 8 ||
        p->hd % 8 || p->hd > 8192 || p->block < 1 || ((uintptr_t)p->k_pool & 15) || ((uintptr_t)p->v_pool & 15) ||
        ((uintptr_t)p->k_out & 15) || ((uintptr_t)p->v_out & 15))
        return (int)cudaErrorInvalidValue;
    return launch_kernel(paged_gather_rows, dim3((unsigned)(p->len - p->start), (unsigned)p->Hkv, 2),
                         dim3((unsigned)(p->hd / 8)), 0, l, *p);
}

/* ---- DeltaNet step over slots ---------------------------------------------------------------------------------- */

/* Two launches per layer (one CTA per row and head group, then the state pass), so the conv, norms and gates are done
 * once per row and head instead of once per column split:
 *   dn_batch_prep  grid (Hk, nd): conv over the ring + the new proj row, ring write, q^/k^ with their L2 norms, v,
 *                  beta / decay / k^.q^ -> the row's fp32 workspace (dn_ws_ld floats, layout in serve_ops.h);
 *   the state pass: the dots, delta, o and the update of one head's state per CTA (dn_batch_state_head, dv = 128
 *                  and an even dk <= 128: every Qwen3.5 size), else of a column slice S[dk][NG cols] (dn_batch_state).
 * prep runs with the decode step's thread count (deltanet.cuh dn_shape), so that the norm sums are the step's own (same
 * per-thread fmaf chains and block_sum3 tree). The whole-head pass reads each state row as one 512-byte warp load (256
 * with bf16 states) and sums over rows in its own order; the column-slice pass keeps the decode step's thread / row /
 * column mapping (DN_RPT rows x VEC columns per thread, tpr threads per row), so its o and S are those of the
 * single-sequence decode step (deltanet.cu: same formulas, sums and fmaf order) bit for bit. Either way a row's sums
 * depend on that row alone. */

/* floats per workspace row: q^ [Hk dk], k^ [Hk dk], v [Hv dv], beta [Hv], decay [Hv], kq [Hv]; a multiple of 4 */
static __host__ __device__ __forceinline__ int dn_ws_ld(int Hk, int Hv, int dk, int dv) {
    return (2 * Hk * dk + Hv * dv + 3 * Hv + 3) & ~3;
}

extern "C" size_t cuda_dn_batch_ws_bytes(int nd, int Hk, int Hv, int dk, int dv) {
    return nd < 1 || Hk < 1 ? 0 : sizeof(float) * (size_t)nd * dn_ws_ld(Hk, Hv, dk, dv);
}

/* conv_history's view of one slot's ring */
typedef struct SbConv {
    const float *conv_w;
    const uint16_t *conv_ring;
    int K;
} SbConv;

/* grid (Hk, nd), dn_shape threads, dn_prep_smem bytes. CTA (n, i): k-head n of row rows[i] and its r = Hv / Hk
 * v-heads n r .. n r + r-1.
 * Channels: q n dk + d, k key_dim + n dk + d (d < dk), v 2 key_dim + n r dv + c (c < r dv); each is convolved
 *   c = bf16(silu(bf16(sum_{j<K-1} w[ch][j] m_{pos-K+1+j} + w[ch][K-1] m_pos)))
 * (conv_history + conv_finish), and the ring row pos % K gets m_pos. Then
 *   q^ = q rsqrt(sum q^2 + 1e-6) / sqrt(dk),  k^ = k rsqrt(sum k^2 + 1e-6),  kq = (sum q k) rq rk,
 * and dn_gates per v-head (its b and a from proj, or with ba_w computed here: DnBatchParams). Every channel is read
 * and written by one thread only, and the history rows (positions pos-K+1 .. pos-1) never include row pos % K, so
 * the ring needs no ordering inside the grid. With p.early the history sums and taps of the CTA's 2 dk + r dv
 * channels go into shared memory before the PDL wait (hs: sums, then taps), each read back by the thread that wrote
 * it. */
static size_t dn_prep_smem(const DnBatchParams *p) {
    return p->early ? 2 * sizeof(float) * (size_t)(2 * p->dk + p->Hv / p->Hk * p->dv) : 0;
}
enum { DN_PREP_SMEM_MAX = 48 * 1024 }; /* the dynamic shared memory a launch gets without an attribute */
__global__ void dn_batch_prep(const __grid_constant__ DnBatchParams p) {
    Q35_TRACE_T0;
    extern __shared__ float sm[];
    float *hs = sm;
    __shared__ float red3[96];
    __shared__ float ba[2 * DN_BA_MAX_R];
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, r = Hv / p.Hk, tid = threadIdx.x, nt = blockDim.x;
    const int n = blockIdx.x, i = blockIdx.y;
    const int key_dim = p.Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int row = p.rows[i], slot = p.slot[i], pos = p.pos[row], rc = pos % p.K;
    uint16_t *ring = (uint16_t *)((char *)p.ring0 + (size_t)slot * p.stride), *ring_row = ring + (size_t)rc * conv_dim;
    const uint16_t *proj = p.proj + (size_t)row * p.ld_proj;
    const SbConv cv = {p.conv_w, ring, p.K};
    float *ws = p.ws + (size_t)i * dn_ws_ld(p.Hk, Hv, dk, dv);
    float *wq = ws + n * dk, *wk = ws + key_dim + n * dk, *wv = ws + 2 * key_dim + n * r * dv;
    const int qch0 = n * dk, kch0 = key_dim + n * dk, vch0 = 2 * key_dim + n * r * dv;
    const int nc = 2 * dk + r * dv; /* the CTA's channels in hs: q, k, v */
    if (p.early) {                  /* the loops below, their history sums and taps only */
        for (int d = tid; d < dk; d += nt) {
            hs[d] = conv_history(cv, conv_dim, qch0 + d, rc, &hs[nc + d]);
            hs[dk + d] = conv_history(cv, conv_dim, kch0 + d, rc, &hs[nc + dk + d]);
        }
        for (int c = tid; c < r * dv; c += nt)
            hs[2 * dk + c] = conv_history(cv, conv_dim, vch0 + c, rc, &hs[nc + 2 * dk + c]);
    }
    pdl_begin();
    Q35_TRACE_T1;
    /* the history sum and tap of channel ch, hs entry e (written by this thread above with p.early) */
    auto hist = [&](int e, int ch, float *tap) {
        if (!p.early) return conv_history(cv, conv_dim, ch, rc, tap);
        *tap = hs[nc + e];
        return hs[e];
    };

    float ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
    for (int d = tid; d < dk; d += nt) {
        float tq, tk;
        const float hq = hist(d, qch0 + d, &tq), hk = hist(dk + d, kch0 + d, &tk);
        const float cq = conv_finish(hq, tq, bf16u(proj[qch0 + d])), ck = conv_finish(hk, tk, bf16u(proj[kch0 + d]));
        wq[d] = cq;
        wk[d] = ck;
        ssq = fmaf(cq, cq, ssq);
        ssk = fmaf(ck, ck, ssk);
        sqk = fmaf(cq, ck, sqk);
        ring_row[qch0 + d] = proj[qch0 + d];
        ring_row[kch0 + d] = proj[kch0 + d];
    }
    for (int c = tid; c < r * dv; c += nt) {
        float tv;
        const float hv = hist(2 * dk + c, vch0 + c, &tv);
        wv[c] = conv_finish(hv, tv, bf16u(proj[vch0 + c]));
        ring_row[vch0 + c] = proj[vch0 + c];
    }
    if (p.ba_w) { /* the r b and a values of this CTA's v-heads, one warp per dot, into ba[q] (q < r: b,
                   * else a), published by block_sum3's barrier */
        const uint16_t *h = p.ba_x + (size_t)row * p.ba_k;
        const int lane = tid & 31;
        for (int q = tid >> 5; q < 2 * r; q += nt >> 5) {
            const int wr = q < r ? n * r + q : Hv + n * r + q - r;
            const uint16_t *w = p.ba_w + (size_t)wr * p.ba_k;
            float acc = 0.0f;
            for (int c = 8 * lane; c < p.ba_k; c += 256) {
                const uint4 hv = *(const uint4 *)(h + c), wv = *(const uint4 *)(w + c);
                acc = fmaf(bf_lo(hv.x), bf_lo(wv.x), acc);
                acc = fmaf(bf_hi(hv.x), bf_hi(wv.x), acc);
                acc = fmaf(bf_lo(hv.y), bf_lo(wv.y), acc);
                acc = fmaf(bf_hi(hv.y), bf_hi(wv.y), acc);
                acc = fmaf(bf_lo(hv.z), bf_lo(wv.z), acc);
                acc = fmaf(bf_hi(hv.z), bf_hi(wv.z), acc);
                acc = fmaf(bf_lo(hv.w), bf_lo(wv.w), acc);
                acc = fmaf(bf_hi(hv.w), bf_hi(wv.w), acc);
            }
            acc = warp_sum(acc);
            if (lane == 0) ba[q] = rbf(acc);
        }
    }
    block_sum3(&ssq, &ssk, &sqk, red3);

    const float rq = rsqrtf(ssq + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(ssk + 1e-6f);
    for (int d = tid; d < dk; d += nt) { /* the values this thread wrote above */
        wq[d] *= rq;
        wk[d] *= rk;
    }
    const uint16_t *tail = proj + conv_dim + value_dim;
    float *wg = ws + 2 * key_dim + value_dim; /* beta [Hv], decay [Hv], kq [Hv] */
    for (int jj = tid; jj < r; jj += nt) {
        const int j = n * r + jj;
        const float b = p.ba_w ? ba[jj] : bf16u(tail[j]), a = p.ba_w ? ba[r + jj] : bf16u(tail[Hv + j]);
        dn_gates(b, a, p.dt_bias[j], p.A_log[j], &wg[j], &wg[Hv + j]);
        wg[2 * Hv + j] = sqk * rq * rk;
    }
    Q35_TRACE_END(90);
}

typedef struct SbArgs {
    DnBatchParams p;
    int tpr, cols;
} SbArgs;

/* floats of dynamic shared memory of dn_batch_state: red_m, red_s [nw][NG cols]; dl [NG cols] */
static size_t sb_smem_bytes(const DnShape *s, int ng) {
    return sizeof(float) * (size_t)(2 * (s->threads / 32) + 1) * ng * s->cols;
}

/* grid (ceil(splits / NG), Hv, nd), dn_shape threads. CTA (x, j, i): head j of row rows[i] on slot slot[i], columns
 * e0 = x NG cols .. + NG cols of its state S[dk][dv]. Thread (rl, cg) = (tid / tpr, tid % tpr) holds state rows
 * rl + m nrl (m < DN_RPT, nrl = threads / tpr) at columns e0 + g cols + cg VEC .. + VEC (g < NG): NG groups of
 * the decode step's column split, each reduced exactly as there (dn_state_dots, then the warps in order):
 *   mem = S^T k^,  sq = S^T q^,  delta = beta (v - decay mem),
 *   o = bf16(decay sq + delta kq)  (= S_new^T q^ with S_new = decay S + k^ delta^T),  S <- decay S + k^ delta^T.
 * The state slice is this CTA's only large read; it is issued before the wait on dn_batch_prep (PDL contract 1:
 * state rows of earlier tokens; prep never touches S). */
template <int VEC, int NG>
__global__ void dn_batch_state(const __grid_constant__ SbArgs args) {
    const DnBatchParams &p = args.p;
    extern __shared__ float sm[];
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, cols = args.cols, tpr = args.tpr, ccols = NG * cols;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
    const int j = blockIdx.y, n = j / (Hv / p.Hk), i = blockIdx.z;
    const int e0 = blockIdx.x * ccols, nrl = nt / tpr, cg = tid % tpr, rl = tid / tpr;
    float *red_m = sm, *red_s = red_m + nw * ccols, *dl = red_s + nw * ccols;

    float *Sh = (float *)((char *)p.S0 + (size_t)p.slot[i] * p.stride) + (size_t)j * dk * dv;
    float s[NG][DN_RPT][VEC];
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int c0 = e0 + g * cols + cg * VEC;
#pragma unroll
        for (int m = 0; m < DN_RPT; m++) {
            const int d = rl + m * nrl;
            if (d < dk && c0 < dv)
                ld_vec<VEC>(Sh + (size_t)d * dv + c0, s[g][m]);
            else
#pragma unroll
                for (int v = 0; v < VEC; v++) s[g][m][v] = 0.0f;
        }
    }
    pdl_begin();

    const int key_dim = p.Hk * dk, value_dim = Hv * dv;
    const float *ws = p.ws + (size_t)i * dn_ws_ld(p.Hk, Hv, dk, dv);
    const float *wq = ws + n * dk, *wk = ws + key_dim + n * dk, *wv = ws + 2 * key_dim + j * dv;
    const float *wg = ws + 2 * key_dim + value_dim;
    float kd[DN_RPT], qd[DN_RPT];
#pragma unroll
    for (int m = 0; m < DN_RPT; m++) {
        const int d = rl + m * nrl;
        kd[m] = d < dk ? wk[d] : 0.0f;
        qd[m] = d < dk ? wq[d] : 0.0f;
    }
    const float beta = wg[j], decay = wg[Hv + j], kq = wg[2 * Hv + j];

#pragma unroll
    for (int g = 0; g < NG; g++) {
        float mem[VEC], sq[VEC];
        dn_state_dots<DN_RPT, VEC>(s[g], kd, qd, tpr, mem, sq);
        if (lane < tpr)
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                red_m[wid * ccols + g * cols + cg * VEC + v] = mem[v];
                red_s[wid * ccols + g * cols + cg * VEC + v] = sq[v];
            }
    }
    __syncthreads();
    uint16_t *orow = p.o + (size_t)p.rows[i] * value_dim + (size_t)j * dv;
    for (int c = tid; c < ccols && e0 + c < dv; c += nt) {
        float mm = 0.0f, q = 0.0f;
        for (int w = 0; w < nw; w++) mm += red_m[w * ccols + c], q += red_s[w * ccols + c];
        const float delta = beta * (wv[e0 + c] - decay * mm);
        dl[c] = delta;
        orow[e0 + c] = bf16_bits(fmaf(delta, kq, decay * q));
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int c0 = e0 + g * cols + cg * VEC;
#pragma unroll
        for (int m = 0; m < DN_RPT; m++) {
            const int d = rl + m * nrl;
            if (d < dk && c0 < dv) {
                float t[VEC];
#pragma unroll
                for (int v = 0; v < VEC; v++) t[v] = fmaf(kd[m], dl[g * cols + cg * VEC + v], decay * s[g][m][v]);
                st_vec<VEC>(Sh + (size_t)d * dv + c0, t);
            }
        }
    }
}

/* One output of the gated RMSNorm (DnBatchParams.y): bf16(bf16(w bf16(o rstd)) silu(z)), o and z bf16 values. */
__device__ __forceinline__ uint16_t dn_gated_y(float o, float rstd, float w, float z) {
    return bf16_bits(rbf(w * rbf(o * rstd)) * silu_acc(z));
}

/* The whole-head state pass (sm_90; dv = 128, dk <= 128 and even): a persistent grid of min(Hv nd, p.n_sm) CTAs, 256
 * threads, one CTA per SM. Item t is head j = t % Hv of row rows[i], i = t / Hv (so the CTAs side by side stream
 * neighbouring heads of a slot); CTA b takes items b, b + grid, ... Thread 0 keeps the states S[dk][128] of its next
 * DN_SP_STAGES items in flight as bulk copies (dk x 512 B each; dk x 256 B with bf16 states, read and stored through
 * dn_sp_ld4 / dn_sp_st4) into a ring in shared memory. Per item, lane l of warp
 * w takes columns 4 l .. 4 l + 3 of rows w + 8 m (m < 16, rows past dk zero):
 *   mem = S^T k^, sq = S^T q^ (each lane over its rows in order of m, then the 8 warps in order through shared memory),
 *   delta = beta (v - decay mem), o = bf16(decay sq + delta kq) (= S_new^T q^), S <- decay S + k^ delta^T.
 * The new S is stored from registers row by row, each store followed by the load of the same row of the next item from
 * the ring and its share of that item's dots, so an SM's stores drain while it computes the next item (a CTA that
 * stored everything before reading on would leave DRAM idle for its compute, the ring being full). One barrier per
 * item: after it every thread has read the item's stage (refilled then) and written its dots (the cross-warp sums
 * alternate between two buffers, so the next item's writes cannot overtake this item's reads). With p.y, warp 0
 * (which holds the head's 128 o values, 4 per lane) also applies the gated norm: the sum of o^2 over its lanes (each
 * lane's 4 in order, then warp_sum), y = dn_gated_y(o, rstd, w, z). The first DN_SP_STAGES states are the only reads
 * before the wait (PDL contract 1: state rows of earlier tokens). A row's sums depend on that row alone, whatever the
 * grid. */
#define DN_SP_STAGES 3
/* the ring (one head's state S[dk][128] of es-byte entries per stage), then one mbarrier per stage */
static int dn_sp_smem(int dk, int es) { return DN_SP_STAGES * (dk * 128 * es + 8); }

/* A state entry as the slots store it: fp32, or bf16 (DnBatchParams.state_bf16). Four consecutive columns are one
 * float4 or one uint2; a bf16 store rounds to nearest even. */
__device__ __forceinline__ float4 dn_sp_ld4(const float *s) { return *(const float4 *)s; }
__device__ __forceinline__ float4 dn_sp_ld4(const uint16_t *s) {
    const uint2 u = *(const uint2 *)s;
    return make_float4(bf_lo(u.x), bf_hi(u.x), bf_lo(u.y), bf_hi(u.y));
}
__device__ __forceinline__ void dn_sp_st4(float *s, float4 v) { *(float4 *)s = v; }
__device__ __forceinline__ void dn_sp_st4(uint16_t *s, float4 v) {
    *(uint2 *)s = make_uint2((uint32_t)bf16_bits(v.x) | (uint32_t)bf16_bits(v.y) << 16,
                             (uint32_t)bf16_bits(v.z) | (uint32_t)bf16_bits(v.w) << 16);
}

/* The small operands of item t for lane `lane` of warp w (see dn_batch_state_head): kq_lane = k^ at row w + 8 lane
 * (lanes 0-15) or q^ at row w + 8 (lane - 16) (lanes 16-31), zero past dk, read back by shuffles; v at columns
 * 4 lane .. 4 lane + 3; beta / decay / kq; the item's output row and state; z at those columns (warp 0, with the
 * gated norm). Loaded an item ahead, so that their L2 round trips are not on the item's path. */
template <typename T>
struct DnSpItem {
    float kq_lane;
    float4 v;
    float beta, decay, kq;
    uint2 z;
    int row;
    T *S;
};

/* The state S[dk][128] of item t: head t % Hv of slot slot[t / Hv] */
template <typename T>
__device__ __forceinline__ T *dn_sp_state(const DnBatchParams &p, int t) {
    const int i = t / p.Hv, j = t - i * p.Hv;
    return (T *)((char *)p.S0 + (size_t)p.slot[i] * p.stride) + (size_t)j * p.dk * 128;
}

template <typename T>
__device__ __forceinline__ void dn_sp_operands(const DnBatchParams &p, int t, int w, int lane, DnSpItem<T> *it) {
    const int dk = p.dk, i = t / p.Hv, j = t - i * p.Hv, n = j / (p.Hv / p.Hk), key_dim = p.Hk * dk;
    const float *ws = p.ws + (size_t)i * dn_ws_ld(p.Hk, p.Hv, dk, 128);
    const float *wg = ws + 2 * key_dim + p.Hv * 128;
    const int d = w + 8 * (lane & 15);
    it->kq_lane = d < dk ? ws[(lane < 16 ? key_dim : 0) + n * dk + d] : 0.0f;
    it->v = *(const float4 *)(ws + 2 * key_dim + j * 128 + 4 * lane);
    it->beta = wg[j];
    it->decay = wg[p.Hv + j];
    it->kq = wg[2 * p.Hv + j];
    it->row = p.rows[i];
    it->z = p.y && w == 0
                ? *(const uint2 *)(p.proj + (size_t)it->row * p.ld_proj + p.z_off + (size_t)j * 128 + 4 * lane)
                : make_uint2(0u, 0u);
    it->S = dn_sp_state<T>(p, t);
}

/* s[m] = this lane's row w + 8 m of the state in ring stage `stage` (zero past dk), and its dots with k^ and q^
 * (kq_lane of DnSpItem) added to *mm, *qq in order of m; before each row is overwritten, `store` is called with m
 * (the previous item's row m goes out there). */
template <typename T, typename Store>
__device__ __forceinline__ void dn_sp_rows(const T *stage, int dk, int w, int lane, float kq_lane, float4 (&s)[16],
                                           float4 *mm, float4 *qq, Store store) {
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
#pragma unroll
    for (int m = 0; m < 16; m++) {
        store(m);
        s[m] = w + 8 * m < dk ? dn_sp_ld4(stage + (w + 8 * m) * 128 + 4 * lane) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float kv = __shfl_sync(0xffffffffu, kq_lane, m), q = __shfl_sync(0xffffffffu, kq_lane, 16 + m);
        a = make_float4(fmaf(s[m].x, kv, a.x), fmaf(s[m].y, kv, a.y), fmaf(s[m].z, kv, a.z), fmaf(s[m].w, kv, a.w));
        b = make_float4(fmaf(s[m].x, q, b.x), fmaf(s[m].y, q, b.y), fmaf(s[m].z, q, b.z), fmaf(s[m].w, q, b.w));
    }
    *mm = a;
    *qq = b;
}

template <typename T>
__global__ void __launch_bounds__(256, 1) dn_batch_state_head(const __grid_constant__ DnBatchParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    Q35_TRACE_T0;
    extern __shared__ float sm[];
    __shared__ float4 red_m[2][8][32], red_s[2][8][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, dk = p.dk, tid = threadIdx.x;
    const int items = p.Hv * p.nd, G = gridDim.x, value_dim = p.Hv * 128;
    const uint32_t bytes = (uint32_t)dk * 128u * (uint32_t)sizeof(T), sbase = smem_addr(sm),
                   fbar = sbase + DN_SP_STAGES * bytes;
    auto fetch = [&](int t, int st) {
        mbar_arrive_expect_tx(fbar + 8 * st, bytes);
        bulk_g2s(sbase + st * bytes, dn_sp_state<T>(p, t), bytes, fbar + 8 * st);
    };
    auto stage = [&](int k) {
        mbar_wait(fbar + 8 * (k % DN_SP_STAGES), (uint32_t)(k / DN_SP_STAGES) & 1u);
        return (const T *)sm + (size_t)(k % DN_SP_STAGES) * dk * 128;
    };
    if (tid == 0) {
        for (int st = 0; st < DN_SP_STAGES; st++) mbar_init(fbar + 8 * st, 1);
        mbar_init_fence();
        for (int st = 0; st < DN_SP_STAGES; st++)
            if ((int)blockIdx.x + st * G < items) fetch(blockIdx.x + st * G, st);
    }
    __syncthreads();
    const float4 nw = p.y && w == 0 ? *(const float4 *)(p.norm_w + 4 * lane) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    pdl_begin();
    Q35_TRACE_T1;
    DnSpItem<T> cu;
    dn_sp_operands(p, blockIdx.x, w, lane, &cu);
    float4 s[16], mm, qq;
    dn_sp_rows(stage(0), dk, w, lane, cu.kq_lane, s, &mm, &qq, [](int) {});
    for (int k = 0, t = blockIdx.x; t < items; k++, t += G) {
        const bool more = t + G < items;
        DnSpItem<T> nx;
        if (more) dn_sp_operands(p, t + G, w, lane, &nx);
        red_m[k & 1][w][lane] = mm;
        red_s[k & 1][w][lane] = qq;
        __syncthreads(); /* every thread has read stage k and written its dots */
        if (tid == 0 && t + DN_SP_STAGES * G < items) fetch(t + DN_SP_STAGES * G, k % DN_SP_STAGES);
        mm = red_m[k & 1][0][lane], qq = red_s[k & 1][0][lane];
#pragma unroll
        for (int u = 1; u < 8; u++) {
            const float4 a = red_m[k & 1][u][lane], b = red_s[k & 1][u][lane];
            mm = make_float4(mm.x + a.x, mm.y + a.y, mm.z + a.z, mm.w + a.w);
            qq = make_float4(qq.x + b.x, qq.y + b.y, qq.z + b.z, qq.w + b.w);
        }
        const float beta = cu.beta, decay = cu.decay, kq = cu.kq;
        const float4 v = cu.v;
        const float4 dl = make_float4(beta * (v.x - decay * mm.x), beta * (v.y - decay * mm.y),
                                      beta * (v.z - decay * mm.z), beta * (v.w - decay * mm.w));
        const int j = t % p.Hv;
        if (w == 0) {
            const size_t row = (size_t)cu.row;
            uint16_t *orow = p.o + row * value_dim + (size_t)j * 128 + 4 * lane;
            const float o0 = rbf(fmaf(dl.x, kq, decay * qq.x)), o1 = rbf(fmaf(dl.y, kq, decay * qq.y)),
                        o2 = rbf(fmaf(dl.z, kq, decay * qq.z)), o3 = rbf(fmaf(dl.w, kq, decay * qq.w));
            orow[0] = bf16_bits(o0);
            orow[1] = bf16_bits(o1);
            orow[2] = bf16_bits(o2);
            orow[3] = bf16_bits(o3);
            if (p.y) {
                const float ss = warp_sum(fmaf(o3, o3, fmaf(o2, o2, fmaf(o1, o1, o0 * o0))));
                const float rstd = rsqrtf(ss / 128.0f + p.eps);
                uint16_t *yrow = p.y + row * value_dim + (size_t)j * 128 + 4 * lane;
                yrow[0] = dn_gated_y(o0, rstd, nw.x, bf_lo(cu.z.x));
                yrow[1] = dn_gated_y(o1, rstd, nw.y, bf_hi(cu.z.x));
                yrow[2] = dn_gated_y(o2, rstd, nw.z, bf_lo(cu.z.y));
                yrow[3] = dn_gated_y(o3, rstd, nw.w, bf_hi(cu.z.y));
            }
        }
        T *Sh = cu.S;
        const float kql = cu.kq_lane;
        /* row w + 8 m of this item's new state */
        auto store = [&](int m) {
            const float kv = __shfl_sync(0xffffffffu, kql, m);
            if (w + 8 * m < dk)
                dn_sp_st4(Sh + (size_t)(w + 8 * m) * 128 + 4 * lane,
                          make_float4(fmaf(kv, dl.x, decay * s[m].x), fmaf(kv, dl.y, decay * s[m].y),
                                      fmaf(kv, dl.z, decay * s[m].z), fmaf(kv, dl.w, decay * s[m].w)));
        };
        if (more) {
            dn_sp_rows(stage(k + 1), dk, w, lane, nx.kq_lane, s, &mm, &qq, store);
            cu = nx;
        } else {
#pragma unroll
            for (int m = 0; m < 16; m++) store(m);
        }
    }
    Q35_TRACE_END(91);
#else
    (void)p;
    __trap(); /* built without sm_90a: the backend runs only on sm_90 devices */
#endif
}

/* The gated norm after a column-slice state pass (DnBatchParams.y): grid (Hv, nd), 128 threads. */
__global__ void __launch_bounds__(128) dn_gated_norm_rows(const __grid_constant__ DnBatchParams p) {
    pdl_begin();
    __shared__ float red[32];
    const int j = blockIdx.x, row = p.rows[blockIdx.y], dv = p.dv;
    const uint16_t *o = p.o + (size_t)row * p.Hv * dv + (size_t)j * dv;
    const uint16_t *z = p.proj + (size_t)row * p.ld_proj + p.z_off + (size_t)j * dv;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dv; c += 128) ss = fmaf(bf16u(o[c]), bf16u(o[c]), ss);
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / (float)dv + p.eps);
    uint16_t *y = p.y + (size_t)row * p.Hv * dv + (size_t)j * dv;
    for (int c = threadIdx.x; c < dv; c += 128) y[c] = dn_gated_y(bf16u(o[c]), rstd, p.norm_w[c], bf16u(z[c]));
}

extern "C" int cuda_dn_batch_step(const DnBatchParams *p, const CudaLaunch *l) {
    DnShape sh;
    if (!p || !l || !p->proj || !p->conv_w || !p->A_log || !p->dt_bias || !p->S0 || !p->ring0 || !p->rows || !p->slot ||
        !p->pos || !p->o || !p->ws || ((uintptr_t)p->ws & 15) || p->nd < 1 || p->nd > 65535 || p->Hk < 1 || p->Hv < 1 ||
        p->Hv % p->Hk || p->K < 1 || p->Hk > 65535 || p->Hv > 65535 || p->n_sm < 1 || dn_shape(p->dk, p->dv, &sh) ||
        (p->y && (!p->norm_w || p->z_off < 0)) ||
        (p->ba_w && (!p->ba_x || p->Hv / p->Hk > DN_BA_MAX_R || p->ba_k < 8 || p->ba_k % 8 ||
                     ((uintptr_t)p->ba_w & 15) || ((uintptr_t)p->ba_x & 15))))
        return (int)cudaErrorInvalidValue;
    const dim3 block((unsigned)sh.threads, 1, 1);
    DnBatchParams pp = *p;
    if (dn_prep_smem(&pp) > DN_PREP_SMEM_MAX) pp.early = 0; /* no Qwen3.5 size: the history after the wait */
    int rc = p->skip & 1 ? 0
                         : launch_kernel(dn_batch_prep, dim3((unsigned)p->Hk, (unsigned)p->nd), block,
                                         dn_prep_smem(&pp), l, pp);
    if (rc || (p->skip & 2)) return rc;
    /* the whole-head pass (dk even: v's float4 loads are aligned) applies the gated norm itself where its z and weight
     * loads are aligned; otherwise dn_gated_norm_rows runs after the state pass */
    const bool whole = p->dv == 128 && p->dk <= 128 && p->dk % 2 == 0;
    if (p->state_bf16 && !whole) return (int)cudaErrorInvalidValue;
    const bool fuse = whole && p->y && !((uintptr_t)p->norm_w & 15) && !((uintptr_t)p->proj & 7) &&
                      p->ld_proj % 4 == 0 && p->z_off % 4 == 0;
    DnBatchParams q = *p;
    if (!fuse) q.y = NULL;
    if (whole) {
        const int smem = dn_sp_smem(p->dk, p->state_bf16 ? 2 : 4), items = p->Hv * p->nd;
        const dim3 grid((unsigned)(items < p->n_sm ? items : p->n_sm));
        /* the largest carveout: the next kernel's CTAs may fit beside (GemmParams.narrow) */
        const cudaError_t e = p->state_bf16 ? smem_attr<dn_batch_state_head<uint16_t>, true>(smem)
                                            : smem_attr<dn_batch_state_head<float>, true>(smem);
        if (e != cudaSuccess) return (int)e;
        rc = p->state_bf16 ? launch_kernel(dn_batch_state_head<uint16_t>, grid, dim3(256), smem, l, q)
                           : launch_kernel(dn_batch_state_head<float>, grid, dim3(256), smem, l, q);
    } else {
        SbArgs a;
        a.p = q;
        a.tpr = sh.tpr;
        a.cols = sh.cols;
        /* two column groups per CTA when the splits pair up: half the CTAs, twice the state loads in flight per
         * thread */
        const int ng = sh.splits % 2 == 0 ? 2 : 1;
        const dim3 grid((unsigned)(sh.splits / ng), (unsigned)p->Hv, (unsigned)p->nd);
        const size_t smem = sb_smem_bytes(&sh, ng);
        if (sh.vec == 4)
            rc = ng == 2 ? launch_kernel(dn_batch_state<4, 2>, grid, block, smem, l, a)
                         : launch_kernel(dn_batch_state<4, 1>, grid, block, smem, l, a);
        else
            rc = ng == 2 ? launch_kernel(dn_batch_state<1, 2>, grid, block, smem, l, a)
                         : launch_kernel(dn_batch_state<1, 1>, grid, block, smem, l, a);
    }
    if (rc || !p->y || fuse) return rc;
    return launch_kernel(dn_gated_norm_rows, dim3((unsigned)p->Hv, (unsigned)p->nd), dim3(128), 0, l, *p);
}

/* grid n, 128 threads. */
__global__ void __launch_bounds__(128) gather_rows_f32(const __grid_constant__ GatherRowsParams p) {
    Q35_TRACE_T0;
    pdl_begin();
    Q35_TRACE_T1;
    const float *x = p.x + (size_t)p.rows[blockIdx.x] * p.D;
    float *y = p.y + (size_t)blockIdx.x * p.D;
    for (int i = threadIdx.x; i < p.D; i += 128) y[i] = x[i];
    Q35_TRACE_END(95);
}

extern "C" int cuda_gather_rows(const GatherRowsParams *p, const CudaLaunch *l) {
    if (p->n < 1 || p->D < 1) return (int)cudaErrorInvalidValue;
    return launch_kernel(gather_rows_f32, dim3((unsigned)p->n), dim3(128), 0, l, *p);
}

/* ---- the greedy pick of the logits rows -------------------------------------------------------------------------- */

#define AM_NT 256 /* threads per CTA: AM_CHUNK / AM_NT = 16 loads in flight per thread */

/* grid (ceil(n_valid / AM_CHUNK), rows), AM_NT threads: chunk c of row r (columns c AM_CHUNK .. + AM_CHUNK - 1 below
 * n_valid) -> its best (value, index) at work [r][c]. */
__global__ void __launch_bounds__(AM_NT) rows_argmax_part(const __grid_constant__ RowsArgmaxParams p) {
    Q35_TRACE_T0;
    __shared__ ArgMax am_s[AM_NT / 32];
    const int r = blockIdx.y, nch = gridDim.x, c0 = blockIdx.x * AM_CHUNK, c1 = min(p.n_valid, c0 + AM_CHUNK);
    const float *x = p.x + (size_t)r * p.cols;
    pdl_wait();
    Q35_TRACE_T1;
    float v[AM_CHUNK / AM_NT];
#pragma unroll
    for (int k = 0; k < AM_CHUNK / AM_NT; k++) {
        const int i = c0 + k * AM_NT + (int)threadIdx.x;
        v[k] = i < c1 ? x[i] : 0.0f;
    }
    ArgMax best = {-INFINITY, INT_MAX};
#pragma unroll
    for (int k = 0; k < AM_CHUNK / AM_NT; k++) {
        const int i = c0 + k * AM_NT + (int)threadIdx.x;
        if (i < c1) best = argmax_better(best, ArgMax{v[k], i});
    }
    best = warp_argmax(best);
    if ((threadIdx.x & 31) == 0) am_s[threadIdx.x >> 5] = best;
    __syncthreads();
    ArgMax b = am_s[0];
    for (int w = 1; w < AM_NT / 32; w++) b = argmax_better(b, am_s[w]);
    /* the chunk's sum of exp(x - its max), in a fixed order: each thread's values, warp trees, warps in order */
    const float cm = b.v;
    float e = 0.0f;
#pragma unroll
    for (int k = 0; k < AM_CHUNK / AM_NT; k++) {
        const int i = c0 + k * AM_NT + (int)threadIdx.x;
        if (i < c1) e += expf(v[k] - cm); /* a NaN anywhere makes the row's logprob NaN, as on the host */
    }
    e = warp_sum(e);
    __shared__ float es[AM_NT / 32];
    if ((threadIdx.x & 31) == 0) es[threadIdx.x >> 5] = e;
    __syncthreads();
    pdl_trigger();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < AM_NT / 32; w++) sum += es[w];
        float *val = (float *)p.work;
        int *idx = (int *)(val + (size_t)p.rows * nch);
        float *sums = (float *)(idx + (size_t)p.rows * nch);
        val[(size_t)r * nch + blockIdx.x] = b.v;
        idx[(size_t)r * nch + blockIdx.x] = b.i;
        sums[(size_t)r * nch + blockIdx.x] = sum;
    }
    Q35_TRACE_END(96);
}

/* grid rows, one warp: the row's nch chunk bests -> out[r] (INT_MAX, i.e. every value NaN: 0, as sampler_argmax). */
__global__ void __launch_bounds__(32) rows_argmax_final(const __grid_constant__ RowsArgmaxParams p, int nch) {
    Q35_TRACE_T0;
    pdl_wait();
    Q35_TRACE_T1;
    const int r = blockIdx.x;
    const float *val = (const float *)p.work;
    const int *idx = (const int *)(val + (size_t)p.rows * nch);
    ArgMax b = {-INFINITY, INT_MAX};
    for (int c = threadIdx.x; c < nch; c += 32)
        b = argmax_better(b, ArgMax{val[(size_t)r * nch + c], idx[(size_t)r * nch + c]});
    b = warp_argmax(b);
    if (p.lp) { /* every lane holds the row's max b.v: the chunk sums rescaled to it, lanes then a fixed tree */
        const float *sums = (const float *)(idx + (size_t)p.rows * nch);
        float s = 0.0f;
        for (int c = threadIdx.x; c < nch; c += 32) {
            s += sums[(size_t)r * nch + c] * expf(val[(size_t)r * nch + c] - b.v);
        }
        s = warp_sum(s);
        if (threadIdx.x == 0) p.lp[r] = -logf(s);
    }
    pdl_trigger();
    if (threadIdx.x == 0) p.out[r] = b.i == INT_MAX ? 0 : b.i;
    Q35_TRACE_END(97);
}

extern "C" int cuda_rows_argmax(const RowsArgmaxParams *p, const CudaLaunch *l) {
    if (!p->x || !p->out || p->rows < 1 || p->rows > 65535 || p->cols < 1 || p->n_valid < 1 || p->n_valid > p->cols ||
        !p->work || p->work_bytes < rows_argmax_work_bytes(p->rows, p->n_valid))
        return (int)cudaErrorInvalidValue;
    const int nch = (p->n_valid + AM_CHUNK - 1) / AM_CHUNK;
    const int rc = launch_kernel(rows_argmax_part, dim3((unsigned)nch, (unsigned)p->rows), dim3(AM_NT), 0, l, *p);
    if (rc) return rc;
    return launch_ex(rows_argmax_final, dim3((unsigned)p->rows), dim3(32), 0, 0, l, *p, nch);
}

extern "C" int cuda_rows_argmax_final(const RowsArgmaxParams *p, const CudaLaunch *l) {
    if (!p->out || p->rows < 1 || p->rows > 65535 || p->n_valid < 1 || !p->work ||
        p->work_bytes < gemm_argmax_work_bytes(p->rows, p->n_valid))
        return (int)cudaErrorInvalidValue;
    const int nch = (p->n_valid + GEMM_AM_CHUNK - 1) / GEMM_AM_CHUNK;
    return launch_ex(rows_argmax_final, dim3((unsigned)p->rows), dim3(32), 0, 0, l, *p, nch);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_serve)
