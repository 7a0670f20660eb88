/* deltanet_prefill_out.cuh — kernel 4 of the chunked DeltaNet prefill: chunk output + gated RMSNorm (and the row norm of the fused-output path).
 * Included by deltanet_prefill.cu only (one translation unit: device code needs no -rdc). */
#ifndef Q35_CUDA_DELTANET_PREFILL_OUT_CUH
#define Q35_CUDA_DELTANET_PREFILL_OUT_CUH

/* ---- 4. chunk output + gated RMSNorm --------------------------------------------------- */

struct DnOutSmem {
    static constexpr int Q = 0;                         /* bf16 [128][128]: q^ hi rows 0..63, lo rows 64..127 */
    static constexpr int S = Q + 2 * DN_C * DN_D * 2;   /* bf16 [256][64]: S hi rows 0..127, lo rows 128..255 */
    static constexpr int V = S + 2 * DN_D * DN_OH * 2;  /* bf16 [128][64]: V' hi rows 0..63, lo rows 64..127 */
    static constexpr int P = V + 2 * DN_C * DN_OH * 2;  /* bf16 [128][64]: P hi rows 0..63, lo rows 64..127 */
    static constexpr int GAM = P + 2 * DN_C * DN_C * 2; /* fp32 [64] */
    static constexpr int RED = GAM + DN_C * 4;          /* fp32 [2][64] */
    static constexpr int BYTES = RED + 2 * DN_C * 4;
};

/* grid (2 Tp/64, Hv), 256 threads, clusters of 2 along x: block x = 2c + half computes columns
 * [64 half, 64 half + 64) of chunk c, head j. ~97 KB of shared memory: 2 blocks per SM, so one
 * block's loads overlap the other's math. Warp (wm, wn) = (w%4, w/4) owns rows 16 wm, columns 32 wn
 * of the block's 64. The gated RMSNorm's sum of squares over a row's 128 columns adds the partner
 * block's half through DSMEM. */
__global__ void __launch_bounds__(256, 2)
    dn_out_chunk(const __grid_constant__ DeltaNetPrefillParams p, const __grid_constant__ DeltaNetScratch sc) {
    pdl_begin();
    using L = DnOutSmem;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sb = smem_addr(smem);
    float *sgam = (float *)(smem + L::GAM), *sred = (float *)(smem + L::RED);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int half = blockIdx.x & 1, c = blockIdx.x >> 1, j = blockIdx.y, n = j / (p.Hv / p.Hk), t0 = c * DN_C;
    const int cb = half * DN_OH; /* first column of this block */
    const int wm = warp & 3, wn = warp >> 2;

    const uint16_t *Sg = sc.s + ((size_t)c * p.Hv + j) * 2 * DN_D * DN_D;
    const uint16_t *Pg = sc.p + ((size_t)c * p.Hv + j) * 2 * DN_C * DN_C;
#pragma unroll
    for (int jj = 0; jj < 2 * DN_C * 16 / 256; jj++) {
        const int i = tid + jj * 256;
        const int r = i >> 4, ch = i & 15; /* q^ row r of [hi; lo] */
        cp_async16(sb + L::Q + swz<16>(r, ch) * 16,
                   (r < DN_C ? sc.q : sc.q_lo) + ((size_t)(t0 + (r & 63)) * p.Hk + n) * DN_D + ch * 8, true);
        const int r2 = i >> 3, ch2 = i & 7; /* S row r2 of [hi; lo] (256 rows) */
        cp_async16(sb + L::S + swz<8>(r2, ch2) * 16, Sg + (size_t)r2 * DN_D + cb + ch2 * 8, true);
    }
#pragma unroll
    for (int jj = 0; jj < 2 * DN_C * 8 / 256; jj++) {
        const int i = tid + jj * 256, r = i >> 3, ch = i & 7; /* V', P row r of [hi; lo] */
        cp_async16(sb + L::V + swz<8>(r, ch) * 16,
                   (r < DN_C ? sc.u : sc.u_lo) + ((size_t)(t0 + (r & 63)) * p.Hv + j) * DN_D + cb + ch * 8, true);
        cp_async16(sb + L::P + swz<8>(r, ch) * 16, Pg + (size_t)r * DN_C + ch * 8, true);
    }
    cp_async_commit();
    if (warp == 0) {
        float y0, y1;
        dn_gamma_scan(sc.g[(size_t)(t0 + 2 * lane) * p.Hv + j], sc.g[(size_t)(t0 + 2 * lane + 1) * p.Hv + j], lane, y0,
                      y1);
        sgam[2 * lane] = y0, sgam[2 * lane + 1] = y1;
    }
    cp_async_wait<0>();
    __syncthreads();

    /* O = diag(e^gamma) Q S * dk^-1/2 + P V', every product split x split (3 mma). Q S: the k loop
     * runs over the 256 rows of the S tile (lo first) with q^ hi (Q's k-block ks % 8), then over S hi
     * with q^ lo. */
    float acc[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < 3 * DN_D / 16; kk++) {
        const int ks = kk < 2 * DN_D / 16 ? (kk + DN_D / 16) % (2 * DN_D / 16) : kk - 2 * DN_D / 16;
        const int qr = kk < 2 * DN_D / 16 ? 0 : DN_C; /* q^ hi, then lo rows */
        uint32_t a[4];
        ldsm_x4(ldsm_addr_a<16>(sb + L::Q, qr + wm * 16, (ks % (DN_D / 16)) * 16, lane), a);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t b[4];
            ldsm_x4_t(ldsm_addr_bk<8>(sb + L::S, ks * 16, wn * 32 + np * 16, lane), b);
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
    const int r0 = wm * 16 + g;
    const float eg0 = DN_QSCALE * expf(sgam[r0]), eg1 = DN_QSCALE * expf(sgam[r0 + 8]);
#pragma unroll
    for (int nt = 0; nt < 4; nt++) acc[nt][0] *= eg0, acc[nt][1] *= eg0, acc[nt][2] *= eg1, acc[nt][3] *= eg1;
        /* + P V' (P is lower triangular: k-blocks <= wm) */
#pragma unroll
    for (int kk = 0; kk < DN_C / 16; kk++) {
        if (kk > wm) break; /* warp-uniform */
        uint32_t a[4], al[4];
        ldsm_x4(ldsm_addr_a<8>(sb + L::P, wm * 16, kk * 16, lane), a);
        ldsm_x4(ldsm_addr_a<8>(sb + L::P, DN_C + wm * 16, kk * 16, lane), al);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t b[4], bl[4];
            ldsm_x4_t(ldsm_addr_bk<8>(sb + L::V, kk * 16, wn * 32 + np * 16, lane), b);
            ldsm_x4_t(ldsm_addr_bk<8>(sb + L::V, DN_C + kk * 16, wn * 32 + np * 16, lane), bl);
            mma_bf16(acc[2 * np], a, bl[0], bl[1]);
            mma_bf16(acc[2 * np + 1], a, bl[2], bl[3]);
            mma_bf16(acc[2 * np], al, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], al, b[2], b[3]);
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
    }

    /* gated RMSNorm over the 128 columns of each row: two warps per row here, two in the partner */
    float ss[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            acc[nt][e] = rbf(acc[nt][e]);
            ss[e >> 1] += acc[nt][e] * acc[nt][e];
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        ss[h] += __shfl_xor_sync(0xffffffffu, ss[h], 1);
        ss[h] += __shfl_xor_sync(0xffffffffu, ss[h], 2);
        if (t == 0) sred[wn * DN_C + r0 + 8 * h] = ss[h];
    }
    cluster_arrive_release(); /* publish sred to the cluster (both blocks) */
    cluster_wait();
    float tot[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h;
        tot[h] = sred[r] + sred[DN_C + r] + ld_dsmem(&sred[r], half ^ 1) + ld_dsmem(&sred[DN_C + r], half ^ 1);
    }
    cluster_arrive_relaxed(); /* done reading the partner's sred; waited on before exit */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h, tok = t0 + r;
        if (tok >= p.T) continue;
        const float inv = rsqrtf(tot[h] / (float)DN_D + p.eps);
        const uint16_t *zr = p.proj + (size_t)tok * p.ld_proj + p.z_off + j * DN_D;
        uint16_t *yr = p.y + ((size_t)tok * p.Hv + j) * DN_D;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int col = cb + wn * 32 + nt * 8 + 2 * t;
            const uint32_t zz = *(const uint32_t *)(zr + col);
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float z = __uint_as_float(e ? (zz & 0xffff0000u) : (zz << 16));
                const float u = rbf(acc[nt][2 * h + e] * inv);
                v[e] = rbf(p.norm_w[col + e] * u) * silu_f(z);
            }
            *(uint32_t *)(yr + col) = pack_bf16(v[0], v[1]);
        }
    }
    cluster_wait(); /* the partner has read our sred */
}

/* grid (ceil(T Hv / (8 DN_NR))), 256 threads, after the fused-output scan: warp = DN_NR (token, head)
 * rows of bf16(O) (sc.u), the gated RMSNorm of dn_out_chunk; lane holds columns 2 lane, 2 lane + 1,
 * 64 + 2 lane, 65 + 2 lane. All the warp's loads are issued before the first reduction (one row per
 * warp, 4096 blocks at T = 2048: 10 us per layer for ~24 MB). */
#define DN_NR 4
__global__ void __launch_bounds__(256)
    dn_norm_out(const __grid_constant__ DeltaNetPrefillParams p, const __grid_constant__ DeltaNetScratch sc) {
    pdl_begin();
    const int row0 = (blockIdx.x * 8 + (threadIdx.x >> 5)) * DN_NR, lane = threadIdx.x & 31, rows = p.T * p.Hv;
    uint32_t ou[DN_NR][2], zu[DN_NR][2];
#pragma unroll
    for (int k = 0; k < DN_NR; k++) {
        const int row = row0 + k;
        if (row >= rows) break;
        const int tok = row / p.Hv, j = row - tok * p.Hv;
        const uint16_t *o = sc.u + (size_t)row * DN_D, *z = p.proj + (size_t)tok * p.ld_proj + p.z_off + j * DN_D;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            ou[k][h] = *(const uint32_t *)(o + 64 * h + 2 * lane);
            zu[k][h] = *(const uint32_t *)(z + 64 * h + 2 * lane);
        }
    }
#pragma unroll
    for (int k = 0; k < DN_NR; k++) {
        const int row = row0 + k;
        if (row >= rows) break;
        float ss = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float a = __uint_as_float(ou[k][h] << 16), b = __uint_as_float(ou[k][h] & 0xffff0000u);
            ss += a * a + b * b;
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
        const float inv = rsqrtf(ss / (float)DN_D + p.eps);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 64 * h + 2 * lane + e;
                const float x = __uint_as_float(e ? (ou[k][h] & 0xffff0000u) : (ou[k][h] << 16));
                const float zz = __uint_as_float(e ? (zu[k][h] & 0xffff0000u) : (zu[k][h] << 16));
                v[e] = rbf(p.norm_w[col] * rbf(x * inv)) * silu_f(zz);
            }
            *(uint32_t *)(p.y + (size_t)row * DN_D + 64 * h + 2 * lane) = pack_bf16(v[0], v[1]);
        }
    }
}

#endif
