/* deltanet_prefill_scan.cuh — kernel 3 of the chunked DeltaNet prefill: the state scan that also computes the chunk
 * outputs, 16 warps. Included by deltanet_prefill.cu only (one translation unit: device code needs no -rdc). */
#ifndef Q35_CUDA_DELTANET_PREFILL_SCAN_CUH
#define Q35_CUDA_DELTANET_PREFILL_SCAN_CUH

/* Shared memory of dn_scan. One stage (double-buffered): K bf16 [128][128] (k^ hi rows 0..63, lo rows 64..127), V
 * slice bf16 [64][16], T2 hi, lo bf16 [64][64], Q [128][128] (q^ hi, lo) and P [128][64] (hi, lo). */
struct DnScanSmem {
    static constexpr int K = 0, V = K + 2 * DN_C * DN_D * 2, TH = V + DN_C * DN_DVS * 2, TL = TH + DN_C * DN_C * 2;
    static constexpr int Q = TL + DN_C * DN_C * 2, P = Q + 2 * DN_C * DN_D * 2;
    static constexpr int STAGE = P + 2 * DN_C * DN_C * 2;
    static constexpr int S = 2 * STAGE;                   /* bf16 [2][128][16]: S = hi + lo */
    static constexpr int R = S + 2 * DN_D * DN_DVS * 2;   /* bf16 [2][64][16]:  R = V - diag(e^gamma) K S, hi + lo */
    static constexpr int VS = R + 2 * DN_C * DN_DVS * 2;  /* bf16 [2][64][16]:  diag(e^(gamma_L - gamma)) V', hi + lo */
    static constexpr int VP = VS + 2 * DN_C * DN_DVS * 2; /* bf16 [2][64][16]:  V', hi + lo */
    static constexpr int BYTES = VP + 2 * DN_C * DN_DVS * 2;
    static constexpr int LO_S = DN_D * DN_DVS * 2, LO_R = DN_C * DN_DVS * 2; /* byte offsets of the lo halves */
};
static_assert(DN_DVS == 16, "the scan's tiles are [rows][16]: 2 swizzled 16-byte chunks per row");

/* split (hi, lo) store of one m16n8 fp32 accumulator tile (rows r0 + g (+8), columns col0 + 2t)
 * into a [rows][16] bf16 tile pair at `base` (lo half `lo` bytes after hi) */
__device__ __forceinline__ void dn_store_split16(uint8_t *base, int lo, const float a[4], int r0, int col0, int g,
                                                 int t) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + g + 8 * h, col = col0 + 2 * t;
        const float x0 = a[2 * h], x1 = a[2 * h + 1];
        *(uint32_t *)(base + swz_off<2>(r, col)) = pack_bf16(x0, x1);
        *(uint32_t *)(base + lo + swz_off<2>(r, col)) = pack_bf16(x0 - rbf(x0), x1 - rbf(x1));
    }
}

/* The tensor maps of the scan's shared loads (cuda_tma_map_bf16, 64-column boxes): k^, q^ hi and lo
 * planes as [Tp][Hk dk] (box 64 rows: one chunk, half a head), T2 and P as [chunks Hv 128][64] (box
 * 128 rows: the hi and lo planes of one (chunk, head)). */
struct DnScanMaps {
    CUtensorMap k, kl, q, ql, t, p;
};
#define DN_SCAN_TX (2 * 2 * DN_C * DN_D * 2 + 2 * 2 * DN_C * DN_C * 2) /* bytes per stage through TMA */

/* Chunk c's K, Q (4 boxes each: hi/lo x column halves), T2 and P (1 box each) into stage st; first arms this
 * block's barrier for the whole stage. */
__device__ __forceinline__ void dn_scan_issue(const DnScanMaps &m, uint32_t st, uint32_t bar, int c, int Hv, int j,
                                              int n) {
    using L = DnScanSmem;
    mbar_arrive_expect_tx(bar, DN_SCAN_TX);
    for (int b = 0; b < 10; b++) {
        const CUtensorMap *mp;
        uint32_t dst;
        int c0 = 0, c1 = (c * Hv + j) * 2 * DN_C;
        if (b < 8) { /* b = 4 (K or Q) + 2 (hi or lo) + column half */
            mp = b < 4 ? ((b & 2) ? &m.kl : &m.k) : ((b & 2) ? &m.ql : &m.q);
            dst = st + (b < 4 ? L::K : L::Q) + ((b >> 1) & 1) * (DN_C * DN_D * 2) + (b & 1) * (DN_C * 64 * 2);
            c0 = n * DN_D + (b & 1) * 64;
            c1 = c * DN_C;
        } else {
            mp = b == 8 ? &m.t : &m.p;
            dst = st + (b == 8 ? L::TH : L::P);
        }
        tma_load_2d(dst, mp, c0, c1, bar);
    }
}
/* chunk c's V slice (this block's 16 columns of head j) by threads tid < 128 */
__device__ __forceinline__ void dn_scan_load_v(const DeltaNetPrefillParams &p, const DeltaNetScratch &sc, uint32_t st,
                                               int c, int j, int e0, int tid) {
    if (tid < DN_C * 2) {
        const int r = tid >> 1, ch = tid & 1;
        cp_async16(st + DnScanSmem::V + swz<2>(r, ch) * 16,
                   sc.v + ((size_t)(c * DN_C + r) * p.Hv + j) * DN_D + e0 + ch * 8, true);
    }
}

/* Warps 0-7 of dn_scan in phase 3: h, l, m (rows sr of S, both n8 tiles) += K^T B, k = the chunk's 64 rows, B the
 * split tile pair at b ([64][16] hi, lo LO_R bytes after): hi x hi into h, hi x lo into l, lo x hi into m. */
__device__ __forceinline__ void dn_kt_mma(uint32_t st, uint32_t b, int sr, int lane, float h[2][4], float l[2][4],
                                          float m[2][4]) {
    using L = DnScanSmem;
#pragma unroll
    for (int kk = 0; kk < DN_C / 16; kk++) {
        uint32_t a[4], al[4], bh[4], bl[4];
        ldsm_x4_t(ldsm_addr_at<SWZ_TMA16>(st + L::K, kk * 16, sr, lane), a);
        ldsm_x4_t(ldsm_addr_at<SWZ_TMA16>(st + L::K, DN_C + kk * 16, sr, lane), al);
        ldsm_x4_t(ldsm_addr_bk<2>(b, kk * 16, 0, lane), bh);
        ldsm_x4_t(ldsm_addr_bk<2>(b + L::LO_R, kk * 16, 0, lane), bl);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            mma_bf16(l[nt], a, bl[2 * nt], bl[2 * nt + 1]);
            mma_bf16(m[nt], al, bh[2 * nt], bh[2 * nt + 1]);
            mma_bf16(h[nt], a, bh[2 * nt], bh[2 * nt + 1]);
        }
    }
}

/* Warps 0-7 of dn_scan in phase 3 of chunk c (S = S_c, v = V', the R tiles free): the state after the first m =
 * pt_off[i] - 64 c rows of the chunk, the chunk-end update cut at row m - 1:
 *   S_pt = e^gamma[m-1] S_c + K^T X,  X[r] = V'[r] e^(gamma[m-1] - gamma[r]) for r < m, 0 below
 * (V' of the first m rows is theirs alone: T2 is lower triangular), X through the R tiles, stored to pt_state[i]. */
__device__ __forceinline__ void dn_scan_point(const DeltaNetPrefillParams &p, uint8_t *smem, uint32_t st_off,
                                              const float S[2][4], const float v[4], const float gr[2], float y0,
                                              float y1, int i, int c, int j, int e0, int wm, int wn, int sr, int g,
                                              int t, int lane) {
    using L = DnScanSmem;
    const int m = dn_pt_off(p, i) - c * DN_C;
    const float gp = m > 0 ? dn_gamma_at(y0, y1, m - 1) : 0.0f; /* m is warp-uniform */
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; e++) x[e] = wm * 16 + g + 8 * (e >> 1) < m ? v[e] * expf(gp - gr[e >> 1]) : 0.0f;
    bar_sync(9, 256); /* the X tiles of an earlier point are read */
    dn_store_split16(smem + L::R, L::LO_R, x, wm * 16, wn * 8, g, t);
    bar_sync(9, 256);
    const float ep = expf(gp);
    float sh[2][4], sl[2][4] = {}, sm[2][4] = {};
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) sh[nt][e] = S[nt][e] * ep;
    const uint32_t sb = smem_addr(smem), st = sb + st_off;
    dn_kt_mma(st, sb + L::R, sr, lane, sh, sl, sm);
    float *dst = dn_pt_state(p, i);
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            dn_state_st2(dn_pt_bf16(p), dst, (size_t)j * DN_D * DN_D + (sr + g + 8 * h) * DN_D + e0 + nt * 8 + 2 * t,
                         make_float2(sh[nt][2 * h] + (sl[nt][2 * h] + sm[nt][2 * h]),
                                     sh[nt][2 * h + 1] + (sl[nt][2 * h + 1] + sm[nt][2 * h + 1])));
}

/* Warps 8-15 of dn_scan<true>: the gated norm of chunk c's rows r0, r0 + 8 (ob: the thread's bf16(O) there, columns
 * col, col + 1 of the head; zz: z of the same) once the head's DN_NSL blocks have all written their sums. */
__device__ __forceinline__ void dn_scan_norm(const DeltaNetPrefillParams &p, const DeltaNetScratch &sc,
                                             const float ob[4], const uint32_t zz[2], const float nw[2], int c, int j,
                                             int r0, int col, int tid) {
    if (tid == 256) wait_count_geq(sc.cnt + c * p.Hv + j, DN_NSL);
    bar_sync(11, 256);
    const float *part = sc.part + (size_t)(c * p.Hv + j) * 2 * DN_NSL * DN_C;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h, tok = c * DN_C + r;
        if (tok >= p.T) continue;
        const float inv = dn_norm_inv(part, r, p.eps);
        const float z0 = __uint_as_float(zz[h] << 16), z1 = __uint_as_float(zz[h] & 0xffff0000u);
        *(uint32_t *)(p.y + ((size_t)tok * p.Hv + j) * DN_D + col) =
            pack_bf16(dn_gate_out(ob[2 * h], inv, nw[0], z0), dn_gate_out(ob[2 * h + 1], inv, nw[1], z1));
    }
}

/* grid (dv/16, Hv) (the column slices of one head along x), 512 threads, one CTA
 * per SM (~218 KB of shared memory: DnScanSmem with K, Q in the SWZ_TMA16 layout, + 2
 * mbarriers). The CTA owns S[:, e0 .. e0+15] of head j: warp w < 8 holds rows 16 w (both n8 tiles)
 * in fp32 registers. The work of a chunk is spread over 16 warps in three phases (three block
 * barriers per chunk) so that the serial chain S_c -> S_c+1 is short:
 *   1. warps 0-7:  X = K S, R = V - diag(e^gamma) X -> split tiles
 *      warps 8-15: the Q S half of O = diag(e^gamma) Q S dk^-1/2 + P V' (kept in registers)
 *      (warp (wm, wn) = (w%4, w/4 % 2): rows 16 wm, k half wn, then n8 tile wn after a swap of
 *      partial sums with its partner: every A element is read from shared memory once)
 *   2. warps 0-7:  V' = T2 R -> diag(e^(gamma_L - gamma)) V' and V' as split tiles (rows 16 wm,
 *                  n8 tile wn)
 *      warps 8-15: the next chunk's loads (one thread: TMA; V: cp.async); NORM: then the gated norm of the
 *                  previous chunk (dn_scan_norm), once the head's other blocks have written their sums
 *   3. warps 0-7:  S <- e^gamma_L S + K^T diag(e^(gamma_L - gamma)) V', snapshot -> split tiles
 *      warps 8-15: O += P V', bf16(O): NORM: its rows' sums of squares over each warp's 8 columns into sc.part,
 *                  and the count of the head's blocks that have written theirs up by one; else bf16(O) into sc.o
 *                  for dn_norm_out
 * NORM needs every block of the grid resident at once (dn_scan_norms): a block waits for the others of its head.
 * Shared-memory reads per chunk (ldmatrix): ~230 KB, half of what an 8 x 8 warp tiling of the same
 * work reads (ncu: the scan is bound by ldmatrix throughput and latency, not by its loads). Before the
 * first chunk the blocks write the call's last K pre-conv rows into the conv ring (dn_conv_bf16_tok,
 * which read the old rows, has finished). */
template <bool NORM>
__global__ void __launch_bounds__(512, 1)
    dn_scan(const __grid_constant__ DeltaNetPrefillParams p, const __grid_constant__ DeltaNetScratch sc,
            const __grid_constant__ DnScanMaps maps) {
    pdl_begin();
    using L = DnScanSmem;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023); /* TMA swizzle: 1024-aligned */
    const uint32_t sb = smem_addr(smem), full = sb + L::BYTES;                 /* full[2]: mbarriers */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const bool xw = warp < 8; /* X / V' warps; the others: Q S, P V', loads */
    const int q8 = warp & 7, wm = q8 & 3, wn = q8 >> 2;
    const int sr = q8 * 16; /* warps 0-7: the S rows they hold */
    const int j = blockIdx.y, e0 = blockIdx.x * DN_DVS, n = j / (p.Hv / p.Hk);
    const int nc = (p.T + DN_C - 1) / DN_C;
    const size_t s0 = (size_t)j * DN_D * DN_D;                /* this head's state: entries s0 .. of p.state */
    const int ocol = e0 + wn * 8 + 2 * t;                     /* warps 8-15: the first of their two output columns */
    const float nw[2] = {p.norm_w[ocol], p.norm_w[ocol + 1]}; /* ... and the norm's weights there */
    float ob[4] = {};    /* warps 8-15: bf16(O) of the last chunk, rows wm 16 + g (+8), columns ocol, ocol + 1 */
    uint32_t zz[2] = {}; /* ... and its z (NORM) */

    { /* conv ring <- the pre-conv rows of the call's last K real positions u, 2 channels per thread: rows of u >= 0
       * from proj, rows of positions pos + u < 0 zero (a call from position 0 leaves the whole ring defined), rows of
       * earlier calls kept */
        const int Tr = p.t_real ? *p.t_real : p.T;
        const int cd = (2 * p.Hk + p.Hv) * DN_D, n2 = p.K * cd / 2;
        for (int i = (blockIdx.y * gridDim.x + blockIdx.x) * 512 + tid; i < n2; i += gridDim.x * gridDim.y * 512) {
            const int r = i / (cd / 2), ch = 2 * i - r * cd, u = Tr - p.K + r, q = p.pos + u;
            if (u < 0 && q >= 0) continue;
            *(uint32_t *)(p.conv_ring + (size_t)((q % p.K + p.K) % p.K) * cd + ch) =
                u >= 0 ? *(const uint32_t *)(p.proj + (size_t)u * p.ld_proj + ch) : 0u;
        }
    }
    if (tid == 0) {
        mbar_init(full, 1), mbar_init(full + 8, 1);
        mbar_init_fence();
    }
    float S[2][4] = {}; /* warps 0-7: rows sr, n8 tiles 0 and 1; a call from position 0 starts from S = 0 */
    if (xw) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
#pragma unroll
            for (int h = 0; h < 2 && p.pos > 0; h++) {
                const float2 v =
                    dn_state_ld2(p.state_bf16, p.state, s0 + (sr + g + 8 * h) * DN_D + e0 + nt * 8 + 2 * t);
                S[nt][2 * h] = v.x, S[nt][2 * h + 1] = v.y;
            }
            dn_store_split16(smem + L::S, L::LO_S, S[nt], sr, nt * 8, g, t);
        }
    }
    __syncthreads();
    if (tid == 256) dn_scan_issue(maps, sb, full, 0, p.Hv, j, n);
    if (!xw) dn_scan_load_v(p, sc, sb, 0, j, e0, tid - 256);
    cp_async_commit();
    float gn0 = sc.g[(size_t)(2 * lane) * p.Hv + j], gn1 = sc.g[(size_t)(2 * lane + 1) * p.Hv + j];

    for (int c = 0; c < nc; c++) {
        const uint32_t st = sb + (c & 1) * L::STAGE;
        mbar_wait(full + (c & 1) * 8, (c >> 1) & 1);
        cp_async_wait<0>();
        __syncthreads();         /* chunk c landed, S_c in smem; everyone is done with chunk c-1 */
        float gL, gr[2], y0, y1; /* gamma_L, gamma of this thread's two tile rows wm*16 + g (+8), the scan */
        dn_chunk_gamma(p, sc, c, nc, j, lane, wm * 16 + g, gn0, gn1, gL, gr, y0, y1);

        /* phase 1: X = K S (A = K) or the Q S half of O (A = Q), 64 x 16; k = dk. Warp (wm, wn)
         * takes rows 16 wm, both n8 tiles, k half wn; the pair (wm, 0), (wm, 1) then swaps the halves
         * of the n8 tiles through shared memory (the VS/VP tiles, free until phase 2), and each
         * finishes n8 tile wn: x = k half 0 + k half 1. */
        float o[4];
        {
            const uint32_t A = st + (xw ? L::K : L::Q);
            float ph[2][4] = {}, pl[2][4] = {}, pm[2][4] = {};
#pragma unroll
            for (int kk = 0; kk < DN_D / 32; kk++) {
                const int k0 = wn * (DN_D / 2) + kk * 16;
                uint32_t a[4], al[4], b[4], bl[4];
                ldsm_x4(ldsm_addr_a<SWZ_TMA16>(A, wm * 16, k0, lane), a);
                ldsm_x4(ldsm_addr_a<SWZ_TMA16>(A, DN_C + wm * 16, k0, lane), al);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::S, k0, 0, lane), b);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::S + L::LO_S, k0, 0, lane), bl);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    mma_bf16(ph[nt], a, b[2 * nt], b[2 * nt + 1]);
                    mma_bf16(pl[nt], a, bl[2 * nt], bl[2 * nt + 1]);
                    mma_bf16(pm[nt], al, b[2 * nt], b[2 * nt + 1]);
                }
            }
            float *xch = (float *)(smem + L::VS); /* [16 warps][4][32] */
            float x[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float mine0 = ph[0][e] + (pl[0][e] + pm[0][e]), mine1 = ph[1][e] + (pl[1][e] + pm[1][e]);
                xch[(warp * 4 + e) * 32 + lane] = wn ? mine0 : mine1; /* the partner's n8 tile */
                x[e] = wn ? mine1 : mine0;
            }
            bar_sync(1 + (warp & 3) + 4 * (warp >> 3), 64);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float other = xch[((warp ^ 4) * 4 + e) * 32 + lane];
                x[e] = wn ? other + x[e] : x[e] + other; /* k half 0 + k half 1 */
            }
            if (xw) { /* R = V - diag(e^gamma) X -> split tiles */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wm * 16 + g + 8 * h, col = wn * 8 + 2 * t;
                    const float eg = expf(gr[h]);
                    const uint32_t vv = *(const uint32_t *)(smem + (st - sb) + L::V + swz_off<2>(r, col));
                    o[2 * h] = __uint_as_float(vv << 16) - eg * x[2 * h];
                    o[2 * h + 1] = __uint_as_float(vv & 0xffff0000u) - eg * x[2 * h + 1];
                }
                dn_store_split16(smem + L::R, L::LO_R, o, wm * 16, wn * 8, g, t);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) o[e] = DN_QSCALE * expf(gr[e >> 1]) * x[e];
            }
        }
        __syncthreads();

        /* phase 2: V' = T2 R (64 x 16; k = the chunk's 64 rows; T2 is lower triangular), warp (wm, wn):
         * rows 16 wm, n8 tile wn */
        float v[4]; /* warps 0-7: V' of the rows and columns above (the snapshot points in phase 3 read it too) */
        if (xw) {
            float vh[4] = {}, vl[4] = {}, vm[4] = {};
#pragma unroll
            for (int kk = 0; kk < DN_C / 16; kk++) {
                if (kk > wm) break; /* warp-uniform */
                uint32_t ah[4], al[4], b[2], bl[2];
                ldsm_x4(ldsm_addr_a<8>(st + L::TH, wm * 16, kk * 16, lane), ah);
                ldsm_x4(ldsm_addr_a<8>(st + L::TL, wm * 16, kk * 16, lane), al);
                ldsm_x2_t(ldsm_addr_bk<2>(sb + L::R, kk * 16, wn * 8, lane), b);
                ldsm_x2_t(ldsm_addr_bk<2>(sb + L::R + L::LO_R, kk * 16, wn * 8, lane), bl);
                mma_bf16(vh, ah, b[0], b[1]);
                mma_bf16(vl, ah, bl[0], bl[1]);
                mma_bf16(vm, al, b[0], b[1]);
            }
            float x[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                v[e] = vh[e] + (vl[e] + vm[e]);
                x[e] = v[e] * expf(gL - gr[e >> 1]);
            }
            dn_store_split16(smem + L::VP, L::LO_R, v, wm * 16, wn * 8, g, t);
            dn_store_split16(smem + L::VS, L::LO_R, x, wm * 16, wn * 8, g, t);
        } else {
            if (c + 1 < nc) {
                const uint32_t nst = sb + ((c + 1) & 1) * L::STAGE;
                if (tid == 256) dn_scan_issue(maps, nst, full + ((c + 1) & 1) * 8, c + 1, p.Hv, j, n);
                dn_scan_load_v(p, sc, nst, c + 1, j, e0, tid - 256);
            }
            if (NORM && c > 0) dn_scan_norm(p, sc, ob, zz, nw, c - 1, j, wm * 16 + g, ocol, tid);
        }
        cp_async_commit();
        __syncthreads();

        if (xw) { /* phase 3, warps 0-7: S <- e^gamma_L S + K^T Vs for rows sr (k = the chunk's 64 rows;
                   * hi x hi into S, the two lo terms into their own accumulators), then the snapshot */
            for (int i = 0, n_pts = dn_n_pts(p); i < n_pts; i++)
                if (dn_pt_off(p, i) / DN_C == c)
                    dn_scan_point(p, smem, st - sb, S, v, gr, y0, y1, i, c, j, e0, wm, wn, sr, g, t, lane);
            const float eL = expf(gL);
            float sl[2][4] = {}, sm[2][4] = {};
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[nt][e] *= eL;
            dn_kt_mma(st, sb + L::VS, sr, lane, S, sl, sm);
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) S[nt][e] += sl[nt][e] + sm[nt][e];
                /* S_c+1 -> split tiles (everyone read S_c before the second barrier) */
                dn_store_split16(smem + L::S, L::LO_S, S[nt], sr, nt * 8, g, t);
            }
        } else { /* phase 3, warps 8-15: O += P V' (P lower triangular) -> bf16(O), its sums of squares */
            float ph[4] = {}, pl[4] = {}, pm[4] = {};
#pragma unroll
            for (int kk = 0; kk < DN_C / 16; kk++) {
                if (kk > wm) break; /* warp-uniform */
                uint32_t a[4], al[4], b[2], bl[2];
                ldsm_x4(ldsm_addr_a<8>(st + L::P, wm * 16, kk * 16, lane), a);
                ldsm_x4(ldsm_addr_a<8>(st + L::P, DN_C + wm * 16, kk * 16, lane), al);
                ldsm_x2_t(ldsm_addr_bk<2>(sb + L::VP, kk * 16, wn * 8, lane), b);
                ldsm_x2_t(ldsm_addr_bk<2>(sb + L::VP + L::LO_R, kk * 16, wn * 8, lane), bl);
                mma_bf16(ph, a, b[0], b[1]);
                mma_bf16(pl, a, bl[0], bl[1]);
                mma_bf16(pm, al, b[0], b[1]);
            }
            float *part = sc.part + ((size_t)(c * p.Hv + j) * 2 * DN_NSL + 2 * blockIdx.x + wn) * DN_C;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wm * 16 + g + 8 * h, tok = c * DN_C + r;
                ob[2 * h] = rbf(o[2 * h] + (ph[2 * h] + (pl[2 * h] + pm[2 * h])));
                ob[2 * h + 1] = rbf(o[2 * h + 1] + (ph[2 * h + 1] + (pl[2 * h + 1] + pm[2 * h + 1])));
                if (!NORM) {
                    *(uint32_t *)(sc.o + ((size_t)tok * p.Hv + j) * DN_D + ocol) = pack_bf16(ob[2 * h], ob[2 * h + 1]);
                    continue;
                }
                float ss = ob[2 * h] * ob[2 * h] + ob[2 * h + 1] * ob[2 * h + 1];
                ss += __shfl_xor_sync(0xffffffffu, ss, 1);
                ss += __shfl_xor_sync(0xffffffffu, ss, 2);
                if (t == 0) part[r] = ss;
                if (tok < p.T)
                    zz[h] = *(const uint32_t *)(p.proj + (size_t)tok * p.ld_proj + p.z_off + j * DN_D + ocol);
            }
            if (NORM) { /* release the sums: each writer's fence, then one add for the block */
                __threadfence();
                bar_sync(10, 256);
                if (tid == 256) atomicAdd(sc.cnt + c * p.Hv + j, 1);
            }
        }
    }
    if (NORM && !xw) dn_scan_norm(p, sc, ob, zz, nw, nc - 1, j, wm * 16 + g, ocol, tid);
    if (xw) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                dn_state_st2(p.state_bf16, p.state, s0 + (sr + g + 8 * h) * DN_D + e0 + nt * 8 + 2 * t,
                             make_float2(S[nt][2 * h], S[nt][2 * h + 1]));
    }
}

#endif
