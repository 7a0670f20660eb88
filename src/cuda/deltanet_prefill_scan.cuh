/* deltanet_prefill_scan.cuh — kernel 3 of the chunked DeltaNet prefill with the output fused in
 * (DeltaNetPrefillParams.fuse_out): the state scan that also computes the chunk outputs, 16 warps.
 * Included by deltanet_prefill.cu only (one translation unit: device code needs no -rdc). */
#ifndef Q35_CUDA_DELTANET_PREFILL_SCAN_CUH
#define Q35_CUDA_DELTANET_PREFILL_SCAN_CUH

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
    int dbg; /* timing experiments only (QWEN35_DN_SCAN_DBG; results are garbage): 1 no mma, 2 no loads */
};
#define DN_SCAN_TX (2 * 2 * DN_C * DN_D * 2 + 2 * 2 * DN_C * DN_C * 2) /* bytes per stage through TMA */

/* Chunk c's K, Q (4 boxes each: hi/lo x column halves), T2 and P (1 box each) into stage st: block
 * `rank` of the cluster issues boxes rank, rank + CL, ... of the 10, each delivered to all CL blocks
 * (the CL column slices of head j share them); first arms this block's barrier for the whole stage. */
template <int CL>
__device__ __forceinline__ void dn_scan_issue(const DnScanMaps &m, uint32_t st, uint32_t bar, int c, int Hv, int j,
                                              int n, int rank) {
    using L = DnScanSmem<true>;
    mbar_arrive_expect_tx(bar, DN_SCAN_TX);
    for (int b = rank; b < 10; b += CL) {
        const CUtensorMap *mp;
        uint32_t dst;
        int c0 = 0, c1 = (c * Hv + j) * 2 * DN_C;
        if (b < 8) { /* b = 4 (K or Q) + 2 (hi or lo) + column half */
            mp = b < 4 ? ((b & 2) ? &m.kl : &m.k) : ((b & 2) ? &m.ql : &m.q);
            dst = st + (b < 4 ? L::K : L::Q) + ((b >> 1) & 1) * (DN_C * DN_D * 2) + (b & 1) * (DN_C * 64 * 2);
            c0 = n * DN_D + (b & 1) * 64, c1 = c * DN_C;
        } else {
            mp = b == 8 ? &m.t : &m.p;
            dst = st + (b == 8 ? L::TH : L::P);
        }
        if (CL > 1) tma_load_2d_mc(dst, mp, c0, c1, bar, (uint16_t)((1u << CL) - 1));
        else tma_load_2d(dst, mp, c0, c1, bar);
    }
}
/* chunk c's V slice (this block's 16 columns of head j) by threads tid < 128 */
__device__ __forceinline__ void dn_scan_load_v(const DeltaNetPrefillParams &p, const DeltaNetScratch &sc, uint32_t st,
                                               int c, int j, int e0, int tid) {
    if (tid < DN_C * 2) {
        const int r = tid >> 1, ch = tid & 1;
        cp_async16(st + DnScanSmem<true>::V + swz<2>(r, ch) * 16,
                   sc.v + ((size_t)(c * DN_C + r) * p.Hv + j) * DN_D + e0 + ch * 8, true);
    }
}

/* grid (dv/16, Hv) in clusters of CL along x (the column slices of one head), 512 threads, one CTA
 * per SM (~217 KB of shared memory: DnScanSmem<true> with K, Q in the SWZ_TMA16 layout, + 2
 * mbarriers). The CTA owns S[:, e0 .. e0+15] of head j: warp w holds the m16n8 tile (rows 16 (w%8),
 * n8 tile w/8) in fp32 registers. Same algebra and the same fp32 operation order as dn_scan_split,
 * but the work of a chunk is spread over 16 warps in three phases (three barriers per chunk) so
 * that the serial chain S_c -> S_c+1 is short:
 *   1. warps 0-7:  X = K S, R = V - diag(e^gamma) X -> split tiles
 *      warps 8-15: the Q S half of O = diag(e^gamma) Q S dk^-1/2 + P V' (kept in registers)
 *   2. warps 0-7:  V' = T2 R -> diag(e^(gamma_L - gamma)) V' and V' as split tiles
 *      warps 8-15: the next chunk's loads (one thread: TMA, multicast to the cluster; V: cp.async)
 *   3. all warps:  S <- e^gamma_L S + K^T diag(e^(gamma_L - gamma)) V' for their tile, snapshot
 *                  -> split tiles; warps 8-15 also add P V' and store bf16(O) in sc.u
 * In phases 1-2 warp w % 8 = (wm, wn) owns rows 16 wm and columns 8 wn of the 64 x 16 tiles.
 * The CL blocks of a cluster load K, Q, T2, P once for all of them (each issues 1/CL of the boxes,
 * multicast): the L2 serves each (chunk, head) tile once instead of 8 times. A stage is refilled
 * (chunk c+1, in chunk c) only after every block of the cluster has finished chunk c-1 with it: a
 * cluster barrier, arrived at the end of chunk c-1 and waited after phase 1 of chunk c. */
template <int CL>
__global__ void __launch_bounds__(512, 1) dn_scan_fo(const __grid_constant__ DeltaNetPrefillParams p,
                                                    const __grid_constant__ DeltaNetScratch sc,
                                                    const __grid_constant__ DnScanMaps maps) {
    using L = DnScanSmem<true>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023); /* TMA swizzle: 1024-aligned */
    const uint32_t sb = smem_addr(smem), full = sb + L::BYTES;                  /* full[2]: mbarriers */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const bool xw = warp < 8; /* X / V' warps; the others: Q S, P V', loads */
    const int q8 = warp & 7, wm = q8 & 3, wn = q8 >> 2;
    const int sr = q8 * 16, snt = warp >> 3; /* this warp's S tile */
    const int j = blockIdx.y, e0 = blockIdx.x * DN_DVS, n = j / (p.Hv / p.Hk);
    const int rank = CL > 1 ? (int)cluster_rank() : 0;
    const int nc = (p.T + DN_C - 1) / DN_C;
    float *state = p.state + (size_t)j * DN_D * DN_D;

    if (tid == 0) {
        mbar_init(full, 1), mbar_init(full + 8, 1);
        mbar_init_fence();
    }
    float S[4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float2 v = *(const float2 *)(state + (sr + g + 8 * h) * DN_D + e0 + snt * 8 + 2 * t);
        S[2 * h] = v.x, S[2 * h + 1] = v.y;
    }
    dn_store_split16(smem + L::S, L::LO_S, S, sr, snt * 8, g, t);
    if (CL > 1) { /* every block's barriers are initialised before anyone multicasts into them */
        cluster_arrive_release();
        cluster_wait();
    } else {
        __syncthreads();
    }
    const int dbg = maps.dbg;
    if (tid == 256 && !(dbg & 2)) dn_scan_issue<CL>(maps, sb, full, 0, p.Hv, j, n, rank);
    if (!xw && !(dbg & 2)) dn_scan_load_v(p, sc, sb, 0, j, e0, tid - 256);
    cp_async_commit();
    float gn0 = sc.g[(size_t)(2 * lane) * p.Hv + j], gn1 = sc.g[(size_t)(2 * lane + 1) * p.Hv + j];

    for (int c = 0; c < nc; c++) {
        const uint32_t st = sb + (c & 1) * L::STAGE;
        if (!(dbg & 2)) mbar_wait(full + (c & 1) * 8, (c >> 1) & 1);
        cp_async_wait<0>();
        __syncthreads(); /* chunk c landed, S_c in smem; everyone is done with chunk c-1 */
        float y0, y1;
        dn_gamma_scan(gn0, gn1, lane, y0, y1);
        const float gL = __shfl_sync(0xffffffffu, y1, 31);
        if (c + 1 < nc) {
            gn0 = sc.g[(size_t)((c + 1) * DN_C + 2 * lane) * p.Hv + j];
            gn1 = sc.g[(size_t)((c + 1) * DN_C + 2 * lane + 1) * p.Hv + j];
        }
        float gr[2]; /* gamma of this thread's two tile rows wm*16 + g (+8) */
#pragma unroll
        for (int h = 0; h < 2; h++) gr[h] = dn_gamma_at(y0, y1, wm * 16 + g + 8 * h);

        /* phase 1: X = K S (A = K) or the Q S half of O (A = Q); k = dk */
        float o[4];
        {
            const uint32_t A = st + (xw ? L::K : L::Q);
            float xh[4] = {}, xl[4] = {}, xm[4] = {};
#pragma unroll
            for (int kk = 0; kk < DN_D / 16; kk++) {
                if (dbg & 1) break;
                uint32_t a[4], al[4], b[4], bl[4];
                ldsm_x4(ldsm_addr_a<SWZ_TMA16>(A, wm * 16, kk * 16, lane), a);
                ldsm_x4(ldsm_addr_a<SWZ_TMA16>(A, DN_C + wm * 16, kk * 16, lane), al);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::S, kk * 16, 0, lane), b);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::S + L::LO_S, kk * 16, 0, lane), bl);
                dn_mma3(xh, xl, xm, a, al, b, bl, wn);
            }
            if (xw) { /* R = V - diag(e^gamma) X -> split tiles */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wm * 16 + g + 8 * h, col = wn * 8 + 2 * t;
                    const float eg = expf(gr[h]);
                    const uint32_t vv = *(const uint32_t *)(smem + (st - sb) + L::V + swz_off<2>(r, col));
                    o[2 * h] = __uint_as_float(vv << 16) - eg * (xh[2 * h] + (xl[2 * h] + xm[2 * h]));
                    o[2 * h + 1] =
                        __uint_as_float(vv & 0xffff0000u) - eg * (xh[2 * h + 1] + (xl[2 * h + 1] + xm[2 * h + 1]));
                }
                dn_store_split16(smem + L::R, L::LO_R, o, wm * 16, wn * 8, g, t);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) o[e] = DN_QSCALE * expf(gr[e >> 1]) * (xh[e] + (xl[e] + xm[e]));
            }
        }
        __syncthreads();
        if (CL > 1 && c >= 1 && c + 1 < nc) cluster_wait(); /* the cluster is done with chunk c-1's stage */

        /* phase 2: V' = T2 R (64 x 16; k = the chunk's 64 rows; T2 is lower triangular) */
        if (xw) {
            float vh[4] = {}, vl[4] = {}, vm[4] = {};
#pragma unroll
            for (int kk = 0; kk < DN_C / 16; kk++) {
                if (kk > wm || (dbg & 1)) break; /* warp-uniform */
                uint32_t ah[4], al[4], b[4], bl[4];
                ldsm_x4(ldsm_addr_a<8>(st + L::TH, wm * 16, kk * 16, lane), ah);
                ldsm_x4(ldsm_addr_a<8>(st + L::TL, wm * 16, kk * 16, lane), al);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::R, kk * 16, 0, lane), b);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::R + L::LO_R, kk * 16, 0, lane), bl);
                dn_mma3(vh, vl, vm, ah, al, b, bl, wn);
            }
            float v[4], x[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                v[e] = vh[e] + (vl[e] + vm[e]);
                x[e] = v[e] * expf(gL - gr[e >> 1]);
            }
            dn_store_split16(smem + L::VP, L::LO_R, v, wm * 16, wn * 8, g, t);
            dn_store_split16(smem + L::VS, L::LO_R, x, wm * 16, wn * 8, g, t);
        } else if (c + 1 < nc) {
            const uint32_t nst = sb + ((c + 1) & 1) * L::STAGE;
            if (tid == 256 && !(dbg & 2))
                dn_scan_issue<CL>(maps, nst, full + ((c + 1) & 1) * 8, c + 1, p.Hv, j, n, rank);
            if (!(dbg & 2)) dn_scan_load_v(p, sc, nst, c + 1, j, e0, tid - 256);
        }
        cp_async_commit();
        __syncthreads();

        /* phase 3: S <- e^gamma_L S + K^T Vs for this warp's tile (k = the chunk's 64 rows; hi x hi
         * into S, the two lo terms into their own accumulators) */
        {
            const float eL = expf(gL);
            float sl[4] = {}, sm[4] = {};
#pragma unroll
            for (int e = 0; e < 4; e++) S[e] *= eL;
#pragma unroll
            for (int kk = 0; kk < DN_C / 16; kk++) {
                if (dbg & 1) break;
                uint32_t a[4], al[4], b[4], bl[4];
                ldsm_x4_t(ldsm_addr_at<SWZ_TMA16>(st + L::K, kk * 16, sr, lane), a);
                ldsm_x4_t(ldsm_addr_at<SWZ_TMA16>(st + L::K, DN_C + kk * 16, sr, lane), al);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::VS, kk * 16, 0, lane), b);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::VS + L::LO_R, kk * 16, 0, lane), bl);
                mma_bf16(sl, a, dn_pick(bl, snt, 0), dn_pick(bl, snt, 1));
                mma_bf16(sm, al, dn_pick(b, snt, 0), dn_pick(b, snt, 1));
                mma_bf16(S, a, dn_pick(b, snt, 0), dn_pick(b, snt, 1));
            }
#pragma unroll
            for (int e = 0; e < 4; e++) S[e] += sl[e] + sm[e];
        }
        if (!xw) { /* O += P V' (P lower triangular) -> bf16 in sc.u */
            float ph[4] = {}, pl[4] = {}, pm[4] = {};
#pragma unroll
            for (int kk = 0; kk < DN_C / 16; kk++) {
                if (kk > wm || (dbg & 1)) break; /* warp-uniform */
                uint32_t a[4], al[4], b[4], bl[4];
                ldsm_x4(ldsm_addr_a<8>(st + L::P, wm * 16, kk * 16, lane), a);
                ldsm_x4(ldsm_addr_a<8>(st + L::P, DN_C + wm * 16, kk * 16, lane), al);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::VP, kk * 16, 0, lane), b);
                ldsm_x4_t(ldsm_addr_bk<2>(sb + L::VP + L::LO_R, kk * 16, 0, lane), bl);
                dn_mma3(ph, pl, pm, a, al, b, bl, wn);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wm * 16 + g + 8 * h, col = wn * 8 + 2 * t;
                const float o0 = o[2 * h] + (ph[2 * h] + (pl[2 * h] + pm[2 * h]));
                const float o1 = o[2 * h + 1] + (ph[2 * h + 1] + (pl[2 * h + 1] + pm[2 * h + 1]));
                *(uint32_t *)(sc.u + ((size_t)(c * DN_C + r) * p.Hv + j) * DN_D + e0 + col) = pack_bf16(o0, o1);
            }
        }
        /* S_c+1 -> split tiles (everyone read S_c before the second barrier) */
        dn_store_split16(smem + L::S, L::LO_S, S, sr, snt * 8, g, t);
        if (CL > 1 && c + 2 < nc) cluster_arrive_release(); /* done with this stage (refilled in chunk c+1) */
    }
#pragma unroll
    for (int h = 0; h < 2; h++)
        *(float2 *)(state + (sr + g + 8 * h) * DN_D + e0 + snt * 8 + 2 * t) = make_float2(S[2 * h], S[2 * h + 1]);
}

#endif
