/* gemm.cu — prefill projections: Y[M][N] = X[M][K] W[N][K]^T with bf16 inputs and fp32
 * accumulation on the tensor cores (mma.sync m16n8k16), for M = prompt length (any M >= 1).
 *
 * One CTA computes a BM x BN tile; each warp a 64 x 64 sub-tile (4 x 8 mma tiles, 128 fp32
 * accumulators per thread). K advances in steps of 64 through a STAGES-deep ring of shared
 * memory filled by cp.async (16-byte chunks, zero-filled outside [M] x [K] and [N] x [K], so
 * ragged M and K tails need no special path). Shared tiles are XOR-swizzled (mma.cuh) so
 * ldmatrix is conflict-free. CTAs walk the tiles in groups of GROUP_M tile rows (column-major
 * inside a group) so the X rows and W rows that concurrent CTAs share stay in L2.
 * Epilogues (GemmParams.epi) round like HF bf16 Linear layers: bf16(acc), the residual add
 * bf16(y + bf16(acc)), and SwiGLU bf16(bf16(silu(bf16 gate)) * bf16 up) on interleaved rows. */
#include <stdlib.h>
#include <string.h>

#include "cuda/gemm.cuh"

template <int BM, int BN>
__device__ __forceinline__ void gemm_tile_coords(const GemmParams &p, int &m0, int &n0) {
    gemm_tile_coords_at<BM, BN>(p, blockIdx.x, m0, n0);
}

/* Issues the cp.async copies of k-tile kt into the stage at sA (A: BM x 64, then B: BN x 64). */
template <int BM, int BN, int THREADS>
__device__ __forceinline__ void gemm_load_tile(const GemmParams &p, uint32_t sA, int kt, int m0, int n0, int tid) {
    using S = GemmShape<BM, BN, 1, THREADS>;
    const uint32_t sB = sA + S::A_BYTES;
    const int k0 = kt * GEMM_BK;
    static_assert((BM * S::NCH) % THREADS == 0 && (BN * S::NCH) % THREADS == 0, "load split");
#pragma unroll
    for (int j = 0; j < BM * S::NCH / THREADS; j++) {
        const int i = tid + j * THREADS, r = i / S::NCH, c = i % S::NCH, gr = m0 + r, gk = k0 + c * 8;
        const bool ok = gr < p.M && gk < p.K;
        cp_async16(sA + swz<S::NCH>(r, c) * 16, p.x + (ok ? (size_t)gr * p.ldx + gk : 0), ok);
    }
#pragma unroll
    for (int j = 0; j < BN * S::NCH / THREADS; j++) {
        const int i = tid + j * THREADS, r = i / S::NCH, c = i % S::NCH, gr = n0 + r, gk = k0 + c * 8;
        const bool ok = gr < p.N && gk < p.K;
        cp_async16(sB + swz<S::NCH>(r, c) * 16, p.w + (ok ? (size_t)gr * p.ldw + gk : 0), ok);
    }
}

/* ---- mma.sync path (sm_80+) ------------------------------------------------------------
 * BM x BN tile per CTA, warps of 64 x 64 (4 x 8 mma tiles, 128 accumulators per thread). */
template <int BM, int BN, int STAGES, int EPI>
__global__ void __launch_bounds__((BM / 64) * (BN / 64) * 32) gemm_bf16_mma(const __grid_constant__ GemmParams p) {
    pdl_begin();
    constexpr int WARPS_N = BN / 64, THREADS = (BM / 64) * WARPS_N * 32;
    using S = GemmShape<BM, BN, STAGES, THREADS>;
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t sbase = smem_addr(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    int m0, n0;
    gemm_tile_coords<BM, BN>(p, m0, n0);

    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    const int ktiles = (p.K + GEMM_BK - 1) / GEMM_BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) gemm_load_tile<BM, BN, THREADS>(p, sbase + s * S::STAGE_BYTES, s, m0, n0, tid);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* k-tile kt landed; every warp is done with slot (kt-1) % STAGES */
        const int nk = kt + STAGES - 1;
        if (nk < ktiles) gemm_load_tile<BM, BN, THREADS>(p, sbase + (nk % STAGES) * S::STAGE_BYTES, nk, m0, n0, tid);
        cp_async_commit();

        const uint32_t sA = sbase + (kt % STAGES) * S::STAGE_BYTES, sB = sA + S::A_BYTES;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; kk++) {
            uint32_t a[4][4], b[8][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) ldsm_x4(ldsm_addr_a<S::NCH>(sA, wm * 64 + mt * 16, kk * 16, lane), a[mt]);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t r[4];
                ldsm_x4(ldsm_addr_bt<S::NCH>(sB, wn * 64 + np * 16, kk * 16, lane), r);
                b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
    }
    cp_async_wait<0>();
    gemm_store<EPI, 4, 8>(p, acc, m0 + wm * 64, n0 + wn * 64, lane >> 2, lane & 3);
}

/* ---- wgmma path (sm_90a) ---------------------------------------------------------------
 * 128 x BN tile per CTA, two warpgroups of 64 x BN (m64nBNk16 wgmma, BN/2 accumulators per
 * thread). cp.async fills a 4-stage ring (swizzled rows of 128 B = wgmma's 128-byte swizzle,
 * stage bases 1024-byte aligned); loads run 2 stages ahead and one wgmma group stays in flight,
 * so the slot refilled at k-tile kt (read by the wgmma of kt-2) is free once every thread has
 * passed wgmma_wait<1> in iteration kt-1 and the barrier of iteration kt. */
#define WG_STAGES 4
template <int BN>
struct WgShape {
    using S = GemmShape<128, BN, WG_STAGES, 256>;
    static constexpr int SMEM = S::SMEM + 1024; /* + slack to align the ring to 1024 B */
};

template <int BN, int EPI>
__global__ void __launch_bounds__(256, 1) gemm_bf16_wgmma(const __grid_constant__ GemmParams p) {
    pdl_begin();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = GemmShape<128, BN, WG_STAGES, 256>;
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t sbase = (smem_addr(smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
    int m0, n0;
    gemm_tile_coords<128, BN>(p, m0, n0);

    float acc[1][BN / 8][4];
#pragma unroll
    for (int j = 0; j < BN / 8; j++) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;

    const int ktiles = (p.K + GEMM_BK - 1) / GEMM_BK;
#pragma unroll
    for (int s = 0; s < WG_STAGES - 2; s++) {
        if (s < ktiles) gemm_load_tile<128, BN, 256>(p, sbase + s * S::STAGE_BYTES, s, m0, n0, tid);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<WG_STAGES - 3>();
        fence_proxy_async();
        __syncthreads();
        const int nk = kt + WG_STAGES - 2;
        if (nk < ktiles) gemm_load_tile<128, BN, 256>(p, sbase + (nk % WG_STAGES) * S::STAGE_BYTES, nk, m0, n0, tid);
        cp_async_commit();

        const uint32_t sA = sbase + (kt % WG_STAGES) * S::STAGE_BYTES + wg * 64 * 128,
                       sB = sA - wg * 64 * 128 + S::A_BYTES;
        reg_fence_acc(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; kk++) {
            const uint64_t da = wgmma_desc(sA + kk * 32), db = wgmma_desc(sB + kk * 32);
            if constexpr (BN == 256)
                wgmma_m64n256k16(acc[0], da, db);
            else
                wgmma_m64n128k16(acc[0], da, db);
        }
        wgmma_commit();
        wgmma_wait<1>();
        reg_fence_acc(acc);
    }
    wgmma_wait<0>();
    reg_fence_acc(acc);
    cp_async_wait<0>();
    gemm_store<EPI, 1, BN / 8>(p, acc, m0 + wg * 64 + wq * 16, n0, lane >> 2, lane & 3);
#else
    (void)p;
    __trap(); /* built without sm_90a: the launcher never selects this kernel then */
#endif
}

/* ---- launch ---------------------------------------------------------------------------- */

template <auto KERN>
static int gemm_run(int smem, int threads, int tiles, const GemmParams *p, const CudaLaunch *l) {
    const cudaError_t e = smem_attr<KERN>(smem);
    if (e != cudaSuccess) return (int)e;
    return launch_ex(KERN, dim3(tiles), dim3(threads), smem, 0, l, *p);
}

static int tiles_of(const GemmParams *p, int bm, int bn) { return ((p->M + bm - 1) / bm) * ((p->N + bn - 1) / bn); }

/* Tile shape: 128 x 256 when that gives at least one tile per SM, else 128 x 128 (narrow N such as
 * the 1024-wide down / out / o projections, or short prompts). mma.sync: 8 warps, 3 stages
 * (144 KiB) or 4 warps, 4 stages (128 KiB); wgmma: 2 warpgroups, 4 stages (193 / 129 KiB). */
template <int EPI>
static int gemm_dispatch(const GemmParams *p, int use_wgmma, int sms, const CudaLaunch *l) {
    const int wide = tiles_of(p, 128, 256) >= sms;
    if (use_wgmma) {
        if (wide) return gemm_run<gemm_bf16_wgmma<256, EPI>>(WgShape<256>::SMEM, 256, tiles_of(p, 128, 256), p, l);
        return gemm_run<gemm_bf16_wgmma<128, EPI>>(WgShape<128>::SMEM, 256, tiles_of(p, 128, 128), p, l);
    }
    if (wide)
        return gemm_run<gemm_bf16_mma<128, 256, 3, EPI>>(GemmShape<128, 256, 3, 256>::SMEM, 256, tiles_of(p, 128, 256),
                                                         p, l);
    return gemm_run<gemm_bf16_mma<128, 128, 4, EPI>>(GemmShape<128, 128, 4, 128>::SMEM, 128, tiles_of(p, 128, 128), p,
                                                     l);
}

/* The algorithm AUTO means on a device of compute capability major `major`: on sm_90 the TMA path (gemm_tma.cu;
 * the GEMMs of a 2048-token prefill 4.99 ms vs ~6.2 with the cp.async wgmma path), else mma.sync. */
static int gemm_auto_algo(int major) { return major == 9 ? GEMM_ALGO_TMA : GEMM_ALGO_MMA; }

extern "C" int cuda_gemm_bf16(const GemmParams *p, const CudaLaunch *l) {
    const int am = p->epi == GEMM_EPI_ARGMAX; /* no Y rows: ldy unused */
    const int ycols = am ? 0 : p->epi == GEMM_EPI_SWIGLU_BF16 ? p->N / 2 : p->N;
    const int G = p->glu_group;
    if (p->M < 1 || p->N < 8 || p->K < 8 || p->N % 8 || p->K % 8 || p->ldx < p->K || p->ldw < p->K || p->ldx % 8 ||
        p->ldw % 8 || p->ldy < ycols || p->ldy % 2 || ((uintptr_t)p->x & 15) || ((uintptr_t)p->w & 15) || !p->y ||
        p->algo < GEMM_ALGO_AUTO || p->algo >= GEMM_ALGO_COUNT || p->epi < GEMM_EPI_BF16 || p->epi > GEMM_EPI_ARGMAX)
        return (int)cudaErrorInvalidValue;
    if (am && (p->am_cols < 1 || p->am_cols > p->N || (p->algo != GEMM_ALGO_TMA_C128 && p->algo != GEMM_ALGO_TMA_P128)))
        return (int)cudaErrorInvalidValue;
    if (p->epi == GEMM_EPI_SWIGLU_BF16 && ((G != 1 && G != 8 && G != 16 && G != 32) || p->N % (2 * G)))
        return (int)cudaErrorInvalidValue;
    int dev = 0, sms = 132, major = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return (int)e;
    const int algo = p->algo == GEMM_ALGO_AUTO ? gemm_auto_algo(major) : p->algo;
    if (algo != GEMM_ALGO_MMA && major != 9) return (int)cudaErrorInvalidDeviceFunction;
    if (algo >= GEMM_ALGO_TMA) {
        GemmParams q = *p;
        q.algo = algo;
        const int rc = gemm_tma_run(&q, sms, l);
        /* AUTO falls back to the cp.async wgmma kernel when the driver cannot encode tensor maps */
        if (rc != (int)cudaErrorNotSupported || p->algo != GEMM_ALGO_AUTO) return rc;
    }
    const int wg = algo != GEMM_ALGO_MMA;
    switch (p->epi) {
    case GEMM_EPI_BF16: return gemm_dispatch<GEMM_EPI_BF16>(p, wg, sms, l);
    case GEMM_EPI_F32: return gemm_dispatch<GEMM_EPI_F32>(p, wg, sms, l);
    case GEMM_EPI_ADD_F32: return gemm_dispatch<GEMM_EPI_ADD_F32>(p, wg, sms, l);
    default: return gemm_dispatch<GEMM_EPI_SWIGLU_BF16>(p, wg, sms, l);
    }
}
